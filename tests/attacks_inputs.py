"""Attacks on the entry points' inputs, registered in tests/attacks.py's table (run by it): Hugging Face round
trips of odd configs, classify and diagnose on adversarial generators, NaN / inf / empty inputs, overlapping
layouts, out-of-range positions, meta tensors, argument types and devices, float16 near its range, and the
layers of tests/attacks_layers.py met in other ways."""

from __future__ import annotations

import math

import torch

import liepos as lp
from attacks import ENCS, F64, attack, ref, refuses, rnd
from attacks_layers import (CUTS, PR_ENCS, att, decode, per_row, ssmax_full, tau_ref)
from liepos.coordinates import circle_rope, ring, vrope, vrope_encoding
from liepos.schedule import build_schedule, window_mask
from liepos.temperature import ScalableSoftmax, SwanLengthScaling
# 18. Hugging Face configs, odd ones, there and back
def _roundtrip(cfg):
    enc = lp.from_hf(cfg); back = lp.from_hf(lp.to_hf(enc) | {"hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads})
    q, k, v = (rnd(1, 1, 9, enc.content_dim, seed=i) for i in range(3)); p = torch.arange(9, dtype=F64) * 700
    return lp.attention(q, k, v, back, p, p), lp.attention(q, k, v, enc, p, p), 1e-9

for rname, rs, extra in (("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 512}, {}),
                         ("yarn partial", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, {"partial_rotary_factor": 0.75}),
                         ("linear head_dim", {"rope_type": "linear", "factor": 2.5}, {"head_dim": 12}),
                         ("dynamic", {"rope_type": "dynamic", "factor": 2.0}, {})):
    @attack(f"hf round trip {rname}")
    def _(rs=rs, extra=extra):
        from transformers import LlamaConfig
        cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=2048, rope_theta=1e4, rope_scaling=rs, **extra)
        return _roundtrip(cfg)

@attack("hf unknown rope type refused")
def _():
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4)
    cfg.rope_scaling = {"rope_type": "warp", "factor": 2.0}
    if hasattr(cfg, "rope_parameters") and isinstance(cfg.rope_parameters, dict):
        cfg.rope_parameters = {**cfg.rope_parameters, "rope_type": "warp"}
    return refuses(lambda: lp.from_hf(cfg), "warp")

@attack("to_hf of xpos refused")
def _():
    return refuses(lambda: lp.to_hf(lp.xpos(8)), "decay")

# 19. diagnose / classify on adversarial generators
def _classified(X, blocks):
    c = lp.classify(X)
    got = torch.tensor(sorted((round(l, 6), round(abs(w), 6), n) for l, w, n in c.blocks), dtype=F64)
    return got, torch.tensor(sorted(blocks), dtype=F64), 1e-6

@attack("classify nearly defective 2x2 (eps 1e-14)")
def _():
    return _classified([[-0.5, 1.0], [1e-14, -0.5]], [(-0.5, 0.0, 2)])

@attack("classify well separated 2x2 (eps 1e-2) is diagonal")
def _():
    return _classified([[-0.5, 1.0], [1e-2, -0.5]], [(-0.4, 0.0, 1), (-0.6, 0.0, 1)])

for s_ in (1e150, 1e-150):
    @attack(f"classify rotation scaled {s_:g}")
    def _(s_=s_):
        c = lp.classify(torch.tensor([[0.0, s_], [-s_, 0.0]], dtype=F64))
        return torch.tensor([c.counts["rotation"]], dtype=F64), torch.tensor([1.0], dtype=F64), 0.0

@attack("classify complex pairs near collision")
def _():
    g = lp.Generator([0.0, 0.0], [1.0, 1.0 + 1e-13], [1, 1])
    c = lp.classify(g.matrix())
    return torch.tensor([c.counts["rotation"], c.counts["polynomial"]], dtype=F64), torch.tensor([2.0, 0.0], dtype=F64), 0.0

@attack("classify nan refused")
def _():
    return refuses(lambda: lp.classify([[math.nan, 0.0], [0.0, 0.0]]), "finite")

@attack("classify non-square refused")
def _():
    return refuses(lambda: lp.classify([[0.0, 1.0, 2.0], [0.0, 0.0, 1.0]]), "square")

@attack("diagnose recovers a decay-rotation mix with a slow plane")
def _():
    enc = lp.Encoding(lp.Generator([-0.3, -1e-4, 0.0], [2.0, 0.5, 1e-3], [1, 1, 1]))
    g = lp.diagnose(enc.query, enc.key, 6).generator
    got = sorted(zip(g.rates.tolist(), g.freqs.abs().tolist()), key=lambda b: b[1])
    return torch.tensor(got, dtype=F64), torch.tensor([[0.0, 1e-3], [-1e-4, 0.5], [-0.3, 2.0]], dtype=F64), 1e-6

@attack("diagnose of an Encoding object (not its encoders) refused")
def _():
    return refuses(lambda: lp.diagnose(lp.rope(8)), "encode_query", ".query")

# 20. NaN / inf / empty / overlapping layouts / out-of-range positions / meta
@attack("empty batch")
def _():
    q = rnd(0, 2, 4, 8)
    return lp.attention(q, q, q, lp.xpos(8)), torch.zeros(0, 2, 4, 8), 0.0

@attack("zero queries with a cache keeps the keys")
def _():
    q, k, v = rnd(1, 2, 0, 8), rnd(1, 2, 3, 8, seed=1), rnd(1, 2, 3, 8, seed=2); c = lp.KVCache()
    lp.attention(q, k, v, lp.xpos(8), torch.zeros(0), torch.arange(3.0), cache=c)
    return torch.tensor([float(len(c))]), torch.tensor([3.0]), 0.0

@attack("zero new keys after a prefill")
def _():
    q, k, v = (rnd(1, 2, 5, 8, seed=i) for i in range(3)); c = lp.KVCache(); enc = lp.xpos(8)
    lp.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache=c)
    got = lp.attention(q[:, :, 4:], k[:, :, :0], v[:, :, :0], enc, [3.0], torch.zeros(0), cache=c)
    return got, ref(q[:, :, 4:], k[:, :, :4], v[:, :, :4], enc, torch.tensor([3.0]), torch.arange(4.0)), 1e-9

