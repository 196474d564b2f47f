"""The native re-centring kernel (liepos.recentred_kernel): the attention it gives equals the float64 reference
within the precision contract and the tiling it replaces, over random shapes (hypothesis: batch, heads, grouped
keys, head sizes, lengths not a multiple of the block, both layouts, decay dims, damped and plain rotation
planes, fading Jordan blocks real and complex); it runs exactly where it should (no gradient, no sinks, float32
everywhere, bfloat16 where it pays and oneDNN packs bfloat16), and its corrections are the encoding's own A(lag)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _kernels, causal_tiling, recentred_kernel
from liepos.catalogue import default_decay_rates
from liepos.recentre import POLY_ROUNDING

F64 = torch.float64
pytestmark = pytest.mark.skipif(_kernels.library() is None or not recentred_kernel.gemms(),
                                reason="the native kernels cannot be built here, or oneDNN's GEMMs do not run here")


def _packs_bfloat16() -> bool:
    return bool(torch.ops.liepos_native.packs_bfloat16())


def _damped(dim: int, layout: str = "interleaved") -> lp.Encoding:
    P = dim // 2
    return lp.Encoding(lp.Generator(-default_decay_rates(P), lp.rope_freqs(dim), [1] * P), layout=layout,
                       name="damped")


def _encoding(kind: str, dim: int, heads: int) -> lp.Encoding:
    """Encodings whose tiling has diagonal blocks of 128 rows (fastest rate 1/2), so that a few hundred rows
    make several of the kernel's blocks: the catalogue decay, per-head decays, damped rotations (both layouts);
    RetNet (blocks of 1024) for the correction tables."""
    if kind == "decay":
        return lp.build("decay", dim, heads)
    if kind == "per_head":
        rates = default_decay_rates(dim) * torch.linspace(1.0, 0.25, heads, dtype=F64).unsqueeze(-1)  # (H, D)
        return lp.decay(rates)
    if kind == "retnet":
        return lp.retnet(dim, num_heads=heads)
    if kind == "retnet_half":
        return lp.retnet(dim, num_heads=heads, layout="half")
    return _damped(dim, "half" if kind == "damped_half" else "interleaved")


def _ran(monkeypatch) -> list:
    calls, real = [], recentred_kernel.kernel
    monkeypatch.setattr(recentred_kernel, "kernel", lambda *a: calls.append(a[5]) or real(*a))  # the block
    return calls


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["decay", "per_head", "damped", "damped_half"]), B=st.integers(1, 2),
       heads=st.sampled_from([(2, 2), (4, 2), (2, 1)]), D=st.sampled_from([16, 32, 64]), Dv=st.sampled_from([16, 48, 64]),
       T=st.integers(200, 600), half=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_equals_the_float64_reference(monkeypatch, kind, B, heads, D, Dv, T, half, seed):
    """Blocks of 64 rows (so that a few hundred rows make several), every pair of blocks re-centred in the kernel:
    within 16·eps·max|v| of the float64 attention on the same rounded inputs (the fused path's contract)."""
    # bfloat16 only where oneDNN packs it (elsewhere the kernel refuses it: test_equals_the_tiling_it_replaces)
    dtype = torch.bfloat16 if half and _packs_bfloat16() else torch.float32
    H, Hk = heads
    if kind == "per_head" and Hk != H:
        Hk = H  # a per-head encoding with grouped keys is repeated per head before the kernel
    monkeypatch.setattr(recentred_kernel, "MAX_BLOCK", 64)
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: True)
    calls = _ran(monkeypatch)
    enc = _encoding(kind, D, H)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, dtype=F64, generator=g).to(dtype)
    k = torch.randn(B, Hk, T, D, dtype=F64, generator=g).to(dtype)
    v = torch.randn(B, Hk, T, Dv, dtype=F64, generator=g).to(dtype)
    with torch.no_grad():
        out = lp.attention(q, k, v, enc)
    assert calls, "the kernel did not run"
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc)
    assert out.dtype == dtype and out.shape == (B, H, T, Dv)
    tol = 16 * torch.finfo(dtype).eps * float(v.double().abs().max())
    assert float((out.double() - ref).abs().max()) <= tol


