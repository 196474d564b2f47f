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


def _dense_with_sinks(q, k, v, visible, c, sinks):
    """softmax(c q kᵀ masked by selection [, s_h]) v with the sink column dropped, in float64; a row that
    weighs a non-finite value is NaN."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    z = (c * q @ k.transpose(-1, -2)).masked_fill(~visible, -math.inf)
    if sinks is not None:
        z = torch.cat((z, sinks.view(1, -1, 1, 1).expand(*z.shape[:-1], 1)), -1)
    w = torch.softmax(z, -1)[..., : k.shape[2]]
    bad = ~torch.isfinite(v)
    out = w @ v.masked_fill(bad, 0.0)
    return out.masked_fill(((w != 0).double() @ bad.double()) > 0, math.nan)


@pytest.mark.parametrize("causal, masked", [(True, False), (False, False), (False, True)])  # callers pass one of them
@pytest.mark.parametrize("finite", [True, False])
@pytest.mark.parametrize("Sk, kv_heads", [(6, H), (9, 2)])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_the_one_sdpa_call_equals_a_dense_softmax_with_the_sink_column(causal, masked, finite, Sk, kv_heads, with_sinks):
    """``attention_sdpa.sdpa`` on its own, every branch: causal (top-left, as SDPA aligns it), a boolean mask,
    or neither, grouped keys, a sink column or none, and the select-masked form for a NaN value (which
    reaches exactly the rows that weigh it) — against the dense softmax written out."""
    from liepos.attention_sdpa import sdpa

    q, k, v, s = qkv(B=2, Sq=6, Sk=Sk, kv_heads=kv_heads, seed=3)
    sinks = s if with_sinks else None
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(2, 1, 6, Sk, generator=g) < 0.7 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every row sees a key
    if not finite:
        v = v.clone()
        v[:, :, 3, 1] = math.nan  # seen by the rows at or past key 3 (causal) or whose mask keeps it
    c = D**-0.5
    visible = torch.ones(6, Sk, dtype=torch.bool)
    if causal:
        visible = visible.tril()
    if mask is not None:
        visible = visible & mask
    got = sdpa(q, k, v, mask, c, is_causal=causal, sinks=sinks, finite=finite)
    want = _dense_with_sinks(q, k, v, visible, c, sinks)
    assert got.shape == want.shape == (2, H, 6, 5)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    if not finite:
        assert bool(torch.isnan(want).any()) and not bool(torch.isnan(want).all())
    assert torch.allclose(got.nan_to_num(), want.nan_to_num(), rtol=1e-12, atol=1e-12)