@attack("a NaN query row stays in its row")
def _():
    q, k, v = (rnd(1, 2, 6, 8, seed=i) for i in range(3)); q[0, 0, 2] = math.nan
    return lp.attention(q, k, v, lp.xpos(8)), ref(q, k, v, lp.xpos(8), torch.arange(6.0)), 1e-9

for bad in (math.inf, math.nan):
    @attack(f"position {bad} refused")
    def _(bad=bad):
        q = rnd(1, 1, 3, 8)
        return refuses(lambda: lp.attention(q, q, q, lp.xpos(8), [0.0, 1.0, bad]), "positions")

@attack("position 2^62 int refused or exact")
def _():
    q = rnd(1, 1, 3, 8); p = torch.tensor([2**62, 2**62 + 1, 2**62 + 2])
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), p, p), "positions")

for ename in ("rope", "decay", "jordan", "alibi"):
    @attack(f"negative non-integer positions {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); p = -1e9 + torch.arange(8, dtype=F64) * 0.37
        return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-9

    @attack(f"unsorted times {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); p = torch.tensor([5.0, 1, 7, 3, 0, 2, 9, 4])
        return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-9

    @attack(f"overlapping q rows {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); base = rnd(1 * 4 * 8 * 8 + 8); q = base.as_strided((1, 4, 8, 8), (64, 16, 2, 1)); k, v = (rnd(1, 4, 8, 8, seed=i) for i in (1, 2))
        p = torch.arange(8, dtype=F64) + 3000
        return lp.attention(q, k, v, enc, p, p, sinks=torch.zeros(4, dtype=F64)), ref(q.contiguous(), k, v, enc, p, sinks=torch.zeros(4, dtype=F64)), 1e-9

@attack("meta tensors with sinks + value_encoding")
def _():
    q = torch.empty(2, 4, 9, 8, device="meta")
    out = lp.attention(q, q, q, lp.xpos(8), sinks=torch.zeros(4, device="meta"), value_encoding=lp.decay([0.1] * 8))
    assert out.device.type == "meta"
    return torch.tensor(out.shape, dtype=F64), torch.tensor([2.0, 4, 9, 8]), 0.0

@attack("meta tensors through a schedule's window")
def _():
    q = torch.empty(1, 2, 6, 8, device="meta"); sch = build_schedule("rnope_swa", 4, 8, 2, window=3)
    out = sch.attention(0, q, q, q)
    return torch.tensor(out.shape, dtype=F64), torch.tensor([1.0, 2, 6, 8]), 0.0

@attack("float16 jordan far with a cache")
def _():
    enc = lp.build("jordan", 8); q, k, v = (rnd(1, 4, 12, 8, dtype=torch.float16, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64) + 1e8
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache()), ref(q, k, v, enc, p), 2e-2


# 21. second pass: the same layers met in other ways
@attack("schedule window on a several-axis encoding refused")
def _():
    return refuses(lambda: lp.Schedule([lp.LayerSpec(lp.mrope(12, sections=(2, 2, 2)), window=3)]), "window", "axes")

@attack("schedule ssmax layer through a cache with padding")
def _():
    sch = build_schedule("ssmax", 2, 8, 4, s=0.5); spec = sch[0]; enc = spec.encoding
    q, k, v = (rnd(2, 4, 12, 8, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64)
    keep = torch.ones(2, 12, dtype=torch.bool); keep[0, 1] = keep[1, 6] = False
    c, outs = lp.KVCache(), []
    for lo, hi in CUTS:
        outs.append(sch.attention(0, q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], p[lo:hi], p[lo:hi], cache=c, key_padding_mask=keep[:, lo:hi]))
    n = (keep[:, None, None, :] & torch.ones(12, 12, dtype=torch.bool).tril()).sum(-1).double()
    return torch.cat(outs, 2), ssmax_full(enc, torch.tensor([0.5], dtype=F64), q, k, v, p, n, mask=keep[:, None, None, :]), 1e-9

@attack("schedule channels_last and stepped inputs")
def _():
    sch = build_schedule("rnope_swa", 4, 8, 4, window=3); spec = sch[0]
    q, k, v = (rnd(2, 4, 10, 8, seed=i) for i in range(3)); p = torch.arange(10, dtype=F64) + 77
    qq = q.contiguous(memory_format=torch.channels_last); kk = torch.stack((k, k), -1).flatten(-2)[..., ::2]
    pb = p.expand(2, 10)
    return sch.attention(0, qq, kk, v, p, p), ref(q, k, v, spec.encoding, p, mask=window_mask(pb, pb, window=3)), 1e-9

@attack("schedule tail queries default positions window")
def _():
    sch = build_schedule("rnope_swa", 4, 8, 4, window=4); spec = sch[0]
    q = rnd(1, 4, 3, 8, seed=0); k, v = rnd(1, 4, 10, 8, seed=1), rnd(1, 4, 10, 8, seed=2); kp = torch.arange(10, dtype=F64)
    m = window_mask(kp[-3:].expand(1, 3), kp.expand(1, 10), window=4)
    return sch.attention(0, q, k, v, key_positions=kp), ref(q, k, v, spec.encoding, kp[-3:], kp, mask=m), 1e-9

@attack("schedule from_hf cohere2 windows and NoPE")
def _():
    from transformers import Cohere2Config
    cfg = Cohere2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=4, sliding_window=5,
                        intermediate_size=32, vocab_size=10)
    sch = lp.Schedule.from_hf(cfg)
    got = torch.tensor([[float(s.window or 0), float(s.encoding.name == "nope")] for s in sch])
    want = torch.tensor([[5.0 if t == "sliding_attention" else 0.0, 0.0 if t == "sliding_attention" else 1.0] for t in cfg.layer_types])
    return got, want, 0.0

@attack("ssmax bidirectional counts every key")
def _():
    q, k, v = (rnd(1, 2, 7, 8, seed=i) for i in range(3)); p = torch.arange(7, dtype=F64)
    got = lp.attention(q, k, v, lp.rope(8), p, p, causal=False, temperature=ScalableSoftmax(0.6))
    return got, ref(tau_ref(q, torch.full((1, 1, 7), 0.6 * math.log(7), dtype=F64)), k, v, lp.rope(8), p, causal=False), 1e-9

for how in ("unmasked", "padded"):
    @attack(f"ssmax bidirectional {how} over several query blocks")
    def _(how=how):
        q, k, v = (rnd(2, 2, 7, 8, seed=i) for i in range(3)); p = torch.arange(7, dtype=F64)
        keep = torch.ones(2, 7, dtype=torch.bool)
        if how == "padded":
            keep[1, 2:4] = False
        n = keep.sum(-1).double()[:, None, None].expand(2, 1, 7)
        got = lp.attention(q, k, v, lp.rope(8), p, p, causal=False, block_size=3, key_padding_mask=keep, temperature=ScalableSoftmax(0.6))
        return got, ssmax_full(lp.rope(8), torch.tensor([0.6], dtype=F64), q, k, v, p, n, causal=False, mask=keep[:, None, None, :]), 1e-9

@attack("ssmax documents count their own keys")
def _():
    q, k, v = (rnd(1, 2, 9, 8, seed=i) for i in range(3)); docs = torch.tensor([[0] * 4 + [1] * 5]); p = torch.cat([torch.arange(4), torch.arange(5)]).double()
    m = (docs[0][:, None] == docs[0][None, :])[None, None] & torch.ones(9, 9, dtype=torch.bool).tril()
    got = lp.attention(q, k, v, lp.xpos(8), p, p, document_ids=docs, temperature=ScalableSoftmax(0.6))
    return got, ssmax_full(lp.xpos(8), torch.tensor([0.6], dtype=F64), q, k, v, p, m.sum(-1).double(), causal=False, mask=m), 1e-9

@attack("ssmax gqa per-head s")
def _():
    s = torch.tensor([0.2, 0.4, 0.8, 1.6], dtype=F64); q = rnd(1, 4, 8, 8, seed=0); k, v = rnd(1, 1, 8, 8, seed=1), rnd(1, 1, 8, 8, seed=2)
    got = lp.attention(q, k, v, lp.decay([0.1] * 8), temperature=ScalableSoftmax(s))
    return got, ssmax_full(lp.decay([0.1] * 8), s, q, k, v, torch.arange(8.0), torch.arange(1, 9, dtype=F64).expand(1, 1, 8)), 1e-9

@attack("ssmax bfloat16")
def _():
    q, k, v = (rnd(1, 2, 20, 8, dtype=torch.bfloat16, seed=i) for i in range(3)); p = torch.arange(20, dtype=F64)
    got = lp.attention(q, k, v, lp.rope(8), p, p, temperature=ScalableSoftmax(0.4))
    return got, ssmax_full(lp.rope(8), torch.tensor([0.4], dtype=F64), q, k, v, p, torch.arange(1, 21, dtype=F64).expand(1, 1, 20)), 6e-2

@attack("per_request mrope batched 3-axis positions")
def _():
    encs = [lp.mrope(12, sections=(2, 2, 2)), lp.scaling.linear(lp.mrope(12, sections=(2, 2, 2)), factor=2.0)]
    q, k, v = (rnd(2, 1, 5, 12, seed=i) for i in range(3)); p = torch.randint(0, 9, (2, 5, 3), generator=torch.Generator().manual_seed(0)).double()
    return lp.PerRequest(encs).attention(q, k, v, p, p), per_row(encs, q, k, v, p), 1e-9

@attack("per_request mrope unbatched positions with seq = batch")
def _():
    encs = [lp.mrope(12, sections=(2, 2, 2)), lp.scaling.linear(lp.mrope(12, sections=(2, 2, 2)), factor=2.0), lp.mrope(12, sections=(2, 2, 2))]
    q, k, v = (rnd(3, 1, 3, 12, seed=i) for i in range(3)); p = torch.tensor([[0.0, 0, 0], [1, 2, 1], [2, 2, 3]])
    want = torch.cat([ref(q[b:b + 1], k[b:b + 1], v[b:b + 1], e, p) for b, e in enumerate(encs)], 0)
    return lp.PerRequest(encs).attention(q, k, v, p, p), want, 1e-9

@attack("per_request batch-1 positions broadcast")
def _():
    encs = PR_ENCS(); q, k, v = (rnd(4, 2, 6, 8, seed=i) for i in range(3)); p = (torch.arange(6, dtype=F64) * 3)[None]
    return lp.PerRequest(encs).attention(q, k, v, p, p), per_row(encs, q, k, v, p[0]), 1e-9

@attack("per_request documents through a cache")
def _():
    encs = PR_ENCS(); pr = lp.PerRequest(encs); q, k, v = (rnd(4, 2, 12, 8, seed=i) for i in range(3))
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12, [0] * 2 + [1] * 10, [0] * 7 + [1] * 5]); p = torch.arange(12, dtype=F64)
    c, outs = pr.cache(), []
    for lo, hi in CUTS:
        outs.append(pr.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], p[lo:hi], p[lo:hi], cache=c, document_ids=docs[:, lo:hi]))
    m = (docs[:, :, None] == docs[:, None, :])[:, None]
    return torch.cat(outs, 2), per_row(encs, q, k, v, p, mask=m), 1e-9

