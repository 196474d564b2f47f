"""Layouts as a change of basis (liepos.interop.permute_qk_weights).

Meta's interleaved (complex) RoPE on Meta-layout q/k weights equals Hugging Face's half-split
RoPE on the permuted weights; the references are the upstream formulas themselves:

* Meta: ``precompute_freqs_cis`` / ``apply_rotary_emb`` of facebookresearch/llama ``llama/model.py``
  (https://github.com/meta-llama/llama/blob/main/llama/model.py), transcribed below;
* Hugging Face: ``apply_rotary_pos_emb`` / ``rotate_half`` of ``transformers`` (imported), and the
  row permutation of ``convert_llama_weights_to_hf.permute`` (the script is not shipped in the
  wheel; its one line is transcribed from
  https://github.com/huggingface/transformers/blob/v4.45.0/src/transformers/models/llama/convert_llama_weights_to_hf.py).
"""

from __future__ import annotations

import pytest
import torch

import liepos as lp
from liepos.interop import layout_permutation, permute_qk_weights

D, H, HK, DIM = 16, 4, 2, 64  # head dim, query heads, kv heads, model dim


# ---------------------------------------------------------------------- upstream, transcribed
def meta_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: (dim // 2)] / dim))
    t = torch.arange(end, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex128


def meta_apply_rotary_emb(xq, xk, freqs_cis):
    # (batch, seq, heads, head_dim) as in llama/model.py
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out, xk_out


def hf_convert_permute(w, n_heads, dim1, dim2):
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def scores(q, k):  # (B, S, H, D) -> (B, H, S, S), GQA by repetition
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2)


# ---------------------------------------------------------------------- the identity
def test_meta_interleaved_equals_hf_half_on_permuted_weights():
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    wq = torch.randn(H * D, DIM, dtype=torch.float64, generator=g)
    wk = torch.randn(HK * D, DIM, dtype=torch.float64, generator=g)
    x = torch.randn(2, 50, DIM, dtype=torch.float64, generator=g)
    S = x.shape[1]

    # Meta: interleaved weights, complex RoPE
    q = (x @ wq.T).view(2, S, H, D)
    k = (x @ wk.T).view(2, S, HK, D)
    mq, mk = meta_apply_rotary_emb(q, k.repeat_interleave(1, 2), meta_freqs_cis(D, S))
    meta = scores(mq, mk)

    # Hugging Face: permuted weights, rotate_half RoPE (cos/sin built as LlamaRotaryEmbedding does)
    wq2, wk2 = permute_qk_weights(wq, H, "interleaved", "half"), permute_qk_weights(wk, HK, "meta", "hf")
    assert torch.equal(wq2, hf_convert_permute(wq, H, H * D, DIM))
    assert torch.equal(wk2, hf_convert_permute(wk, HK, HK * D, DIM))
    q2 = (x @ wq2.T).view(2, S, H, D).transpose(1, 2)
    k2 = (x @ wk2.T).view(2, S, HK, D).transpose(1, 2)
    inv = lp.rope_freqs(D)
    freqs = torch.arange(S, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    hq, hk = apply_rotary_pos_emb(q2, k2, emb.cos()[None], emb.sin()[None])
    hf = scores(hq.transpose(1, 2), hk.transpose(1, 2))
    assert (hf - meta).abs().max() < 1e-9 * meta.abs().max()

    # liepos: interleaved RoPE on the Meta weights, half RoPE on the permuted ones
    t = torch.arange(S)
    li = scores(lp.rope(D).query(q.transpose(1, 2), t).transpose(1, 2),
                lp.rope(D).key(k.transpose(1, 2), t).transpose(1, 2))
    lh = scores(lp.rope(D, layout="half").query(q2, t).transpose(1, 2),
                lp.rope(D, layout="half").key(k2, t).transpose(1, 2))
    assert (li - meta).abs().max() < 1e-9 * meta.abs().max()
    assert (lh - meta).abs().max() < 1e-9 * meta.abs().max()
    # without the permutation the scores are wrong (the bug of llama2.c PR#286 and friends)
    q_bad = (x @ wq.T).view(2, S, H, D).transpose(1, 2)
    k_bad = (x @ wk.T).view(2, S, HK, D).transpose(1, 2)
    bad = scores(lp.rope(D, layout="half").query(q_bad, t).transpose(1, 2),
                 lp.rope(D, layout="half").key(k_bad, t).transpose(1, 2))
    assert (bad - meta).abs().max() > 1e-2 * meta.abs().max()


@pytest.mark.parametrize("rotary_dim", [None, 8, 0])
def test_round_trip_is_exact(rotary_dim):
    g = torch.Generator().manual_seed(1)
    for w in (torch.randn(H * D, DIM, generator=g), torch.randn(H * D, generator=g),
              torch.randn(HK * D, DIM, dtype=torch.bfloat16, generator=g)):
        n = H if w.shape[0] == H * D else HK
        there = permute_qk_weights(w, n, "interleaved", "half", rotary_dim=rotary_dim)
        back = permute_qk_weights(there, n, "half", "interleaved", rotary_dim=rotary_dim)
        assert torch.equal(back, w) and back.dtype == w.dtype
        assert torch.equal(permute_qk_weights(w, n, "half", "half"), w)


def test_bias_is_permuted_like_the_weight_rows():
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(H * D, DIM, generator=g), torch.randn(H * D, generator=g)
    x = torch.randn(3, DIM, generator=g)
    y = x @ w.T + b
    y2 = x @ permute_qk_weights(w, H, "meta", "neox").T + permute_qk_weights(b, H, "gptj", "hf")
    assert torch.equal(y2, y.view(3, H, D)[..., layout_permutation(D, "meta", "hf")].reshape(3, -1))


def test_partial_rotary_matches_liepos_layouts():
    """With rotary_dim < head_dim (the NoPE dims stay last), the permutation is the change of
    basis between liepos's own layouts of the same generator (from_hf's partial rotary)."""
    enc = lp.from_hf({"head_dim": D, "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    assert enc.layout == "half"
    inter = enc.replace(layout="interleaved")
    idx = layout_permutation(D, "half", "interleaved", rotary_dim=8)
    q = torch.randn(1, 2, 7, D, dtype=torch.float64)
    t = torch.arange(7) * 13
    assert torch.allclose(enc.query(q, t)[..., idx], inter.query(q[..., idx], t), atol=1e-12)
    assert idx[8:].tolist() == list(range(8, D))


def test_errors_name_the_argument():
    w = torch.randn(H * D, DIM)
    with pytest.raises(ValueError, match="from_layout"):
        permute_qk_weights(w, H, "complex", "half")
    with pytest.raises(ValueError, match="to_layout"):
        permute_qk_weights(w, H, "half", None)
    with pytest.raises(ValueError, match="num_heads=5"):
        permute_qk_weights(w, 5, "half", "interleaved")
    with pytest.raises(ValueError, match="rotary_dim"):
        permute_qk_weights(w, H, "half", "interleaved", rotary_dim=7)
    with pytest.raises(ValueError, match="rotary_dim"):
        permute_qk_weights(torch.randn(H * 5, DIM), H, "half", "interleaved")
    with pytest.raises(ValueError, match="shape"):
        permute_qk_weights(torch.randn(2, 3, 4), 1, "half", "interleaved")
    with pytest.raises(TypeError, match="w must be"):
        permute_qk_weights([1.0], 1, "half", "interleaved")
