"""Attacks on the layers above the encoding, registered in tests/attacks.py's table (run by it): per-layer
schedules and their windows, logit temperatures, one encoding per batch row, coordinate maps, a cache's
state, growth and version changes, sinks with value encodings and grouped keys, composed scaling maps."""

from __future__ import annotations

import math

import torch

import liepos as lp
from attacks import ENCS, F64, attack, ref, refuses, rnd
from liepos.coordinates import circle_rope, ring, vrope, vrope_encoding
from liepos.schedule import build_schedule, window_mask
from liepos.temperature import ScalableSoftmax, SwanLengthScaling


def decode(call, q, k, v, p, cuts, kp=None, **kw):
    """``call(q, k, v, positions, key_positions, cache=…)`` over the chunks ``cuts`` of the sequence (a
    prefill, then decode steps) through one cache, the outputs concatenated along the queries."""
    c, outs, kp = kw.pop("cache"), [], p if kp is None else kp
    for lo, hi in cuts:
        outs.append(call(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], p[..., lo:hi], kp[..., lo:hi], cache=c, **kw))
    return torch.cat(outs, 2)


def decode_ref(q, k, v, enc, p, cuts, **kw):
    """The reference of :func:`decode`: each chunk's queries over the keys given so far (a key of a later
    call is not there yet, even at an equal time)."""
    return torch.cat([ref(q[:, :, lo:hi], k[:, :, :hi], v[:, :, :hi], enc, p[..., lo:hi], p[..., :hi], **kw) for lo, hi in cuts], 2)


def att(enc):
    """``lp.attention`` with ``enc``, called as :func:`decode` calls."""
    return lambda q, k, v, p, kp, **kw: lp.attention(q, k, v, enc, p, kp, **kw)


def tau_ref(q, tau):
    """Queries times their row's temperature ``(B, H|1, Sq)`` (the temperature's identity), float64."""
    return q.double() * tau.unsqueeze(-1)


CUTS = ((0, 5), (5, 6), (6, 7), (7, 12))

# 11. schedules: windows and chunks follow the times, through a cache, with masks, GQA, far times
for sname, opts, layer in (("rnope_swa", {"window": 3}, 0), ("llama4", {"chunk": 4}, 0), ("swan_gpt", {"window": 3, "alpha": 0.3, "train_length": 4}, 1)):
    for how in ("full", "decode", "far", "batch-varying", "gqa", "user-mask", "real-times"):
        @attack(f"schedule {sname} layer {layer} {how}")
        def _(sname=sname, opts=opts, layer=layer, how=how):
            sch = build_schedule(sname, 4, 8, 4, **opts); spec = sch[layer]
            hk = 2 if how == "gqa" else 4
            q = rnd(2, 4, 12, 8, seed=0); k, v = rnd(2, hk, 12, 8, seed=1), rnd(2, hk, 12, 8, seed=2)
            p = torch.arange(12, dtype=F64)
            if how == "far":
                p = p + 1e9
            elif how == "batch-varying":
                p = p + torch.tensor([[0.0], [37.0]])
            elif how == "real-times":
                p = torch.cumsum(torch.rand(12, dtype=F64, generator=torch.Generator().manual_seed(3)) * 2 + 0.1, 0)
            pb = p.expand(2, 12)
            m = window_mask(pb, pb, window=spec.window, chunk=spec.chunk)
            kw = {}
            if how == "user-mask":
                um = torch.ones(2, 1, 12, 12, dtype=torch.bool); um[0, 0, :, 1] = False
                kw["attn_mask"] = um; m = m & um
            if how == "decode":
                got = decode(lambda *a, **kk: sch.attention(layer, *a, **kk), q, k, v, p, CUTS, cache=lp.KVCache())
            else:
                got = sch.attention(layer, q, k, v, p, p, **kw)
            assert spec.temperature is None
            return got, ref(q, k, v, spec.encoding, p, mask=m), 1e-9

@attack("schedule layer -1 refused")
def _():
    sch = build_schedule("rnope_swa", 4, 8, window=3); q = rnd(1, 1, 4, 8)
    return refuses(lambda: sch.attention(-1, q, q, q), "layer", "-1")

@attack("schedule window 0 refused")
def _():
    return refuses(lambda: build_schedule("rnope_swa", 4, 8, window=0), "window", "0")

@attack("schedule window 2.5 refused")
def _():
    return refuses(lambda: build_schedule("rnope_swa", 4, 8, window=2.5), "window", "2.5")