@attack("per_request a cache of another PerRequest refused")
def _():
    q = rnd(2, 1, 4, 8); other = lp.PerRequest([lp.rope(8), lp.xpos(8), lp.decay([0.1] * 8)]).cache()
    return refuses(lambda: lp.PerRequest([lp.rope(8), lp.xpos(8)]).attention(q, q, q, cache=other), "cache")

@attack("ring at token 1e9 = its residue")
def _():
    phi = ring(12); t = 1e9 + torch.arange(24, dtype=F64)
    return phi(t), phi(torch.remainder(t, 12)), 1e-13

@attack("ring attention at token 1e12")
def _():
    m = lp.Mapped(lp.rope_directions(8), ring(12)); q, k, v = (rnd(1, 1, 6, 8, seed=i) for i in range(3)); t = 1e12 + torch.arange(6, dtype=F64)
    u, u0 = m.positions(t), m.positions(torch.remainder(t, 12))
    return lp.attention(q, k, v, m.encoding, u, u, causal=False), ref(q, k, v, m.encoding, u0, causal=False), 1e-9

@attack("circle_rope int64 positions")
def _():
    phi = circle_rope(3, 2, 2)
    return phi(torch.arange(10)), phi(torch.arange(10, dtype=F64)), 0.0

@attack("vrope negative token indices")
def _():
    phi = vrope(2, 1, 2, 2)
    return phi(torch.tensor([-3.0, -1.0])), torch.tensor([[-3.0] * 4, [-1.0] * 4], dtype=F64), 0.0

