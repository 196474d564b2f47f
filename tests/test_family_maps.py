"""The 2026 additions inside the family: p-RoPE, RoPE-ID, clipped RoPE (CoPE), per-eigenvalue and per-head
factors — each against its method's own formula or code, each exact through a KVCache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import liepos as lp
from liepos import scaling

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def rotate_half_reference(x, inv_freq, t):
    """Hugging Face / Gemma's rotate-half application, written out: cos/sin of t·inv_freq repeated twice."""
    ang = t[:, None] * inv_freq[None, :]  # (S, d/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (S, d)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


# ---------------------------------------------------------------------- p-RoPE, RoPE-ID
@pytest.mark.parametrize("p", [0.25, 0.5, 0.75, 1.0])
def test_p_rope_is_gemmas_truncated_spectrum(p):
    """Barbero et al.'s p-RoPE (arXiv 2410.06205), reimplemented from the paper (its code is Gemma's, in JAX):
    timescales base^(2i/d) for i < ⌊p·d/2⌋, infinite (no rotation) beyond, applied in the rotate-half layout."""
    d, base = 16, 10000.0
    i = torch.arange(d // 2, dtype=F64)
    inv = torch.where(i < int(p * d // 2), base ** (-2 * i / d), torch.zeros((), dtype=F64))
    q, t = torch.randn(1, 2, 5, d, dtype=F64), torch.tensor([0.0, 3.0, 10.0, 77.0, 4096.0], dtype=F64)
    got = lp.p_rope(d, p, base, layout="half").query(q, t)
    assert rel_err(got, rotate_half_reference(q, inv, t)) < 1e-13


def test_p_rope_matches_transformers_proportional():
    """Hugging Face's own `proportional` rope (Gemma 4) is p-RoPE: the same inv_freq, bit for bit up to float32."""
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PretrainedConfig()
    cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.max_position_embeddings = 64, 2, 32, 4096
    cfg.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    inv, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, "cpu")
    assert rel_err(lp.p_rope(32, 0.25).generator.freqs, inv.double()) < 1e-6


def test_rope_id_rotates_the_fast_half_only():
    """RoPE-ID (arXiv 2603.18017): the fastest half of the planes keep RoPE's frequencies, the slow half is NoPE."""
    enc = lp.rope_id(16, base=500.0)
    w = enc.generator.freqs
    assert torch.equal(w[:4], lp.rope_freqs(16, 500.0)[:4]) and torch.equal(w[4:], torch.zeros(4, dtype=F64))
    q = torch.randn(1, 1, 1, 16, dtype=F64)
    out = enc.query(q, [123.0])
    assert torch.equal(out[..., 8:], q[..., 8:])  # interleaved: dims 8..15 are the four NoPE planes
    assert lp.classify(enc.generator).counts["rotation"] == 4


# ---------------------------------------------------------------------- clipped RoPE (CoPE)
def cope_inv_freq(inv_freq: np.ndarray, n: int) -> np.ndarray:
    """CoPE's clipping, reimplemented from arXiv 2602.05258 / its reference modeling_cope.py:
    ``inv_freq[-n:] *= 0.5 * (1 + cos(linspace(0, pi, n)))``."""
    out = inv_freq.copy()
    out[-n:] *= 0.5 * (1 + np.cos(np.linspace(0, np.pi, n)))
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 20])
def test_clipped_is_copes_hann_taper(n):
    inv = lp.rope_freqs(64, 500000.0).numpy()
    got = scaling.clipped(lp.rope(64, 500000.0), clip=n).generator.freqs.numpy()
    np.testing.assert_allclose(got, cope_inv_freq(inv, n), rtol=1e-15, atol=0)
    if n > 1:
        assert got[-1] == 0.0  # the slowest plane becomes a NoPE plane


