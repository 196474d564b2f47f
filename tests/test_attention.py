"""Encoded attention: precise tables, time-ordered masks, re-centring, ALiBi without a bias matrix,
caches that keep time, padding, packing and gradients — each against an independent float64
reference computed from the lags (``attention_reference``) or from mpmath."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import liepos as lp
from liepos.recentre import POLY_ROUNDING

F64 = torch.float64
H, D = 4, 8


def encodings(heads=H, dim=D):
    return {
        "nope": lp.nope(dim),
        "rope": lp.rope(dim),
        "rope_half": lp.rope(dim, layout="half"),
        "xpos": lp.xpos(dim),
        "retnet": lp.retnet(dim, num_heads=heads),
        "decay": lp.decay(torch.linspace(0.01, 0.5, dim, dtype=F64)),
        "alibi": lp.alibi(dim, num_heads=heads),
        "jordan": lp.build("jordan", dim),
        "mixed": lp.Encoding(
            lp.direct_sum(
                lp.rope(dim // 2).generator,
                lp.Generator([-0.2], [0.0], [3]),
                lp.nope(dim // 2 - 3).generator,
            )
        ),
    }


def qkv(B=2, Sq=12, Sk=12, heads=H, kv_heads=H, dim=D, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, heads, Sq, dim, generator=g, dtype=dtype)
    k = torch.randn(B, kv_heads, Sk, dim, generator=g, dtype=dtype)
    v = torch.randn(B, kv_heads, Sk, 5, generator=g, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------------- 1. precise tables
def mp_cos_sin(w: float, t: int):
    import mpmath

    mpmath.mp.dps = 40
    a = mpmath.mpf(w) * t  # the float64 frequency taken as exact
    return float(mpmath.cos(a)), float(mpmath.sin(a))


@pytest.mark.parametrize("base", [1e4, 5e5])
def test_rope_table_precision_up_to_2_pow_31(base):
    enc = lp.rope(128, base=base)
    positions = torch.tensor([0, 40, 2048, 16384, 131071, 262144, 2**20, 2**24 + 1, 2**31 - 1], dtype=F64)
    tab = enc.tables(positions, "query").to(torch.float32)
    cos, sin = tab.a[:, 0::2], tab.b[:, 1::2]  # (positions, planes); b carries (-sin, +sin)
    w = enc.generator.freqs
    planes = list(range(0, 64, 7)) + [63]
    worst = 0.0
    for i, t in enumerate(positions.long().tolist()):
        for k in planes:
            c, s = mp_cos_sin(float(w[k]), t)
            worst = max(worst, abs(float(cos[i, k]) - c), abs(float(sin[i, k]) - s))
    assert worst < 2e-6


def test_tables_do_not_depend_on_input_dtype_or_autocast():
    enc = lp.rope(64)
    pos = torch.arange(0, 200000, 997)
    x = torch.randn(1, 2, pos.numel(), 64)
    ref = enc.query(x, pos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = enc.query(x, pos)
    assert torch.equal(inside, ref)
    for dt in (torch.bfloat16, torch.float16):
        xl = x.to(dt)
        # half precision: computed in float32 from the same float64 tables, rounded once
        assert torch.equal(enc.query(xl, pos), enc.query(xl.float(), pos).to(dt))
    # positions given as float32, int32, int64 or float64 give the same tables
    for p in (pos.int(), pos.float(), pos.double()):
        assert torch.equal(enc.query(x, p), ref)


# ---------------------------------------------------------------------- 2. attention
@pytest.mark.parametrize("name", list(encodings()))
def test_attention_matches_lag_reference(name):
    enc = encodings()[name]
    q, k, v = qkv()
    out = lp.attention(q, k, v, enc, block_size=5)
    ref = lp.attention_reference(q, k, v, enc, torch.arange(12), torch.arange(12))
    assert float((out - ref).abs().max()) < 1e-12


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi", "mixed"])
def test_causal_mask_follows_times_not_indices(name):
    enc = encodings()[name]
    q, k, v = qkv(B=1, Sq=7, Sk=9)
    gen = torch.Generator().manual_seed(3)
    qpos = torch.rand(7, generator=gen, dtype=F64) * 20
    kpos = torch.rand(9, generator=gen, dtype=F64) * 20  # unsorted, real-valued
    out = lp.attention(q, k, v, enc, qpos, kpos, block_size=3)
    ref = lp.attention_reference(q, k, v, enc, qpos, kpos)
    assert float((out - ref).abs().max()) < 1e-12
    # permuting keys (with their times) changes nothing
    p = torch.randperm(9, generator=gen)
    out2 = lp.attention(q, k[:, :, p], v[:, :, p], enc, qpos, kpos[p], block_size=3)
    assert float((out2 - out).abs().max()) < 1e-12


@pytest.mark.parametrize("name", ["rope", "xpos", "retnet", "alibi"])
def test_grouped_query_attention(name):
    enc = encodings()[name]
    q, k, v = qkv(kv_heads=2)
    out = lp.attention(q, k, v, enc)
    ref = lp.attention_reference(q, k, v, enc, None, torch.arange(12))
    assert float((out - ref).abs().max()) < 1e-12


def test_sdpa_scale_uses_the_content_dim_with_slots():
    enc = lp.alibi(D, num_heads=H)
    q, k, v = qkv()
    out = lp.attention(q, k, v, enc)
    t = torch.arange(12, dtype=F64)
    bias = -lp.alibi_slopes(H).reshape(1, H, 1, 1) * (t[:, None] - t[None, :])
    mask = t[:, None] >= t[None, :]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D) + bias).masked_fill(~mask, -math.inf)
    assert float((out - torch.softmax(scores, -1) @ v).abs().max()) < 1e-12


def test_bidirectional_is_refused_outside_the_family():
    q, k, v = qkv()
    for name in ["xpos", "decay", "alibi", "jordan"]:
        with pytest.raises(ValueError, match="bidirectional"):
            lp.attention(q, k, v, encodings()[name], causal=False)
    # rotations are fine both ways; the opt-in runs the rest
    out = lp.attention(q, k, v, lp.rope(D), causal=False)
    ref = lp.attention_reference(q, k, v, lp.rope(D), None, torch.arange(12), causal=False)
    assert float((out - ref).abs().max()) < 1e-12
    lp.attention(q, k, v, encodings()["xpos"], causal=False, allow_bidirectional=True)


# ---------------------------------------------------------------------- 3. re-centring
# bfloat16 keeps 8 significant bits: q, k, v and the output are rounded to ~4e-3 relative, so the
# documented bound for bfloat16 attention outputs (values ~N(0, 1)) is 3e-2 absolute.
BF16_TOL = 3e-2

@pytest.mark.slow
@pytest.mark.parametrize("name", ["xpos", "retnet", "decay", "alibi"])
@pytest.mark.parametrize("where", ["1e6", "1e9-real"])
def test_long_sequences_far_from_zero_stay_exact(name, where):
    S, heads, dim = 16384, 2, 16
    enc = encodings(heads, dim)[name]
    gen = torch.Generator().manual_seed(0)
    if where == "1e6":
        pos = torch.arange(S, dtype=F64) + 1_000_000
    else:
        pos = 1e9 + torch.cumsum(0.5 + torch.rand(S, generator=gen, dtype=F64), 0)  # irregular real times
    q = torch.randn(1, heads, S, dim, generator=gen)
    k = torch.randn(1, heads, S, dim, generator=gen)
    v = torch.randn(1, heads, S, 4, generator=gen)
    rows = torch.cat((torch.arange(0, 8), torch.arange(S // 2, S // 2 + 8), torch.arange(S - 16, S)))
    ref = lp.attention_reference(q[:, :, rows], k, v, enc, pos[rows], pos)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, BF16_TOL)):
        if dtype == torch.float32 and name == "xpos":
            # the whole 16 384 x 16 384 causal forward once (block-wise re-centring throughout)
            out = lp.attention(q, k, v, enc, pos, pos)[:, :, rows]
        else:
            # the checked query rows attend over all 16 384 keys
            out = lp.attention(q[:, :, rows].to(dtype), k.to(dtype), v.to(dtype), enc, pos[rows], pos)
        assert torch.isfinite(out).all()
        err = float((out.double() - ref).abs().max())
        assert err < tol, (dtype, err)


# ---------------------------------------------------------------------- 4. ALiBi without a bias matrix
class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("heads", [1, 3, 8, 12, 64])
def test_alibi_equals_press_bias_and_never_builds_a_seq_by_seq_tensor(heads):
    S, dim = 96, 8
    enc = lp.alibi(dim, num_heads=heads)
    q, k, v = qkv(B=1, Sq=S, Sk=S, heads=heads, kv_heads=heads, dim=dim, dtype=torch.float32)
    with LargestTensor() as probe:
        out = lp.attention(q, k, v, enc, block_size=16)
    # the largest tensor is a block of 16 query rows against all keys (or the keys themselves);
    # a materialised bias would be heads * S * S, six times more
    assert probe.largest <= heads * S * max(16, dim + 2) < heads * S * S
    t = torch.arange(S, dtype=F64)
    bias = -lp.alibi_slopes(heads).reshape(1, heads, 1, 1) * (t[:, None] - t[None, :])
    scores = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(dim) + bias)
    scores = scores.masked_fill(~(t[:, None] >= t[None, :]), -math.inf)
    assert float((out.double() - torch.softmax(scores, -1) @ v.double()).abs().max()) < 1e-5


# ---------------------------------------------------------------------- 5. caches that keep time
@pytest.mark.parametrize("name", list(encodings()))
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-9), (torch.float32, 1e-5)])
def test_full_equals_prefill_plus_decode_and_windows(name, dtype, tol):
    enc = encodings()[name]
    if max(enc.generator.sizes) > 2 and dtype == torch.float32:
        tol = POLY_ROUNDING  # Jordan parts: the cancellation bound re-centring keeps (liepos.recentre)
    q, k, v = qkv(B=2, Sq=20, Sk=20, kv_heads=2, dtype=dtype)
    full = lp.attention(q, k, v, enc)
    # prefill 8, then one token at a time
    cache = lp.KVCache()
    outs = [lp.attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], enc, cache=cache)]
    for i in range(8, 20):
        outs.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, cache=cache))
    assert float((torch.cat(outs, 2) - full).abs().max()) < tol
    # prefill 5, then windows of 3, 4, 8
    cache = lp.KVCache()
    outs, i = [lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache)], 5
    for w in (3, 4, 8):
        outs.append(lp.attention(q[:, :, i : i + w], k[:, :, i : i + w], v[:, :, i : i + w], enc, cache=cache))
        i += w
    assert float((torch.cat(outs, 2) - full).abs().max()) < tol


@pytest.mark.slow
@pytest.mark.parametrize("name", ["xpos", "retnet"])
def test_ten_thousand_decode_steps_do_not_overflow_or_drift(name, one_thread):
    steps, heads, dim = 10_000, 2, 8
    enc = encodings(heads, dim)[name]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, heads, steps, dim, generator=gen)
    k = torch.randn(1, heads, steps, dim, generator=gen)
    v = torch.randn(1, heads, steps, 4, generator=gen)
    cache = lp.KVCache()
    last = None
    for i in range(steps):
        last = lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, cache=cache)
        if i in (0, 999, 4999):
            assert torch.isfinite(last).all()
    ref = lp.attention_reference(q[:, :, -1:], k, v, enc, torch.tensor([steps - 1.0]), torch.arange(steps))
    assert float((last.double() - ref).abs().max()) < 1e-5


def test_cache_refuses_out_of_order_times():
    enc = lp.rope(D)
    q, k, v = qkv(B=1, Sq=4, Sk=4)
    cache = lp.KVCache()
    lp.attention(q, k, v, enc, torch.arange(10, 14), torch.arange(10, 14), cache=cache)
    with pytest.raises(ValueError, match="go back in time.*time 3.0 after a cached key at time 13.0"):
        lp.attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc, [3], [3], cache=cache)
    # a refused call leaves the cache as it was
    with pytest.raises(ValueError, match="attn_mask of shape"):
        lp.attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc, [14], [14], cache=cache,
                     attn_mask=torch.ones(3, 3, dtype=torch.bool))
    assert len(cache) == 4 and cache.times.tolist() == [[10.0, 11.0, 12.0, 13.0]]


@pytest.mark.parametrize("name", ["rope_half", "xpos", "retnet", "alibi", "jordan"])
def test_left_padding_equals_each_sequence_alone(name):
    enc = encodings()[name]
    lens = [9, 5]
    S = max(lens)
    q, k, v = qkv(B=2, Sq=S, Sk=S, dtype=torch.float32)
    keep = torch.zeros(2, S, dtype=torch.bool)
    pos = torch.zeros(2, S)
    for b, n in enumerate(lens):
        keep[b, S - n :] = True
        pos[b, S - n :] = torch.arange(n)
    out = lp.attention(q, k, v, enc, pos, pos, key_padding_mask=keep)
    for b, n in enumerate(lens):
        alone = lp.attention(q[b : b + 1, :, S - n :], k[b : b + 1, :, S - n :], v[b : b + 1, :, S - n :], enc)
        assert float((out[b : b + 1, :, S - n :] - alone).abs().max()) < 1e-5


@pytest.mark.parametrize("name", ["rope", "xpos", "retnet", "alibi", "decay"])
def test_packed_documents_equal_separate_sequences(name):
    enc = encodings()[name]
    lens = [4, 7, 3]
    S = sum(lens)
    q, k, v = qkv(B=1, Sq=S, Sk=S, dtype=torch.float32)
    docs = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).unsqueeze(0)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    out = lp.attention(q, k, v, enc, pos, pos, document_ids=docs)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        alone = lp.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc)
        assert float((out[:, :, sl] - alone).abs().max()) < 1e-5
        start += n


def test_dynamic_generator_cache_has_no_stale_keys():
    """A length-dependent generator re-encodes cached keys under the current version (HF #25104)."""
    base = lp.rope(D, layout="half")

    def rule(length):
        factor = max(1.0, length / 16)
        return base.replace(generator=base.generator.with_params(freqs=base.generator.freqs / factor), length_rule=rule)

    enc = base.replace(length_rule=rule)
    q, k, v = qkv(B=1, Sq=40, Sk=40)
    short = lp.attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc)
    cache = lp.KVCache()
    lp.attention(q, k, v, enc, cache=cache)  # a long prompt changes the generator
    again = lp.attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc)
    assert torch.equal(short, again)
    # decoding past the switch equals the full forward of the current generator
    cache = lp.KVCache()
    lp.attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], enc, cache=cache)
    step = lp.attention(q[:, :, 10:30], k[:, :, 10:30], v[:, :, 10:30], enc, cache=cache)
    full = lp.attention(q[:, :, :30], k[:, :, :30], v[:, :, :30], enc)
    assert float((step - full[:, :, 10:]).abs().max()) < 1e-12