@attack("mapped query transposed layout")
def _():
    m = lp.Mapped(vrope_encoding(16), vrope(1, 1, 2, 2)); q = rnd(1, 2, 6, 16); t = torch.arange(6.0)
    return m.query(q.transpose(1, 2).contiguous().transpose(1, 2), t), vrope_encoding(16).query_reference(q, m.positions(t)), 1e-12

@attack("cache prefill in inference_mode then decode")
def _():
    enc = lp.xpos(8); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); c = lp.KVCache(); p = torch.arange(8, dtype=F64)
    with torch.inference_mode():
        a = lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=c)
    b = lp.attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], enc, cache=c)
    return torch.cat((a.clone(), b), 2), ref(q, k, v, enc, p), 1e-9

@attack("cache gradient through decode = full forward's")
def _():
    enc = lp.xpos(8); q, k, v = (rnd(1, 2, 6, 8, seed=i).requires_grad_() for i in range(3)); c = lp.KVCache()
    out = torch.cat([lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, cache=c) for lo, hi in ((0, 3), (3, 4), (4, 6))], 2)
    g1 = torch.autograd.grad(out.square().sum(), (q, k, v))
    g2 = torch.autograd.grad(ref(q, k, v, enc, torch.arange(6.0)).square().sum(), (q, k, v))
    return torch.cat([g.flatten() for g in g1]), torch.cat([g.flatten() for g in g2]), 1e-9

@attack("cache batch change refused")
def _():
    q = rnd(2, 1, 4, 8); c = lp.KVCache(); lp.attention(q, q, q, lp.rope(8), cache=c)
    q1 = rnd(1, 1, 1, 8)
    return refuses(lambda: lp.attention(q1, q1, q1, lp.rope(8), cache=c), "batch")

