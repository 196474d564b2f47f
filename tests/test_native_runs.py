"""The native kernels of the re-centred attention's hot loop — a run of real factors or rotation planes in half
precision (``scale``, ``planes``), the clearing in place (``clear_``) and the merge of a tile into the running
output (``merge``) — against the torch ops they replace and the float64 reference: both layouts of the input
(BHSD, BSHD), per-head tables, conjugate planes, in place, non-finite values, random rows (hypothesis); and
the attention they serve equal with and without them."""

from __future__ import annotations

import math
import platform
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _fast, _kernels, causal_tiling
from liepos.attention_pieces import Rows
from liepos.generator import Generator, direct_sum

CAN_BUILD = _kernels._missing() is None
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason="no C++ compiler or ninja: the native ops are not built")


@pytest.fixture
def small(monkeypatch):
    """The native ops on the tests' small tensors (under MIN_ELEMS), recording which ran."""
    monkeypatch.setattr(_kernels, "MIN_ELEMS", 0)
    monkeypatch.setattr(_kernels, "_ran", set())
    yield


def _mixed() -> lp.Encoding:
    """Interleaved: rotation planes with decay, a real decay run, a NoPE (copy) run, per head."""
    g = direct_sum(lp.retnet(8, num_heads=3).generator, Generator([[-0.2, -0.1]] * 3, [[0.0, 0.0]] * 3, [1, 1]),
                   Generator([[0.0] * 6] * 3, [[0.0] * 6] * 3, [1] * 6))  # 8 + 2 + 6 = 16 dims
    return lp.Encoding(g, name="mixed")


ENCODINGS = {
    "decay": lambda: lp.build("decay", 16, 3),
    "xpos": lambda: lp.xpos(16),
    "retnet": lambda: lp.retnet(16, num_heads=3),
    "rope_half": lambda: lp.rope(16, layout="half"),
    "mixed": _mixed,
}


def _x(dtype: torch.dtype, bshd: bool, H: int = 3, S: int = 13, D: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, S, H, D, generator=g) if bshd else torch.randn(2, H, S, D, generator=g)
    return (x.transpose(1, 2) if bshd else x).to(dtype)


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("side", ["query", "key"])
def test_half_precision_runs_equal_the_float32_scratch_and_the_reference(name, dtype, bshd, side, small,
                                                                         monkeypatch):
    """Half precision read and written directly (float32 in registers) equals the float32 scratch it replaces
    to one rounding of the dtype, and the float64 dense reference to the dtype's precision."""
    enc = ENCODINGS[name]()
    x, pos = _x(dtype, bshd), torch.arange(13) - 6
    f = getattr(enc, side)
    got = f(x, pos)
    ran = set(_kernels.status()["native"])
    assert ran & {f"scale {dtype}", f"planes {dtype}", f"halves {dtype}"}, ran
    monkeypatch.setattr(_fast, "_native_runs", lambda *a: False)
    want = f(x, pos)
    ref = getattr(enc, f"{side}_reference")(x.double(), pos)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape and got.stride() == want.stride()
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-10
    scale = ref.abs().amax()
    assert ((got.double() - want.double()).abs() <= ulp * want.double().abs() + 2**-20 * scale).all()
    assert float((got.double() - ref).abs().max() / scale) <= 2 * ulp


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("conj", [False, True])
@pytest.mark.parametrize("bshd", [False, True])
def test_planes_are_the_complex_product(dtype, conj, bshd, small):
    """``planes``: each pair (x[2i], x[2i+1]) times t[i] (or its conjugate), as a complex product in the work
    dtype; a lazy conjugate view of t is its conjugate; in place gives the same values."""
    x = _x(dtype, bshd)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(2)
    t = torch.polar(torch.rand(3, 13, 8, generator=g, dtype=work) + 0.5, torch.randn(3, 13, 8, generator=g, dtype=work))
    cplx = torch.view_as_complex(x.to(work).unflatten(-1, (-1, 2)).contiguous())  # (B, H, S, 8)
    want = torch.view_as_real(cplx * (t.conj() if conj else t)).flatten(-2)  # (B, H, S, 16)
    out = torch.empty_like(x)
    assert _kernels.multiply(x, t, out, conj=conj) is out
    tol = 1e-14 if dtype == torch.float64 else 2e-6 if dtype == torch.float32 else 2**-7
    assert float(((out.double() - want.to(dtype).double()).abs() / want.double().abs().clamp_min(1)).max()) <= tol
    lazy = torch.empty_like(x)
    assert _kernels.multiply(x, t.conj(), lazy, conj=not conj) is lazy  # conj(conj(t)) = t
    assert torch.equal(lazy, out)
    y = x.clone()
    assert _kernels.multiply(y, t, y, conj=conj) is y
    assert torch.equal(y, out)
    assert f"planes {dtype}" in _kernels.status()["native"]