# 12. temperatures: SSMax / Llama 4 / SWAN through caches, re-centring, masks, sinks, value encodings
def ssmax_full(enc, s, q, k, v, p, counts, **kw):
    return ref(tau_ref(q, s.reshape(1, -1, 1) * torch.log(counts.clamp_min(1.0))), k, v, enc, p, **kw)

for ename in ("rope", "xpos", "decay", "jordan"):
    for how in ("full", "decode", "far", "padded", "sinks", "value_encoding"):
        @attack(f"ssmax {ename} {how}")
        def _(ename=ename, how=how):
            enc = ENCS[ename](); s = torch.tensor([0.3, 0.5, 1.0, 2.0], dtype=F64); T = ScalableSoftmax(s)
            q, k, v = (rnd(2, 4, 12, 8, seed=i) for i in range(3))
            p = torch.arange(12, dtype=F64) + (1e7 if how == "far" else 0.0)
            n = torch.arange(1, 13, dtype=F64).expand(2, 1, 12)
            kw, rkw = {}, {}
            if how == "padded":
                keep = torch.ones(2, 12, dtype=torch.bool); keep[0, :3] = False; keep[1, 7] = False
                kw["key_padding_mask"] = keep; rkw["mask"] = keep[:, None, None, :]
                n = (keep[:, None, None, :] & torch.ones(12, 12, dtype=torch.bool).tril()).sum(-1).double()
            if how == "sinks":
                kw["sinks"] = rkw["sinks"] = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
            if how == "value_encoding":
                kw["value_encoding"] = rkw["value_encoding"] = lp.xpos(8)
            if how == "decode":
                got = decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache(), temperature=T)
            else:
                got = lp.attention(q, k, v, enc, p, p, temperature=T, **kw)
            return got, ssmax_full(enc, s, q, k, v, p, n, **rkw), 1e-9

for how in ("full", "decode", "batch-varying", "jordan-far"):
    @attack(f"swan {how}")
    def _(how=how):
        T = SwanLengthScaling(alpha=0.4, train_length=5); enc = lp.build("jordan", 8) if how == "jordan-far" else lp.rope(8)
        q, k, v = (rnd(2, 4, 12, 8, seed=i) for i in range(3))
        p = torch.arange(12, dtype=F64) + (torch.tensor([[0.0], [100.0]]) if how == "batch-varying" else 0.0)
        if how == "jordan-far":
            p = p + 1e6
        pb = p.expand(2, 12)
        tau = (1 + 0.4 * torch.log(((pb + 1) / 5).clamp_min(1.0)))[:, None, :]
        if how == "decode":
            got = decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache(), temperature=T)
        else:
            got = lp.attention(q, k, v, enc, p, p, temperature=T)
        return got, ref(tau_ref(q, tau), k, v, enc, p), 1e-9

for how in ("boundary", "decode"):
    @attack(f"llama4 temperature {how}")
    def _(how=how):
        T = lp.Llama4Temperature(floor_scale=4, attn_scale=0.5); enc = lp.nope(8)
        q, k, v = (rnd(1, 4, 12, 8, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64)
        tau = (1 + 0.5 * torch.log1p(torch.floor((p.float() + 1) / 4))).double().reshape(1, 1, 12)  # in float32, as upstream
        if how == "decode":
            got = decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache(), temperature=T)
        else:
            got = lp.attention(q, k, v, enc, p, p, temperature=T)
        return got, ref(tau_ref(q, tau), k, v, enc, p), 1e-9

@attack("ssmax on a row that sees no key gives zeros")
def _():
    q, k, v = (rnd(2, 2, 6, 8, seed=i) for i in range(3)); keep = torch.ones(2, 6, dtype=torch.bool); keep[1] = False
    got = lp.attention(q, k, v, lp.rope(8), key_padding_mask=keep, temperature=ScalableSoftmax(0.5))
    n = torch.arange(1, 7, dtype=F64).expand(2, 1, 6)
    return got, ssmax_full(lp.rope(8), torch.tensor([0.5], dtype=F64), q, k, v, torch.arange(6.0), n, mask=keep[:, None, None, :]), 1e-9

@attack("ssmax float16")
def _():
    q, k, v = (rnd(1, 2, 33, 8, dtype=torch.float16, seed=i) for i in range(3)); p = torch.arange(33, dtype=F64)
    n = torch.arange(1, 34, dtype=F64).expand(1, 1, 33)
    got = lp.attention(q, k, v, lp.xpos(8), p, p, temperature=ScalableSoftmax(0.4))
    return got, ssmax_full(lp.xpos(8), torch.tensor([0.4], dtype=F64), q, k, v, p, n), 2e-2

