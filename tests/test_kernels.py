"""The Inductor-compiled one-pass kernels (liepos._kernels) against the torch-op fallback and the
float64 dense reference: both layouts' encodings, slots, coupling/Jordan columns, BSHD strides,
grouped-query broadcast tables, in place, bfloat16, backward; compiled once per variant; the fallback
is announced, never silent."""

from __future__ import annotations

import logging

import pytest
import torch

import liepos as lp
from liepos import _kernels
from liepos.generator import Generator, direct_sum

from torch._dynamo.utils import counters


@pytest.fixture
def kernels_on_small_inputs(monkeypatch):
    """Every input takes the compiled kernel (the tests' tensors are under MIN_ELEMS), in small slabs."""
    monkeypatch.setattr(_kernels, "MIN_ELEMS", 0)
    monkeypatch.setattr(_kernels, "SLAB_BYTES", 3 * 5 * 16 * 8)  # a few rows: several slabs of both kinds
    yield


def _half_mixed() -> lp.Encoding:
    """Half layout: RoPE planes + a decay + a 3×3 Jordan block + NoPE (the halves run, a real run, coupling)."""
    g = direct_sum(lp.rope(8).generator, Generator([-0.1, -0.05], [0.0, 0.0], [1, 3]), lp.nope(2).generator)
    return lp.Encoding(g, layout="half", name="mixed_half")


def _half_with_slots() -> lp.Encoding:
    a = lp.alibi(2, 8)
    g = direct_sum(lp.rope(8).generator, a.generator)
    return lp.Encoding(g, layout="half", query_slots=a.query_slots, key_slots=a.key_slots)


ENCODINGS = {
    "rope_half": lambda: lp.rope(16, layout="half"),
    "xpos_half": lambda: lp.xpos(16, layout="half"),
    "retnet_half": lambda: lp.retnet(2, 16, layout="half"),  # per-head tables (H, S, P)
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
@pytest.mark.parametrize("bshd", [False, True])
def test_kernel_equals_fallback_equals_dense(name, dtype, bshd, kernels_on_small_inputs):
    enc = ENCODINGS[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    before = len(_kernels.status()["compiled"])
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
    assert len(_kernels.status()["compiled"]) > before or before > 0  # the kernel did run
    assert not _kernels.status()["failed"]


@pytest.mark.parametrize("name", ["rope_half", "mixed_half", "retnet_half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bshd", [False, True])
def test_kernel_in_place_is_in_place_and_equals_out_of_place(name, dtype, bshd, kernels_on_small_inputs):
    enc = ENCODINGS[name]()
    q, k, pos = _inputs(enc, dtype, bshd)
    for f, x in ((enc.query, q), (enc.key, k)):
        want = f(x, pos)
        y = x.clone()
        ptr = y.data_ptr()
        out = f(y, pos, inplace=True)
        assert out.data_ptr() == ptr and torch.equal(out, y)
        assert torch.equal(y, want)  # the same kernel, in slabs: bit for bit


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


def test_compiled_once_per_variant_with_dynamic_shapes(kernels_on_small_inputs):
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