def test_clipped_sizes_itself_from_the_training_length():
    """mlx-lm's sizing: clip every plane whose period 2π/ω is longer than original_max_position_embeddings."""
    inv = lp.rope_freqs(64, 10000.0).numpy()
    n = int((2 * np.pi / inv > 4096).sum())
    got = scaling.clipped(lp.rope(64), original_max_position_embeddings=4096).generator.freqs.numpy()
    np.testing.assert_allclose(got, cope_inv_freq(inv, n), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="exactly one of"):
        scaling.clipped(lp.rope(8))
    with pytest.raises(ValueError, match="clip"):
        scaling.clipped(lp.rope(8), clip=5)  # 4 planes


def hf_yarn_inv_freq(d, base, factor, L0):
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PretrainedConfig()
    cfg.hidden_size, cfg.num_attention_heads, cfg.max_position_embeddings = d, 1, int(L0 * factor)
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": base, "factor": factor,
                           "original_max_position_embeddings": L0}
    inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    return inv.double().numpy(), af


def yarn_blend(w: np.ndarray, d, base, s, L0) -> np.ndarray:
    """YaRN's blend (1 − γ)ω + γω/s, γ the ramp over the planes of the base's correction range."""
    lo, hi = scaling.yarn_correction_range(rotary_dim=d, base=base, original_max_position_embeddings=L0)
    gamma = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    return w * (1 - gamma) + w / s * gamma


def test_clipped_composes_with_yarn_and_the_order_matters():
    """With CoPE's own sizing (clip the planes slower than L0, measured on the spectrum it is given) the orders
    differ: after yarn more planes are slower than L0. Each order equals its formula, the yarn part being
    transformers' own inv_freq."""
    d, base, s, L0 = 64, 10000.0, 8.0, 2048
    yarn_hf, af = hf_yarn_inv_freq(d, base, s, L0)
    n_after = int((2 * np.pi / yarn_hf > L0).sum())
    after = scaling.clipped(scaling.yarn(lp.rope(d, base), factor=s, original_max_position_embeddings=L0),
                            original_max_position_embeddings=L0)
    np.testing.assert_allclose(after.generator.freqs.numpy(), cope_inv_freq(yarn_hf, n_after), rtol=1e-6)
    assert math.isclose(after.logit_scale, af * af, rel_tol=1e-12)
    inv = lp.rope_freqs(d, base).numpy()
    n_before = int((2 * np.pi / inv > L0).sum())
    before = scaling.yarn(scaling.clipped(lp.rope(d, base), original_max_position_embeddings=L0), factor=s,
                          original_max_position_embeddings=L0, base=base)
    np.testing.assert_allclose(before.generator.freqs.numpy(), yarn_blend(cope_inv_freq(inv, n_before), d, base, s, L0),
                               rtol=1e-13)
    assert n_after > n_before and not torch.allclose(before.generator.freqs, after.generator.freqs)
    with pytest.raises(ValueError, match="yarn needs base="):  # the tapered spectrum has no base to read
        scaling.yarn(scaling.clipped(lp.rope(d, base), clip=3), factor=s, original_max_position_embeddings=L0)


def test_a_fixed_clip_commutes_with_yarn_at_a_given_base():
    """A fixed number of clipped planes and yarn at an explicit base are both per-plane multipliers: they commute."""
    d, base, s, L0, n = 64, 10000.0, 8.0, 2048, 12
    a = scaling.clipped(scaling.yarn(lp.rope(d, base), factor=s, original_max_position_embeddings=L0), clip=n)
    b = scaling.yarn(scaling.clipped(lp.rope(d, base), clip=n), factor=s, original_max_position_embeddings=L0, base=base)
    assert rel_err(a.generator.freqs, b.generator.freqs) < 1e-15 and a.logit_scale == b.logit_scale


def test_clipped_and_factors_are_registered_maps():
    assert scaling.SCALINGS["clipped"] is scaling.clipped and scaling.SCALINGS["factors"] is scaling.factors
    a = scaling.scale(lp.rope(8), "clipped", clip=2)
    assert torch.equal(a.generator.freqs, scaling.clipped(lp.rope(8), clip=2).generator.freqs)


