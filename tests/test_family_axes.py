"""Several axes and several requests: MRoPE-Interleave against transformers' Qwen3-VL rotary, golden-gate /
random-direction N-D RoPE and Multi-Head RoPE against their formulas, per-request encodings in one batch and
positions through a coordinate map — each exact through a KVCache."""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp
from liepos.coordinates import Mapped, ring
from liepos.per_request import PerRequest

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def test_mrope_interleaved_matches_qwen3_vl():
    """transformers' Qwen3VLTextRotaryEmbedding (cos/sin recomposed per axis) applied with its own
    apply_rotary_pos_emb, against lp.mrope_interleaved in the half layout."""
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding, apply_rotary_pos_emb

    cfg = Qwen3VLTextConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5]})
    rot = Qwen3VLTextRotaryEmbedding(cfg)
    S = 7
    pos = torch.stack([torch.arange(S), torch.arange(S) % 3, torch.arange(S) // 2 + 5])  # (3, S): t, h, w
    q = torch.randn(1, 2, S, 32, dtype=torch.float32)
    cos, sin = rot(q, pos[:, None, :])
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    got = lp.mrope_interleaved(32, (6, 5, 5)).query(q.double(), pos.T.double())  # positions (S, 3)
    assert rel_err(got, want.double()) < 1e-5  # transformers computes the angles in float32


def test_rope_directions_golden_angle_and_relative_in_2d():
    enc = lp.rope_directions(8, directions="golden", base=50.0)
    w = enc.generator.freqs  # (axes, planes)
    phi = torch.arange(4, dtype=F64) * math.pi * (3 - math.sqrt(5))
    want = torch.stack([torch.cos(phi), torch.sin(phi)]) * lp.rope_freqs(8, 50.0)
    assert rel_err(w, want) < 1e-15
    q, k = torch.randn(1, 1, 3, 8, dtype=F64), torch.randn(1, 1, 3, 8, dtype=F64)
    p = torch.randn(3, 2, dtype=F64) * 10
    shift = torch.tensor([3.5, -7.25], dtype=F64)
    s1 = enc.query(q, p) @ enc.key(k, p).transpose(-1, -2)
    s2 = enc.query(q, p + shift) @ enc.key(k, p + shift).transpose(-1, -2)
    assert rel_err(s2, s1) < 1e-12
    d = lp.rope_directions(8, axes=3, directions="random").generator
    assert d.freqs.shape == (3, 4) and rel_err(d.freqs.norm(dim=0), lp.rope_freqs(8, 100.0)) < 1e-14
    with pytest.raises(ValueError, match="golden"):
        lp.rope_directions(8, axes=3)


def test_mhrope_assigns_one_axis_per_head():
    enc = lp.mhrope(8, num_heads=4, axes=3, head_axes=[2, 0, 1, 2])
    q = torch.randn(1, 4, 2, 8, dtype=F64)
    p = torch.tensor([[3.0, 5.0, 7.0], [1.0, 2.0, 9.0]], dtype=F64)  # (S, axes)
    got = enc.query(q, p)
    for h, a in enumerate([2, 0, 1, 2]):
        assert rel_err(got[:, h], lp.rope(8, layout="half").query(q[:, h : h + 1], p[:, a])[:, 0]) < 1e-13
    with pytest.raises(ValueError, match="head_axes"):
        lp.mhrope(8, num_heads=2, axes=2, head_axes=[0, 2])


@pytest.mark.parametrize("make", [lambda: lp.mrope_interleaved(16, (4, 2, 2)), lambda: lp.rope_directions(16, 3, "random"),
                                  lambda: lp.mhrope(16, num_heads=2)], ids=["mrope_interleaved", "rope_directions", "mhrope"])
def test_decode_equals_full_forward_on_several_axes(make):
    enc = make()
    A = enc.num_axes
    q, k, v = (torch.randn(1, 2, 6, 16, dtype=F64) for _ in range(3))
    p = torch.randn(6, A, dtype=F64).mul(5).round()
    full = lp.attention(q, k, v, enc, p, p)
    cache = lp.KVCache()
    parts = [lp.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, p[:4], p[:4], cache=cache)]
    for i in (4, 5):
        parts.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, p[i : i + 1],
                                  p[i : i + 1], cache=cache))
    assert rel_err(torch.cat(parts, 2), full) < 1e-12


