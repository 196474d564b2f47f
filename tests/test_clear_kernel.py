"""The native clear and absmax ops, which keep subnormal numbers out of the flash kernel's inputs in one
pass each: equal to the torch ops they replace (``x.masked_fill(x.abs() < tau, 0)`` compared in float32
for half precision, ``x.abs().amax()``) on any strides, dtypes and values, NaN, inf, signed zeros and
subnormals included; the re-centred attention calls them."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _kernels
from liepos._fast import clear_small
from liepos.attention_pieces import _below

pytestmark = pytest.mark.skipif(_kernels._missing() is not None,
                                reason=f"the native kernels cannot be built here: {_kernels._missing()}")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(_kernels, "MIN_ELEMS", 0)
    monkeypatch.setattr(_kernels, "_ran", set())
    yield


def _view(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x (B, H, S, D) as a view the ops must read by its strides: unit-stride rows, any other strides."""
    if kind == "bshd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if kind == "stepped":
        return x[:, :, ::2]
    if kind == "expanded":
        return x[:, :1].expand(x.shape)
    if kind == "rows cut":  # rows adjacent within a head, heads apart (the ops walk runs of adjacent rows)
        return x[:, :, 1:]
    if kind == "heads cut":  # a head's rows adjacent to the next head's, batch rows apart
        return x[:, 1:]
    return x


def _values(draw_scale: float, specials: list[float], shape: tuple[int, ...], seed: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * draw_scale
    flat = x.view(-1)
    for i, v in enumerate(specials):
        flat[(i * 7919) % flat.numel()] = v
    return x.to(dtype)


VIEWS = ["contiguous", "bshd", "stepped", "expanded", "rows cut", "heads cut"]
SPECIALS = st.lists(st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-42, 2.0**-126, 3e-8]),
                    max_size=5)