# ---------------------------------------------------------------------- 6. gradients
@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
def test_gradcheck_through_encoding_and_attention():
    torch.manual_seed(0)
    q, k, v = (t.requires_grad_() for t in qkv(B=1, Sq=5, Sk=5, heads=2, kv_heads=2, dim=6))
    for enc in (lp.rope(6), lp.xpos(6), lp.alibi(6, num_heads=2), lp.build("jordan", 6)):
        assert torch.autograd.gradcheck(lambda q, k, v, enc=enc: lp.attention(q, k, v, enc, block_size=2), (q, k, v))


def test_gradcheck_learnable_rates_freqs_and_real_positions():
    rates = torch.tensor([-0.2, -0.05], dtype=F64, requires_grad=True)
    freqs = torch.tensor([0.9, 0.3], dtype=F64, requires_grad=True)
    pos = torch.tensor([0.0, 0.7, 1.9, 3.2], dtype=F64, requires_grad=True)
    q, k, v = qkv(B=1, Sq=4, Sk=4, heads=1, kv_heads=1, dim=4)

    def f(rates, freqs, pos):
        enc = lp.Encoding(lp.Generator(rates, freqs, [1, 1]))
        return lp.attention(q, k, v, enc, pos, pos, block_size=2)

    assert torch.autograd.gradcheck(f, (rates, freqs, pos))


