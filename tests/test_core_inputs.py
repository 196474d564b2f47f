"""Bad input to the core is refused at construction with a named error, never accepted silently; several
axes are first-class for the scaling maps; length-dependent encodings never silently run unscaled;
scaled encodings pickle; the table cache holds no more than its bound."""

from __future__ import annotations

import io
import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _fast, scaling
from liepos.nn import LearnableEncoding, LearnableGenerator

F64 = torch.float64


# ---------------------------------------------------------------------- one validator, one verdict
@pytest.mark.parametrize("make", [
    lambda: lp.rope("8"), lambda: lp.axial_rope("8"), lambda: LearnableGenerator("8"), lambda: lp.mrope(8.0),
    lambda: lp.xpos(8.0), lambda: lp.retnet(8, num_heads=2.0), lambda: lp.alibi(8, num_heads="2"), lambda: lp.nope(True),
    lambda: lp.jordan(2.0), lambda: lp.build("rope", "8"), lambda: lp.rope_mixed(8, num_heads="2"),
])
def test_a_wrong_type_is_a_type_error_everywhere(make):
    with pytest.raises(TypeError, match=r"^`\w+` must be an integer, got"):
        make()


def test_heads_of_generator_and_slots_are_checked_at_construction():
    g = lp.direct_sum(lp.retnet(8, num_heads=3).generator, lp.Generator(torch.zeros(3, 1), torch.zeros(3, 1), [2]))
    with pytest.raises(ValueError, match=r"disagree on the number of heads: \[2, 3\]"):
        lp.Encoding(g, query_slots=torch.ones(2, 2), key_slots=torch.ones(2, 2))


def test_growth_is_refused_unless_asked():
    X = [[0.5, 0.0], [0.0, -1.0]]
    with pytest.raises(ValueError, match="positive real part.*allow_growth=True"):
        lp.Generator.from_matrix(X)
    g = lp.Generator.from_matrix(X, allow_growth=True)
    assert g.allow_growth and max(r for r, _, _ in g.blocks) == pytest.approx(0.5)
    lp.Encoding(g)  # asked for: accepted
    g.allow_growth = False  # a generator whose flag no longer matches its rates
    with pytest.raises(ValueError, match="growth"):
        lp.Encoding(g)
    with pytest.raises(ValueError, match="growth"):
        lp.Generator.from_matrices([X])


@pytest.mark.parametrize("slopes, exc", [
    ([float("nan"), 0.5], ValueError), ([float("inf"), 0.5], ValueError), ([-0.5, 0.5], ValueError),
    ([0.5 + 1j, 0.5], TypeError), ([0.5], ValueError),
])
def test_alibi_slopes_are_checked(slopes, exc):
    with pytest.raises(exc, match="`slopes`"):
        lp.alibi(4, num_heads=2, slopes=slopes)


def test_slots_are_checked():
    g = lp.alibi(4, num_heads=2).generator
    with pytest.raises(ValueError, match="`query_slots` must be finite"):
        lp.Encoding(g, query_slots=[float("nan"), 0.0], key_slots=[0.0, 1.0])
    with pytest.raises(TypeError, match="`key_slots` must be real"):
        lp.Encoding(g, query_slots=[1.0, 0.0], key_slots=[0.0, 1j])


def test_a_complex_rate_keeps_its_imaginary_part_by_being_refused():
    with pytest.raises(TypeError, match="`rates` must be real"):
        lp.Generator([-0.1 + 1j], [0.0], [1])
    with pytest.raises(TypeError, match="`rates` must be real"):
        lp.decay(torch.tensor([0.1 + 0.2j]))


def test_sizes_are_never_rounded_and_blocks_never_empty():
    with pytest.raises(TypeError, match=r"`sizes\[0\]` must be an integer, got 1.7"):
        lp.Generator([-0.1], [0.0], [1.7])
    with pytest.raises(ValueError, match="`sizes` must name at least one block"):
        lp.Generator([], [], [])
    with pytest.raises(ValueError, match="`size` must be >= 1, got 0"):
        lp.build("jordan", 8, size=0)
    with pytest.raises(ValueError, match="`size` must be <= 8, got 9"):
        lp.build("jordan", 8, size=9)


def test_learnable_options_are_checked():
    with pytest.raises(ValueError, match="`num_heads` must be >= 1, got 0"):
        LearnableEncoding(8, num_heads=0)
    with pytest.raises(TypeError, match="`num_heads` must be an integer, got 2.5"):
        LearnableEncoding(8, num_heads=2.5)
    with pytest.raises(ValueError, match="`init`.*needs `axes`"):
        LearnableEncoding(8, init="mixed")
    with pytest.raises(ValueError, match="`layout`"):
        LearnableEncoding(8, layout="diagonal")