@given(dtype=st.sampled_from(DTYPES), kind=st.sampled_from(VIEWS),
       scale=st.sampled_from([1e-6, 1e-3, 1.0, 1e3]), tau=st.sampled_from([0.0, 1e-7, 1e-4, 1e-3, 0.5]),
       specials=SPECIALS, seed=st.integers(0, 2**16), S=st.integers(1, 9), D=st.sampled_from([1, 3, 16, 64]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_clear_and_absmax_equal_the_torch_ops(dtype, kind, scale, tau, specials, seed, S, D, any_size):
    x = _view(_values(scale, specials, (2, 3, 2 * S, D), seed, dtype), kind)
    got = _kernels.clear_below(x, tau)
    a = x.abs()
    want = x.masked_fill((a if dtype in (torch.float32, torch.float64) else a.float()) < tau, 0)
    assert got is not None and got.is_contiguous() and got.dtype == dtype
    # the same bits: NaNs where x has them, +0 where cleared, every other entry as it was
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert torch.equal(got.view(bits), want.contiguous().view(bits))
    base = _values(scale, specials, (2, 3, 2 * S, D), seed, dtype)
    before, view = base.clone(), _view(base, kind)
    if kind in ("stepped", "rows cut", "heads cut", "expanded") and view.numel() > 1:  # gaps, or shared elements
        with pytest.raises(ValueError, match="in place needs x's elements to be distinct"):
            _kernels.clear_below(view, tau, into=view)
    else:  # in place through the view's strides, any order of its axes: the same bits, nothing else written
        assert _kernels.clear_below(view, tau, into=view) is view
        assert torch.equal(view.contiguous().view(bits), want.contiguous().view(bits))
        outside = torch.ones(base.shape, dtype=torch.bool)
        _view(outside, kind).fill_(False)
        assert torch.equal(base[outside].view(bits), before[outside].view(bits))
    m, ref = _kernels.absmax(x), float(x.abs().amax())
    assert m == ref or (math.isnan(m) and math.isnan(ref))
    big, small = _kernels.absrange(x)
    nonzero = a[(a != 0) & ~a.isnan()]
    assert big == m or (math.isnan(big) and math.isnan(m))
    assert small == (float(nonzero.min()) if nonzero.numel() else math.inf)
    assert {f"clear {dtype}", f"absmax {dtype}", f"absrange {dtype}"} <= set(_kernels.status()["native"])


def test_the_torch_fallback_gives_the_same_values(any_size):
    x = _values(1e-3, [math.nan, -0.0, 1e-40], (1, 2, 8, 16), 3, torch.bfloat16)
    got = _kernels.clear_below(x, 1e-3)
    with _kernels.off():
        assert _kernels.clear_below(x, 1e-3) is None and _kernels.absmax(x) is None
        fallback = clear_small(x, 1e-3)
    assert torch.equal(got.isnan(), fallback.isnan()) and torch.equal(got.nan_to_num(), fallback.nan_to_num())


def test_a_bad_threshold_is_refused_by_name(any_size):
    with pytest.raises(ValueError, match="tau must be at least 0, got -1.0"):
        _kernels.clear_below(torch.ones(1, 1, 2, 2), -1.0)


def test_into_must_fit(any_size):
    x = torch.ones(1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"into must be a contiguous tensor of x's shape \(1, 1, 4, 4\)"):
        _kernels.clear_below(x, 0.5, into=torch.empty(1, 1, 4, 3))
    out = torch.full((1, 1, 4, 4), 7.0)
    assert _kernels.clear_below(x * 1e-3, 0.5, into=out) is out and not out.any()
    wide = torch.ones(1, 1, 4, 8)  # x: its first four columns; into: its first 16 elements, in x's rows
    with pytest.raises(ValueError, match="into overlaps x"):
        _kernels.clear_below(wide[..., :4], 0.5, into=wide.view(-1)[:16].view(1, 1, 4, 4))


def test_the_ops_pass_opcheck(any_size):
    _kernels._ops()
    x = torch.randn(1, 2, 5, 8)[:, :, ::2]
    torch.library.opcheck(torch.ops.liepos_native.clear.default, (x, 0.5, torch.empty(x.shape)))
    torch.library.opcheck(torch.ops.liepos_native.absmax.default, (x,))
    torch.library.opcheck(torch.ops.liepos_native.absrange.default, (x,))


def test_the_gradient_passes_through_the_clearing(any_size):
    x = torch.tensor([[[[1e-9, 1.0, -1e-9, 2.0]]]], requires_grad=True)
    y = _below(x, 1e-6)
    assert torch.equal(y.detach(), torch.tensor([[[[0.0, 1.0, 0.0, 2.0]]]]))
    (g,) = torch.autograd.grad((y * torch.arange(4.0)).sum(), x)
    assert torch.equal(g, torch.arange(4.0).view(1, 1, 1, 4))


@pytest.mark.parametrize("name", ["decay", "retnet", "jordan"])
def test_re_centred_attention_clears_through_the_native_ops(name, monkeypatch, tiling):
    """At the benchmark's shape the tiles take the native ops, clearing their encoded q and k in the pass that
    encodes them (decay's scale, RetNet's planes, Jordan's shifted terms), and give the bits of the torch ops'
    clearing. (RetNet at 1024 is one causal block, within the diagonal budget: nothing to clear; at 2048 its fast
    head fades.)"""
    from liepos import causal_tiling

    monkeypatch.setattr(_kernels, "_ran", set())
    enc = lp.build(name, 64, 8) if name != "jordan" else lp.build(name, 64)
    T = 2048 if name == "retnet" else 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, T, 64, generator=g) for _ in range(3))
    pos = torch.arange(T)
    with torch.no_grad():
        got = lp.attention(q, k, v, enc, positions=pos)
        ran = set(_kernels.status()["native"])
        assert "absmax torch.float32" in ran
        fused = {"decay": "scale torch.float32", "retnet": "planes torch.float32",
                 "jordan": "terms torch.float32 cleared"}[name]  # cleared as encoded
        assert fused in ran and "clear_ torch.float32" not in ran, ran
        monkeypatch.setattr(_kernels, "clear_below", lambda x, tau, into=None: None)
        monkeypatch.setattr(_kernels, "absmax", lambda x: None)
        monkeypatch.setattr(causal_tiling, "clear_thresholds", lambda *a: None)  # the tiles cleared after encoding
        want = lp.attention(q, k, v, enc, positions=pos)
    if name == "retnet":  # its planes there by the native op (fused multiply-adds), here by torch's complex product
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * float(want.abs().max()))
    else:
        assert torch.equal(got, want)