# ---------------------------------------------------------------------- per-request encodings
def requests():
    yarn = lp.scaling.yarn(lp.rope(16), factor=4.0, original_max_position_embeddings=4)
    return [lp.rope(16), yarn, lp.rope(16), lp.scaling.linear(lp.rope(16), factor=2.0)]


def test_per_request_rows_are_their_own_encodings():
    encs = requests()
    pr = PerRequest(encs)
    assert len(pr.groups) == 3  # the two plain RoPE rows share one call
    q, k, v = (torch.randn(4, 2, 9, 16, dtype=F64) for _ in range(3))
    keep = torch.ones(4, 9, dtype=torch.bool)
    keep[2, :3] = False
    out = pr.attention(q, k, v, key_padding_mask=keep)
    for b, e in enumerate(encs):
        one = lp.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], e, key_padding_mask=keep[b : b + 1])
        assert rel_err(out[b : b + 1], one) < 1e-13, b
        ref = lp.attention_reference(q[b : b + 1], k[b : b + 1], v[b : b + 1], e, torch.arange(9), torch.arange(9),
                                     mask=keep[b : b + 1, None, None, :])
        assert rel_err(out[b : b + 1, :, 3:] if b == 2 else out[b : b + 1], ref[:, :, 3:] if b == 2 else ref) < 1e-12


def test_per_request_decode_equals_full_forward():
    pr = PerRequest(requests())
    q, k, v = (torch.randn(4, 2, 8, 16, dtype=F64) for _ in range(3))
    full = pr.attention(q, k, v)
    cache = pr.cache()
    parts = [pr.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache=cache)]
    for i in range(5, 8):
        parts.append(pr.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], cache=cache))
    assert rel_err(torch.cat(parts, 2), full) < 1e-12 and len(cache) == 8


def test_per_request_refusals_leave_every_cache_as_it_was():
    pr = PerRequest(requests())
    cache = pr.cache()
    q, k, v = (torch.randn(4, 2, 3, 16, dtype=F64) for _ in range(3))
    pr.attention(q, k, v, cache=cache)
    back = torch.tensor([[5.0]] * 4, dtype=F64)
    back[3] = 0.0  # the last group's time goes back: it refuses after the first two groups appended
    with pytest.raises(ValueError, match="back in time"):
        pr.attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], back, back, cache=cache)
    assert [len(c) for c in cache.caches] == [3, 3, 3]
    with pytest.raises(TypeError, match="cache"):
        pr.attention(q, k, v, cache=lp.KVCache())
    with pytest.raises(ValueError, match="batch"):
        pr.attention(q[:2], k[:2], v[:2])


# ---------------------------------------------------------------------- positions through a map
def test_a_ring_map_is_relative_in_its_coordinates_only():
    """Circle-RoPE's shape: positions on a ring, then 2-D RoPE. Relative in the mapped coordinates (diagnose of
    the 2-axis encoding), not in the raw positions (diagnose of the composite)."""
    enc = lp.rope_directions(8, base=10.0)
    m = Mapped(enc, ring(16, radius=3.0))
    raw = lp.diagnose(m.query, m.key, dim=8, domain="integer", label="ring ∘ rope_directions")
    assert not raw.relative and "not_translation_invariant" in raw.names()
    mapped = lp.diagnose(enc.query, enc.key, dim=8, axes=2)
    assert mapped.relative
    q, k, v = (torch.randn(1, 1, 5, 8, dtype=F64) for _ in range(3))
    t = torch.arange(5, dtype=F64)
    out = lp.attention(q, k, v, enc, m.positions(t), m.positions(t))  # lp.attention takes the mapped positions
    z = m.query(q, t) @ m.key(k, t).transpose(-1, -2) / math.sqrt(8)  # the composite's scores, causal by token
    w = torch.softmax(z.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf), -1)
    assert rel_err(out, w @ v) < 1e-12
