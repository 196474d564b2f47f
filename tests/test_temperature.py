"""Logit temperatures beside the group: Scalable-Softmax (s·log n) and Llama 4's attn_temperature_tuning,
against their formulas and transformers' Llama 4 attention, exact through a KVCache and re-centring."""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp
from liepos.temperature import TEMPERATURES, Llama4Temperature, ScalableSoftmax, SwanLengthScaling

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def ssmax_reference(q, k, v, enc, t, s, svals, keep=None):
    """Scalable-Softmax, reimplemented from arXiv 2501.19399 (no package): z_i ↦ (s · log n_i) z_i, n_i the
    number of keys row i attends to, then softmax; z the encoded scores c·qᵀA(t − s)k from the dense matrices."""
    c = 1 / math.sqrt(q.shape[-1])
    z = c * enc.query_reference(q, t) @ enc.key_reference(k, s).transpose(-1, -2)  # (B, H, Sq, Sk)
    vis = (torch.as_tensor(s)[None, :] <= torch.as_tensor(t)[:, None])[None, None]  # (1, 1, Sq, Sk)
    if keep is not None:
        vis = vis & keep[:, None, None, :]
    n = vis.sum(-1, keepdim=True).double()  # (B, 1, Sq, 1)
    tau = torch.as_tensor(svals, dtype=F64).reshape(1, -1, 1, 1) * torch.log(n)
    w = torch.softmax((tau * z).masked_fill(~vis, -math.inf), -1)
    return w @ v


@pytest.mark.parametrize("s", [0.43, [0.3, 1.7]])
def test_ssmax_is_the_papers_formula(s):
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=F64) for _ in range(3))
    t = torch.arange(9, dtype=F64)
    enc = lp.rope(8)
    got = lp.attention(q, k, v, enc, temperature=ScalableSoftmax(s))
    assert rel_err(got, ssmax_reference(q, k, v, enc, t, t, s)) < 1e-12


def test_ssmax_counts_only_visible_keys():
    """Padding is not a key: n counts the keys a row really sees (the general, masked path)."""
    q, k, v = (torch.randn(2, 2, 6, 8, dtype=F64) for _ in range(3))
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :2] = False  # left padding in row 1
    t = torch.arange(6, dtype=F64)
    got = lp.attention(q, k, v, lp.rope(8), key_padding_mask=keep, temperature=ScalableSoftmax(0.8))
    ref = ssmax_reference(q, k, v, lp.rope(8), t, t, 0.8, keep)
    assert rel_err(got[1, :, 2:], ref[1, :, 2:]) < 1e-12 and rel_err(got[0], ref[0]) < 1e-12


@pytest.mark.parametrize("enc", [lp.rope(8), lp.xpos(8), lp.decay([0.1] * 8)], ids=["rope", "xpos", "decay"])
@pytest.mark.parametrize("T", [ScalableSoftmax([0.5, 1.5]), Llama4Temperature(floor_scale=3, attn_scale=0.4),
                               SwanLengthScaling(alpha=0.7, train_length=3)], ids=["ssmax", "llama4", "swan"])
def test_decode_equals_full_forward(enc, T):
    q, k, v = (torch.randn(1, 2, 8, 8, dtype=F64) for _ in range(3))
    full = lp.attention(q, k, v, enc, temperature=T)
    cache = lp.KVCache()
    parts = [lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache, temperature=T)]
    for i in range(5, 8):
        parts.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, cache=cache,
                                  temperature=T))
    assert rel_err(torch.cat(parts, 2), full) < 1e-12


def test_re_centring_keeps_ssmax_exact_far_from_zero():
    """SSMax depends on n, not on t: xPos re-centred at 10⁹ equals the reference at 0."""
    q, k, v = (torch.randn(1, 2, 7, 8, dtype=F64) for _ in range(3))
    far = torch.arange(7, dtype=F64) + 1e9
    T = ScalableSoftmax(0.9)
    got = lp.attention(q, k, v, lp.xpos(8), far, far, temperature=T)
    ref = ssmax_reference(q, k, v, lp.xpos(8), torch.arange(7, dtype=F64), torch.arange(7, dtype=F64), 0.9)
    assert rel_err(got, ref) < 1e-9


