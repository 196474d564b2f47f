"""Attention's inputs: never silently wrong, every refused call leaves the cache unchanged,
non-finite keys that no query sees change nothing, the natural self-attention call means what it
says, and the crashes of the adversarial run are named errors or work."""

import math

import pytest
import torch

import liepos as lp

F64 = torch.float64
H, D = 4, 8


def qkv(B=2, Sq=12, Sk=12, kv_heads=H, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Sq, D, generator=g, dtype=F64).to(dtype)
    k = torch.randn(B, kv_heads, Sk, D, generator=g, dtype=F64).to(dtype)
    v = torch.randn(B, kv_heads, Sk, 5, generator=g, dtype=F64).to(dtype)
    return q, k, v


def mixture():
    return lp.Encoding(lp.direct_sum(lp.rope(4).generator, lp.Generator([-0.2], [0.0], [3]), lp.nope(1).generator))


# ---------------------------------------------------------------------- 1. bfloat16 with Jordan blocks
def test_bfloat16_alibi_is_as_exact_as_bfloat16_sdpa_with_its_bias():
    """ALiBi in bfloat16 attends in bfloat16 (the bias rides as the kernel's float32 mask): within the
    contract (16·eps·max|v|) and within twice the error of bfloat16 SDPA given the same bias as a float32
    mask, on the same rounded inputs; float32 stays exact."""
    enc = lp.alibi(D, num_heads=H)
    q, k, v = qkv(B=1, Sq=64, Sk=64, dtype=torch.bfloat16)
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc)
    out = lp.attention(q, k, v, enc)
    assert out.dtype == torch.bfloat16
    err = float((out.double() - ref).abs().max())
    t = torch.arange(64, dtype=F64)
    slopes = lp.alibi_slopes(H)
    bias = -slopes.view(H, 1, 1) * (t.view(-1, 1) - t.view(1, -1)).clamp_min(0)  # (H, S, S)
    bias = bias.masked_fill(t.view(-1, 1) < t.view(1, -1), -math.inf).float()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0))
    assert float((sdpa.double() - ref).abs().max()) < 1e-1  # the bias above is ALiBi's (a wrong one is far off)
    assert err <= 2 * float((sdpa.double() - ref).abs().max()) + 1e-3
    assert err <= 16 * 2**-8 * float(v.abs().max())
    f32 = lp.attention(q.float(), k.float(), v.float(), enc)
    assert (f32.double() - ref).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["jordan", "mixture"])
def test_bfloat16_error_is_the_rounding_of_the_inputs(name):
    enc = {"jordan": lp.build("jordan", D), "mixture": mixture()}[name]
    q, k, v = qkv(B=1, Sq=64, Sk=64, dtype=torch.bfloat16)
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc)  # exact on the rounded inputs
    out = lp.attention(q, k, v, enc)
    assert out.dtype == torch.bfloat16
    # what is left is the rounding of the output to bfloat16 (8 bits: 2^-8 relative)
    assert ((out.double() - ref).abs() <= 2**-8 * ref.abs() + 1e-3).all()
    f32 = lp.attention(q.float(), k.float(), v.float(), enc)
    assert (f32.double() - ref).abs().max() < 1e-4
    # decode agrees with the full forward at the same level
    cache = lp.KVCache()
    steps = [lp.attention(q[:, :, :48], k[:, :, :48], v[:, :, :48], enc, cache=cache)]
    for i in range(48, 64):
        sl = slice(i, i + 1)
        steps.append(lp.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc, cache=cache))
    assert ((torch.cat(steps, 2).double() - ref).abs() <= 2**-8 * ref.abs() + 1e-3).all()


# ---------------------------------------------------------------------- 2. a refused call never writes
def snapshot(cache):
    return [None if t is None else t.clone() for t in (cache.k, cache.v, cache.times, cache.keep)]


def same(a, b):
    return all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["rope", "xpos", "retnet"])