@attack("cache nan key time refused")
def _():
    q = rnd(1, 1, 4, 8); c = lp.KVCache(); lp.attention(q, q, q, lp.rope(8), cache=c)
    q1 = rnd(1, 1, 1, 8)
    return refuses(lambda: lp.attention(q1, q1, q1, lp.rope(8), [math.nan], [math.nan], cache=c), "positions")

@attack("cache expanded (stride 0) keys")
def _():
    enc = lp.decay([0.1] * 8); q = rnd(2, 4, 8, 8, seed=0); k, v = rnd(1, 4, 8, 8, seed=1).expand(2, 4, 8, 8), rnd(1, 4, 8, 8, seed=2).expand(2, 4, 8, 8)
    p = torch.arange(8, dtype=F64) * 2
    return decode(att(enc), q, k, v, p, ((0, 5), (5, 6), (6, 8)), cache=lp.KVCache()), ref(q, k.contiguous(), v.contiguous(), enc, p), 1e-9

@attack("grad wrt positions rope far = reference's")
def _():
    q, k, v = (rnd(1, 2, 6, 8, seed=i) for i in range(3)); p = (1e6 + torch.arange(6, dtype=F64) * 1.5).requires_grad_()
    g1, = torch.autograd.grad(lp.attention(q, k, v, lp.xpos(8), p, p).square().sum(), p)
    p2 = p.detach().clone().requires_grad_()
    g2, = torch.autograd.grad(ref(q, k, v, lp.xpos(8), p2).square().sum(), p2)
    return g1, g2, 1e-7

@attack("grad wrt q with sinks and values = reference's")
def _():
    q = rnd(1, 4, 7, 8, seed=0).requires_grad_(); k, v = rnd(1, 2, 7, 8, seed=1), rnd(1, 2, 7, 8, seed=2); s = torch.tensor([0.1, 0.2, -0.3, 1.0], dtype=F64)
    p = torch.arange(7, dtype=F64) + 1e5
    g1, = torch.autograd.grad(lp.attention(q, k, v, lp.retnet(8, num_heads=4), p, p, sinks=s, value_encoding=lp.xpos(8)).sum(), q)
    g2, = torch.autograd.grad(ref(q, k, v, lp.retnet(8, num_heads=4), p, sinks=s, value_encoding=lp.xpos(8)).sum(), q)
    return g1, g2, 1e-9

for bad in (0.0, -1.0, math.inf, math.nan):
    @attack(f"scale {bad} refused")
    def _(bad=bad):
        q = rnd(1, 1, 3, 8)
        return refuses(lambda: lp.attention(q, q, q, lp.rope(8), scale=bad), "scale")

@attack("block_size 0 refused")
def _():
    q = rnd(1, 1, 3, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.xpos(8), block_size=0), "block_size", "0")

@attack("block_size 1 jordan far with sinks")
def _():
    enc = lp.build("jordan", 8); q, k, v = (rnd(1, 4, 9, 8, seed=i) for i in range(3)); p = torch.arange(9, dtype=F64) * 10 + 3e8
    s = torch.tensor([0.0, 1.0, 2.0, -1.0], dtype=F64)
    return lp.attention(q, k, v, enc, p, p, block_size=1, sinks=s), ref(q, k, v, enc, p, sinks=s), 1e-9

@attack("scale given with alibi slots")
def _():
    enc = lp.alibi(8, num_heads=4); q, k, v = (rnd(1, 4, 9, 8, seed=i) for i in range(3)); p = torch.arange(9, dtype=F64) * 3
    return lp.attention(q, k, v, enc, p, p, scale=0.7), ref(q, k, v, enc, p, scale=0.7), 1e-9

@attack("bidirectional rope with sinks and rope values")
def _():
    q, k, v = (rnd(1, 2, 7, 8, seed=i) for i in range(3)); p = torch.arange(7, dtype=F64) * 1e4; s = torch.tensor([0.3, -0.2], dtype=F64)
    return lp.attention(q, k, v, lp.rope(8), p, p, causal=False, sinks=s, value_encoding=lp.rope(8, layout="half")), \
        ref(q, k, v, lp.rope(8), p, causal=False, sinks=s, value_encoding=lp.rope(8, layout="half")), 1e-9

@attack("transport by 1e9 = key at the shifted origin")
def _():
    enc = lp.rope(8); k = rnd(1, 1, 4, 8); s = torch.arange(4, dtype=F64)
    return enc.transport(enc.key(k, s), 1e9), enc.key_reference(k, s, origin=torch.tensor(1e9, dtype=F64)), 1e-12

@attack("transport delta nan refused")
def _():
    enc = lp.rope(8); k = rnd(1, 1, 4, 8)
    return refuses(lambda: enc.transport(k, math.nan), "delta")

@attack("scaling factors per head")
def _():
    f = torch.tensor([[1.0], [3.0]], dtype=F64); enc = lp.scaling.factors(lp.rope(8), factors=f)
    q, k, v = (rnd(1, 2, 6, 8, seed=i) for i in range(3)); p = torch.arange(6, dtype=F64) * 3
    h0 = ref(q[:, :1], k[:, :1], v[:, :1], lp.rope(8), p); h1 = ref(q[:, 1:], k[:, 1:], v[:, 1:], lp.rope(8), p / 3)
    return lp.attention(q, k, v, enc, p, p), torch.cat((h0, h1), 1), 1e-9