def test_llama4_temperature_matches_transformers_attention():
    """transformers' own Llama4TextAttention (a NoPE layer, attn_temperature_tuning on, eager) against liepos:
    the same projections, lp.attention with lp.nope and the temperature, the same o_proj."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    cfg = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           num_hidden_layers=4, intermediate_size=64, intermediate_size_mlp=64, vocab_size=16,
                           attn_temperature_tuning=True, floor_scale=3, attn_scale=0.25, use_qk_norm=False)
    cfg._attn_implementation = "eager"
    layer = 3
    assert cfg.no_rope_layers[layer] == 0  # a NoPE layer: the temperature applies
    torch.manual_seed(0)
    attn = Llama4TextAttention(cfg, layer).double().eval()
    S = 11
    h = torch.randn(2, S, 32, dtype=F64)
    mask = torch.full((S, S), -math.inf, dtype=F64).triu(1)[None, None]  # (1, 1, S, S) causal, additive
    with torch.no_grad():
        want = attn(h, None, mask)[0]
        q = attn.q_proj(h).view(2, S, 4, 8).transpose(1, 2)  # (B, H, S, hd)
        k = attn.k_proj(h).view(2, S, 2, 8).transpose(1, 2)
        v = attn.v_proj(h).view(2, S, 2, 8).transpose(1, 2)
        y = lp.attention(q, k, v, lp.nope(8), temperature=Llama4Temperature(floor_scale=3, attn_scale=0.25))
        got = attn.o_proj(y.transpose(1, 2).reshape(2, S, 32))
    assert rel_err(got, want) < 1e-12  # τ is transformers' float32 value in both; the rest is float64
    # and the temperature is not a no-op here: without it the output differs
    with torch.no_grad():
        plain = attn.o_proj(lp.attention(q, k, v, lp.nope(8)).transpose(1, 2).reshape(2, S, 32))
    assert rel_err(plain, want) > 1e-3


def test_refusals_leave_the_cache_untouched():
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=F64) for _ in range(3))
    cache = lp.KVCache()
    with pytest.raises(ValueError, match="slots"):
        lp.attention(q, k, v, lp.alibi(4, num_heads=2), cache=cache, temperature=ScalableSoftmax())
    with pytest.raises(ValueError, match="3 heads"):
        lp.attention(q, k, v, lp.rope(4), cache=cache, temperature=ScalableSoftmax([1.0, 1.0, 1.0]))
    with pytest.raises(TypeError, match="temperature"):
        lp.attention(q, k, v, lp.rope(4), cache=cache, temperature=2.0)
    with pytest.raises(ValueError, match="`s`"):
        ScalableSoftmax(-1.0)
    assert len(cache) == 0
    assert TEMPERATURES["ssmax"] is ScalableSoftmax and TEMPERATURES["llama4"] is Llama4Temperature


def test_swan_length_scaling_is_its_formula():
    """τ(t) = 1 + α·log(max(1, (t + 1)/L_train)), written out with math.log per time: 1 inside the training
    length, continuous at it, α·log of the extrapolation ratio beyond."""
    T = SwanLengthScaling(alpha=0.3, train_length=5)
    t = torch.tensor([[0.0, 3.0, 4.0, 5.0, 9.0, 99.0, 1e9]], dtype=F64)
    got = T.factor(t, None)
    assert got.shape == (1, 1, 7)
    want = [1.0 + 0.3 * math.log(max(1.0, (ti + 1.0) / 5)) for ti in t.flatten().tolist()]
    assert max(abs(g - w) for g, w in zip(got.flatten().tolist(), want)) < 1e-15
    assert got.flatten()[:3].tolist() == [1.0, 1.0, 1.0] and got.flatten()[3] > 1.0
    assert TEMPERATURES["swan"] is SwanLengthScaling and repr(T) == "SwanLengthScaling(alpha=0.3, train_length=5)"
    assert SwanLengthScaling(alpha=0.0, train_length=4096).factor(t, None).eq(1.0).all()


def test_swan_length_scaling_is_exact_through_re_centring_far_from_zero():
    """xPos (re-centred) at times near 10⁹: the attention equals the readable reference at times from 0 with
    the query rows multiplied by τ of their far absolute times (the factor reads the times, never an origin)."""
    q, k, v = (torch.randn(1, 2, 7, 8, dtype=F64) for _ in range(3))
    t0 = torch.arange(7, dtype=F64)
    far = t0 + 1e9
    T = SwanLengthScaling(alpha=0.2, train_length=4096)
    tau = T.factor(far[None], None)  # (1, 1, 7): about 1 + 0.2·log(2.4e5) ≈ 3.5
    assert float(tau.min()) > 3.0
    got = lp.attention(q, k, v, lp.xpos(8), far, far, temperature=T)
    ref = lp.attention_reference(q * tau.unsqueeze(-1), k, v, lp.xpos(8), t0, t0)
    assert rel_err(got, ref) < 1e-9
    cache = lp.KVCache()
    parts = [lp.attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], lp.xpos(8), far[:3], far[:3], cache=cache,
                          temperature=T)]
    for i in range(3, 7):
        parts.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], lp.xpos(8),
                                  far[i : i + 1], far[i : i + 1], cache=cache, temperature=T))
    assert rel_err(torch.cat(parts, 2), got) < 1e-9


def test_swan_length_scaling_refuses_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        SwanLengthScaling(alpha=-0.1, train_length=4096)
    with pytest.raises(ValueError, match="train_length"):
        SwanLengthScaling(alpha=0.1, train_length=0)
    with pytest.raises((TypeError, ValueError), match="train_length"):
        SwanLengthScaling(alpha=0.1, train_length=2.5)
    with pytest.raises(TypeError, match="train_length"):  # the model's trained length has no default
        SwanLengthScaling(alpha=0.1)
    with pytest.raises(ValueError, match="train_length"):
        lp.build_schedule("swan_gpt", 4, 8, alpha=0.5)