def _float_patterns() -> torch.Tensor:
    """Every float32 top half (sign, exponent, 7 mantissa bits) with low halves at and around bfloat16's rounding
    boundaries (0, the tie 0x8000 and its neighbours, the extremes) and a few others: every class of value — zeros,
    subnormals, normals, the largest finite, ±inf, NaNs of either sign and any payload — and every tie."""
    top = torch.arange(1 << 16, dtype=torch.int64) << 16  # (65536,)
    low = torch.tensor([0, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xFFFF, 0x1234, 0xC0DE], dtype=torch.int64)
    bits = (top[:, None] | low[None, :]).flatten()  # (65536 · 10,)
    return (bits - ((bits >= 1 << 31).long() << 32)).to(torch.int32).view(torch.float32)


def test_bfloat16_outputs_are_rounded_as_torch_rounds_every_class_of_float():
    """The scale op with x = 1 stores its float32 table rounded to bfloat16: the bits torch's own conversion gives
    for every float32 class — ties to even, subnormals (which the AVX512-BF16 conversion instruction would read as
    0), overflow to ±inf — and NaN for NaN (torch's own kernels differ in a NaN's sign and payload bits)."""
    t = _float_patterns().view(1, 1, -1, 64)  # (1, 1, 10240, 64)
    x = torch.ones(t.shape, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    assert _kernels.multiply(x, t, out) is out
    want = t.to(torch.bfloat16)
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.nan_to_num(0.0).view(torch.int16), want.nan_to_num(0.0).view(torch.int16))
    assert "scale torch.bfloat16" in _kernels.status()["native"]


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c) for float32 a, c and a bfloat16-exact b: a·b is exact in float64 (24 + 8 bits) and
    a·b + c rounds once to float64, then to float32 (a double rounding that moves a result only when the float64
    sum lands on a float32 tie it did not start on, which these random inputs do not produce)."""
    return (a.double() * b.double() + c.double()).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("conj", [False, True])
@pytest.mark.parametrize("D", [16, 40, 64])
def test_planes_and_halves_are_the_plain_loops_fused_multiply_adds_to_the_bit(dtype, conj, D, small):
    """planes: out[2i] = fma(re, x0, −(im·x1)), out[2i+1] = fma(im, x0, re·x1) (im negated under conj); halves:
    out[k] = fma(c, x0, −(s·x1)), out[k+P] = fma(s, x0, c·x1), with x1 the row's second half — the same bits from
    the sixteen-lane bfloat16 loop (where the CPU has one) as from the plain loop, widths of whole and partial
    vectors, in place too."""
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, 3, 37, D, generator=g).to(dtype)
    t = torch.polar(torch.rand(37, D // 2, generator=g) + 0.5, torch.randn(37, D // 2, generator=g) * 3)
    re, im = t.real, (-t.imag if conj else t.imag)
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    want = torch.stack((_fma32(re, x0, -(im * x1)), _fma32(im, x0, re * x1)), -1).flatten(-2).to(dtype)
    out = torch.empty_like(x)
    assert _kernels.multiply(x, t, out, conj=conj) is out
    assert torch.equal(out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    y = x.clone()
    assert _kernels.multiply(y, t, y, conj=conj) is y and torch.equal(y, out)
    c, s = t.real.contiguous(), (t.imag if not conj else -t.imag).contiguous()  # (37, D/2): the half-layout tables
    h0, h1 = xf[..., : D // 2], xf[..., D // 2 :]
    want = torch.cat((_fma32(c, h0, -(s * h1)), _fma32(s, h0, c * h1)), -1).to(dtype)
    got = _kernels.rotate_halves(x, c[None, None], s[None, None], into=torch.empty_like(x))
    assert got is not None and torch.equal(got, want)


def test_scale_broadcasts_tables_and_refuses_what_it_cannot_take(small):
    """``scale`` broadcasts a (S, W) table over batch and heads; a table of another dtype, an odd width for
    planes or an output overlapping x part-way are not taken (None: the caller's torch ops run)."""
    x = _x(torch.bfloat16, True)
    t = torch.rand(13, 16) + 0.5
    out = torch.empty_like(x)
    assert _kernels.multiply(x, t, out) is out
    assert torch.equal(out, (x.float() * t).to(torch.bfloat16))
    assert _kernels.multiply(x, t.double(), out) is None
    assert _kernels.multiply(x[..., :15], torch.ones(13, 7, dtype=torch.complex64), out[..., :15]) is None
    y = torch.randn(2, 3, 14, 16)
    assert _kernels.multiply(y[:, :, :13], torch.ones(13, 16), y[:, :, 1:]) is None
    z = torch.randn(2, 3, 3, 16)  # z and a view of z in another order share their first element
    assert _kernels.multiply(z, torch.ones(3, 16), z.transpose(1, 2)) is None


def _merge_ref(O, L, o, Li, first):
    if first:
        return o.to(O.dtype), Li.clone()
    Ln = torch.logaddexp(L, Li)
    w = torch.where(Li == -math.inf, torch.zeros_like(Li), torch.exp(Li - Ln))
    Ln = torch.where(Li == -math.inf, L, Ln)
    return O + w.unsqueeze(-1) * (o.to(O.dtype) - O), Ln


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lo=st.floats(-60, 60), spread=st.floats(0, 80),
       half=st.booleans(), first=st.booleans())
