"""The catalogue has one source of truth and no argument-order trap.

``build(name, dim, num_heads, **options)`` is the entry's own function called with exactly those
arguments: generators, layouts, slots, heads and encoded outputs agree for every entry, with the
defaults and with one non-default option each. Every builder takes the width ``dim`` first and
``num_heads`` by keyword only, so a ``(num_heads, dim)`` call raises. Two encodings that encode
differently never print the same repr.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

import liepos as lp
from liepos import catalogue
from liepos._graph_key import key, rebuild

F64 = torch.float64
D, H = 12, 2  # every entry builds at 12 (a multiple of 2·3 and of 4) with 2 heads

# one non-default option per entry, valid at (D, H); every entry must have a case
OPTION = {
    "nope": {},  # no option: NoPE is X = 0 at any width
    "decay": {"rate": 0.1},
    "growth": {"rate": 0.2},
    "rope": {"base": 500.0},
    "xpos": {"scale_base": 64.0},
    "retnet": {"base": 100.0},
    "alibi": {"slopes": [0.5, 0.1]},
    "jordan": {"size": 2},
    "axial_rope": {"axes": 3},
    "rope_mixed": {"seed": 3},
    "mrope": {"sections": (4, 1, 1)},
    "decay_axial_rope": {"axes": 3},
    "p_rope": {"p": 0.5},
    "rope_id": {"fraction": 0.25},
    "cope_clipped": {"clip": 3},
    "string_google": {"seed": 1},
    "mrope_interleaved": {"sections": (2, 2, 2)},
    "rope_directions": {"directions": "random"},
    "mhrope": {"axes": 2},
}
# the registry's own builders where the public function of that name means something else:
# lp.decay takes the rates themselves, lp.jordan is one block
BANKS = {"decay", "jordan"}


def direct(name: str, dim: int, num_heads: int, **options) -> lp.Encoding:
    """The entry's function called by hand, as a reader would: the width, then num_heads by keyword."""
    fn = catalogue.CATALOGUE[name].fn if name in BANKS else getattr(catalogue, name)
    if "num_heads" in inspect.signature(fn).parameters:
        return fn(dim, num_heads=num_heads, **options)
    return fn(dim, **options)


def outputs(enc: lp.Encoding, heads: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, 5, enc.content_dim, generator=g, dtype=F64)
    k = torch.randn(1, heads, 5, enc.content_dim, generator=g, dtype=F64)
    t = torch.tensor([0.0, 1.0, 3.0, 4.5, 9.0], dtype=F64)
    if enc.num_axes is not None:  # a different time on each axis: (seq,) -> (seq, axes)
        t = t[:, None] * torch.arange(1.0, enc.num_axes + 1, dtype=F64)
    return enc.query(q, t), enc.key(k, t)


def assert_same(a: lp.Encoding, b: lp.Encoding, heads: int) -> None:
    ga, gb = a.generator, b.generator
    assert (ga.sizes, ga.complex, ga.num_axes, ga.num_heads) == (gb.sizes, gb.complex, gb.num_axes, gb.num_heads)
    for x, y in ((ga.rates, gb.rates), (ga.freqs, gb.freqs), (ga.nus, gb.nus), (ga.basis, gb.basis),
                 (a.query_slots, b.query_slots), (a.key_slots, b.key_slots)):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y))
    assert (a.layout, a.num_slots, a.num_heads, a.name) == (b.layout, b.num_slots, b.num_heads, b.name)
    for x, y in zip(outputs(a, heads, 0), outputs(b, heads, 0)):
        assert torch.equal(x, y)
    assert key(a) == key(b)


def test_every_entry_has_an_option_case():
    assert sorted(OPTION) == sorted(lp.CATALOGUE)


@pytest.mark.parametrize("name", sorted(lp.CATALOGUE))
def test_the_entry_is_the_public_function_itself(name):
    """One source of truth: the registry holds the builder, not a lambda re-declaring its defaults."""
    entry = lp.CATALOGUE[name]
    if name not in BANKS:
        assert entry.fn is getattr(lp, name)
    assert entry.options == [p for p in inspect.signature(entry.fn).parameters if p not in ("dim", "num_heads")]
    assert set(OPTION[name]) <= set(entry.options)


@pytest.mark.parametrize("name", sorted(lp.CATALOGUE))
@pytest.mark.parametrize("with_option", [False, True], ids=["defaults", "option"])
def test_build_equals_the_function_called_directly(name, with_option):
    options = OPTION[name] if with_option else {}
    got = lp.build(name, D, H, **options)
    assert_same(got, direct(name, D, H, **options), H)
    assert_same(lp.CATALOGUE[name].build(D, H, **options), got, H)
    if options:  # the option reached the function: it changes the encoding
        assert key(got) != key(lp.build(name, D, H))


def test_the_functions_defaults_hold_through_build():
    assert lp.build("decay_axial_rope", 24).num_axes == lp.decay_axial_rope(24).num_axes == 2
    assert_same(lp.build("mrope", 8), lp.mrope(8), 1)  # lp.mrope's sections default scales with dim
    assert lp.mrope(128).generator.freqs.ne(0).sum(-1).tolist() == [16, 24, 24]  # Qwen2-VL's split at 128
    assert lp.mrope_interleaved(128).generator.freqs.ne(0).sum(-1).tolist() == [24, 20, 20]  # Qwen3-VL's