@pytest.mark.parametrize("positions", [[10**400], [float("inf")], [float("nan")], [-float("inf")]])
def test_positions_beyond_float64_or_not_finite_are_refused(positions):
    q = torch.randn(1, 1, 1, 8, dtype=F64)
    with pytest.raises(ValueError, match="positions must be finite"):
        lp.rope(8).query(q, positions)


@pytest.mark.parametrize("make", [lambda: lp.xpos(8), lambda: lp.retnet(8, num_heads=1), lambda: lp.decay([0.1] * 8)])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_far_positions_raise_the_same_named_error_on_both_sides(make, dtype):
    enc = make()
    x = torch.randn(1, 1, 1, 8, dtype=dtype)
    for side in (enc.query, enc.key):
        with pytest.raises(OverflowError, match=r"at positions up to 1e\+15: re-centre with origin=.*liepos.attention"):
            side(x, [1e15])
    # re-centred, the same times are fine and the score is the relative one
    s = (enc.query(x, [1e15], origin=1e15) * enc.key(x, [1e15 - 3], origin=1e15)).sum()
    ref = (enc.query(x, [3.0]) * enc.key(x, [0.0])).sum()
    assert torch.allclose(s, ref, rtol=1e-5 if dtype == torch.float32 else 1e-12)


def test_a_query_scale_that_would_underflow_to_zero_is_refused():
    # e^{-0.5·2000} underflows float32 and float64: the query would silently score 0 against every key
    enc = lp.decay([0.5] * 4)
    with pytest.raises(OverflowError, match="underflows"):
        enc.query(torch.ones(1, 1, 1, 4), [2000.0])
    # a key that fades to 0 is a key that faded: kept
    assert float(enc.key(torch.ones(1, 1, 1, 4), [-2000.0]).abs().max()) == 0.0


# ---------------------------------------------------------------------- length-dependent encodings
def _dynamic():
    return scaling.dynamic(lp.rope(8), factor=2.0, original_max_position_embeddings=16)


def test_a_length_dependent_encoding_needs_its_length():
    enc = _dynamic()
    q = torch.randn(1, 1, 3, 8, dtype=F64)
    with pytest.raises(ValueError, match=r"length-dependent.*call enc.at_length\(41\)"):
        enc.query(q, [0, 1, 40])
    with pytest.raises(TypeError, match="`length` must be an integer, got 40.5"):
        enc.at_length(40.5)
    at = enc.at_length(41)
    assert at.length == 41 and not torch.equal(at.generator.freqs, lp.rope(8).generator.freqs)
    at.query(q, [0, 1, 40])
    with pytest.raises(ValueError, match=r"has length 41.*at_length\(42\)"):
        at.key(q, [0, 1, 41])
    # lp.attention resolves the length itself
    out = lp.attention(q, q, q, enc, positions=torch.tensor([0.0, 1, 40]), key_positions=torch.tensor([0.0, 1, 40]))
    ref = lp.attention(q, q, q, enc.at_length(41).replace(length_rule=None), positions=torch.tensor([0.0, 1, 40]),
                       key_positions=torch.tensor([0.0, 1, 40]))
    assert torch.equal(out, ref)


def test_a_scaled_encoding_pickles_and_saves():
    enc = scaling.linear(_dynamic(), factor=3.0)
    back = pickle.loads(pickle.dumps(enc))
    buf = io.BytesIO()
    torch.save(enc, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    q = torch.randn(1, 1, 4, 8, dtype=F64)
    want = enc.at_length(100).query(q, [96, 97, 98, 99])
    for other in (back, saved):
        assert torch.equal(other.at_length(100).query(q, [96, 97, 98, 99]), want)
        assert other.at_length(100).version == enc.at_length(100).version


# ---------------------------------------------------------------------- several axes are first-class
def test_linear_scaling_of_axial_rope_divides_every_position():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 5, 16, generator=g, dtype=F64)
    p = torch.randn(5, 2, generator=g, dtype=F64) * 50
    enc = lp.axial_rope(16)
    assert torch.allclose(scaling.linear(enc, factor=2.0).query(q, p), enc.query(q, p / 2), atol=1e-12)