@attack("ssmax with alibi refused")
def _():
    q = rnd(1, 4, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.alibi(8, num_heads=4), temperature=ScalableSoftmax(0.4)), "temperature", "slots")

@attack("ssmax heads mismatch refused")
def _():
    q = rnd(1, 4, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), temperature=ScalableSoftmax([0.1, 0.2])), "temperature", "2")

for bad in (0.0, -0.5, math.nan, math.inf):
    @attack(f"ssmax s={bad} refused")
    def _(bad=bad):
        return refuses(lambda: ScalableSoftmax(bad), "s")

@attack("temperature as a string refused")
def _():
    q = rnd(1, 1, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), temperature="ssmax"), "temperature", "ssmax")

@attack("swan on several axes refused")
def _():
    q = rnd(1, 1, 4, 12); p = torch.arange(4.0)[:, None].expand(4, 3)
    return refuses(lambda: lp.attention(q, q, q, lp.mrope(12, sections=(2, 2, 2)), p, p, temperature=SwanLengthScaling(alpha=0.1, train_length=2)),
                   "axes")

# 13. one encoding per batch row
def per_row(encs, q, k, v, p, **kw):
    rows = []
    for b, e in enumerate(encs):
        pb = p[b] if p.dim() == (2 if e.num_axes is None else 3) else p
        extra = {n: x[b:b + 1] for n, x in kw.items()}
        rows.append(ref(q[b:b + 1], k[b:b + 1], v[b:b + 1], e, pb, **extra))
    return torch.cat(rows, 0)

PR_ENCS = lambda: [lp.rope(8), lp.scaling.linear(lp.rope(8), factor=4.0), lp.rope(8), lp.xpos(8)]  # noqa: E731
for how in ("full", "batch-positions", "decode", "padded", "gqa"):
    @attack(f"per_request {how}")
    def _(how=how):
        encs = PR_ENCS(); pr = lp.PerRequest(encs); hk = 2 if how == "gqa" else 4
        q = rnd(4, 4, 12, 8, seed=0); k, v = rnd(4, hk, 12, 8, seed=1), rnd(4, hk, 12, 8, seed=2)
        p = torch.arange(12, dtype=F64) + (torch.tensor([[0.0], [5.0], [1e6], [7.5]]) if how in ("batch-positions", "decode") else 0.0)
        if how == "decode":
            return decode(pr.attention, q, k, v, p, CUTS, cache=pr.cache()), per_row(encs, q, k, v, p), 1e-9
        if how == "padded":
            keep = torch.ones(4, 12, dtype=torch.bool); keep[2, :4] = False; keep[3, 5] = False
            return pr.attention(q, k, v, p, p, key_padding_mask=keep), per_row(encs, q, k, v, p, mask=keep[:, None, None, :]), 1e-9
        return pr.attention(q, k, v, p, p), per_row(encs, q, k, v, p), 1e-9

@attack("per_request dynamic ntk rows at their own length")
def _():
    dyn = lp.scaling.dynamic(lp.rope(8), factor=4.0, original_max_position_embeddings=4)
    encs = [lp.rope(8), dyn]; q, k, v = (rnd(2, 1, 10, 8, seed=i) for i in range(3))
    got = lp.PerRequest(encs).attention(q, k, v)
    want = torch.cat([lp.attention(q[:1], k[:1], v[:1], encs[0]), lp.attention(q[1:], k[1:], v[1:], dyn)], 0)
    return got, want, 1e-12

@attack("per_request refused later group leaves every cache unchanged")
def _():
    encs = [lp.rope(8), lp.decay([0.1] * 8)]; pr = lp.PerRequest(encs); c = pr.cache()
    q, k, v = (rnd(2, 1, 6, 8, seed=i) for i in range(3))
    pr.attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], cache=c)
    try:
        pr.attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], causal=False, cache=c)
    except ValueError:
        pass
    return torch.tensor([float(len(x)) for x in c.caches]), torch.tensor([3.0, 3.0]), 0.0

@attack("per_request batch mismatch refused")
def _():
    q = rnd(3, 1, 4, 8)
    return refuses(lambda: lp.PerRequest([lp.rope(8), lp.xpos(8)]).attention(q, q, q), "batch", "3")

