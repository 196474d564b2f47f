"""The tiles' encodings at integer ranges of times (``Encoding._span``), their range check from the two ends
(``check_span``) and the bounds their clearing takes (``fading_bound``): each equal to, or bounding, what the
general path computes."""

from __future__ import annotations

import re
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import attention_pieces
from liepos.attend import attention
from liepos.catalogue import default_decay_rates
from liepos.causal_tiling import fading_bound
from liepos.tables import check_range, check_span

F64 = torch.float64

ENCODINGS = {
    "decay": lambda: lp.build("decay", 16, 2),
    "retnet": lambda: lp.retnet(16, num_heads=2),
    "xpos": lambda: lp.xpos(16),
    "jordan": lambda: lp.build("jordan", 16),
    "rope": lambda: lp.rope(16),
    "alibi": lambda: lp.alibi(16, num_heads=2),
}


def _general(enc: lp.Encoding, x: torch.Tensor, p0: int, side: str, fade: bool) -> torch.Tensor:
    pos = torch.arange(p0, p0 + x.shape[-2], dtype=F64)
    if side == "key":
        return enc.key(x, pos)
    return enc._query_after(x, pos) if fade else enc.query(x, pos)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ENCODINGS)), p0=st.integers(-300, 300), S=st.integers(0, 70),
       side=st.sampled_from(["query", "key"]), fade=st.booleans(),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_span_is_query_and_key_at_the_range(name, p0, S, side, fade, dtype, seed):
    """``_span(x, p0, side)`` gives the values, dtype and errors of ``query`` / ``key`` / ``_query_after`` at
    ``arange(p0, p0 + S)``, bit for bit (the same tables and kernels)."""
    enc = ENCODINGS[name]()
    fade = fade and side == "query"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, S, enc.content_dim, dtype=F64, generator=g).to(dtype)
    try:
        want = _general(enc, x, p0, side, fade)
    except OverflowError as err:
        with pytest.raises(OverflowError, match=re.escape(str(err))):
            enc._span(x, p0, side, fade)
        return
    got = enc._span(x, p0, side, fade)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # bit for bit (an inf·0 NaN alike)


def test_span_falls_back_where_the_fast_path_does_not_run():
    """Learned parameters (a gradient into the tables) and a length-dependent encoding past its length take the
    general path: the same gradient, and the same refusal that names what to call."""
    enc = lp.build("decay", 16, 2)
    g = enc.generator
    learned = enc.replace(generator=g.with_params(rates=g.rates.clone().requires_grad_(True), freqs=g.freqs))
    x = torch.randn(1, 2, 9, 16, dtype=F64)
    got, want = learned._span(x, -4, "key"), _general(learned, x, -4, "key", False)
    assert torch.equal(got, want) and got.requires_grad
    (gr,) = torch.autograd.grad(got.sum(), learned.generator.rates)
    (gw,) = torch.autograd.grad(want.sum(), learned.generator.rates)
    assert torch.equal(gr, gw)
    dyn = lp.scaling.dynamic(lp.rope(16), factor=2.0, original_max_position_embeddings=8)
    with pytest.raises(ValueError, match="at_length"):
        dyn._span(x, 0, "query")
    assert torch.equal(dyn.at_length(9)._span(x, 0, "query"), dyn.at_length(9).query(x, torch.arange(9)))


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(sorted(ENCODINGS)), lo=st.floats(-2e5, 2e5), width=st.floats(0, 2e5),
       side=st.sampled_from(["query", "key"]), fade=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_check_span_is_check_range_over_the_span(name, lo, width, side, fade, dtype):
    """From the two ends alone, the same verdict and message as :func:`check_range` over every time between."""
    enc = ENCODINGS[name]()
    hi = lo + width
    pos = torch.linspace(lo, hi, 33, dtype=F64)

    def verdict(fn):
        try:
            fn()
        except OverflowError as err:
            return str(err)
        return None

    want = verdict(lambda: check_range(enc.generator, pos, side, dtype, fade=fade))
    got = verdict(lambda: check_span(enc.generator, lo, hi, side, dtype, fade=fade))
    assert got == want


def test_check_span_takes_one_axis():
    with pytest.raises(ValueError, match="one axis"):
        check_span(lp.mrope(12, sections=(2, 2, 2)).generator, 0.0, 1.0, "query", torch.float32)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["decay", "retnet", "xpos", "damped"]), width=st.integers(1, 400),
       scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**31 - 1))
def test_fading_bound_bounds_every_between_tile(name, width, scale, seed):
    """Every entry of ``F(t − p) q`` (``t − p ∈ [0, width)``) and ``G(s − p) k`` (``s − p ∈ [−width, 0)``) is at
    most the bound, computed in float64 from the encoded values themselves."""
    if name == "damped":
        P = 8
        enc = lp.Encoding(lp.Generator(-default_decay_rates(P), lp.rope_freqs(16), [1] * P))
    else:
        enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(1, 2, width, 16, dtype=F64, generator=g) for _ in range(2))
    call = _bound_call(enc, q, k)
    bound = fading_bound(call)
    assert bound is not None
    qe, ke = enc._span(q, 0, "query", fade=True), enc._span(k, -width, "key")
    assert float(qe.abs().max()) <= bound[0] and float(ke.abs().max()) <= bound[1]