# ---------------------------------------------------------------------- no argument-order trap
def test_every_builder_takes_dim_first_and_num_heads_by_keyword():
    for name, entry in lp.CATALOGUE.items():
        params = list(inspect.signature(entry.fn).parameters.values())
        assert params[0].name == "dim", name
        if "num_heads" in (p.name for p in params):
            heads = next(p for p in params if p.name == "num_heads")
            assert heads.kind is inspect.Parameter.KEYWORD_ONLY and heads.default is inspect.Parameter.empty, name
            assert entry.takes_heads
        else:
            assert not entry.takes_heads


PER_HEAD = ["alibi", "retnet", "rope_mixed", "mhrope"]


def test_the_per_head_entries_are_the_ones_that_take_num_heads():
    assert sorted(n for n, e in lp.CATALOGUE.items() if e.takes_heads) == sorted(PER_HEAD)


@pytest.mark.parametrize("name", PER_HEAD)
def test_a_heads_then_width_positional_call_raises(name):
    fn = getattr(lp, name)
    with pytest.raises(TypeError, match="positional argument"):
        fn(8, 4)  # a second positional number is refused, never read as a width or a head count
    with pytest.raises(TypeError, match="num_heads"):
        fn(8)
    with pytest.raises(TypeError, match="`num_heads`"):
        lp.build(name, 8)


def test_alibi_64_8_is_refused_not_64_heads_of_width_8():
    with pytest.raises(TypeError):
        lp.alibi(64, 8)
    enc = lp.alibi(64, num_heads=8)
    assert (enc.content_dim, enc.num_heads) == (64, 8)


def test_a_head_shared_entry_serves_any_head_count():
    assert_same(lp.build("rope", 8, 4), lp.rope(8), 4)
    with pytest.raises(ValueError, match="`num_heads` must be >= 1, got 0"):
        lp.build("rope", 8, 0)


def test_a_bad_option_names_the_entry_and_its_options():
    with pytest.raises(TypeError, match=r"'rope'.*\['base', 'layout'\]"):
        lp.build("rope", 8, basis=3)


# ---------------------------------------------------------------------- the repr
def test_the_repr_shows_the_heads():
    a2, a4 = lp.alibi(8, num_heads=2), lp.alibi(8, num_heads=4)
    assert repr(a2) != repr(a4) and "heads=2" in repr(a2) and "heads=4" in repr(a4)
    r2, r4 = lp.retnet(8, num_heads=2), lp.retnet(8, num_heads=4)
    assert repr(r2) != repr(r4) and "heads=2" in repr(r2)


def test_the_repr_tells_per_head_parameters_apart():
    """ALiBi with other slopes (or RoPE with another base) has the same structure and heads: the
    values digest tells them apart."""
    assert repr(lp.alibi(8, num_heads=2)) != repr(lp.alibi(8, num_heads=2, slopes=[0.5, 0.2]))
    assert repr(lp.alibi(8, num_heads=2, slopes=[0.5, 0.2])) != repr(lp.alibi(8, num_heads=2, slopes=[0.5, 0.25]))
    assert repr(lp.rope(8)) != repr(lp.rope(8, base=10000.0 * (1 + 1e-12)))
    assert repr(lp.rope(8)) != repr(lp.rope(8).replace(logit_scale=1.0 + 1e-9))


def _zoo() -> list[lp.Encoding]:
    """The catalogue at a few sizes and head counts, defaults and one option, plus near-twins."""
    out = []
    for name, dim, heads, with_option in itertools.product(sorted(lp.CATALOGUE), (12, 24), (1, 2, 3), (False, True)):
        options = dict(OPTION[name]) if with_option else {}
        if name == "alibi" and with_option:
            options["slopes"] = [0.5, 0.1, 0.05][:heads]
        if name == "mrope" and with_option:
            options["sections"] = (dim // 6,) * 3
        if name == "mrope_interleaved" and with_option:
            options["sections"] = (dim // 6,) * 3
        out.append(lp.build(name, dim, heads, **options))
    out += [lp.rope(12, base=b) for b in (10000.0, 10000.5)]
    out += [lp.alibi(12, num_heads=2, slopes=s) for s in ([0.5, 0.1], [0.5, 0.1 + 1e-12])]
    return out


def test_equal_reprs_imply_equal_encodings_over_the_catalogue():
    by_repr: dict[str, set[str]] = {}
    zoo = _zoo()
    for enc in zoo:
        by_repr.setdefault(repr(enc), set()).add(key(enc))
    assert all(len(keys) == 1 for keys in by_repr.values()), [r for r, k in by_repr.items() if len(k) > 1]
    # and the other way round: an equal encoding (the same entry built again, or rebuilt from its key)
    # prints the same
    assert len({key(e) for e in zoo}) == len(by_repr)
    for enc in zoo[::7]:
        assert repr(rebuild(key(enc))) == repr(enc)


def test_the_repr_inside_a_trace_reads_the_real_values():
    """An error message inside ``torch.compile`` formats an encoding while a fake-tensor mode is on."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    enc = lp.alibi(8, num_heads=2)
    with FakeTensorMode():
        inside = repr(enc)
    assert inside == repr(enc) and "values=#" in inside