# 14. coordinate maps

for mname, mk, enc_mk, S in (("circle_rope", lambda: circle_rope(3, 2, 3), lambda: lp.mrope(12, sections=(2, 2, 2)), 12),
                             ("circle_rope 1x1", lambda: circle_rope(2, 1, 1), lambda: lp.mrope(12, sections=(2, 2, 2)), 6),
                             ("vrope", lambda: vrope(2, 2, 2, 2), lambda: vrope_encoding(16), 14)):
    for how in ("attention", "decode", "batch", "query"):
        @attack(f"coordinates {mname} {how}")
        def _(mk=mk, enc_mk=enc_mk, S=S, how=how):
            phi, enc = mk(), enc_mk(); D = enc.content_dim
            q, k, v = (rnd(2, 2, S, D, seed=i) for i in range(3))
            t = torch.arange(S, dtype=F64)
            if how == "batch":
                t = torch.stack((t, t + 3.0))
            u = phi(t)
            if how == "query":
                m = lp.Mapped(enc, phi)
                return m.query(q, t), enc.query_reference(q, u), 1e-9
            if how == "decode":
                return decode(att(enc), q, k, v, u.transpose(-1, -2), ((0, S - 3), (S - 3, S - 2), (S - 2, S)),
                              cache=lp.KVCache()).contiguous() if False else \
                    torch.cat([lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, u[lo:hi], u[lo:hi], cache=c)
                               for c in [lp.KVCache()] for lo, hi in ((0, S - 3), (S - 3, S - 2), (S - 2, S))], 2), ref(q, k, v, enc, u), 1e-9
            return lp.attention(q, k, v, enc, u, u), ref(q, k, v, enc, u), 1e-9

for bad in (0.5, math.nan, -math.inf):
    @attack(f"circle_rope position {bad} refused")
    def _(bad=bad):
        return refuses(lambda: circle_rope(2, 2, 2)(torch.tensor([0.0, bad])), "integers")

@attack("ring period 0 refused")
def _():
    return refuses(lambda: ring(0), "period", "0")

@attack("mapped fn giving the wrong shape refused")
def _():
    m = lp.Mapped(lp.mrope(12, sections=(2, 2, 2)), ring(5))  # 2 coordinates for an encoding of 3 axes
    return refuses(lambda: m.query(rnd(1, 1, 4, 12), torch.arange(4.0)), "positions")

# 15. KVCache: state/restore, growth, a version change, mixed dtypes, rows at different times, the caller's tensors
for ename in ("rope", "xpos", "jordan", "alibi"):
    @attack(f"cache state-restore {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(1, 4, 10, 8, seed=i) for i in range(3)); k2 = rnd(1, 4, 10, 8, seed=7)
        p = torch.arange(10, dtype=F64) * 3; c = lp.KVCache()
        lp.attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc, p[:6], p[:6], cache=c); st = c.state()
        lp.attention(q[:, :, 6:8], k2[:, :, 6:8], v[:, :, 6:8], enc, p[6:8], p[6:8], cache=c)  # a branch, undone
        c.restore(st)
        got = lp.attention(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], enc, p[6:], p[6:], cache=c)
        return got, ref(q, k, v, enc, p)[:, :, 6:], 1e-9

    @attack(f"cache growth 150 steps {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(1, 4, 150, 8, seed=i) for i in range(3)); p = torch.arange(150, dtype=F64) * 50.0
        c = lp.KVCache()
        outs = [lp.attention(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], enc, p[i:i + 1], p[i:i + 1], cache=c) for i in range(150)]
        return torch.cat(outs, 2), ref(q, k, v, enc, p), 1e-9

    @attack(f"cache jump 1e9 {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3))
        p = torch.tensor([0.0, 1, 2, 3, 4, 1e9, 1e9 + 1, 1e9 + 2], dtype=F64)
        return decode(att(enc), q, k, v, p, ((0, 5), (5, 6), (6, 8)), cache=lp.KVCache()), ref(q, k, v, enc, p), 1e-9

    @attack(f"cache rows at different times {ename}")
    def _(ename=ename):
        enc = ENCS[ename](); q, k, v = (rnd(3, 4, 9, 8, seed=i) for i in range(3))
        p = torch.stack((torch.arange(9.0), 1e6 + 2.5 * torch.arange(9.0), torch.tensor([0.0, 0, 0, 1, 1, 5e8, 5e8, 5e8 + 1, 2e9]))).double()
        cuts = ((0, 4), (4, 5), (5, 9))
        return decode(att(enc), q, k, v, p, cuts, cache=lp.KVCache()), decode_ref(q, k, v, enc, p, cuts), 1e-9

@attack("cache switches encoding between calls")
def _():
    q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); c = lp.KVCache(); p = torch.arange(8, dtype=F64)
    lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], lp.rope(8), cache=c)
    got = lp.attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], lp.xpos(8), cache=c)
    return got, ref(q, k, v, lp.xpos(8), p)[:, :, 5:], 1e-9

