"""No subnormal number reaches the flash kernel: every tensor the fused path hands it (q, k, v, the
per-key mask) holds none, and every product of a q entry and a k entry is 0 or a normal number, for
every block type that fades (decay, RetNet, xPos, Jordan, a damped rotation) and ALiBi, at T = 8192 and
at times near 10⁶, in float32 and bfloat16. Subnormal operands cost x86 cores a microcode assist per
operation; the count holds on any machine, whatever its penalty (on x86 the flash calls run with subnormals
flushed; the count is taken with the flush off, so that it sees the construction alone).
The caller's flush-to-zero setting is never changed (tests/test_native_runs.py)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import liepos as lp
from liepos import _kernels, attention_pieces, causal_tiling, recentred_kernel
from liepos.catalogue import default_decay_rates

F64 = torch.float64
HEADS, DIM = 2, 64


def _damped() -> lp.Encoding:
    """A damped rotation: every plane rotates (RoPE's frequencies) and fades at rates 1/2 … 1/2048."""
    P = DIM // 2
    rates = default_decay_rates(P)
    return lp.Encoding(lp.Generator(-rates, lp.rope_freqs(DIM), [1] * P), name="damped")


ENCODINGS = {
    "decay": lambda: lp.build("decay", DIM, HEADS),
    "retnet": lambda: lp.retnet(DIM, num_heads=HEADS),
    "xpos": lambda: lp.xpos(DIM),
    "jordan": lambda: lp.build("jordan", DIM),
    "damped": _damped,
    "alibi": lambda: lp.alibi(DIM, num_heads=HEADS),
}


def _subnormal(x: torch.Tensor | None) -> int:
    if x is None:
        return 0
    return int(((x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)).sum())


def _smallest(x: torch.Tensor) -> float:
    a = x.detach().abs().double()
    a = a[a > 0]
    return float(a.min()) if a.numel() else math.inf


@pytest.fixture
def flash_inputs(monkeypatch) -> list[dict]:
    """Per flash call of the fused path: the subnormal count of each input and a lower bound of every
    nonzero product ``q_d k_d`` the kernel forms (the smallest nonzero |q| times the smallest nonzero |k|)."""
    seen, real = [], attention_pieces._flash

    def spy(q, k, v, *a, attn_mask=None, **kw):
        seen.append({"q": _subnormal(q), "k": _subnormal(k), "v": _subnormal(v), "mask": _subnormal(attn_mask),
                     "product": _smallest(q) * _smallest(k), "tiny": torch.finfo(q.dtype).tiny})
        return real(q, k, v, *a, attn_mask=attn_mask, **kw)

    def spy_kernel(qe, ke, v, *a, real_kernel=recentred_kernel.kernel):
        # the native kernel's inputs: the blocks' encodings (and, for Jordan blocks, the diagonal blocks' own, a[3:]),
        # every factor within the diagonal budget (its corrected query rows are formed inside it, its threads'
        # subnormals flushed for its run)
        for qx, kx in [(qe, ke)] + ([(a[3], a[4])] if len(a) > 3 and a[3] is not None else []):
            seen.append({"q": _subnormal(qx), "k": _subnormal(kx), "v": _subnormal(v), "mask": 0,
                         "product": _smallest(qx) * _smallest(kx), "tiny": torch.finfo(qx.dtype).tiny})
        return real_kernel(qe, ke, v, *a)

    monkeypatch.setattr(recentred_kernel, "kernel", spy_kernel)
    # counted with subnormals kept: on x86 the flash calls run flushed (_kernels.flushed), which would read a
    # subnormal as 0 whatever the clearing did; without it the count is the construction's, as on any machine
    monkeypatch.setattr(_kernels, "flushed", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(attention_pieces, "_flash", spy)
    return seen


def _run(name: str, dtype: torch.dtype, T: int, offset: int, grad: bool = False) -> None:
    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(T + offset)
    q, k, v = (torch.randn(1, HEADS, T, DIM, dtype=F64, generator=g).to(dtype) for _ in range(3))
    if grad:
        q.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        out = lp.attention(q, k, v, enc, torch.arange(T) + offset)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())


def _assert_clear(seen: list[dict], name: str) -> None:
    assert seen, f"{name}: the fused flash path did not run"
    for i, s in enumerate(seen):
        assert s["q"] == s["k"] == s["v"] == s["mask"] == 0, (name, i, s)
        assert s["product"] >= s["tiny"], (name, i, s)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_subnormal_near_a_million(name, dtype, flash_inputs):
    _run(name, dtype, 2048, 10**6 + 17)
    _assert_clear(flash_inputs, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_subnormal_at_8192(name, dtype, flash_inputs):
    _run(name, dtype, 8192, 0)
    _assert_clear(flash_inputs, name)


def test_no_subnormal_with_a_gradient(flash_inputs):
    """The autograd path (every tile made and merged at once) hands the kernel the same cleared tiles."""
    _run("decay", torch.float32, 2048, 0, grad=True)
    _assert_clear(flash_inputs, "decay")


def test_the_count_sees_the_fades_without_clearing(flash_inputs, monkeypatch):
    """Without the clearing the far tiles' fades underflow to subnormal numbers: the count above can fail."""
    monkeypatch.setattr(attention_pieces, "_cleared", lambda q, k, c, scratch=None, owned=False, bound=None: (q, k))
    monkeypatch.setattr(causal_tiling, "clear_thresholds", lambda *a: None)  # nor in the encodings' own pass
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiling's tiles, not the native kernel
    _run("decay", torch.float32, 2048, 0)
    assert sum(s["q"] + s["k"] for s in flash_inputs) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_clearing_moves_no_logit_past_its_bound(dtype):
    """``_cleared``: every score ``c qᵀk`` moves by at most ``CLEAR_LOGIT`` (computed in float64 from the
    same rounded entries), entries far below the scale become exact zeros, and no entry is subnormal."""
    g = torch.Generator().manual_seed(5)
    scale = torch.logspace(-45, 1, DIM, dtype=F64)  # entries from far below any score to the scale
    q = (torch.randn(3, 2, 40, DIM, dtype=F64, generator=g) * scale).to(dtype)
    k = (torch.randn(3, 2, 50, DIM, dtype=F64, generator=g) * scale.flip(0)).to(dtype)
    c = DIM**-0.5
    qc, kc = attention_pieces._cleared(q, k, c)
    before = c * q.double() @ k.double().transpose(-1, -2)
    after = c * qc.double() @ kc.double().transpose(-1, -2)
    assert float((after - before).abs().max()) <= attention_pieces.CLEAR_LOGIT[dtype]
    assert int((qc == 0).sum()) > int((q == 0).sum())  # something was cleared
    assert bool(((qc == q) | (qc == 0)).all()) and bool(((kc == k) | (kc == 0)).all())  # nothing else changed
    if dtype != torch.float64:
        assert _subnormal(qc) == _subnormal(kc) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clearing_takes_every_entry_below_its_threshold_and_none_above(dtype):
    """The thresholds are those of the bound: ``τ_q = δ / (2 D c ‖k‖_∞)`` and ``τ_k = δ / (2 D c ‖q‖_∞)``, so an
    entry at 0.9 τ becomes 0 and one at 1.1 τ stays (a smaller threshold would let near-subnormal products
    through; a larger one would move logits past δ)."""
    c, delta = DIM**-0.5, attention_pieces.CLEAR_LOGIT[dtype]
    q = torch.full((1, 1, 4, DIM), 0.5, dtype=F64)
    k = torch.full((1, 1, 5, DIM), 0.25, dtype=F64)
    q[..., 0, 0], k[..., 0, 0] = 2.0, 4.0  # ‖q‖_∞ = 2, ‖k‖_∞ = 4
    tq, tk = delta / (2 * DIM * c * 4.0), delta / (2 * DIM * c * 2.0)
    q[..., 1, 1:3] = torch.tensor([0.9 * tq, 1.1 * tq], dtype=F64)
    k[..., 1, 1:3] = torch.tensor([0.9 * tk, 1.1 * tk], dtype=F64)
    q, k = q.to(dtype), k.to(dtype)
    qc, kc = attention_pieces._cleared(q, k, c)
    assert float(qc[..., 1, 1]) == 0.0 and float(qc[..., 1, 2]) == float(q[..., 1, 2]) != 0.0
    assert float(kc[..., 1, 1]) == 0.0 and float(kc[..., 1, 2]) == float(k[..., 1, 2]) != 0.0
    assert torch.equal((qc != q).sum(), torch.tensor(1)) and torch.equal((kc != k).sum(), torch.tensor(1))
