"""The one-pass kernels of liepos._kernels — Inductor's half-layout rotation, the native in-place rotation
and the native terms kernel of Jordan-coupled encodings — against the torch-op fallback and the float64
dense reference: both layouts' encodings, slots, coupling/Jordan columns (real and rotating blocks, per
head), BSHD strides, grouped-query broadcast tables, in place, bfloat16/float16, backward (gradcheck);
compiled once per variant; the fallback is announced, never silent; without a C compiler the values are
checked all the same."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _fast, _kernels, _pages
from liepos.generator import Generator, direct_sum
from helpers import fast_lane

from torch._dynamo.utils import counters


@pytest.fixture
def kernels_on_small_inputs(monkeypatch):
    """Every input takes the compiled kernel (the tests' tensors are under MIN_ELEMS), in small slabs."""
    monkeypatch.setattr(_kernels, "MIN_ELEMS", 0)
    monkeypatch.setattr(_kernels, "SLAB_BYTES", 3 * 5 * 16 * 8)  # a few rows: several slabs of both kinds
    monkeypatch.setattr(_kernels, "TILE", 4)  # the terms kernel in tiles of 4 positions (a ragged last one)
    monkeypatch.setattr(_kernels, "TILE_ABOVE_BYTES", 0)
    monkeypatch.setattr(_kernels, "_ran", set())  # which native ops ran: this test's calls only
    yield


def _half_mixed() -> lp.Encoding:
    """Half layout: RoPE planes + a decay + a 3×3 Jordan block + NoPE (the halves run, a real run, coupling)."""
    g = direct_sum(lp.rope(8).generator, Generator([-0.1, -0.05], [0.0, 0.0], [1, 3]), lp.nope(2).generator)
    return lp.Encoding(g, layout="half", name="mixed_half")


def _half_with_slots() -> lp.Encoding:
    a = lp.alibi(8, num_heads=2)
    g = direct_sum(lp.rope(8).generator, a.generator)
    return lp.Encoding(g, layout="half", query_slots=a.query_slots, key_slots=a.key_slots)


ENCODINGS = {
    "rope_half": lambda: lp.rope(16, layout="half"),
    "xpos_half": lambda: lp.xpos(16, layout="half"),
    "retnet_half": lambda: lp.retnet(16, num_heads=2, layout="half"),  # per-head tables (H, S, P)
    "mixed_half": _half_mixed,
    "slots_half": _half_with_slots,
}


def _inputs(enc, dtype, bshd, S=11):
    torch.manual_seed(0)
    H = enc.num_heads or 4
    Hk = H if enc.num_heads is not None else 2  # grouped queries: the tables broadcast over heads
    d = enc.content_dim
    mk = lambda h: (torch.randn(2, S, h, d, dtype=dtype).transpose(1, 2) if bshd  # noqa: E731
                    else torch.randn(2, h, S, d, dtype=dtype))
    return mk(H), mk(Hk), torch.arange(3, 3 + S)


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bshd", fast_lane(False, True))
def test_kernel_equals_fallback_equals_dense(name, dtype, bshd, kernels_on_small_inputs):
    enc = ENCODINGS[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    built = lambda: len(_kernels.status()["compiled"]) + len(_kernels.status()["native"])  # noqa: E731
    before = built()
    for side, x in (("query", q), ("key", k)):
        f = enc.query if side == "query" else enc.key
        got = f(x, pos)
        with _kernels.off():
            ops = f(x, pos)
        ref = (enc.query_reference if side == "query" else enc.key_reference)(x.double(), pos)
        assert got.dtype == ops.dtype and got.shape == ops.shape and got.stride() == ops.stride()
        scale = ref.abs().amax().clamp_min(1.0)
        if dtype == torch.bfloat16:
            # both compute in float32 from the same tables and round once: one bfloat16 ulp apart at most
            assert ((got.double() - ops.double()).abs() <= 2**-7 * ops.double().abs() + 1e-6).all()
            assert float((got.double() - ref).abs().max() / scale) < 2e-2
        else:
            tol = 1e-12 if dtype == torch.float64 else 2e-6
            assert float((got.double() - ops.double()).abs().max() / scale) <= tol
            assert float((got.double() - ref).abs().max() / scale) <= 10 * tol
    assert built() > before or before > 0  # a kernel did run (native C, else Inductor's)
    assert not [k for k in _kernels.status()["failed"] if k[0] != "native" or CAN_BUILD]


def _close(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor | None = None) -> None:
    """``got`` equals ``want`` up to one rounding of their dtype (fused multiply-adds round once less), and
    the float64 dense reference ``ref`` up to the dtype's precision."""
    assert got.dtype == want.dtype and got.shape == want.shape
    fin = want.isfinite()  # float16 overflows at large scales, alike on both paths
    assert torch.equal(got.isfinite(), fin)
    got, want = got[fin], want[fin]
    ref = None if ref is None else ref[fin]
    ulp = {torch.float64: 2**-50, torch.float32: 2**-21, torch.bfloat16: 2**-7, torch.float16: 2**-10}[got.dtype]
    work = 2**-49 if got.dtype == torch.float64 else 2**-20  # cancellation: the work dtype's error on the inputs
    scale = want.double().abs().amax().clamp_min(1.0)
    assert ((got.double() - want.double()).abs() <= ulp * want.double().abs() + work * scale).all()
    if ref is not None:
        tol = {torch.float64: 1e-11, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[got.dtype]
        assert float((got.double() - ref).abs().max() / ref.abs().amax().clamp_min(1.0)) <= tol


@pytest.mark.parametrize("name", ["rope_half", "mixed_half", "retnet_half"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bshd", [False, True])
def test_kernel_in_place_is_in_place_and_equals_out_of_place(name, dtype, bshd, kernels_on_small_inputs):
    """In place the half-layout rotation is the native one-pass kernel (both halves loaded, both stored);
    out of place Inductor's loop: the same values up to one rounding, and the dense reference."""
    enc = ENCODINGS[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    for side, x in (("query", q), ("key", k)):
        f = getattr(enc, side)
        want = f(x, pos)
        y = x.clone()
        ptr = y.data_ptr()
        out = f(y, pos, inplace=True)
        assert out.data_ptr() == ptr and torch.equal(out, y)
        _close(y, want, getattr(enc, f"{side}_reference")(x.double(), pos))
        with _kernels.off():
            z = x.clone()
            f(z, pos, inplace=True)
        _close(y, z)
    # the half-layout rotation in place, or (a coupled encoding) the terms kernel in place
    kernel = "terms" if name == "mixed_half" else "halves"
    assert any(kernel in v for v in _kernels.status()["native"]) or not CAN_BUILD


@pytest.mark.parametrize("name", ["rope_half", "mixed_half", "slots_half"])
def test_kernel_backward_is_the_transpose(name, kernels_on_small_inputs):
    enc = ENCODINGS[name]()
    q, k, pos = _inputs(enc, torch.float64, False)
    q.requires_grad_(True)
    w = torch.randn(enc.dim, dtype=torch.float64)
    (g,) = torch.autograd.grad((enc.query(q, pos) * w).square().sum(), q)
    with _kernels.off():
        (g_ops,) = torch.autograd.grad((enc.query(q, pos) * w).square().sum(), q)
    # gradient of the float64 dense reference (autograd through exp(tX)ᵀ q)
    (g_ref,) = torch.autograd.grad((enc.query_reference(q, pos) * w).square().sum(), q)
    assert torch.allclose(g, g_ops, atol=1e-11) and torch.allclose(g, g_ref, atol=1e-9)
    # in place after a projection, through the kernel both ways
    x = torch.randn(*q.shape, dtype=torch.float64, requires_grad=True)
    (gi,) = torch.autograd.grad((enc.query(x * 1.0, pos, inplace=enc.num_slots == 0) * w).square().sum(), x)
    (go,) = torch.autograd.grad((enc.query(x * 1.0, pos) * w).square().sum(), x)
    assert torch.allclose(gi, go, atol=1e-12)


@pytest.mark.slow
def test_compiled_once_per_variant_with_dynamic_shapes(kernels_on_small_inputs, monkeypatch):
    """The Inductor loop (the half layout where the native kernel does not run: CUDA, no C compiler)."""
    monkeypatch.setattr(_kernels, "_rotate_halves_native", lambda *a: None)
    enc = lp.rope(16, layout="half")
    _kernels._compiled.clear()
    torch._dynamo.reset()
    counters.clear()
    for B, H, S in ((2, 3, 7), (2, 5, 19), (3, 4, 64), (2, 6, 100)):  # new batch, heads and lengths
        x = torch.randn(B, H, S, 16)
        assert torch.allclose(enc.query(x), enc.query_reference(x.double()).float(), atol=1e-5)
    # one variant (the float32 kernel, no size-1 axes of x, tables shared by batch and heads)
    assert len(_kernels.status()["compiled"]) == 1
    assert counters["stats"]["unique_graphs"] == 1  # no recompilation for any new shape


def test_environment_switch_logs_once_and_uses_the_torch_ops(kernels_on_small_inputs, monkeypatch, caplog):
    enc = lp.rope(16, layout="half")
    x = torch.randn(2, 4, 9, 16)
    want = enc.query(x)
    monkeypatch.setenv(_kernels.ENV, "0")
    monkeypatch.setattr(_kernels, "_said", set())
    _kernels._compiled.clear()
    with caplog.at_level(logging.INFO, logger="liepos"):
        got = enc.query(x)
        enc.query(x)
    assert not _kernels.status()["compiled"]  # nothing compiled: the torch ops ran
    assert torch.allclose(got, want, atol=1e-6)
    assert sum(_kernels.ENV in r.getMessage() for r in caplog.records) == 1


def test_a_failing_compiler_warns_once_and_falls_back(kernels_on_small_inputs, monkeypatch):
    def broken(*args, **kwargs):
        def fn(*a):
            raise RuntimeError("no C++ compiler here")
        return fn

    monkeypatch.setattr(_kernels, "_said", set())
    monkeypatch.setattr(_kernels, "_failed", {})
    monkeypatch.setattr(_kernels, "_compiled", {})
    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(_kernels, "_rotate_halves_native", lambda *a: None)  # the Inductor loop is asked for
    enc = lp.rope(16, layout="half")
    x = torch.randn(2, 4, 9, 16, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler here"):
        got = enc.query(x)
    assert torch.allclose(got, enc.query_reference(x), atol=1e-12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is silent: the variant is never tried again
        assert torch.allclose(enc.query(x), got)
    assert _kernels.status()["failed"]


def test_no_kernel_on_devices_it_cannot_compile_for():
    assert not _kernels.enabled(torch.device("meta"))
    with _kernels.off():
        assert not _kernels.enabled(torch.device("cpu"))
    assert _kernels.enabled(torch.device("cpu"))


# ---------------------------------------------------------------------- the native terms kernel (Jordan coupling)
def _jordan_mixed(layout: str) -> lp.Encoding:
    """RoPE planes + a damped complex (rotating) Jordan block + decays + a 3×3 and a 2×2 Jordan block + NoPE."""
    g = direct_sum(
        lp.rope(6).generator,
        Generator([-0.05], [0.3], [2]),
        Generator([-0.1, -0.01, -0.2, 0.0], [0.0, 0.0, 0.0, 0.0], [1, 1, 3, 2]),
        lp.nope(1).generator,
    )  # 18 dims: an even width keeps the interleaved planes (2k, 2k+1)
    return lp.Encoding(g, layout=layout, name=f"jordan_mixed_{layout}")


def _jordan_with_slots() -> lp.Encoding:
    a = lp.alibi(8, num_heads=2)
    g = direct_sum(lp.build("jordan", 9).generator, a.generator)
    return lp.Encoding(g, query_slots=a.query_slots, key_slots=a.key_slots, name="jordan_slots")


def _rope_and_blocks(dim: int, size: int) -> lp.Encoding:
    """RoPE planes on half the dims, then decaying Jordan blocks of ``size``, the rest NoPE."""
    nb = (dim - dim // 2) // size
    gens = [lp.rope(dim // 2).generator, Generator(-torch.linspace(0.01, 0.2, nb), torch.zeros(nb), [size] * nb)]
    if dim - dim // 2 - size * nb:
        gens.append(lp.nope(dim - dim // 2 - size * nb).generator)
    return lp.Encoding(direct_sum(*gens), name=f"rope_jordan{size}_{dim}")


# the term structures the native kernel compiles with their constants (offsets of the query's forward terms, the key's;
# widths 64 and 128): each encoding here must keep producing them, or the compiled paths go untested
COMPILED = {
    "bank_64": (lambda: lp.build("jordan", 64), (0, -1, -2), (0, 1, 2)),
    "bank2_128": (lambda: lp.build("jordan", 128, size=2), (0, -1), (0, 1)),
    "rope_jordan3_64": (lambda: _rope_and_blocks(64, 3), (0, -1, 1, -2), (0, -1, 1, 2)),
    "rope_jordan2_128": (lambda: _rope_and_blocks(128, 2), (0, -1, 1), (0, -1, 1)),
}

JORDAN = {
    **{name: fn for name, (fn, _, _) in COMPILED.items()},
    "jordan3_bank": lambda: lp.build("jordan", 16),  # 5 decaying 3×3 blocks + one NoPE dim
    "jordan2": lambda: lp.jordan(2, -0.1),
    "jordan3_growth": lambda: lp.jordan(3, 0.0),
    "complex_jordan": lambda: lp.jordan(2, -0.1, 0.5),
    "mixed": lambda: _jordan_mixed("interleaved"),
    "mixed_half": lambda: _jordan_mixed("half"),
    "slots": _jordan_with_slots,
    # per-head rates: tables (H, S, J, D), one row per head
    "per_head": lambda: lp.Encoding(Generator(-torch.linspace(0.01, 0.3, 8).reshape(4, 2), torch.zeros(4, 2), [3, 2])),
}


# a machine without a C++ compiler or ninja runs the torch ops (warned once): the values are checked all the
# same, only the assertions that the native kernel ran are conditional
CAN_BUILD = _kernels._missing() is None


def _terms_ran() -> bool:
    return any("terms" in v for v in _kernels.status()["native"]) or not CAN_BUILD


@pytest.mark.parametrize("name", list(JORDAN))
@pytest.mark.parametrize("dtype", fast_lane(torch.float64, torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("bshd", fast_lane(False, True))
def test_terms_kernel_equals_torch_ops_equals_dense(name, dtype, bshd, kernels_on_small_inputs):
    """Jordan-coupled encodings in one native pass: the values of the torch ops (up to one rounding) and
    of the float64 dense reference, both sides, BSHD strides, grouped-query keys, half precision."""
    enc = JORDAN[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    for side, x in (("query", q), ("key", k)):
        f = getattr(enc, side)
        got = f(x, pos)
        with _kernels.off():
            ops = f(x, pos)
        assert got.stride() == ops.stride()
        _close(got, ops, getattr(enc, f"{side}_reference")(x.double(), pos))
    # slots of a half-precision input are written in float32, an output dtype the terms kernel does not take
    upcast = name == "slots" and dtype in (torch.bfloat16, torch.float16)
    assert (_terms_ran() != upcast or not CAN_BUILD) and (not _kernels.status()["failed"] or not CAN_BUILD)


@pytest.mark.parametrize("name", ["jordan3_bank", "mixed_half", "slots"])
@pytest.mark.parametrize("bshd", [False, True])
def test_terms_kernel_head_after_head(name, bshd, kernels_on_small_inputs, monkeypatch):
    """Below TILE_ABOVE_BYTES the rows run head after head (one tile per sequence): the same values."""
    enc = JORDAN[name]()
    q, k, pos = _inputs(enc, torch.float32, bshd)
    tiled = enc.key(k, pos)
    monkeypatch.setattr(_kernels, "TILE_ABOVE_BYTES", 1 << 40)
    assert torch.equal(enc.key(k, pos), tiled)
    _close(enc.query(q, pos), enc.query(q, pos), enc.query_reference(q.double(), pos))


@pytest.mark.parametrize("name", ["jordan3_bank", "complex_jordan", "mixed", "mixed_half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bshd", [False, True])
def test_terms_kernel_in_place(name, dtype, bshd, kernels_on_small_inputs):
    """In place each row is read whole before it is written: the out-of-place values, bit for bit."""
    enc = JORDAN[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    for f, x in ((enc.query, q), (enc.key, k)):
        want = f(x, pos)
        y = x.clone()
        out = f(y, pos, inplace=True)
        assert out.data_ptr() == y.data_ptr() and torch.equal(y, want)


@pytest.mark.parametrize("name", ["jordan3_bank", "jordan2", "complex_jordan", "mixed", "mixed_half", "slots"])
def test_terms_kernel_backward_is_the_transpose(name, kernels_on_small_inputs):
    """The backward (the transposed terms: offsets negated, tables shifted) passes gradcheck in float64,
    on both sides and through ``inplace=True``."""
    enc = JORDAN[name]()
    H = enc.num_heads or 2
    x = torch.randn(1, H, 5, enc.content_dim, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(2, 7)
    assert torch.autograd.gradcheck(lambda x: enc.query(x, pos), (x,))
    assert torch.autograd.gradcheck(lambda x: enc.key(x, pos), (x,))
    if not enc.num_slots:
        assert torch.autograd.gradcheck(lambda x: enc.key(x * 1.0, pos, inplace=True), (x,))
    w = torch.randn(enc.dim, dtype=torch.float64)
    (g,) = torch.autograd.grad((enc.query(x, pos) * w).square().sum(), x)
    (g_ref,) = torch.autograd.grad((enc.query_reference(x, pos) * w).square().sum(), x)
    assert torch.allclose(g, g_ref, atol=1e-9)
    assert _terms_ran()


@pytest.mark.parametrize("col", [0, 3, 15])
def test_terms_kernel_keeps_non_finite_values_in_their_block(col, kernels_on_small_inputs):
    """A structural zero is skipped, not multiplied: an inf in one block leaves the others finite, as the
    torch ops do (a multiply by a zero table entry would spread NaN to the neighbouring block). Column 3
    starts the second 3×3 block; 0 and 15 (NoPE) are what a row read in place reads of its neighbours."""
    enc = lp.build("jordan", 16)
    torch.manual_seed(col)
    x = torch.randn(2, 3, 9, 16)
    x[..., col] = float("inf")
    pos = torch.arange(1, 10)
    for f in (enc.query, enc.key):
        got = f(x, pos)
        with _kernels.off():
            ops = f(x, pos)
        assert torch.equal(got.isfinite(), ops.isfinite()) and got[..., 6:9].isfinite().all()
        fin = ops.isfinite()
        _close(got[fin], ops[fin])  # one rounding apart, as for finite inputs


@pytest.mark.parametrize("name", list(COMPILED))
def test_the_compiled_term_structures_are_what_the_encodings_produce(name):
    """The offsets the kernel compiles as constants are those of liepos's Jordan encodings at widths 64 and 128
    (the forward terms of the query and of the key)."""
    fn, *want = COMPILED[name]
    enc = fn()
    assert enc.content_dim in (64, 128)
    for side, offsets in zip(("query", "key"), want):
        ft = enc._build_fast(torch.arange(4.0, dtype=torch.float64), side, torch.float32, True)
        assert ft.terms is not None and ft.terms[0] == offsets


@pytest.mark.parametrize("name", list(JORDAN))
@pytest.mark.parametrize("side", ["query", "key"])
def test_term_tables_are_zero_where_no_term_exists(name, side):
    """The terms op adds every term of a finite row without reading the masks: its contract is tables that are
    zero where a mask is 0, for the terms and for the transposed terms of the backward."""
    enc = JORDAN[name]()
    ft = enc._build_fast(torch.arange(-3.0, 9.0, dtype=torch.float64), side, torch.float32, True)
    assert ft.terms is not None
    for _, masks, T in (ft.terms, _fast._transposed_terms(ft)):
        absent = ~torch.tensor(masks, dtype=torch.bool)  # (J, D)
        assert T.shape[-2:] == absent.shape and absent.any()
        assert (T[..., absent] == 0).all() and (T.abs().amax(tuple(range(T.dim() - 2)))[~absent] > 0).any()


@pytest.mark.parametrize("name", list(COMPILED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_terms_kernel_keeps_non_finite_values_where_they_belong(name, dtype, kernels_on_small_inputs):
    """A row holding an inf or a NaN takes the masks on the compiled structures too: where the torch ops stay
    finite the kernel does, with their values; the other rows of the same call take every term; in place
    gives the same bits."""
    enc = JORDAN[name]()
    torch.manual_seed(1)
    D = enc.content_dim
    x = torch.randn(2, 3, 9, D).to(dtype)
    x[0, 1, 2, D // 2 + 1] = float("inf")  # a Jordan block's column
    x[1, 0, 5, 0] = float("nan")  # a rotation plane's, or the first block's
    x[1, 2, 7, D - 1] = float("-inf")  # the last column: what a row read in place reads of its neighbours
    pos = torch.arange(1, 10)
    for f in (enc.query, enc.key):
        got = f(x, pos)
        with _kernels.off():
            ops = f(x, pos)
        assert torch.equal(got.isfinite(), ops.isfinite()) and ops.isfinite().any(-1).all()
        assert not ops[0, 1, 2].isfinite().all() and ops[0, 0].isfinite().all()
        fin = ops.isfinite()
        _close(got[fin], ops[fin])
        y = x.clone()  # in place: the row-at-a-time loop, the same sums in the same order as out of place
        f(y, pos, inplace=True)
        assert torch.equal(y.isfinite(), fin) and torch.equal(y[fin], got[fin])
    assert _terms_ran()


@given(
    rates=st.lists(st.floats(-0.3, 0.0), min_size=2, max_size=2),
    freq=st.floats(0.0, 2.0),
    start=st.integers(-40, 40),
    real=st.booleans(),
    per_batch=st.booleans(),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_terms_kernel_at_random_rates_and_positions(rates, freq, start, real, per_batch, kernels_on_small_inputs):
    """Any rates, a rotating block's frequency, integer ranges (cached windows), real positions (tables
    built per call) or one row of positions per batch item (tables (B, 1, S, J, D)): the kernel gives the
    dense reference's values."""
    g = direct_sum(Generator([rates[0]], [freq], [2]), Generator([rates[1]], [0.0], [3]), lp.nope(1).generator)
    enc = lp.Encoding(g)
    x = torch.randn(2, 3, 8, enc.dim, dtype=torch.float64)
    pos = torch.arange(start, start + 8, dtype=torch.float64)
    if real:
        pos = pos * 0.37 + 0.1
    if per_batch:
        pos = torch.stack((pos, pos.flip(0) - 3.0))  # (B, S)
    for side in ("query", "key"):
        got = getattr(enc, side)(x, pos)
        ref = getattr(enc, f"{side}_reference")(x, pos)
        assert torch.allclose(got, ref, rtol=1e-10, atol=1e-10 * float(ref.abs().max().clamp_min(1.0)))
    assert _terms_ran()


def test_native_kernels_off_by_the_environment_use_the_torch_ops(kernels_on_small_inputs, monkeypatch):
    enc = lp.build("jordan", 16)
    x = torch.randn(2, 4, 9, 16)
    want = enc.query(x, torch.arange(9))
    assert _terms_ran()
    monkeypatch.setenv(_kernels.ENV, "0")
    monkeypatch.setattr(_kernels, "_ran", set())
    got = enc.query(x, torch.arange(9))
    y = x.clone()
    lp.rope(16, layout="half").query(y, torch.arange(9), inplace=True)
    assert not _kernels.status()["native"]  # no native op ran: the torch ops did
    _close(got, want)


@pytest.mark.parametrize("missing", ["compiler", "ninja"])
def test_no_compiler_or_no_ninja_warns_once_naming_it_and_falls_back(kernels_on_small_inputs, monkeypatch, tmp_path,
                                                                      missing):
    """A machine without a C++ compiler (CXX names a missing program) or without ninja: one warning naming
    what is missing, then the torch ops, silently, with the same values."""
    from torch.utils import cpp_extension

    if missing == "compiler":
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    else:
        monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    monkeypatch.setenv(_kernels.CACHE_ENV, str(tmp_path / "cache"))
    for name in ("_said", "_failed", "_native"):
        monkeypatch.setattr(_kernels, name, set() if name == "_said" else {})
    enc = lp.build("jordan", 16)
    x = torch.randn(2, 4, 9, 16, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler" if missing == "compiler" else "no ninja") as seen:
        got = enc.query(x, torch.arange(9))
    assert len([w for w in seen if "liepos" in str(w.message)]) == 1
    assert torch.allclose(got, enc.query_reference(x, torch.arange(9)), atol=1e-12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never tried again
        assert torch.allclose(enc.query(x, torch.arange(9)), got)
    assert _kernels.status()["failed"] and not _kernels.status()["native"]
    assert not (tmp_path / "cache").exists()  # nothing built


@pytest.mark.skipif(not CAN_BUILD, reason="no C++ compiler or ninja: nothing is built")
def test_the_native_library_is_built_once_and_not_rebuilt(kernels_on_small_inputs, monkeypatch):
    """The library is built once per build key: asked for again (a fresh process would), it is found up to
    date: the same file, not relinked, and the ops give the same values."""
    enc = lp.build("jordan", 16)
    x = torch.randn(2, 4, 9, 16)
    want = enc.key(x, torch.arange(9))
    lib = _kernels.library()
    assert lib is not None and lib.with_suffix(".sha256").exists()
    before = os.stat(lib)
    monkeypatch.setattr(_kernels, "_native", {})
    assert _kernels.library() == lib
    after = os.stat(lib)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    assert torch.equal(enc.key(x, torch.arange(9)), want) and _kernels.status()["native"]


@pytest.mark.skipif(not CAN_BUILD, reason="no C++ compiler or ninja: nothing is built")
@pytest.mark.parametrize("op", ["terms", "terms_", "halves", "halves_", "halves streamed"])
def test_the_native_ops_pass_opcheck(op):
    """Schema (the written tensor annotated), fake implementation, autograd registration and AOT dispatch of
    each ``liepos_native`` op, on one representative case of each (BSHD strides, broadcast tables)."""
    ops = _kernels._ops()
    assert ops is not None
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8).transpose(1, 2)  # (B, H, S, D), BSHD strides
    if op.startswith("terms"):
        offsets, masks = [0, -1, 1], _kernels._mask_tensor(((1,) * 8, (0,) + (1,) * 7, (1,) * 7 + (0,)))
        T = torch.randn(1, 3, 5, 3, 8) * masks  # zero where no term exists, the op's contract
        T = T.expand(2, 3, 5, 3, 8)  # (1, 3, 5, 3, 8) -> (2, 3, 5, 3, 8), stride 0 on the batch
        args = (x, T, offsets, masks, 2) if op == "terms_" else (x, T, offsets, masks, 2, torch.empty(2, 3, 5, 8))
    else:
        c, s = torch.randn(1, 1, 5, 4).expand(2, 3, 5, 4), torch.randn(1, 1, 5, 4).expand(2, 3, 5, 4)
        args = (x, c, s, 2) if op == "halves_" else (x, c, s, 2, torch.empty(2, 3, 5, 8))
        if op == "halves streamed":
            op, args = "halves", (*args, True)
    torch.library.opcheck(getattr(ops, op).default, args)


@pytest.mark.skipif(not CAN_BUILD, reason="no C++ compiler or ninja: nothing is built")
@settings(max_examples=30, deadline=None)
@given(P=st.sampled_from([4, 16, 32, 64]), S=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.float64]),
       misaligned=st.booleans(), seed=st.integers(0, 2**16))
def test_a_streamed_half_rotation_writes_the_bits_of_a_stored_one(P, S, dtype, misaligned, seed):
    """``halves(..., stream=True)``: non-temporal stores where they run (float32, AVX with FMA, widths 16, 32 and 64
    planes, rows 32-byte aligned, out not x, its pages mapped) and the plain loop elsewhere; either way the same
    bits."""
    ops = _kernels._ops()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, S, 2 * P, generator=g, dtype=dtype)
    x[0, 0, 0, 0] = float("nan")
    c, s = (torch.randn(1, 1, S, P, generator=g, dtype=dtype).expand(2, 3, S, P) for _ in range(2))
    base = torch.zeros(x.numel() + 1, dtype=dtype)  # its pages mapped
    out = base[1:].view(x.shape) if misaligned else base[:-1].view(x.shape)  # misaligned: one element on
    want = torch.empty_like(x)
    ops.halves(x, c, s, 32, want, False)
    ops.halves(x, c, s, 32, out, True)
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.nan_to_num(0.0), want.nan_to_num(0.0))
    avx = "avx" in open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else False
    aligned = out.data_ptr() % 32 == 0
    assert bool(ops.halves_streams(x, out)) == (avx and "fma" in open("/proc/cpuinfo").read().split()
                                                 and dtype == torch.float32 and P in (16, 32, 64) and aligned)
    assert not ops.halves_streams(x, x)  # in place never streams


def test_only_a_fresh_output_from_the_streamed_size_on_is_asked_to_stream(monkeypatch, kernels_on_small_inputs):
    """``rotate_halves``: a fresh output of STREAM_ABOVE_BYTES or more is asked to stream; an output given (the
    attention's tiles, read right after) or a smaller one is written through the cache."""
    seen = []
    real = _kernels._ops
    if real() is None:
        pytest.skip("the native kernels cannot be built here")

    class Spy:
        def __getattr__(self, name):
            op = getattr(real(), name)
            return (lambda *a: seen.append(a[-1]) or op(*a)) if name == "halves" else op

    monkeypatch.setattr(_kernels, "_ops", lambda: Spy())
    monkeypatch.setattr(_kernels, "STREAM_ABOVE_BYTES", 4 * 2 * 3 * 16 * 16)  # 16 positions of (2, 3, S, 16)
    c, s = torch.rand(1, 1, 64, 8).expand(2, 3, 64, 8), torch.rand(1, 1, 64, 8).expand(2, 3, 64, 8)
    for S, fresh, want in ((64, True, True), (16, True, True), (15, True, False), (64, False, False)):
        x = torch.randn(2, 3, S, 16)
        cs, ss = c[:, :, :S], s[:, :, :S]
        seen.clear()
        y = _kernels.rotate_halves(x, cs, ss) if fresh else _kernels.rotate_halves(x, cs, ss, into=torch.empty_like(x))
        assert seen == [want], (S, fresh)
        ref = torch.cat((cs * x[..., :8] - ss * x[..., 8:], ss * x[..., :8] + cs * x[..., 8:]), -1)
        assert torch.allclose(y, ref, atol=1e-6)


@pytest.mark.skipif(not CAN_BUILD or not os.path.exists("/proc/cpuinfo") or "avx2" not in open("/proc/cpuinfo").read(),
                    reason="non-temporal stores: x86 with AVX and FMA, Linux")
def test_streaming_takes_only_pages_already_mapped():
    """A fresh mapping (no page touched yet, no huge page that a neighbour's touch would map) is written through:
    its first touch faults and zeroes each page into the cache. Once touched, the same memory streams."""
    import mmap
    import warnings

    ops = _kernels._ops()
    x = torch.randn(1, 2, 64, 64)
    m = mmap.mmap(-1, x.nbytes)  # anonymous, page-aligned, untouched
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer's note that the tensor shares the buffer's memory
        fresh = torch.frombuffer(m, dtype=torch.float32).view(x.shape)
    assert not ops.halves_streams(x, fresh)
    fresh.zero_()  # every page of it mapped
    assert ops.halves_streams(x, fresh)
    del fresh


def test_fresh_outputs_ask_for_huge_pages_over_their_aligned_interior(monkeypatch):
    """An output of at least HUGE_ABOVE_BYTES is advised as transparent huge pages over exactly its 2 MiB-aligned
    interior (never a byte outside it), a smaller one not at all; the values are those of 4 KiB pages, every layout
    that allocates a fresh output (half, interleaved, Jordan terms)."""
    calls: list[tuple[int, int, int]] = []
    real = _pages._madvise()
    monkeypatch.setattr(_pages, "_madvise", lambda: lambda a, n, advice: calls.append((a, n, advice)) or (
        real(a, n, advice) if real is not None else 0))
    small = _pages.huge(torch.empty(_pages.HUGE_ABOVE_BYTES // 4 - 1))
    assert calls == [] and small.numel() == _pages.HUGE_ABOVE_BYTES // 4 - 1
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # as torch.compile traces: no data pointer to advise, the tensor as it is
        fake = torch.empty(_pages.HUGE_ABOVE_BYTES // 4)
        assert _pages.huge(fake) is fake
    assert _pages.huge(meta := torch.empty(_pages.HUGE_ABOVE_BYTES, device="meta")) is meta and calls == []
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, 4096, 64, generator=g)  # 32 MiB
    pos = torch.arange(4096)
    for enc in (lp.rope(64, layout="half"), lp.rope(64), lp.build("jordan", 64, rate=-1 / 8192)):
        calls.clear()
        y = enc.query(x, pos)
        assert calls, enc.name
        lo, hi = y.data_ptr(), y.data_ptr() + y.nbytes
        for a, n, advice in calls:
            assert advice == 14 and a % (2 << 20) == 0 and n % (2 << 20) == 0 and n > 0
        assert any(lo <= a and a + n <= hi for a, n, _ in calls)
        monkeypatch.setattr(_pages, "HUGE_ABOVE_BYTES", float("inf"))
        assert torch.equal(enc.query(x, pos), y)
        monkeypatch.setattr(_pages, "HUGE_ABOVE_BYTES", 32 << 20)