# ---------------------------------------------------------------------- per-eigenvalue and per-head factors
def test_factors_per_eigenvalue_is_longrope2s_rescale():
    """LongRoPE2 (arXiv 2502.20082) rescales plane i by a searched factor λ_i: θ_i / λ_i (formula from the paper)."""
    lam = torch.linspace(1.0, 40.0, 8, dtype=F64)
    got = scaling.factors(lp.rope(16), factors=lam)
    assert torch.equal(got.generator.freqs, lp.rope_freqs(16) / lam)
    # LongRoPE2's two windows (original factors short, rescaled long) are longrope with arbitrary vectors
    two = scaling.longrope(lp.rope(16), short_factor=[1.0] * 8, long_factor=lam.tolist(),
                           original_max_position_embeddings=64, factor=1.0)
    assert torch.equal(two.at_length(65).generator.freqs, got.generator.freqs)


def test_factors_per_head_gives_each_head_its_spectrum():
    """AdaRoPE's head-specific scaling: ω_{h,i} / λ_{h,i}; head h of the result is rope scaled by its own row."""
    lam = torch.tensor([[1.0], [2.0], [4.0]], dtype=F64)  # (heads, 1): one factor per head
    enc = scaling.factors(lp.rope(8), factors=lam)
    assert enc.num_heads == 3
    q = torch.randn(1, 3, 4, 8, dtype=F64)
    t = torch.tensor([0.0, 5.0, 9.0, 300.0], dtype=F64)
    got = enc.query(q, t)
    for h in range(3):
        assert rel_err(got[:, h], lp.rope(8).query(q[:, h : h + 1], t / lam[h, 0])[:, 0]) < 1e-12
    with pytest.raises(ValueError, match="factors"):
        scaling.factors(lp.rope(8), factors=torch.ones(3, 3, dtype=F64))
    with pytest.raises(ValueError, match="factors"):
        scaling.factors(lp.rope(8), factors=[1.0, -1.0, 1.0, 1.0])


def test_learnable_generator_has_per_head_spectra():
    """AdaRoPE's learnable per-head frequencies: LearnableGenerator(num_heads=H) trains one spectrum per head."""
    g = lp.LearnableGenerator(8, num_heads=3)
    assert g().freqs.shape == (3, 4)
    loss = (g().freqs * torch.arange(3.0, dtype=F64)[:, None]).sum()
    loss.backward()
    grad = g.raw_freq.grad
    assert torch.equal(grad[0], torch.zeros(4, dtype=F64)) and bool((grad[1:] != 0).all())  # heads independent


# ---------------------------------------------------------------------- decode == full forward
@pytest.mark.parametrize("make", [
    lambda: lp.p_rope(16, 0.5), lambda: lp.rope_id(16), lambda: lp.cope_clipped(16, layout="half"),
    lambda: scaling.factors(lp.rope(16), factors=torch.tensor([[1.0], [3.0]], dtype=F64)),
    lambda: scaling.clipped(lp.xpos(16), clip=3), lambda: lp.string_google(16),
], ids=["p_rope", "rope_id", "cope_clipped", "factors_per_head", "clipped_xpos", "string_google"])
def test_decode_equals_full_forward(make):
    enc = make()
    q, k, v = (torch.randn(1, 2, 7, 16, dtype=F64) for _ in range(3))
    full = lp.attention(q, k, v, enc)
    cache = lp.KVCache()
    pre = lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache)
    steps = [lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, cache=cache) for i in (5, 6)]
    assert rel_err(torch.cat([pre, *steps], 2), full) < 1e-12
    ref = lp.attention_reference(q, k, v, enc, torch.arange(7), torch.arange(7))
    assert rel_err(full, ref) < 1e-12