@pytest.mark.parametrize("name", ["decay", "retnet"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_the_tiling_it_replaces(monkeypatch, name, dtype):
    """T = 2048: the kernel and the tiles of causal_tiling give the same attention to within their roundings. On
    a CPU where oneDNN packs no bfloat16 (no AMX) a bfloat16 call never reaches the kernel, even where it would
    pay, and the op itself refuses bfloat16 by name."""
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: True)
    calls = _ran(monkeypatch)
    enc = lp.build(name, 64, 4)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 2048, 64, dtype=F64, generator=g).to(dtype) for _ in range(3))
    if dtype == torch.bfloat16 and not _packs_bfloat16():
        with torch.no_grad():
            out = lp.attention(q, k, v, enc)
        assert not calls and out.dtype == dtype  # the tiling served it
        corr, partner = recentred_kernel.corrections(enc, 128, 16, 0.125)
        with pytest.raises(RuntimeError, match="bfloat16 needs oneDNN's packed GEMM"):
            recentred_kernel.kernel(q, k, v, corr, partner, 128)
        return
    with torch.no_grad():
        new = lp.attention(q, k, v, enc)
        assert len(calls) == 1
        monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)
        old = lp.attention(q, k, v, enc)
        assert len(calls) == 1
    tol = 32 * torch.finfo(dtype).eps * float(v.double().abs().max())
    assert float((new.double() - old.double()).abs().max()) <= tol


def test_runs_only_where_it_should(monkeypatch):
    monkeypatch.setattr(recentred_kernel, "_MEASURED", {"here": True})  # as on the CPU kind it was timed on
    calls = _ran(monkeypatch)
    enc = lp.build("decay", 64, 2)
    q, k, v = (torch.randn(1, 2, 1024, 64) for _ in range(3))
    with torch.no_grad():
        lp.attention(q, k, v, enc)
    assert len(calls) == 1  # float32, more than one block, no gradient
    with torch.no_grad():
        lp.attention(q, k, v, lp.build("jordan", 64))  # fading Jordan blocks: their queries and keys at the edges
    assert calls == [128, 64]
    q.requires_grad_(True)
    lp.attention(q, k, v, enc).sum().backward()  # a gradient: the tiling
    with torch.no_grad():
        lp.attention(q, k, v, enc, sinks=torch.zeros(2))  # sinks: the tiling
        lp.attention(q[:, :, :100], k[:, :, :100], v[:, :, :100], enc)  # one block: the tiling
        with _kernels.off():
            lp.attention(q, k, v, enc)  # native kernels off
        lp.attention(q, k, v, lp.build("jordan", 64, rate=0.0))  # Jordan blocks that do not fade
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
        lp.attention(q, k, v, enc)  # no oneDNN GEMMs of its kind (not x86 with AVX2): the tiling
    assert len(calls) == 2


def test_pays(monkeypatch):
    """float32 wherever the kernel runs; bfloat16 where the tiling's diagonal blocks are small and few; Jordan blocks
    up to TERMS_ROWS; none on a CPU of another kind than the one it was timed on."""
    f32, bf16 = torch.float32, torch.bfloat16
    monkeypatch.setattr(recentred_kernel, "_MEASURED", {"here": False})
    assert not recentred_kernel.pays(f32, 2048, 128) and not recentred_kernel.pays(bf16, 2048, 128)
    monkeypatch.setattr(recentred_kernel, "_MEASURED", {"here": True})
    assert recentred_kernel.pays(f32, 8192, 1024)
    assert recentred_kernel.pays(bf16, 2048, 128) and recentred_kernel.pays(bf16, 1024, 128)
    assert not recentred_kernel.pays(bf16, 4096, 128) and not recentred_kernel.pays(bf16, 2048, 1024)
    rows = recentred_kernel.TERMS_ROWS  # Jordan blocks: up to a length, in float32 (their half precision is widened)
    assert recentred_kernel.pays(f32, rows, 32, terms=True) and not recentred_kernel.pays(f32, rows + 1, 32, terms=True)