def test_merge_is_the_log_sum_exp_merge(seed, lo, spread, half, first):
    """``merge`` over a tile's rows of a strided (B, H, T, D) state: ``L' = log(e^L + e^Li)``, ``O' = O +
    e^{Li − L'} (o − O)``; rows the tile gives no weight (``Li = −inf``) unchanged; the rows outside the tile
    untouched; half-precision o read as it is stored."""
    g = torch.Generator().manual_seed(seed)
    O = torch.randn(1, 3, 28, 8, generator=g)
    L = lo + spread * torch.rand(1, 3, 28, generator=g)
    L[0, 0, 0] = -math.inf  # a row no earlier tile gave weight
    r = Rows(2, 3, 8, 4, 8)  # rows 2 + 8j + [4, 8)
    o = torch.randn(3, 3, 4, 8, generator=g).to(torch.bfloat16 if half else torch.float32)
    Li = lo + spread * torch.rand(3, 3, 4, generator=g)
    Li[1, 2, 3] = -math.inf
    before_O, before_L = O.clone(), L.clone()
    with mock.patch.object(_kernels, "MIN_ELEMS", 0):  # hypothesis runs the body many times under one test
        assert _kernels.merge(r.view(O), r.view(L), r.scatter(o), r.scatter(Li), first)
    # the reference in float64 from the same inputs; the kernel's float32 rounds L' (and so each weight e^{Li − L'})
    # to a relative 2^-24 of |L'|: the weights' error is that times |L'|, the output's that times |o − O|
    wO, wL = _merge_ref(r.view(before_O).double(), r.view(before_L).double(), r.scatter(o).double(),
                        r.scatter(Li).double(), first)
    eps, big = torch.finfo(torch.float32).eps, float(torch.cat([L.flatten(), Li.flatten()]).abs().nan_to_num(0, 0, 0).max()) + 1
    tol_O = 4 * eps * (big * float((r.scatter(o).float() - r.view(before_O)).abs().max()) + float(wO.abs().max()))
    assert float((r.view(O).double() - wO).abs().max()) <= tol_O
    assert torch.equal(r.view(L).isinf(), wL.isinf())
    assert float((r.view(L).double() - wL).nan_to_num(0, 0, 0).abs().max()) <= 4 * eps * big
    inside = torch.zeros(1, 3, 28, dtype=torch.bool)
    r.view(inside).fill_(True)
    assert torch.equal(O[~inside], before_O[~inside]) and torch.equal(L[~inside], before_L[~inside])