SCALED = {
    "linear": dict(factor=4.0),
    "ntk": dict(factor=4.0),
    "dynamic": dict(factor=4.0, original_max_position_embeddings=32),
    "yarn": dict(factor=4.0, original_max_position_embeddings=32),
    "longrope": dict(short_factor=[1.0] * 8, long_factor=[1.0 + i for i in range(8)],
                     original_max_position_embeddings=32, factor=4.0),
    "llama3": dict(factor=4.0, original_max_position_embeddings=32),
    "proportional": dict(partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("kind", sorted(SCALED))
def test_every_scaling_map_on_mrope_text_is_the_map_on_rope(kind):
    """On text tokens (equal axes) M-RoPE is RoPE; a map rescales each plane's frequency vector, so the
    scaled M-RoPE on text is the scaled RoPE — what Hugging Face computes for Qwen2-VL's inv_freq."""
    m = scaling.scale(lp.mrope(16, (2, 3, 3)), kind, **SCALED[kind]).at_length(64)
    r = scaling.scale(lp.rope(16, layout="half"), kind, **SCALED[kind]).at_length(64)
    t = torch.arange(60.0, 64.0, dtype=F64)
    q = torch.randn(1, 1, 4, 16, dtype=F64)
    assert torch.allclose(m.query(q, t[:, None].expand(4, 3)), r.query(q, t), atol=1e-12)
    assert m.logit_scale == r.logit_scale


@pytest.mark.parametrize("kind", sorted(SCALED))
def test_every_scaling_map_on_axial_rope_stays_relative_in_both_axes(kind):
    params = dict(SCALED[kind], **({"base": 10000.0} if kind == "yarn" else {}))
    enc = scaling.scale(lp.axial_rope(16), kind, **params).at_length(64)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 3, 16, generator=g, dtype=F64), torch.randn(1, 1, 3, 16, generator=g, dtype=F64)
    t, s = torch.rand(3, 2, generator=g, dtype=F64) * 30, torch.rand(3, 2, generator=g, dtype=F64) * 30
    c = torch.tensor([7.0, -3.0], dtype=F64)
    a = enc.query(q, t) @ enc.key(k, s).transpose(-1, -2)
    b = enc.query(q, t + c) @ enc.key(k, s + c).transpose(-1, -2)
    assert torch.allclose(a, b, atol=1e-10)
    # the direction of every plane is kept: axial planes still follow one axis each
    assert torch.equal(enc.generator.freqs != 0, lp.axial_rope(16).generator.freqs != 0) or kind == "proportional"


def test_repr_of_an_axes_encoding_keeps_the_logit_scale():
    enc = scaling.yarn(lp.mrope(16, (2, 3, 3)), factor=4.0, original_max_position_embeddings=64)
    assert f"logit_scale={enc.logit_scale:g}" in repr(enc) and "axes=3" in repr(enc)


# ---------------------------------------------------------------------- the table cache's bound
def _held(cache: _fast.TableCache) -> int:
    """Bytes of every distinct storage the cache keeps alive (views of one window counted once)."""
    seen: dict[int, int] = {}
    for ft in list(cache._d.values()):
        tabs = [t for r in ft.runs for t in (r.tab if isinstance(r.tab, tuple) else (r.tab,))]
        tabs += [ft.slot_vals, ft.rowmax, None if ft.coupling is None else ft.coupling[2]]
        for t in tabs:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def test_the_table_cache_holds_no_more_than_its_bound(monkeypatch):
    bound = 1 << 20  # 1 MiB, so that a few thousand tokens of a 64-dim head pass it
    monkeypatch.setattr(_fast.CACHE, "max_bytes", bound)
    _fast.CACHE.clear()
    enc = lp.rope(64)
    for S, p0 in ((4096, 0), (3000, 5000), (64, 0), (1, 70000), (2048, 9000)):
        x = torch.randn(1, 2, S, 64)
        enc.key(x, torch.arange(p0, p0 + S))
        assert _held(_fast.CACHE) <= bound, (S, p0, _held(_fast.CACHE))
    # and decode still hits the cache
    misses = _fast.CACHE.misses
    for p in range(100, 110):
        enc.key(torch.randn(1, 2, 1, 64), torch.tensor([p]))
    assert _fast.CACHE.misses - misses <= 1
    _fast.CACHE.clear()


@pytest.mark.parametrize("origin", [torch.zeros(3), torch.zeros(2, 5), torch.zeros(1, 1, 1, 1)])
def test_an_origin_of_the_wrong_shape_is_a_named_error(origin):
    """An `origin` that fits neither a scalar, the batch, nor the positions is refused by name."""
    enc = lp.xpos(8)
    q = torch.randn(2, 1, 4, 8)
    with pytest.raises(ValueError, match="`origin` of shape"):
        enc.query(q, torch.arange(4.0), origin=origin)


def test_query_scale_is_checked_and_kept_through_replace_and_scaling():
    """A per-dim temperature on the query (``query_scale``): positive, one per content dim, carried by
    ``replace`` and the scaling maps, and part of the encoding's identity (``version``)."""
    enc = lp.rope(8)
    with pytest.raises(ValueError, match="`query_scale` must have 8 entries"):
        enc.replace(query_scale=torch.ones(6))
    with pytest.raises(ValueError, match="`query_scale` must be > 0"):
        enc.replace(query_scale=torch.tensor([1.0] * 7 + [0.0]))
    with pytest.raises(TypeError, match="`query_scale`"):
        enc.replace(query_scale="2")
    D = torch.tensor([2.0] * 4 + [1.0] * 4, dtype=torch.float64)
    scaled = enc.replace(query_scale=D)
    assert enc.replace(query_scale=torch.ones(8)).query_scale is None  # all ones is no temperature
    assert scaled.version != enc.version and "query_scale" in repr(scaled)
    assert torch.equal(lp.scaling.linear(scaled, factor=2.0).query_scale, D)
    q, k = torch.randn(2, 1, 1, 3, 8, dtype=torch.float64)
    p = torch.tensor([0.0, 5.0, 9.0])
    got = scaled.query(q, p) @ scaled.key(k, p).transpose(-1, -2)
    want = enc.query(q * D, p) @ enc.key(k, p).transpose(-1, -2)
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)
    assert torch.allclose(scaled.query_reference(q, p), scaled.query(q, p), rtol=1e-12, atol=1e-12)