@attack("scaling linear on dynamic = dynamic at the length, then linear")
def _():
    dyn = lp.scaling.dynamic(lp.rope(8), factor=4.0, original_max_position_embeddings=4); comp = lp.scaling.linear(dyn, factor=2.0)
    q, k, v = (rnd(1, 1, 10, 8, seed=i) for i in range(3))
    return lp.attention(q, k, v, comp), lp.attention(q, k, v, lp.scaling.linear(dyn.at_length(10), factor=2.0)), 1e-12

@attack("hf round trip longrope")
def _():
    from transformers import Phi3Config
    short, long = [1.0 + 0.05 * i for i in range(8)], [1.5 + 0.7 * i for i in range(8)]
    cfg = Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                     original_max_position_embeddings=1024, rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
    enc = lp.from_hf(cfg).at_length(3000); back = lp.from_hf(lp.to_hf(enc) | {"hidden_size": 64, "num_attention_heads": 4}).at_length(3000)
    q, k, v = (rnd(1, 1, 9, 16, seed=i) for i in range(3)); p = torch.arange(9, dtype=F64) * 300
    return lp.attention(q, k, v, back, p, p), lp.attention(q, k, v, enc, p, p), 1e-9

@attack("hf rope_theta 0 refused")
def _():
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4)
    cfg.rope_theta = 0.0
    if isinstance(getattr(cfg, "rope_parameters", None), dict):
        cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": 0.0}
    return refuses(lambda: lp.from_hf(cfg), "theta")

@attack("classify Jordan block at norm 1e150")
def _():
    return _classified(torch.tensor([[0.0, 1e150], [0.0, 0.0]], dtype=F64), [(0.0, 0.0, 2)])

@attack("classify Jordan block at norm 1e-150")
def _():
    return _classified(torch.tensor([[0.0, 1e-150], [0.0, 0.0]], dtype=F64), [(0.0, 0.0, 2)])

@attack("classify defective rotation (4x4, a complex Jordan pair)")
def _():
    g = lp.Generator([-0.2], [1.5], [2], complex=[True]); P = torch.eye(4, dtype=F64) + 0.2 * rnd(4, 4, seed=3)
    X = P @ g.matrix() @ torch.linalg.inv(P)
    return _classified(X, [(-0.2, 1.5, 2)])

@attack("classify rotation pair 1e-9 apart (not a Jordan block)")
def _():
    g = lp.Generator([0.0, 0.0], [1.0, 1.0 + 1e-9], [1, 1]); P = torch.eye(4, dtype=F64) + 0.2 * rnd(4, 4, seed=4)
    c = lp.classify(P @ g.matrix() @ torch.linalg.inv(P))
    return torch.tensor([c.counts["rotation"], c.counts["polynomial"]], dtype=F64), torch.tensor([2.0, 0.0], dtype=F64), 0.0

@attack("float16 alibi far with a cache")
def _():
    enc = lp.alibi(8, num_heads=4); q, k, v = (rnd(1, 4, 12, 8, dtype=torch.float16, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64) * 300 + 1e6
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache()), ref(q, k, v, enc, p), 2e-2

@attack("float16 values encoding with a cache")
def _():
    enc = lp.rope(8); q, k, v = (rnd(1, 4, 12, 8, dtype=torch.float16, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64) + 5e4
    venc = lp.xpos(8)
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache(), value_encoding=venc), ref(q, k, v, enc, p, value_encoding=venc), 2e-2

@attack("meta tensors through a per_request")
def _():
    q = torch.empty(2, 2, 5, 8, device="meta")
    out = lp.PerRequest([lp.rope(8), lp.xpos(8)]).attention(q, q, q)
    return torch.tensor(out.shape, dtype=F64), torch.tensor([2.0, 2, 5, 8]), 0.0

@attack("meta tensors with a temperature")
def _():
    q = torch.empty(1, 2, 5, 8, device="meta")
    out = lp.attention(q, q, q, lp.rope(8), temperature=ScalableSoftmax(0.5))
    return torch.tensor(out.shape, dtype=F64), torch.tensor([1.0, 2, 5, 8]), 0.0


# 22. third pass: argument types and devices at the entry points, the cache's own store
@attack("float additive attn_mask refused")
def _():
    q = rnd(1, 2, 4, 8); am = torch.zeros(4, 4, dtype=F64); am[:, 1] = -math.inf
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), attn_mask=am), "attn_mask", "boolean")

@attack("integer key_padding_mask refused")
def _():
    q = rnd(1, 2, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), key_padding_mask=torch.tensor([[1, 1, 0, 1]])), "key_padding_mask", "boolean")

@attack("boolean positions refused")
def _():
    q = rnd(1, 2, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), torch.tensor([True, False, True, True])), "positions", "bool")

@attack("meta positions with data refused")
def _():
    q = rnd(1, 2, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), torch.arange(4.0, device="meta")), "positions", "meta")

@attack("meta tensors with meta positions")
def _():
    q = torch.empty(1, 2, 4, 8, device="meta"); p = torch.arange(4.0, device="meta")
    out = lp.attention(q, q, q, lp.xpos(8), p, p)
    return torch.tensor(out.shape, dtype=F64), torch.tensor([1.0, 2, 4, 8]), 0.0