def test_fading_bound_is_none_where_a_block_grows():
    """Jordan blocks' binomial terms and rising rates exceed the raw entries: no bound, the exact largest entries."""
    q = k = torch.randn(1, 1, 8, 16, dtype=F64)
    assert fading_bound(_bound_call(lp.build("jordan", 16), q, k)) is None
    rising = lp.Encoding(lp.Generator(torch.full((8,), 0.01, dtype=F64), lp.rope_freqs(16), [1] * 8, allow_growth=True))
    assert fading_bound(_bound_call(rising, q, k)) is None


def _bound_call(enc, q, k):
    """What :func:`fading_bound` reads of a call: its encoding, q and k."""
    return types.SimpleNamespace(enc=enc, q=q, k=k)


def test_diagonal_tiles_are_not_cleared_and_between_tiles_take_the_bound(monkeypatch, tiling):
    """The tiled triangle of a fading encoding: its diagonal blocks go to the kernel as encoded (within the diagonal
    budget nothing underflows), its other tiles cleared by the bound, with no pass to find their largest entries;
    the output equals float64 attention to float32 rounding."""
    seen, real = [], attention_pieces._fit

    def spy(q, k, v, D, Dv, c, scratch=None, owned=False, bound=None, clean=False):
        seen.append((k.shape[-2] == q.shape[-2] and clean, bound))
        return real(q, k, v, D, Dv, c, scratch, owned, bound, clean)

    absmax_calls = []
    monkeypatch.setattr(attention_pieces, "_fit", spy)
    monkeypatch.setattr(attention_pieces, "absmax", lambda x: absmax_calls.append(1) or float(x.abs().amax()))
    enc = lp.build("decay", 64, 2)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 1024, 64, dtype=F64, generator=g) for _ in range(3))
    with torch.no_grad():
        got = attention(q.float(), k.float(), v.float(), enc)
    assert any(clean for clean, _ in seen) and any(b is not None for _, b in seen)
    assert all(clean or b is not None for clean, b in seen)
    assert len(absmax_calls) == 0  # the bound's passes are the call's, over raw q and k (causal_tiling's import)
    want = lp.attention(q, k, v, enc)
    assert float((got.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ENCODINGS)), p0=st.integers(-200, 200), S=st.integers(1, 40),
       form=st.sampled_from(["none", "arange", "row", "shuffled", "batched"]), side=st.sampled_from(["query", "key"]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_query_and_key_of_an_integer_range_equal_the_general_path(name, p0, S, form, side, dtype, seed):
    """``query`` / ``key`` at positions None or an int64 range (``(S,)`` or ``(1, S)``) take the range's start
    directly; every other form the general path; either way the bits (and errors) of the same times as float64."""
    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, S, enc.content_dim, dtype=F64, generator=g).to(dtype)
    ramp = torch.arange(p0, p0 + S)
    positions = {"none": None, "arange": ramp, "row": ramp.unsqueeze(0), "batched": torch.stack([ramp, ramp + 3]),
                 "shuffled": ramp[torch.randperm(S, generator=g)]}[form]
    times = torch.arange(S, dtype=F64) if positions is None else positions.double()
    fn = enc.query if side == "query" else enc.key
    still_a_range = form == "shuffled" and torch.equal(positions, ramp)  # the identity permutation
    expected = {"none": 0, "arange": p0, "row": p0}.get(form, p0 if still_a_range else None)
    assert enc._range_start(positions, x) == expected
    try:
        want = fn(x, times)
    except OverflowError as err:
        with pytest.raises(OverflowError, match=re.escape(str(err))):
            fn(x, positions)
        return
    got = fn(x, positions)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # bit for bit (an inf·0 NaN alike)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_span_cleared_in_its_pass_equals_the_span_cleared_after(name, dtype):
    """``_span(..., clear=τ)``: the span's values with every entry below τ +0, the same bits whether its encoding
    takes the clearing into its one native pass (decay dims, rotation planes) or clears after it (Jordan terms, the
    half layout, slots), into a buffer or a fresh tensor; refused with a gradient."""
    from liepos._fast import clear_small

    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1, 2, 300, enc.content_dim, dtype=F64, generator=g) * 1e-3).to(dtype)
    buf = lambda shape, dt: torch.empty(shape, dtype=dt)  # noqa: E731
    for side, p0, fade in (("query", 0, True), ("key", -300, False)):
        want = clear_small(enc._span(x, p0, side, fade=fade), 3e-4)
        for into in (buf, None):
            got = enc._span(x, p0, side, fade=fade, into=into, clear=3e-4)
            assert torch.equal(got, want) and (got == 0).any()
    with pytest.raises(ValueError, match=r"clear=0.0003 needs no gradient \(a cleared entry would take none\)"):
        enc._span(x.float().requires_grad_(), 0, "key", into=buf, clear=3e-4)


def test_between_tiles_come_cleared_from_their_encoding(monkeypatch, tiling):
    """Streamed (no gradient), a fading encoding's tiles between keys and queries are cleared by the encoding's own
    pass: no clearing pass runs over them after, and the output has the bits of the separate clearing."""
    from liepos import _kernels, causal_tiling

    enc = lp.build("decay", 64, 8)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 8, 1024, 64, generator=g) for _ in range(3))
    passes, real = [], _kernels.clear_below
    monkeypatch.setattr(_kernels, "clear_below", lambda x, tau, into=None: passes.append(1) or real(x, tau, into))
    with torch.no_grad():
        got = attention(q, k, v, enc)
        assert passes == []
        monkeypatch.setattr(causal_tiling, "clear_thresholds", lambda *a: None)  # the clearing after each encoding
        want = attention(q, k, v, enc)
    assert passes and torch.equal(got, want)
