"""Learned attention sinks: the sink logit joins the softmax denominator only.

The reference is written out here, independently of liepos's kernels: scores from the encoded
queries and keys, masked by selection, softmax over ``[scores, s_h]``, the sink column dropped.
"""

import math

import pytest
import torch

import liepos as lp

F64 = torch.float64
H, D = 4, 8


def encodings():
    return {
        "rope": lp.rope(D),
        "rope_half": lp.rope(D, layout="half"),
        "xpos": lp.xpos(D),
        "retnet": lp.retnet(D, num_heads=H),
        "alibi": lp.alibi(D, num_heads=H),
        "jordan": lp.build("jordan", D),
    }


def qkv(B=2, Sq=10, Sk=10, kv_heads=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Sq, D, generator=g, dtype=F64)
    k = torch.randn(B, kv_heads, Sk, D, generator=g, dtype=F64)
    v = torch.randn(B, kv_heads, Sk, 5, generator=g, dtype=F64)
    s = torch.randn(H, generator=g, dtype=F64)
    return q, k, v, s


def with_sink_column(q, k, v, enc, t, s_pos, sinks, visible):
    """softmax over [scores, s_h] with the sink column dropped (float64, explicit scores)."""
    B = q.shape[0]
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    o = float(max(t.max(), s_pos.max()))  # one origin for the whole call: scores do not depend on it
    # c·qᵀA k (+ the slots' unscaled bias): scale the content of q, then encode
    z = enc.query(q / math.sqrt(D), t, origin=o) @ enc.key(k, s_pos, origin=o).transpose(-1, -2)
    z = z.masked_fill(~visible, -math.inf)
    col = sinks.view(1, H, 1, 1).expand(B, H, q.shape[2], 1)
    w = torch.softmax(torch.cat((z, col), -1), -1)[..., :-1]
    return w @ v


@pytest.mark.parametrize("name", list(encodings()))
def test_sinks_equal_a_softmax_with_a_dropped_sink_column(name):
    enc = encodings()[name]
    q, k, v, s = qkv()
    t = torch.arange(10, dtype=F64)
    causal = (t[None, :] <= t[:, None]).expand(1, 1, 10, 10)
    want = with_sink_column(q, k, v, enc, t, t, s, causal)
    assert torch.allclose(lp.attention(q, k, v, enc, sinks=s), want, atol=1e-10)  # fused causal kernel
    assert torch.allclose(lp.attention(q, k, v, enc, sinks=s, block_size=3), want, atol=1e-10)
    assert torch.allclose(lp.attention_reference(q, k, v, enc, sinks=s), want, atol=1e-10)


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_sinks_with_real_times_padding_and_grouped_queries(name):
    enc = encodings()[name]
    q, k, v, s = qkv(kv_heads=2, seed=1)
    t = torch.cumsum(torch.rand(10, dtype=F64, generator=torch.Generator().manual_seed(2)) + 0.1, 0) + 5e5
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[0, :3] = False
    vis = (t[None, :] <= t[:, None])[None, None] & keep[:, None, None, :]
    out = lp.attention(q, k, v, enc, t, t, key_padding_mask=keep, sinks=s, block_size=4)
    assert torch.allclose(out, with_sink_column(q, k, v, enc, t, t, s, vis), atol=1e-9)


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi", "jordan"])
def test_sinks_prefill_plus_decode_equal_the_full_forward(name):
    enc = encodings()[name]
    q, k, v, s = qkv(Sq=9, Sk=9)
    full = lp.attention(q, k, v, enc, sinks=s)
    cache = lp.KVCache()
    outs = [lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache, sinks=s)]
    for i in range(5, 9):
        outs.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, cache=cache, sinks=s))
    assert torch.allclose(torch.cat(outs, 2), full, atol=1e-10)


def test_sinks_bidirectional_and_a_query_that_sees_nothing():
    enc = lp.rope(D)
    q, k, v, s = qkv()
    t = torch.arange(10, dtype=F64)
    everyone = torch.ones(1, 1, 10, 10, dtype=torch.bool)
    want = with_sink_column(q, k, v, enc, t, t, s, everyone)
    assert torch.allclose(lp.attention(q, k, v, enc, causal=False, sinks=s), want, atol=1e-10)
    # a query that sees no key puts all its weight on the sink: zeros, as without sinks
    early = lp.attention(q[:, :, :1], k, v, enc, [-1.0], t, sinks=s)
    assert torch.equal(early, torch.zeros_like(early))


def test_learnable_sinks_gradcheck():
    q, k, v, s = qkv(B=1, Sq=5, Sk=5)
    s.requires_grad_(True)
    q.requires_grad_(True)
    for enc in (lp.rope(D), lp.xpos(D)):
        for block in (256, 2):  # the fused causal kernel, then query blocks with masks
            f = lambda q, s: lp.attention(q, k, v, enc, sinks=s, block_size=block)  # noqa: B023, E731
            assert torch.autograd.gradcheck(f, (q, s), fast_mode=True)
            assert torch.autograd.gradcheck(lambda s: f(q.detach(), s), (s,))  # noqa: B023


def test_sinks_in_float32_and_bfloat16():
    q, k, v, s = qkv()
    want = lp.attention_reference(q, k, v, lp.alibi(D, num_heads=H), sinks=s)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        out = lp.attention(q.to(dtype), k.to(dtype), v.to(dtype), lp.alibi(D, num_heads=H), sinks=s.to(dtype))
        assert out.dtype == dtype
        assert (out.double() - want).abs().max() < tol


def test_bad_sinks_are_refused():
    q, k, v, s = qkv()
    enc = lp.rope(D)
    with pytest.raises(ValueError, match=r"`sinks` must have shape \(4,\)"):
        lp.attention(q, k, v, enc, sinks=s[:3])
    with pytest.raises(ValueError, match="`sinks` must have 1 dims"):
        lp.attention(q, k, v, enc, sinks=s[None])
    with pytest.raises(ValueError, match="`sinks` must be finite"):
        lp.attention(q, k, v, enc, sinks=torch.full((H,), math.nan))
    with pytest.raises(TypeError, match="`sinks` must be real numbers"):
        lp.attention(q, k, v, enc, sinks="big")