def test_edge_rows():
    """Jordan blocks: off the diagonal every factor within e^{−32} (rate·W ≤ 32), the diagonal at its middle or in
    halves at theirs within the diagonal budget."""
    assert recentred_kernel.edge_rows(22.6, 0.5, 32.0) == (64, True)  # the catalogue's 3×3 blocks in float32
    assert recentred_kernel.edge_rows(64.0, 0.5, 32.0) == (64, False)  # 2×2 blocks: the budget covers half a block
    assert recentred_kernel.edge_rows(22.6, 0.01, 32.0) == (64, True)  # slow: the halves' budget caps it
    assert recentred_kernel.edge_rows(40.0, 0.01, 32.0) == (128, True)
    assert recentred_kernel.edge_rows(500.0, 0.01, 32.0) == (recentred_kernel.MAX_BLOCK, False)
    assert recentred_kernel.edge_rows(22.6, 1.0, 32.0) is None  # 32 rows at most: below the kernel's 64
    assert recentred_kernel.edge_rows(15.0, 0.01, 32.0) is None  # halves of 32 rows need 16 from their middle


def test_block_rows():
    assert recentred_kernel.block_rows(64.0, 2048) == 128  # decay at rate 1/2: e^{±32}
    assert recentred_kernel.block_rows(1009.0, 2048) == recentred_kernel.MAX_BLOCK
    assert recentred_kernel.block_rows(math.inf, 2048) == recentred_kernel.MAX_BLOCK
    assert recentred_kernel.block_rows(64.0, 99) == 100  # one block: T rounded up to even
    assert recentred_kernel.block_rows(31.0, 2048) is None  # below 64 rows


def _jordan(kind: str, dim: int) -> lp.Encoding:
    """Encodings of fading Jordan blocks: the catalogue's (3×3 real blocks and a NoPE dim), 2×2 ones, and complex
    ones (a damped rotation plane of Jordan chains) beside a decay dim."""
    if kind == "jordan3":
        return lp.build("jordan", dim)
    if kind == "jordan2":
        return lp.build("jordan", dim, size=2)
    P = (dim - 2) // 4  # complex blocks of size 2 (4 dims each), the rest decay dims
    rest = dim - 4 * P
    g = lp.Generator(torch.cat([-default_decay_rates(P), torch.full((rest,), -0.1, dtype=F64)]),
                     torch.cat([lp.rope_freqs(2 * P), torch.zeros(rest, dtype=F64)]), [2] * P + [1] * rest,
                     complex=[True] * P + [False] * rest)
    return lp.Encoding(g, name="damped_jordan")


@pytest.mark.parametrize("kind", ["retnet", "retnet_half", "damped", "damped_half", "decay", "per_head", "jordan3",
                                  "jordan2", "damped_jordan"])
@pytest.mark.parametrize("edges", [False, True])
def test_corrections_are_the_encodings_own(kind, edges):
    """corr[h, m] applied to an encoded query row equals the encoding at the lag of the pair of blocks m apart
    (m·W, or (m − 1)·W with ``edges``) applied to it (float64), to the float32 rounding of the table's entries."""
    D, H, W, nb = 16, 2, 64, 4
    enc = _jordan(kind, D) if "jordan" in kind else _encoding(kind, D, H)
    corr, partner = recentred_kernel.corrections(enc, W, nb, 1.0, edges)
    P = corr.shape[2]
    assert partner.shape == (P - 1, D)
    terms = torch.cat([torch.arange(D).unsqueeze(0), partner])  # (P, D)
    x = torch.randn(1, corr.shape[0], 3, D, dtype=F64)
    for m in range(nb):
        lag = max(m - 1, 0) * W if edges else m * W
        want = enc._query_after(x, torch.full((3,), float(lag), dtype=F64))
        a = corr[:, m].double().view(1, -1, 1, P, D) / recentred_kernel._LOG2E  # (1, Hc, 1, P, D)
        parts = a * x[..., terms]  # (1, Hc, 3, P, D): each term's product
        got = parts.sum(-2)
        tiny = 2 * P * torch.finfo(torch.float32).tiny * float(x.abs().max())  # an entry underflowing float32: 0
        assert bool(((got - want).abs() <= 2.0**-22 * parts.abs().sum(-2) + tiny).all())