def test_a_refused_call_leaves_the_cache_unchanged(name):
    enc = {"rope": lp.rope(D), "xpos": lp.xpos(D), "retnet": lp.retnet(D, num_heads=H)}[name]
    q, k, v = qkv()
    cache = lp.KVCache()
    lp.attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], enc, cache=cache)
    before = snapshot(cache)
    step = (q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9])
    bad_calls = [
        (dict(scale=-1.0), ValueError),
        (dict(scale="a"), TypeError),
        (dict(sinks=torch.zeros(3)), ValueError),
        (dict(key_padding_mask=torch.ones(2, 3, dtype=torch.bool)), ValueError),
        (dict(attn_mask=torch.ones(7, 7, dtype=torch.bool)), ValueError),
        (dict(key_positions=[2.0]), ValueError),  # back in time
    ]
    for kw, err in bad_calls:
        with pytest.raises(err):
            lp.attention(*step, enc, cache=cache, **kw)
        assert same(snapshot(cache), before), kw
    with pytest.raises(ValueError, match="per-head parameters for 3 heads"):
        lp.attention(*step, lp.retnet(D, num_heads=3), cache=cache)
    with pytest.raises(TypeError, match="must share one dtype"):  # a mixed-dtype call
        lp.attention(step[0].float(), step[1], step[2], enc, cache=cache)
    with pytest.raises(TypeError, match="must keep the cached dtype"):
        lp.attention(*(x.float() for x in step), enc, cache=cache)
    with pytest.raises(ValueError, match="batch size changed mid-cache"):
        lp.attention(*(x[:1] for x in step), enc, cache=cache)
    assert same(snapshot(cache), before)
    # the next correct call is the full forward's row
    out = lp.attention(*step, enc, cache=cache)
    assert torch.allclose(out, lp.attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], enc)[:, :, 8:], atol=1e-10)


# ---------------------------------------------------------------------- 4. invisible non-finite keys
@pytest.mark.parametrize("name", ["rope", "xpos", "alibi", "jordan"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_key_or_value_no_query_sees_changes_nothing(name, bad):
    enc = {"rope": lp.rope(D), "xpos": lp.xpos(D), "alibi": lp.alibi(D, num_heads=H), "jordan": lp.build("jordan", D)}[name]
    q, k, v = qkv()
    t = torch.arange(12, dtype=F64)
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[:, 2] = False  # padding
    clean = lp.attention(q, k, v, enc, t, t, key_padding_mask=keep, block_size=5)
    for which in ("k", "v"):
        kk, vv = k.clone(), v.clone()
        (kk if which == "k" else vv)[:, :, 2] = bad  # padded out
        (kk if which == "k" else vv)[:, :, 9] = bad  # later in time than queries 0..8
        out = lp.attention(q, kk, vv, enc, t, t, key_padding_mask=keep, block_size=5)
        assert torch.allclose(out[:, :, :9], clean[:, :, :9], atol=1e-12), which
        assert not torch.isfinite(out[:, :, 9:]).all()  # the queries that see it do see it
        # the fused causal kernel (no mask asked for) keeps the same guarantee
        out = lp.attention(q, kk, vv, enc)
        assert torch.allclose(out[:, :, :2], lp.attention(q, k, v, enc)[:, :, :2], atol=1e-12)
    # keys later than every query (cross-attention) and a cache
    cache = lp.KVCache()
    kk = k.clone()
    kk[:, :, 11] = math.nan
    lp.attention(q[:, :, :4], kk[:, :, :4], v[:, :, :4], enc, cache=cache)
    out = lp.attention(q[:, :, 4:6], kk[:, :, 4:], v[:, :, 4:], enc, t[4:6], t[4:], cache=cache)
    assert torch.allclose(out, lp.attention(q, k, v, enc)[:, :, 4:6], atol=1e-10)


# ---------------------------------------------------------------------- a non-finite query
QUERY_PATHS = {  # every kernel family a query row can meet
    "rope": lambda: lp.rope(64),  # SDPA's flash kernel
    "xpos": lambda: lp.xpos(64),  # the causal tiling
    "decay": lambda: lp.build("decay", 64, 2),  # the tiling (and the native kernel where it runs)
    "retnet": lambda: lp.retnet(64, num_heads=2),  # faded keys
    "alibi": lambda: lp.alibi(64, num_heads=2),  # the per-key mask
    "jordan": lambda: lp.build("jordan", 64),  # float32 attention for half precision
}


@pytest.mark.parametrize("name", sorted(QUERY_PATHS))
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_query_row_is_nan_in_its_row_alone(name, dtype, bad):
    """Whatever kernel runs (SDPA's flash kernels give such a row 0 on some CPUs and dtypes, NaN on others), a
    query row holding a NaN or an infinity is NaN, every other row is the clean call's, as the reference says."""
    enc = QUERY_PATHS[name]()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 700, 64, generator=g, dtype=F64).to(dtype) for _ in range(3))
    qq = q.clone()
    qq[0, 1, 333, 7] = bad
    with torch.no_grad():
        clean, out = lp.attention(q, k, v, enc), lp.attention(qq, k, v, enc)
    assert torch.isnan(out[0, 1, 333]).all()
    rest = torch.ones(700, dtype=torch.bool)
    rest[333] = False
    assert torch.equal(out[0, 0], clean[0, 0]) and torch.equal(out[0, 1, rest], clean[0, 1, rest])
    if dtype == F64:
        ref = lp.attention_reference(qq[..., :40, :], k[..., :40, :], v[..., :40, :], enc)
        assert ref.isnan().sum() == 0 and not qq[..., :40, :].isnan().any()  # the bad row lies past 40
        ref = lp.attention_reference(qq[..., 300:340, :], k[..., :340, :], v[..., :340, :], enc,
                                     torch.arange(300, 340), torch.arange(340))
        assert torch.isnan(ref[0, 1, 33]).all() and ref.isnan().sum() == 64