def test_generator_memos_follow_a_new_storage():
    """``p.data = …`` keeps torch's version counter; the memos (orthogonality, bounds, the cache key) still follow it."""
    from liepos.tables import check_range

    g = lp.rope(8).generator
    far = torch.tensor([1e6], dtype=torch.float64)
    check_range(g, far, "query", torch.float32)  # a rotation: nothing to overflow
    key = g.key()
    g.rates.data = torch.full_like(g.rates, 1.0)  # a new storage, version counter unchanged
    assert not g.is_orthogonal and g.bounds()[0] == 1.0 and g.key() != key
    with pytest.raises(OverflowError, match="query scale"):
        check_range(g, far, "query", torch.float32)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 300), st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
       st.sampled_from([None, "nan", "inf", "-inf", "huge"]), st.integers(0, 10**6))
def test_all_finite_is_the_elementwise_check(n, dtype, bad, seed):
    """The one-sum check decides like ``isfinite(x).all()``: a NaN or ±inf anywhere, or finite values whose
    sum overflows (which must still count as finite)."""
    from liepos._checks import all_finite

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(dtype)
    if n and bad is not None:
        i = int(torch.randint(n, (1,), generator=g))
        big = torch.finfo(dtype).max
        x[i] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": big}[bad]
        if bad == "huge":
            x[:] = big  # every value finite, their sum overflows
    assert all_finite(x, torch.zeros(2)) == bool(torch.isfinite(x).all())


def test_all_finite_decides_after_a_libm_call_left_errno_set():
    """A NaN's sum read after a C library call that set ``errno`` to ERANGE (an exp that overflows, as a native
    kernel's may): Python's ``abs(complex(nan))`` then raises OverflowError; the check answers False."""
    import ctypes
    import ctypes.util

    from liepos._checks import all_finite

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.exp.restype, libm.exp.argtypes = ctypes.c_double, [ctypes.c_double]
    x = torch.tensor([1.0, math.nan, 2.0])
    libm.exp(1000.0)  # errno = ERANGE
    with pytest.raises(OverflowError):
        abs(complex(math.nan))  # the state is real: the old reading of the sum fails here
    libm.exp(1000.0)
    assert all_finite(torch.ones(3), x) is False and all_finite(torch.ones(3)) is True
    assert all_finite(torch.tensor([1 + 2j, complex(math.nan, 0)])) is False and all_finite(torch.tensor([1 + 2j]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.floats(-300.0, 300.0), min_size=1, max_size=12), st.sampled_from(["query", "key"]),
       st.booleans(), st.floats(0.05, 3.0), st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_check_range_refuses_exactly_the_tables_that_leave_the_dtype(times, side, fade, rate, dtype):
    """The range check (which reads the least and the greatest time only) against every position and
    block computed directly: the scale e^{±λt} overflows, the query scale underflows (unless
    ``fade``), or a coupling t^k/k! overflows."""
    from liepos.tables import check_range

    rates = [-rate, -rate / 7, 0.0, 20.0 * rate]
    g = lp.Generator(rates, [0.0, 0.3, 0.0, 0.0], [1, 3, 2, 1], complex=[False, True, False, False],
                     allow_growth=True)
    work = torch.float32 if dtype == torch.bfloat16 else dtype
    top, bottom = math.log(torch.finfo(work).max), math.log(torch.finfo(work).tiny)
    expected = False
    for t in times:
        for lam in rates:
            E = lam * t if side == "query" else -lam * t
            expected |= E >= top or (side == "query" and not fade and E <= bottom)
        expected |= abs(t) > 0 and 2 * math.log(abs(t)) - math.lgamma(3.0) >= top
    try:
        check_range(g, torch.tensor(times, dtype=F64), side, dtype, fade=fade)
        refused = False
    except OverflowError:
        refused = True
    assert refused == expected