def test_more_terms_than_the_kernel_takes_are_refused():
    """A dim coupled to more than MAX_TERMS − 1 others (a Jordan block of size 9) has no correction the kernel
    takes: None, and the call is tiled."""
    assert recentred_kernel.corrections(lp.jordan(recentred_kernel.MAX_TERMS + 1), 64, 3, 1.0) is None
    assert recentred_kernel.corrections(lp.jordan(recentred_kernel.MAX_TERMS), 64, 3, 1.0) is not None


def test_the_op_refuses_what_it_cannot_take():
    ops = torch.ops.liepos_native
    x = torch.randn(1, 2, 128, 16)
    corr, partner = torch.zeros(1, 2, 2, 16), torch.arange(16).unsqueeze(0)
    with pytest.raises(RuntimeError, match="block"):
        ops.recentred_flash(x, x, x, corr, partner, 63)
    with pytest.raises(RuntimeError, match="corr"):
        ops.recentred_flash(x, x, x, torch.zeros(1, 3, 2, 16), partner, 64)
    with pytest.raises(RuntimeError, match="last axis"):
        ops.recentred_flash(x, x, x.transpose(2, 3).contiguous().transpose(2, 3), corr, partner, 64)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.recentred_flash(x.double(), x.double(), x.double(), corr, partner, 64)
    with pytest.raises(RuntimeError, match="qd and kd come together"):
        ops.recentred_flash(x, x, x, corr, partner, 64, x, None)
    with pytest.raises(RuntimeError, match="qd and kd must be shaped"):
        ops.recentred_flash(x, x, x, corr, partner, 64, x[:, :, :64], x)
    with pytest.raises(RuntimeError, match="partner must be"):
        ops.recentred_flash(x, x, x, corr, torch.arange(16), 64)
    with pytest.raises(RuntimeError, match="corr must be"):
        ops.recentred_flash(x, x, x, torch.zeros(1, 2, 9, 16), torch.zeros(8, 16, dtype=torch.long), 64)
    with pytest.raises(RuntimeError, match="kx .blocks in halves. needs qd and kd"):
        ops.recentred_flash(x, x, x, torch.zeros(1, 4, 2, 16), partner, 64, None, None, x)
    with pytest.raises(RuntimeError, match="float32"):
        b = x.bfloat16()
        ops.recentred_flash(b, b, b, torch.zeros(1, 4, 2, 16), partner, 64, b, b, b)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.recentred_flash(x, x, x, torch.zeros(1, 3, 2, 16), partner, 50)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["jordan3", "jordan2", "damped_jordan"]), B=st.integers(1, 2),
       heads=st.sampled_from([(2, 2), (4, 2), (2, 1)]), D=st.sampled_from([16, 32, 64]), Dv=st.sampled_from([16, 48]),
       T=st.integers(260, 520), half=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_jordan_blocks_equal_the_float64_reference(monkeypatch, kind, B, heads, D, Dv, T, half, seed):
    """Fading Jordan blocks in the kernel (queries at their block's start, keys at its end, the diagonal blocks at
    their middles): within the polynomial parts' contract, 2⁻¹⁴·max|v|, of the float64 attention on the same rounded
    inputs where the attention is well conditioned (q and k of norm ~0.8: the slow 3×3 blocks' u²/2 still makes
    logits of tens by 500 tokens); bfloat16 inputs are attended in float32 and rounded once (16·eps·max|v|)."""
    dtype = torch.bfloat16 if half else torch.float32
    H, Hk = heads
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: True)  # on any CPU whose GEMMs the kernel runs on
    calls = _ran(monkeypatch)
    enc = _jordan(kind, D)
    g = torch.Generator().manual_seed(seed)
    q, k = (0.1 * torch.randn(B, n, T, D, dtype=F64, generator=g) for n in (H, Hk))
    v = torch.randn(B, Hk, T, Dv, dtype=F64, generator=g)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with torch.no_grad():
        out = lp.attention(q, k, v, enc)
    # blocks of 64 (rate 1/2: every factor within e^{±32}), the 3×3 blocks' diagonal in halves (22.6 from the middle)
    assert calls == [64], "the kernel did not run"
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc)
    scale = float(v.double().abs().max())
    tol = (16 * torch.finfo(dtype).eps if half else POLY_ROUNDING) * scale
    assert out.dtype == dtype and float((out.double() - ref).abs().max()) <= tol