@pytest.mark.parametrize("first", [False, True])
def test_merge_splits_runs_of_rows_between_threads(first):
    """Two threads over 3 · 9000 rows of 8 take chunks of the rows that start and end inside a run of the
    last row axis (each run's offsets computed once, then stepped): every row merged as the reference merges it."""
    g = torch.Generator().manual_seed(5)
    O, L = torch.randn(1, 3, 1, 9000, 8, generator=g), 4 * torch.rand(1, 3, 1, 9000, generator=g)
    o, Li = torch.randn(1, 3, 1, 9000, 8, generator=g), 4 * torch.rand(1, 3, 1, 9000, generator=g)
    o, Li = o.transpose(1, 2).contiguous().transpose(1, 2), Li.transpose(1, 2).contiguous().transpose(1, 2)  # strided
    wO, wL = _merge_ref(O, L, o, Li, first)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _kernels.merge(O, L, o, Li, first)
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(O, wO, rtol=1e-5, atol=1e-5) and torch.allclose(L, wL, rtol=1e-6, atol=1e-5)


def test_merge_propagates_nan_and_refuses_what_it_cannot_take(small):
    """A NaN in a tile's output reaches its row's output (never hidden); a float64 state with float32 o, a
    state overlapping the tile's output, or strided rows are not taken (False: the torch ops run)."""
    O, L = torch.zeros(1, 1, 1, 4, 4), torch.zeros(1, 1, 1, 4)
    o, Li = torch.ones(1, 1, 1, 4, 4), torch.zeros(1, 1, 1, 4)
    o[0, 0, 0, 2, 1] = math.nan
    assert _kernels.merge(O, L, o, Li, False)
    assert O[0, 0, 0, 2].isnan().any() and not O[0, 0, 0, [0, 1, 3]].isnan().any()
    assert torch.allclose(O[0, 0, 0, 0], torch.full((4,), 0.5)) and torch.allclose(L, torch.full_like(L, math.log(2)))
    assert not _kernels.merge(O.double(), L.double(), o, Li.double(), False)
    assert not _kernels.merge(O, L, O, Li, False)
    assert not _kernels.merge(O.transpose(-1, -2), L, o, Li, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_clear_in_place_on_any_order_of_axes(dtype, small):
    """``clear_below(x, τ, into=x)`` on a BSHD-strided x equals ``masked_fill(|x| < τ, 0)`` and writes x itself;
    an x whose elements repeat (an expanded view) is refused by name."""
    x = _x(dtype, True) * torch.logspace(-8, 0, 16).to(dtype)
    want = x.masked_fill(x.abs().float() < 1e-3, 0)
    ptr = x.data_ptr()
    assert _kernels.clear_below(x, 1e-3, into=x) is x and x.data_ptr() == ptr
    assert torch.equal(x, want)
    e = torch.randn(1, 1, 5, 16).expand(2, 3, 5, 16)
    with pytest.raises(ValueError, match="in place needs x's elements to be distinct"):
        _kernels.clear_below(e, 1e-3, into=e)


@pytest.mark.parametrize("op", ["scale", "planes", "clear_", "merge"])
def test_the_new_native_ops_pass_opcheck(op):
    """Schema (the written tensors annotated), fake implementation and dispatch of each op, BSHD strides and
    broadcast tables."""
    ops = _kernels._ops()
    x = torch.randn(2, 5, 3, 8).transpose(1, 2)  # (B, H, S, D), BSHD strides
    t = torch.randn(1, 1, 5, 8).expand(2, 3, 5, 8)
    if op == "scale":
        args = (x, t, 2, torch.empty(2, 3, 5, 8))
    elif op == "planes":
        args = (x, t, True, 2, torch.empty(2, 3, 5, 8))
    elif op == "clear_":
        args = (x.clone(), 0.5)
    else:
        args = (torch.randn(1, 3, 2, 4, 8), torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4, 8).bfloat16(),
                torch.randn(1, 3, 2, 4), False)
    torch.library.opcheck(getattr(ops, op).default, args)