def test_a_non_finite_query_is_nan_through_a_cache_and_masks():
    """A decode step and a masked call keep the rule: the bad row NaN, the others as without it."""
    enc = lp.xpos(D)
    q, k, v = qkv()
    qq = q.clone()
    qq[1, 2, 10, 0] = math.nan
    cache = lp.KVCache()
    lp.attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], enc, cache=cache)
    step = lp.attention(qq[:, :, 10:], k[:, :, 10:], v[:, :, 10:], enc, cache=cache)
    full = lp.attention(q, k, v, enc)[:, :, 10:]
    assert torch.isnan(step[1, 2, 0]).all() and step.isnan().sum() == step.shape[-1]
    keep = ~torch.isnan(step)
    assert torch.allclose(step[keep], full[keep], atol=1e-10)
    keys = torch.ones(2, 12, dtype=torch.bool)
    keys[:, 3] = False
    masked = lp.attention(qq, k, v, enc, key_padding_mask=keys, block_size=4)
    ref = lp.attention_reference(qq, k, v, enc, mask=keys[:, None, None, :])
    assert torch.equal(masked.isnan(), ref.isnan()) and masked.isnan().sum() == v.shape[-1]
    assert torch.allclose(masked.nan_to_num(0.0), ref.nan_to_num(0.0), atol=1e-10)


# ---------------------------------------------------------------------- 8. positions without key_positions
@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_positions_alone_in_self_attention_place_the_keys_there_too(name):
    enc = {"rope": lp.rope(D), "xpos": lp.xpos(D), "alibi": lp.alibi(D, num_heads=H)}[name]
    q, k, v = qkv()
    p = torch.arange(12, dtype=F64) + 5000
    alone = lp.attention(q, k, v, enc, positions=p)
    assert torch.equal(alone, lp.attention(q, k, v, enc, positions=p, key_positions=p))
    # cross-attention (other lengths) keeps the documented default 0 … k_seq − 1
    out = lp.attention(q[:, :, :3], k, v, enc, positions=[11.0, 12.0, 13.0])
    ref = lp.attention_reference(q[:, :, :3], k, v, enc, [11.0, 12.0, 13.0], torch.arange(12))
    assert torch.allclose(out, ref, atol=1e-10)


# ---------------------------------------------------------------------- crashes and bad scales
@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_empty_batches_and_sequences(name):
    enc = {"rope": lp.rope(D), "xpos": lp.xpos(D), "alibi": lp.alibi(D, num_heads=H)}[name]
    q, k, v = qkv()
    assert lp.attention(q[:0], k[:0], v[:0], enc).shape == (0, H, 12, 5)
    assert lp.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], enc).shape == (2, H, 0, 5)
    assert torch.equal(lp.attention(q[:, :, :3], k[:, :, :0], v[:, :, :0], enc, [0.0, 1.0, 2.0]),
                       torch.zeros(2, H, 3, 5, dtype=F64))
    cache = lp.KVCache()
    lp.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], enc, cache=cache)
    out = lp.attention(q, k, v, enc, cache=cache)
    assert torch.allclose(out, lp.attention(q, k, v, enc), atol=1e-12)


def test_bad_scale_and_integer_inputs_are_named_errors():
    q, k, v = qkv()
    for enc in (lp.rope(D), lp.xpos(D)):
        for bad in (0.0, -1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="`scale` must be"):
                lp.attention(q, k, v, enc, scale=bad)
        with pytest.raises(TypeError, match="`scale` must be a real number, got 'a'"):
            lp.attention(q, k, v, enc, scale="a")
        with pytest.raises(TypeError, match="`q` must have a floating dtype, got torch.int64"):
            lp.attention(q.long(), k, v, enc)
        with pytest.raises(TypeError, match="`causal` must be True or False"):
            lp.attention(q, k, v, enc, causal=1)
        with pytest.raises(ValueError, match="`block_size` must be >= 1"):
            lp.attention(q, k, v, enc, block_size=0)
        with pytest.raises(TypeError, match="`cache` must be a liepos.KVCache"):
            lp.attention(q, k, v, enc, cache={})
    assert torch.allclose(lp.attention(q, k, v, lp.rope(D), scale=0.1),
                          lp.attention_reference(q, k, v, lp.rope(D), scale=0.1), atol=1e-12)