@attack("float document ids")
def _():
    q, k, v = (rnd(1, 2, 6, 8, seed=i) for i in range(3)); docs = torch.tensor([[0.0, 0, 1, 1, 1, 2]])
    m = (docs[0][:, None] == docs[0][None, :])[None, None]
    return lp.attention(q, k, v, lp.xpos(8), document_ids=docs), ref(q, k, v, lp.xpos(8), torch.arange(6.0), mask=m), 1e-9

@attack("sinks as a list")
def _():
    q, k, v = (rnd(1, 2, 5, 8, seed=i) for i in range(3))
    return lp.attention(q, k, v, lp.rope(8), sinks=[0.1, -0.4]), ref(q, k, v, lp.rope(8), torch.arange(5.0), sinks=torch.tensor([0.1, -0.4], dtype=F64)), 1e-9

@attack("no keys, sinks, explicit positions")
def _():
    q = rnd(1, 2, 3, 8); k = rnd(1, 2, 0, 8)
    return lp.attention(q, k, k, lp.rope(8), torch.arange(3.0), torch.zeros(0), sinks=torch.zeros(2)), torch.zeros(1, 2, 3, 8), 0.0

@attack("per-head encoding with too few heads refused")
def _():
    q = rnd(1, 2, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.retnet(8, num_heads=4)), "heads", "4", "2")

@attack("head dim mismatch refused")
def _():
    q = rnd(1, 2, 4, 6)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8)), "head dim", "6", "8")

@attack("schedule temperature passed twice refused")
def _():
    q = rnd(1, 2, 4, 8); sch = build_schedule("rnope_swa", 4, 8, window=2)
    return refuses(lambda: sch.attention(0, q, q, q, temperature=ScalableSoftmax(0.5)), "temperature")

@attack("int32 positions near 2^31")
def _():
    q, k, v = (rnd(1, 2, 4, 8, seed=i) for i in range(3)); p = torch.arange(4, dtype=torch.int32) + (2**31 - 4)
    return lp.attention(q, k, v, lp.xpos(8), p, p), ref(q, k, v, lp.xpos(8), p.double()), 1e-9

@attack("numpy positions")
def _():
    import numpy as np
    q, k, v = (rnd(1, 2, 4, 8, seed=i) for i in range(3)); p = np.array([3.5, 7.0, 100.25, 1e6])
    return lp.attention(q, k, v, lp.decay([0.1] * 8), p, p), ref(q, k, v, lp.decay([0.1] * 8), torch.from_numpy(p)), 1e-9

@attack("cache rope + decay values at 1e8 through decode")
def _():
    enc, venc = lp.rope(8), lp.decay([0.05] * 8); q, k, v = (rnd(1, 4, 12, 8, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64) * 0.5 + 1e8
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache(), value_encoding=venc), ref(q, k, v, enc, p, value_encoding=venc), 1e-9

@attack("cache alternating encodings A, B, A")
def _():
    q, k, v = (rnd(1, 4, 9, 8, seed=i) for i in range(3)); c = lp.KVCache(); p = torch.arange(9, dtype=F64)
    encs = [lp.xpos(8), lp.build("jordan", 8), lp.xpos(8)]; outs = []
    for (lo, hi), e in zip(((0, 3), (3, 6), (6, 9)), encs):
        outs.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], e, cache=c))
    want = torch.cat([ref(q, k, v, e, p)[:, :, lo:hi] for (lo, hi), e in zip(((0, 3), (3, 6), (6, 9)), encs)], 2)
    return torch.cat(outs, 2), want, 1e-9

@attack("cache an encoding changed in place (an optimizer step)")
def _():
    enc = lp.xpos(8); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); c = lp.KVCache()
    lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=c)
    with torch.no_grad():
        enc.generator.rates.mul_(2.0)  # the encoding's own tensor, changed in place
    got = lp.attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], enc, cache=c)
    return got, ref(q, k, v, enc, torch.arange(8.0))[:, :, 5:], 1e-9

@attack("cache decode with more keys than queries")
def _():
    enc = lp.xpos(8); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); c = lp.KVCache(); p = torch.arange(8, dtype=F64)
    a = lp.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache=c)
    b = lp.attention(q[:, :, 7:], k[:, :, 4:], v[:, :, 4:], enc, cache=c)  # one query, four new keys (a speculative chunk)
    return torch.cat((a, b), 2), torch.cat((ref(q, k, v, enc, p)[:, :, :4], ref(q[:, :, 7:], k, v, enc, p[7:], p)), 2), 1e-9

@attack("encoded store append of the wrong length refused")
def _():
    from liepos.cache import EncodedKeys
    st = EncodedKeys(); st.append(k=torch.zeros(1, 1, 3, 4))
    return refuses(lambda: st.append(k=torch.zeros(1, 1, 2, 4), v=torch.zeros(1, 1, 3, 4)), "")

@attack("PerRequest empty refused")
def _():
    return refuses(lambda: lp.PerRequest([]), "encodings")

@attack("Schedule of non-specs refused")
def _():
    return refuses(lambda: lp.Schedule([lp.rope(8)]), "layers", "LayerSpec")