@attack("cache drops the value encoding between calls")
def _():
    q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); c = lp.KVCache(); p = torch.arange(8, dtype=F64)
    lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], lp.rope(8), cache=c, value_encoding=lp.xpos(8))
    got = lp.attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], lp.rope(8), cache=c)
    return got, ref(q, k, v, lp.rope(8), p)[:, :, 5:], 1e-9

@attack("cache dtype change refused")
def _():
    q = rnd(1, 1, 4, 8, dtype=torch.float32); c = lp.KVCache(); lp.attention(q, q, q, lp.rope(8), cache=c)
    q64 = rnd(1, 1, 1, 8)
    return refuses(lambda: lp.attention(q64, q64, q64, lp.rope(8), cache=c), "dtype", "float32")

@attack("cache time going back refused")
def _():
    q = rnd(1, 1, 4, 8); c = lp.KVCache(); lp.attention(q, q, q, lp.rope(8), torch.arange(4.0) + 10, cache=c)
    return refuses(lambda: lp.attention(q[:, :, :1], q[:, :, :1], q[:, :, :1], lp.rope(8), [2.0], [2.0], cache=c), "back", "2.0")

@attack("cache never writes the caller's tensors")
def _():
    q, k, v = (rnd(1, 4, 8, 8, seed=i) for i in range(3)); k0, v0 = k.clone(), v.clone(); c = lp.KVCache()
    for lo, hi in ((0, 1), (1, 2), (2, 8)):
        lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], lp.xpos(8), cache=c)
    return torch.cat((k, v)), torch.cat((k0, v0)), 0.0

@attack("cache equal times (a repeated timestamp)")
def _():
    enc = lp.xpos(8); q, k, v = (rnd(1, 4, 6, 8, seed=i) for i in range(3)); p = torch.tensor([0.0, 1, 1, 1, 2, 2])
    cuts = ((0, 2), (2, 3), (3, 6))
    return decode(att(enc), q, k, v, p, cuts, cache=lp.KVCache()), decode_ref(q, k, v, enc, p, cuts), 1e-9

# 16. sinks + value encodings + grouped keys + masks, together
for ename in ("rope", "xpos", "decay", "jordan", "retnet"):
    for vname in ("xpos", "decay", "rope-half"):
        @attack(f"combo {ename} values {vname} gqa sinks padding far")
        def _(ename=ename, vname=vname):
            enc, venc = ENCS[ename](), ENCS[vname]()
            q = rnd(2, 4, 14, 8, seed=0); k, v = rnd(2, 2, 14, 8, seed=1), rnd(2, 2, 14, 8, seed=2)
            p = 1e6 + torch.cumsum(torch.rand(2, 14, dtype=F64, generator=torch.Generator().manual_seed(4)) * 3 + 0.1, 1)
            keep = torch.ones(2, 14, dtype=torch.bool); keep[0, 2] = keep[1, :5] = False
            s = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
            got = lp.attention(q, k, v, enc, p, p, sinks=s, value_encoding=venc, key_padding_mask=keep)
            return got, ref(q, k, v, enc, p, sinks=s, value_encoding=venc, mask=keep[:, None, None, :]), 1e-9

@attack("combo documents + sinks + values decode")
def _():
    enc, venc = lp.xpos(8), lp.decay([0.1] * 8); q, k, v = (rnd(1, 4, 12, 8, seed=i) for i in range(3))
    docs = torch.tensor([[0] * 5 + [1] * 7]); p = torch.arange(12, dtype=F64); s = torch.tensor([0.1, 0.2, 0.3, -5.0], dtype=F64)
    m = (docs[0][:, None] == docs[0][None, :])[None, None]
    c, outs = lp.KVCache(), []
    for lo, hi in CUTS:
        outs.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, p[lo:hi], p[lo:hi], cache=c, sinks=s,
                                 value_encoding=venc, document_ids=docs[:, lo:hi]))
    return torch.cat(outs, 2), ref(q, k, v, enc, p, sinks=s, value_encoding=venc, mask=m), 1e-9