@given(dtype=st.sampled_from(DTYPES), pairs=st.booleans(), conj=st.booleans(), kind=st.sampled_from(["contiguous", "bshd"]),
       tau=st.sampled_from([0.0, 1e-7, 1e-3, 0.5, "an output's own magnitude"]), specials=SPECIALS,
       seed=st.integers(0, 2**16), S=st.integers(1, 9), D=st.sampled_from([2, 16, 64]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_scale_and_planes_clear_in_their_own_pass_as_clear_does(dtype, pairs, conj, kind, tau, specials, seed, S, D,
                                                                   any_size):
    """``multiply(..., clear=τ)`` (the encodings of a tile between its keys and its queries) writes the bits of
    ``multiply`` followed by ``clear_below``: the product rounded to x's dtype, +0 where that is below τ
    (an output exactly at τ kept), NaN kept (as NaN: the two loops may give it either sign, as IEEE 754 leaves
    a NaN's sign to the operation); τ = 0 clears nothing, -0 included."""
    x = _view(_values(1e-2, specials, (2, 3, 2 * S, D), seed, dtype), kind)
    g = torch.Generator().manual_seed(seed + 1)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if pairs:
        t = torch.polar(torch.rand(2 * S, D // 2, generator=g, dtype=work), torch.rand(2 * S, D // 2, generator=g,
                                                                                         dtype=work) * 6)
    else:
        t = torch.rand(2 * S, D, generator=g, dtype=work) * 10.0 ** torch.randint(-12, 1, (2 * S, D), generator=g)
    plain = _kernels.multiply(x, t, torch.empty(x.shape, dtype=dtype), conj=conj and pairs)
    assert plain is not None
    if tau == "an output's own magnitude":
        finite = plain[plain.isfinite() & (plain != 0)]
        tau = float(finite.abs().flatten()[seed % finite.numel()]) if finite.numel() else 1e-3
    got = _kernels.multiply(x, t, torch.empty(x.shape, dtype=dtype), conj=conj and pairs, clear=tau)
    want = _kernels.clear_below(plain, tau)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert got is not None and torch.equal(got.isnan(), want.isnan())  # NaN kept (its sign bit is IEEE's to choose)
    got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
    assert torch.equal(got.contiguous().view(bits), want.view(bits))


@given(dtype=st.sampled_from(DTYPES), side=st.sampled_from(["query", "key"]), kind=st.sampled_from(["contiguous", "bshd"]),
       tau=st.sampled_from([0.0, 1e-7, 1e-3, 0.5, "an output's own magnitude"]), specials=SPECIALS,
       seed=st.integers(0, 2**16), S=st.integers(1, 9), D=st.sampled_from([4, 64]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_terms_clear_in_their_own_pass_as_clear_does(dtype, side, kind, tau, specials, seed, S, D, any_size,
                                                      monkeypatch):
    """``apply_terms(..., clear=τ)`` (a Jordan encoding of a tile between its keys and its queries) writes the bits
    of ``apply_terms`` followed by ``clear_below``, with the Jordan tables of either side: the sum rounded to x's
    dtype, +0 where that is below τ (an output exactly at τ kept), NaN kept; τ = 0 clears nothing."""
    monkeypatch.setattr(_kernels, "MIN_ELEMS_TERMS", 0)
    enc = lp.build("jordan", D)
    ft = enc._span_tables(0 if side == "query" else -2 * S, 2 * S, side, dtype, side == "query", torch.device("cpu"))
    offsets, masks, T = ft.terms
    T = T.view(1, 1, *T.shape[-3:])  # (S, J, D) -> (1, 1, S, J, D)
    x = _view(_values(1e-2, specials, (2, 3, 2 * S, D), seed, dtype), kind)
    plain = _kernels.apply_terms(x, T, offsets, masks, into=torch.empty(x.shape, dtype=dtype))
    assert plain is not None
    if tau == "an output's own magnitude":
        finite = plain[plain.isfinite() & (plain != 0)]
        tau = float(finite.abs().flatten()[seed % finite.numel()]) if finite.numel() else 1e-3
    got = _kernels.apply_terms(x, T, offsets, masks, into=torch.empty(x.shape, dtype=dtype), clear=tau)
    want = _kernels.clear_below(plain, tau)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert got is not None and torch.equal(got.isnan(), want.isnan())
    got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
    assert torch.equal(got.contiguous().view(bits), want.view(bits))
    if tau:
        with pytest.raises(ValueError, match="terms: clear=.* needs an output of its own"):
            _kernels.apply_terms(x, T, offsets, masks, into=x, clear=tau)


def test_a_bad_clearing_threshold_is_refused_by_name(any_size):
    _kernels._ops()
    x = torch.ones(1, 1, 2, 2)
    with pytest.raises(RuntimeError, match="scale: tau must be at least 0, got -1"):
        torch.ops.liepos_native.scale(x, x, 2, torch.empty_like(x), -1.0)
    with pytest.raises(RuntimeError, match="terms: tau must be at least 0, got -1"):
        torch.ops.liepos_native.terms(x, torch.zeros(1, 1, 2, 1, 2), [0], torch.ones(1, 2, dtype=torch.uint8), 2,
                                      torch.empty_like(x), -1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_tiles_skip_a_clearing_that_would_change_nothing(dtype, monkeypatch):
    """ALiBi's tiles read rows of q and k as they are: one pass over each (absrange) bounds them all, and where no
    nonzero entry lies below its threshold no tile is cleared, with the bits of clearing every tile; a tiny entry
    (1e-30, far below q's threshold) makes the tiles clear again, and it is cleared: the output of the entry 0."""
    from liepos import attention_pieces, recentre

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g).to(dtype) for _ in range(3))
    enc = lp.alibi(64, num_heads=8)
    passes, real = [], _kernels.clear_below
    monkeypatch.setattr(_kernels, "clear_below", lambda x, tau, into=None: passes.append(1) or real(x, tau, into))
    fit, seen = attention_pieces._fit, []
    monkeypatch.setattr(attention_pieces, "_fit", lambda q_, k_, v_, *a: seen.append(a[-2:]) or fit(q_, k_, v_, *a))
    with torch.no_grad():
        got = lp.attention(q, k, v, enc)
        assert passes == [] and seen and all(clean and bound is not None for bound, clean in seen)
        tiny = q.clone()
        tiny[0, 3, 1500, 7] = 1e-30
        seen.clear()
        cleared = lp.attention(tiny, k, v, enc)
        assert passes and all(not clean and bound is not None for bound, clean in seen)
        monkeypatch.setattr(recentre, "raw_clearing", lambda *a: None)  # every tile finds its own bound, clears
        assert torch.equal(lp.attention(q, k, v, enc), got)
        tiny[0, 3, 1500, 7] = 0.0
        assert torch.equal(cleared, lp.attention(tiny, k, v, enc))


@given(dtype=st.sampled_from(DTYPES), kind=st.sampled_from(VIEWS),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 2**16), S=st.integers(1, 9),
       D=st.sampled_from([1, 3, 16, 64, 70]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_row_norms_in_one_pass_equal_the_float64_norms(dtype, kind, scale, seed, S, D, any_size):
    """The native norms op (the keys' norms of ALiBi's windows and of faded keys): every row's norm of x as stored,
    in the work dtype, within the work dtype's rounding of the float64 norm, on any view the kernels take."""
    from liepos.attention_call import row_norms

    x = _view(_values(scale, [], (2, 3, 2 * S, D), seed, dtype), kind)
    got = _kernels.norms(x)
    want = torch.linalg.vector_norm(x.double(), dim=-1)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    assert got is not None and got.dtype == work and got.shape == x.shape[:3]
    assert float(((got.double() - want).abs() / want.clamp_min(1e-300)).max()) <= 4 * D * torch.finfo(work).eps
    if dtype != torch.float64:  # what the attention's bounds read: the native pass (float64 keeps float32 norms)
        assert torch.equal(row_norms(x), got)
    assert f"norms {dtype}" in _kernels.status()["native"]
    torch.library.opcheck(torch.ops.liepos_native.norms.default, (x,))