# ---------------------------------------------------------------------- bad input
def test_attention_errors_name_the_argument():
    enc = lp.rope(D)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="key/value heads \\(3\\) must divide query heads \\(4\\)"):
        lp.attention(q, k[:, :3], v[:, :3], enc)
    with pytest.raises(ValueError, match="batch sizes differ"):
        lp.attention(q, k[:1], v[:1], enc)
    with pytest.raises(ValueError, match="must share heads and sequence length"):
        lp.attention(q, k, v[:, :, :5], enc)
    with pytest.raises(ValueError, match="q has head dim 8 but k has 6"):
        lp.attention(q, k[..., :6], v, enc)
    with pytest.raises(ValueError, match="key_positions has length 3 but the sequence has 12"):
        lp.attention(q, k, v, enc, None, torch.arange(3))
    with pytest.raises(ValueError, match="positions must have shape"):
        lp.attention(q, k, v, enc, torch.zeros(2, 2, 12))
    with pytest.raises(ValueError, match="positions must be finite"):
        lp.attention(q, k, v, enc, torch.full((12,), float("inf")))
    with pytest.raises(TypeError, match="`enc` must be a liepos.Encoding"):
        lp.attention(q, k, v, "rope")


# ---------------------------------------------------------------------- fused pieces for re-centred encodings
def test_recentred_diagonal_blocks_equal_the_masked_path_and_the_reference():
    """Equal increasing times: each query block sees the keys before it (no mask) and its own keys
    causally, merged by log-sum-exp. A fast decay (|λ| = 5: blocks of 6 time units) forces many blocks;
    real times, sinks and values carried by a generator ride along."""
    enc = lp.Encoding(lp.direct_sum(lp.rope(4).generator, lp.Generator([-5.0, -0.3], [0.0, 0.0], [1, 3])),
                      name="fast decay + jordan")
    q, k, v = qkv(B=2, Sq=40, Sk=40, kv_heads=2)
    v = v[..., :4]
    s = torch.linspace(-1, 1, H, dtype=F64)
    venc = lp.xpos(4)
    t = torch.cumsum(torch.rand(40, dtype=F64, generator=torch.Generator().manual_seed(4)) + 0.5, 0) + 1e6
    fused = lp.attention(q, k, v, enc, t, t, sinks=s, value_encoding=venc)
    everyone = torch.ones(40, 40, dtype=torch.bool)  # an explicit mask takes the masked query blocks
    masked = lp.attention(q, k, v, enc, t, t, sinks=s, value_encoding=venc, attn_mask=everyone)
    assert torch.allclose(fused, masked, atol=1e-10)
    ref = lp.attention_reference(q, k, v, enc, t, t, sinks=s, value_encoding=venc)
    assert torch.allclose(fused, ref, atol=1e-9)
    assert torch.allclose(lp.attention(q, k, v, enc, t, t), lp.attention_reference(q, k, v, enc, t, t), atol=1e-9)
    f = lambda q, k, v, s: lp.attention(q, k, v, enc, t[:12], t[:12], sinks=s)  # noqa: E731
    args = (q[:1, :, :12], k[:1, :, :12], v[:1, :, :12], s)
    assert torch.autograd.gradcheck(f, tuple(a.clone().requires_grad_(True) for a in args), fast_mode=True)