@attack("LayerSpec temperature with slots refused at the call")
def _():
    sch = lp.Schedule([lp.LayerSpec(lp.alibi(8, num_heads=2), temperature=ScalableSoftmax(0.5))]); q = rnd(1, 2, 4, 8)
    return refuses(lambda: sch.attention(0, q, q, q), "temperature", "slots")

@attack("vrope_encoding odd dim refused")
def _():
    return refuses(lambda: vrope_encoding(7), "dim", "7")

@attack("circle_rope alpha 2 refused")
def _():
    return refuses(lambda: circle_rope(2, 2, 2, alpha=2.0), "alpha", "2")

@attack("Mapped with a non-callable refused")
def _():
    return refuses(lambda: lp.Mapped(lp.rope(8), 3), "fn")

@attack("swan alpha negative refused")
def _():
    return refuses(lambda: SwanLengthScaling(alpha=-0.1, train_length=4), "alpha")

@attack("swan train_length 0 refused")
def _():
    return refuses(lambda: SwanLengthScaling(alpha=0.1, train_length=0), "train_length", "0")

@attack("llama4 floor_scale 0 refused")
def _():
    return refuses(lambda: lp.Llama4Temperature(floor_scale=0), "floor_scale", "0")


@attack("alibi window: a block of anti-aligned own keys, the nearest key 1000 before")
def _():
    q, k, v = (rnd(1, 4, 4, 8, dtype=torch.float32, seed=i) for i in range(3)); q[:, :, 3] = q[:, :, 2]
    for i in (2, 3):
        k[:, :, i] = -q[:, :, 2] / q[:, :, 2].norm(dim=-1, keepdim=True) * 1e3
    p = torch.tensor([0.0, 1000.0, 2000.0, 2000.5], dtype=F64); enc = lp.alibi(8, num_heads=4)
    return lp.attention(q, k, v, enc, p, p, block_size=2), ref(q, k, v, enc, p), 1e-5


# 23. float16 near its range: large (finite) inputs times the factors a call applies
def big_half(*shape, scale, seed):
    """float16 values up to ``2·scale`` in magnitude (every one finite)."""
    return (rnd(*shape, seed=seed).clamp(-2, 2) * scale).half()

for how in ("ssmax", "query_scale", "decay far", "xpos values", "jordan", "alibi"):
    @attack(f"float16 large q, {how}")
    def _(how=how):
        S = 40; q, k, v = big_half(1, 2, S, 8, scale=1e4, seed=0), big_half(1, 2, S, 8, scale=1e-3, seed=1), big_half(1, 2, S, 8, scale=1.0, seed=2)
        p = torch.cumsum(torch.rand(S, dtype=F64, generator=torch.Generator().manual_seed(3)) * 2 + 0.1, 0) + 1e5
        enc, kw, rkw = lp.rope(8), {}, {}
        if how == "ssmax":
            kw["temperature"] = ScalableSoftmax(2.0)
            n = torch.arange(1, S + 1, dtype=F64).expand(1, 1, S)
            return lp.attention(q, k, v, enc, p, p, **kw), ssmax_full(enc, torch.tensor([2.0], dtype=F64), q, k, v, p, n), 2e-2
        if how == "query_scale":
            enc = lp.rope(8, layout="half").replace(query_scale=torch.full((8,), 8.0))
        elif how == "decay far":
            enc = lp.decay([0.5, 0.3, 0.2, 0.1, 0.05, 0.5, 0.4, 0.0])
        elif how == "xpos values":
            kw["value_encoding"] = rkw["value_encoding"] = lp.decay([0.5] * 8)
            v = big_half(1, 2, S, 8, scale=1e4, seed=2)
            return lp.attention(q, k, v, enc, p, p, **kw), ref(q, k, v, enc, p, **rkw), 2e-2 * 2e4
        elif how == "jordan":
            enc = lp.build("jordan", 8)
        else:
            enc = lp.alibi(8, num_heads=2)
        return lp.attention(q, k, v, enc, p, p, **kw), ref(q, k, v, enc, p, **rkw), 2e-2

@attack("float16 large q through a cache, decay")
def _():
    S = 12; q, k, v = big_half(1, 2, S, 8, scale=1e4, seed=0), big_half(1, 2, S, 8, scale=1e-3, seed=1), big_half(1, 2, S, 8, scale=1.0, seed=2)
    q[:, :, :5] = q[:, :, :5] * 1e-3  # small queries first, large ones later: the work dtype changes mid-cache
    enc = lp.decay([0.5] * 8); p = torch.arange(S, dtype=F64) * 1.5 + 1e5
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache()), ref(q, k, v, enc, p), 2e-2


@attack("hf Qwen2-VL legacy rope_scaling type mrope")
def _():
    from transformers import Qwen2VLConfig
    cfg = Qwen2VLConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, vocab_size=10, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    enc = lp.from_hf(cfg); want = lp.mrope(16, sections=(2, 3, 3), base=1e6, layout="half")
    q, k, v = (rnd(1, 4, 6, 16, seed=i) for i in range(3)); p = torch.randint(0, 5, (6, 3), generator=torch.Generator().manual_seed(1)).double()
    return lp.attention(q, k, v, enc, p, p), ref(q, k, v, want, p), 1e-9