@pytest.mark.parametrize("name", ["decay", "retnet", "xpos", "jordan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_equals_itself_without_the_new_kernels(name, dtype, monkeypatch):
    """The re-centred attention at a size where the native ops run (scale / planes / terms clearing as they encode,
    merge) equals the same call through the torch ops they replace, to the dtype's rounding."""
    enc = lp.build(name, 64, 4) if name in ("decay", "retnet") else lp.build(name, 64)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 1024, 64, generator=g).to(dtype) for _ in range(3))
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiling's native ops (not the one kernel)
    monkeypatch.setattr(_kernels, "_ran", set())
    with torch.no_grad():
        got = lp.attention(q, k, v, enc)
        ran = set(_kernels.status()["native"])
        # the off-diagonal tiles' q and k cleared in the pass that encodes them (decay's scale, Jordan's shifted
        # terms), and the tiles merged (xpos and RetNet at this length: one causal block, within the diagonal
        # budget, nothing to clear, and its output, in either dtype, the call's: nothing merged); Jordan's half
        # precision attends in float32
        work = torch.float32 if name == "jordan" else dtype
        one_block = name in ("xpos", "retnet")
        assert f"clear_ {work}" not in ran, ran
        assert (f"terms {work} cleared" in ran) == (name == "jordan"), ran
        assert (f"scale {work}" in ran) == (name == "decay"), ran
        assert (f"merge {work}" in ran) != one_block, ran
        monkeypatch.setattr(causal_tiling, "term_bounds", lambda *a: None)  # each tile finds and clears its own
        monkeypatch.setattr(_kernels, "merge", lambda *a: False)
        monkeypatch.setattr(_kernels, "multiply", lambda *a, **kw: None)
        real = _kernels.clear_below
        monkeypatch.setattr(_kernels, "clear_below", lambda x, tau, into=None: real(x, tau, None if into is x else into))
        want = lp.attention(q, k, v, enc)
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    assert float((got.float() - want.float()).abs().max()) <= tol * float(want.float().abs().max())


def _subnormal_survives() -> bool:
    """Whether a product landing in the subnormal range stays there on every thread of a parallel op."""
    x = torch.full((1 << 20,), 2.0**-120)
    return bool(((x * 2.0**-10) > 0).all())


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the x86 control register")
@pytest.mark.parametrize("callers", [False, True])
def test_flushed_sets_the_pool_and_gives_every_thread_its_own_setting_back(callers):
    """Inside :func:`flushed` subnormal results are flushed on every intra-op thread; after it (forward and
    backward of a re-centred attention that runs it around its flash calls, an exception inside included) each
    thread has the setting it had: the caller's flush-to-zero, on or off, is never changed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.set_flush_denormal(callers)
        before = _subnormal_survives()
        with _kernels.flushed(torch.device("cpu")):
            assert not _subnormal_survives()
        assert _subnormal_survives() == before
        with pytest.raises(RuntimeError, match="inside"), _kernels.flushed(torch.device("cpu")):
            raise RuntimeError("inside")
        assert _subnormal_survives() == before
        q, k, v = (torch.randn(1, 4, 512, 64, requires_grad=True) for _ in range(3))
        lp.attention(q, k, v, lp.alibi(64, num_heads=4)).sum().backward()
        assert _subnormal_survives() == before
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def test_no_python_runs_flushed():
    """Only the flash kernel runs flushed: with denormals-are-zero ``hash()`` of a subnormal float is 0, so a
    table-cache key holding one (an encoding with a rate of 1e-309) would be lost to a lookup made flushed, and
    the next miss (which sums the cache's entries) would raise KeyError. A tiled call after such an encoding's
    tables entered the cache makes its own tables unflushed and finds the cache whole."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and _kernels._ops() is not None:
        with _kernels.flushed(torch.device("cpu")):
            inside = hash(float(torch.tensor(1e-309, dtype=torch.float64)))
        assert inside != hash(1e-309)  # the hazard this guards against, on the machines that have it
    rates = torch.full((32,), -0.01, dtype=torch.float64)
    rates[0] = -1e-309
    tiny = lp.Encoding(Generator(rates, lp.rope_freqs(64), [1] * 32))
    q, k, v = (torch.randn(1, 2, 512, 64) for _ in range(3))
    with torch.no_grad():
        tiny.query(q)  # its tables enter the cache (unflushed), keyed by its parameters
        out = lp.attention(q, k, v, lp.build("decay", 64, 2))  # a new encoding: every tile's tables a miss
    assert bool(torch.isfinite(out).all())