@attack("combo per-head attn_mask + sinks jordan")
def _():
    enc = lp.build("jordan", 8); q, k, v = (rnd(1, 4, 10, 8, seed=i) for i in range(3)); p = torch.arange(10, dtype=F64) + 5e5
    m = torch.rand(1, 4, 10, 10, generator=torch.Generator().manual_seed(9)) > 0.3; s = torch.tensor([0.0, 1.0, -1.0, 3.0], dtype=F64)
    return lp.attention(q, k, v, enc, p, p, attn_mask=m, sinks=s), ref(q, k, v, enc, p, mask=m, sinks=s), 1e-9

@attack("sinks of the kv heads' count refused")
def _():
    q = rnd(1, 4, 4, 8); k = rnd(1, 2, 4, 8)
    return refuses(lambda: lp.attention(q, k, k, lp.rope(8), sinks=torch.zeros(2)), "sinks", "4")

@attack("value_encoding with slots refused")
def _():
    q = rnd(1, 4, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), value_encoding=lp.alibi(8, num_heads=4)), "value_encoding")

@attack("value_encoding of another width refused")
def _():
    q = rnd(1, 1, 4, 8)
    return refuses(lambda: lp.attention(q, q, q, lp.rope(8), value_encoding=lp.rope(4)), "value_encoding", "4")

# 17. scaling maps composed: a map of positions is the same map of times
for ename in ("rope", "xpos", "retnet", "decay", "alibi", "jordan"):
    @attack(f"scaling linear∘linear {ename} = frequencies / 6")
    def _(ename=ename):
        enc = ENCS[ename](); comp = lp.scaling.linear(lp.scaling.linear(enc, factor=2.0), factor=3.0)
        q, k, v = (rnd(1, 4, 10, 8, seed=i) for i in range(3)); p = torch.arange(10, dtype=F64) * 6.0 + 60
        g = enc.generator  # the maps change the rotation frequencies only (the rates are kept)
        want = enc.replace(generator=g.with_params(freqs=torch.where(torch.tensor(g.complex), g.freqs / 6.0, g.freqs)))
        return lp.attention(q, k, v, comp, p, p), ref(q, k, v, want, p), 1e-9

@attack("scaling factors of the wrong count refused")
def _():
    return refuses(lambda: lp.scaling.factors(lp.rope(8), factors=[1.0, 2.0, 3.0]), "factors", "3")

@attack("scaling factors zero refused")
def _():
    return refuses(lambda: lp.scaling.factors(lp.rope(8), factors=[1.0, 0.0, 1.0, 1.0]), "factors")

@attack("scaling per-eigenvalue factors = per-plane times")
def _():
    f = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=F64); enc = lp.scaling.factors(lp.rope(8, layout="half"), factors=f)
    q, k, v = (rnd(1, 2, 7, 8, seed=i) for i in range(3)); p = torch.arange(7, dtype=F64) * 3
    w = lp.rope_freqs(8) / f  # each plane's frequency divided by its factor
    want = ref(q, k, v, lp.Encoding(lp.Generator(torch.zeros(4), w, [1] * 4), layout="half"), p)
    return lp.attention(q, k, v, enc, p, p), want, 1e-9

@attack("scaling clipped through a cache")
def _():
    enc = lp.cope_clipped(8, clip=4) if "cope_clipped" in dir(lp) else None
    q, k, v = (rnd(1, 2, 12, 8, seed=i) for i in range(3)); p = torch.arange(12, dtype=F64)
    return decode(att(enc), q, k, v, p, CUTS, cache=lp.KVCache()), ref(q, k, v, enc, p), 1e-9

@attack("scaling dynamic ntk decode = full at each length")
def _():
    dyn = lp.scaling.dynamic(lp.rope(8), factor=4.0, original_max_position_embeddings=4)
    q, k, v = (rnd(1, 2, 9, 8, seed=i) for i in range(3)); c = lp.KVCache(); outs, wants = [], []
    for lo, hi in ((0, 3), (3, 4), (4, 5), (5, 9)):
        outs.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], dyn, cache=c))
        wants.append(lp.attention(q[:, :, :hi], k[:, :, :hi], v[:, :, :hi], dyn)[:, :, lo:hi])
    return torch.cat(outs, 2), torch.cat(wants, 2), 1e-9
