"""Adversarial attacks on the fast paths, counted: ``PYTHONPATH=src python tests/attacks.py [-v]``.

Each attack calls liepos on an input meant to break a fast path's assumptions (dtypes, far times,
tiny and huge norms, batch-varying times, grouped-query keys in odd layouts, strided caches, values
carried by a generator, in place on views, masks, sinks) or a layer above them (per-layer schedules
and their windows, logit temperatures, one encoding per batch row, coordinate maps, a cache's state and
version changes, composed scaling maps, Hugging Face round trips, classify and diagnose, argument types
and devices) and compares with the float64 reference. A verdict per attack: RIGHT (within the
tolerance), NAMED (a ValueError / TypeError / OverflowError naming the input), WRONG (a wrong answer
without a word, or a call that should be refused accepted) or CRASH (any other exception, or a refusal
that does not name what :func:`refuses` expects). The last line gives the counts; ``-v`` prints every
verdict, else only WRONG and CRASH; ``--only=PREFIX`` (repeatable) runs the attacks whose name starts so.
"""

from __future__ import annotations

import math
import sys

import torch

import liepos as lp

F64 = torch.float64
R: list[tuple[str, str, str]] = []


ATTACKS: list[tuple[str, object]] = []


def attack(name):
    """Register an attack: a function returning ``(got, want, tolerance)`` (run by :func:`main`)."""
    def deco(fn):
        ATTACKS.append((name, fn))
        return fn
    return deco


class Accepted(Exception):
    """A call that should have been refused returned a value."""


def refuses(call, *words):
    """Run ``call``; a refusal naming every word of ``words`` (case-insensitive) is re-raised (NAMED), a
    refusal that names none is a crash (unhelpful), a value is a silent acceptance (WRONG)."""
    try:
        out = call()
    except (ValueError, TypeError, OverflowError, NotImplementedError) as e:
        if all(w.lower() in str(e).lower() for w in words):
            raise
        raise RuntimeError(f"refused without naming {words}: {type(e).__name__}: {e}") from e
    raise Accepted(f"accepted, returned {type(out).__name__}")


def verdict(fn) -> tuple[str, str]:
    try:
        got, want, tol = fn()
        got, want = got.double(), want.double()
        if got.shape != want.shape:
            return "WRONG", f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
        bad = ~(torch.isclose(got, want, rtol=0, atol=tol) | (torch.isnan(got) & torch.isnan(want)))
        err = float((got - want).abs().nan_to_num(math.inf).max()) if got.numel() else 0.0
        return ("WRONG" if bool(bad.any()) else "RIGHT"), f"{err:.2e}"
    except Accepted as e:
        return "WRONG", str(e)
    except (ValueError, TypeError, OverflowError, NotImplementedError) as e:
        return "NAMED", f"{type(e).__name__}: {str(e)[:110]}"
    except Exception as e:  # anything else is a crash without a useful message
        return "CRASH", f"{type(e).__name__}: {str(e)[:160]}"


def rnd(*shape, dtype=F64, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed)).to(dtype)

def ref(q, k, v, enc, p, kp=None, **kw):
    return lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p if kp is None else kp, **kw)

ENCS = {"rope": lambda: lp.rope(8), "rope-half": lambda: lp.rope(8, layout="half"), "xpos": lambda: lp.xpos(8),
        "decay": lambda: lp.decay([0.3, 0.1, 0.05, 0.0, 0.2, 0.02, 0.01, 0.1]), "alibi": lambda: lp.alibi(8, num_heads=4),
        "jordan": lambda: lp.build("jordan", 8), "retnet": lambda: lp.retnet(8, num_heads=4)}
EPS = {F64: 1e-9, torch.float32: 3e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}

# 1. dtypes through every encoding, a unit ramp and real times
for name, mk in ENCS.items():
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for real in (False, True):
            @attack(f"dtype {name} {dt} real={real}")
            def _(mk=mk, dt=dt, real=real):
                enc = mk(); q, k, v = (rnd(1, 4, 40, 8, dtype=dt, seed=i) for i in range(3))
                p = torch.cumsum(torch.rand(40, dtype=F64) * 2 + 0.1, 0) if real else torch.arange(40, dtype=F64)
                return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), EPS[dt] * 4

# 2. huge times
for name, mk in ENCS.items():
    for t0 in (1e9, 2.0**52, 1e15, 1e18):
        @attack(f"far {name} t0={t0:g}")
        def _(mk=mk, t0=t0):
            enc = mk(); q, k, v = (rnd(1, 4, 12, 8, dtype=torch.float32, seed=i) for i in range(3))
            step = 1.0 if t0 < 2**53 else 256.0
            p = t0 + step * torch.arange(12, dtype=F64)
            return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-4

# 3. tiny and huge norms (float32)
for name, mk in ENCS.items():
    for s in (1e-30, 1e-12, 1e6, 1e15):
        @attack(f"norm {name} x{s:g}")
        def _(mk=mk, s=s):
            enc = mk(); q, k = (rnd(1, 4, 24, 8, dtype=torch.float32, seed=i) * s for i in range(2))
            v = rnd(1, 4, 24, 8, dtype=torch.float32, seed=5)
            p = torch.arange(24, dtype=F64)
            return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-4

# 4. batch-varying positions
for name, mk in ENCS.items():
    for kind in ("offset", "real", "packed-decode"):
        @attack(f"batch-varying {name} {kind}")
        def _(mk=mk, kind=kind):
            enc = mk(); q, k, v = (rnd(3, 4, 10, 8, seed=i) for i in range(3))
            if kind == "offset":
                p = torch.arange(10, dtype=F64) + torch.tensor([[0.0], [500.0], [1e6]])
            else:
                p = torch.cumsum(torch.rand(3, 10, dtype=F64) * 3 + 0.1, 1)
            if kind != "packed-decode":
                return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-9
            c, outs = lp.KVCache(), []
            for lo, hi in ((0, 6), (6, 7), (7, 10)):
                outs.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, p[:, lo:hi], p[:, lo:hi], cache=c))
            return torch.cat(outs, 2), ref(q, k, v, enc, p), 1e-9

# 5. GQA, with layouts
for name, mk in ENCS.items():
    for lay in ("contig", "transposed", "stepped", "expanded"):
        @attack(f"gqa {name} {lay}")
        def _(mk=mk, lay=lay):
            enc = mk(); q = rnd(2, 4, 20, 8, seed=0); k, v = rnd(2, 1, 20, 8, seed=1), rnd(2, 1, 20, 8, seed=2)
            if lay == "transposed":
                k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
            elif lay == "stepped":
                k, v = (torch.stack((x, x), -1).flatten(-2)[..., ::2] for x in (k, v))
            elif lay == "expanded":
                k, v = k[:1].expand(2, 1, 20, 8), v[:1].expand(2, 1, 20, 8)
            p = torch.arange(20, dtype=F64)
            return lp.attention(q, k, v, enc, p, p, sinks=torch.zeros(4, dtype=F64) if name == "rope" else None), \
                ref(q, k.contiguous(), v.contiguous(), enc, p, sinks=torch.zeros(4, dtype=F64) if name == "rope" else None), 1e-9  # noqa: B023 (called at once)

# 6. fewer queries than keys, strided caches, value encodings on strided v
for name, mk in ENCS.items():
    @attack(f"tail-queries {name}")
    def _(mk=mk):
        enc = mk(); q = rnd(1, 4, 3, 8, seed=0); k, v = rnd(1, 4, 30, 8, seed=1), rnd(1, 4, 30, 8, seed=2)
        kp = torch.arange(30, dtype=F64) * 7; p = kp[-3:]
        return lp.attention(q, k, v, enc, p, kp), ref(q, k, v, enc, p, kp), 1e-9

    @attack(f"decode strided {name}")
    def _(mk=mk):
        enc = mk()
        big = rnd(1, 4, 20, 16, seed=3)
        q, k = big[..., ::2], big[..., 1::2]  # stepped
        v = big.transpose(1, 2).contiguous().transpose(1, 2)[..., 8:]  # BSHD memory, an offset
        p = torch.arange(20, dtype=F64) + 100
        c, outs = lp.KVCache(), []
        for lo, hi in ((0, 10), *((i, i + 1) for i in range(10, 20))):
            outs.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, p[lo:hi], p[lo:hi], cache=c))
        return torch.cat(outs, 2), ref(q, k, v, enc, p), 1e-9

for vname in ("xpos", "decay", "rope"):
    for lay in ("channels_last", "stepped"):
        @attack(f"value_encoding {vname} {lay}")
        def _(vname=vname, lay=lay):
            enc = lp.rope(8); venc = ENCS[vname](); q, k, v = (rnd(1, 4, 16, 8, seed=i) for i in range(3))
            vv = v.contiguous(memory_format=torch.channels_last) if lay == "channels_last" else torch.stack((v, v), -1).flatten(-2)[..., ::2]
            p = torch.arange(16, dtype=F64) + 50
            return lp.attention(q, k, vv, enc, p, p, value_encoding=venc), ref(q, k, v, enc, p, value_encoding=venc), 1e-9

# 7. in place on views
for name in ("rope", "rope-half", "xpos", "decay", "jordan"):
    for lay in ("slice-of-wider", "transposed", "stepped", "expanded-heads", "overlap-strided"):
        @attack(f"inplace {name} {lay}")
        def _(name=name, lay=lay):
            enc = lp.build("jordan", 64) if name == "jordan" else (ENCS[name]() if name != "rope-half" else lp.rope(64, layout="half"))
            D = enc.content_dim
            x = rnd(2, 4, 300, D, dtype=torch.float32)
            if lay == "slice-of-wider":
                w = torch.zeros(2, 4, 300, D + 6); w[..., 3:3 + D] = x; view = w[..., 3:3 + D]
            elif lay == "transposed":
                view = x.transpose(1, 2).contiguous().transpose(1, 2)
            elif lay == "stepped":
                w = torch.zeros(2, 4, 600, D); w[:, :, ::2] = x; view = w[:, :, ::2]
            elif lay == "expanded-heads":
                x = x[:, :1].expand(2, 4, 300, D); view = x
            else:
                base = torch.randn(2 * 4 * 300 * D); view = base.as_strided((2, 4, 300, D), (4 * 300 * D, 300 * D, D - 1, 1)); x = view.clone()
            p = torch.arange(300, dtype=F64)
            o = None if not enc.needs_recentring else 150.0
            want = enc.query_reference(x.double(), p, origin=o)
            got = enc.query(view, p, origin=o, inplace=True)
            return got, want, 1e-6 * float(want.abs().max())

# 8. masks: rows with no key, documents, padding under ALiBi and decay
for name, mk in ENCS.items():
    @attack(f"all-padded-row {name}")
    def _(mk=mk):
        enc = mk(); q, k, v = (rnd(2, 4, 8, 8, seed=i) for i in range(3))
        keep = torch.ones(2, 8, dtype=torch.bool); keep[1] = False
        p = torch.arange(8, dtype=F64)
        return lp.attention(q, k, v, enc, p, p, key_padding_mask=keep), ref(q, k, v, enc, p, mask=keep[:, None, None, :]), 1e-9

    @attack(f"documents {name}")
    def _(mk=mk):
        enc = mk(); q, k, v = (rnd(1, 4, 12, 8, seed=i) for i in range(3))
        docs = torch.tensor([[0] * 5 + [1] * 7]); p = torch.cat([torch.arange(5), torch.arange(7)]).double()
        m = (docs[0][:, None] == docs[0][None, :])[None, None] & torch.ones(12, 12, dtype=torch.bool).tril()
        return lp.attention(q, k, v, enc, p, p, document_ids=docs), ref(q, k, v, enc, p, causal=False, mask=m), 1e-9

# 9. mixed dtypes and devices-of-positions
@attack("mixed dtype q64 k32")
def _():
    q = rnd(1, 1, 4, 8); k = rnd(1, 1, 4, 8, dtype=torch.float32)
    return lp.attention(q, k, k.double(), lp.rope(8)), ref(q, k, k, lp.rope(8), torch.arange(4.)), 1e-6

@attack("positions float32 1e7 (not exact)")
def _():
    q, k, v = (rnd(1, 1, 4, 8, seed=i) for i in range(3))
    p32 = (torch.arange(4) + 16777216).float()
    return lp.attention(q, k, v, lp.rope(8), p32, p32), ref(q, k, v, lp.rope(8), p32.double()), 1e-9

@attack("alibi sinks far anti-aligned")
def _():
    enc = lp.alibi(8, num_heads=4); q, k, v = (rnd(1, 4, 8, 8, dtype=torch.float32, seed=i) for i in range(3))
    k[:, :, 4] = -q[:, :, 4] * 500; p = 700.0 * torch.arange(8, dtype=F64)
    s = torch.tensor([0.1, 2.0, -1.0, 0.0])
    return lp.attention(q, k, v, enc, p, p, sinks=s), ref(q, k, v, enc, p, sinks=s), 1e-4

# 10. ALiBi's window under batch-varying times and adversarial rows, GQA, huge float64 norms
for dt in (torch.float32, F64):
    for gqa in (False, True):
        @attack(f"alibi window batch-varying {dt} gqa={gqa}")
        def _(dt=dt, gqa=gqa):
            enc = lp.alibi(8, num_heads=4); q = rnd(2, 4, 10, 8, dtype=dt, seed=0)
            hk = 2 if gqa else 4
            k, v = rnd(2, hk, 10, 8, dtype=dt, seed=1), rnd(2, hk, 10, 8, dtype=dt, seed=2)
            k[1, :, 6] = -q[1, :hk, 6] * 300
            gaps = torch.tensor([[1.0] * 10, [900.0] * 10], dtype=F64); p = torch.cumsum(gaps, 1)
            return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), EPS[dt] * 4

for s_ in (1e100, 1e-100):
    @attack(f"alibi float64 norms x{s_:g}")
    def _(s_=s_):
        enc = lp.alibi(8, num_heads=4); q, k = rnd(1, 4, 12, 8, seed=0), rnd(1, 4, 12, 8, seed=1) * s_
        v = rnd(1, 4, 12, 8, seed=2); p = 400.0 * torch.arange(12, dtype=F64)
        return lp.attention(q, k, v, enc, p, p), ref(q, k, v, enc, p), 1e-9

for bad in (math.inf, -math.inf, math.nan):
    @attack(f"sinks {bad}")
    def _(bad=bad):
        q, k, v = (rnd(1, 2, 4, 8, seed=i) for i in range(3)); s = torch.tensor([bad, 0.0], dtype=F64)
        return lp.attention(q, k, v, lp.xpos(8), sinks=s), ref(q, k, v, lp.xpos(8), torch.arange(4.), sinks=s), 1e-9

for name, mk in ENCS.items():
    @attack(f"float16 sinks {name}")
    def _(mk=mk):
        enc = mk(); q, k, v = (rnd(1, 4, 33, 8, dtype=torch.float16, seed=i) for i in range(3))
        s = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float16); p = torch.arange(33, dtype=F64)
        return lp.attention(q, k, v, enc, p, p, sinks=s), ref(q, k, v, enc, p, sinks=s.double()), 2e-2


# ---------------------------------------------------------------- the per-layer, per-row and temperature layers
from liepos.schedule import build_schedule, window_mask  # noqa: E402 (the sections above need only liepos)
from liepos.temperature import ScalableSoftmax, SwanLengthScaling  # noqa: E402


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
def _ssmax_full(enc, s, q, k, v, p, counts, **kw):
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
            return got, _ssmax_full(enc, s, q, k, v, p, n, **rkw), 1e-9

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
    return got, _ssmax_full(lp.rope(8), torch.tensor([0.5], dtype=F64), q, k, v, torch.arange(6.0), n, mask=keep[:, None, None, :]), 1e-9

@attack("ssmax float16")
def _():
    q, k, v = (rnd(1, 2, 33, 8, dtype=torch.float16, seed=i) for i in range(3)); p = torch.arange(33, dtype=F64)
    n = torch.arange(1, 34, dtype=F64).expand(1, 1, 33)
    got = lp.attention(q, k, v, lp.xpos(8), p, p, temperature=ScalableSoftmax(0.4))
    return got, _ssmax_full(lp.xpos(8), torch.tensor([0.4], dtype=F64), q, k, v, p, n), 2e-2

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
def _per_row(encs, q, k, v, p, **kw):
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
            return decode(pr.attention, q, k, v, p, CUTS, cache=pr.cache()), _per_row(encs, q, k, v, p), 1e-9
        if how == "padded":
            keep = torch.ones(4, 12, dtype=torch.bool); keep[2, :4] = False; keep[3, 5] = False
            return pr.attention(q, k, v, p, p, key_padding_mask=keep), _per_row(encs, q, k, v, p, mask=keep[:, None, None, :]), 1e-9
        return pr.attention(q, k, v, p, p), _per_row(encs, q, k, v, p), 1e-9

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
from liepos.coordinates import circle_rope, vrope, vrope_encoding, ring  # noqa: E402

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
    return torch.cat(outs, 2), _ssmax_full(enc, torch.tensor([0.5], dtype=F64), q, k, v, p, n, mask=keep[:, None, None, :]), 1e-9

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
        return got, _ssmax_full(lp.rope(8), torch.tensor([0.6], dtype=F64), q, k, v, p, n, causal=False, mask=keep[:, None, None, :]), 1e-9

@attack("ssmax documents count their own keys")
def _():
    q, k, v = (rnd(1, 2, 9, 8, seed=i) for i in range(3)); docs = torch.tensor([[0] * 4 + [1] * 5]); p = torch.cat([torch.arange(4), torch.arange(5)]).double()
    m = (docs[0][:, None] == docs[0][None, :])[None, None] & torch.ones(9, 9, dtype=torch.bool).tril()
    got = lp.attention(q, k, v, lp.xpos(8), p, p, document_ids=docs, temperature=ScalableSoftmax(0.6))
    return got, _ssmax_full(lp.xpos(8), torch.tensor([0.6], dtype=F64), q, k, v, p, m.sum(-1).double(), causal=False, mask=m), 1e-9

@attack("ssmax gqa per-head s")
def _():
    s = torch.tensor([0.2, 0.4, 0.8, 1.6], dtype=F64); q = rnd(1, 4, 8, 8, seed=0); k, v = rnd(1, 1, 8, 8, seed=1), rnd(1, 1, 8, 8, seed=2)
    got = lp.attention(q, k, v, lp.decay([0.1] * 8), temperature=ScalableSoftmax(s))
    return got, _ssmax_full(lp.decay([0.1] * 8), s, q, k, v, torch.arange(8.0), torch.arange(1, 9, dtype=F64).expand(1, 1, 8)), 1e-9

@attack("ssmax bfloat16")
def _():
    q, k, v = (rnd(1, 2, 20, 8, dtype=torch.bfloat16, seed=i) for i in range(3)); p = torch.arange(20, dtype=F64)
    got = lp.attention(q, k, v, lp.rope(8), p, p, temperature=ScalableSoftmax(0.4))
    return got, _ssmax_full(lp.rope(8), torch.tensor([0.4], dtype=F64), q, k, v, p, torch.arange(1, 21, dtype=F64).expand(1, 1, 20)), 6e-2

@attack("per_request mrope batched 3-axis positions")
def _():
    encs = [lp.mrope(12, sections=(2, 2, 2)), lp.scaling.linear(lp.mrope(12, sections=(2, 2, 2)), factor=2.0)]
    q, k, v = (rnd(2, 1, 5, 12, seed=i) for i in range(3)); p = torch.randint(0, 9, (2, 5, 3), generator=torch.Generator().manual_seed(0)).double()
    return lp.PerRequest(encs).attention(q, k, v, p, p), _per_row(encs, q, k, v, p), 1e-9

@attack("per_request mrope unbatched positions with seq = batch")
def _():
    encs = [lp.mrope(12, sections=(2, 2, 2)), lp.scaling.linear(lp.mrope(12, sections=(2, 2, 2)), factor=2.0), lp.mrope(12, sections=(2, 2, 2))]
    q, k, v = (rnd(3, 1, 3, 12, seed=i) for i in range(3)); p = torch.tensor([[0.0, 0, 0], [1, 2, 1], [2, 2, 3]])
    want = torch.cat([ref(q[b:b + 1], k[b:b + 1], v[b:b + 1], e, p) for b, e in enumerate(encs)], 0)
    return lp.PerRequest(encs).attention(q, k, v, p, p), want, 1e-9

@attack("per_request batch-1 positions broadcast")
def _():
    encs = PR_ENCS(); q, k, v = (rnd(4, 2, 6, 8, seed=i) for i in range(3)); p = (torch.arange(6, dtype=F64) * 3)[None]
    return lp.PerRequest(encs).attention(q, k, v, p, p), _per_row(encs, q, k, v, p[0]), 1e-9

@attack("per_request documents through a cache")
def _():
    encs = PR_ENCS(); pr = lp.PerRequest(encs); q, k, v = (rnd(4, 2, 12, 8, seed=i) for i in range(3))
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12, [0] * 2 + [1] * 10, [0] * 7 + [1] * 5]); p = torch.arange(12, dtype=F64)
    c, outs = pr.cache(), []
    for lo, hi in CUTS:
        outs.append(pr.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], p[lo:hi], p[lo:hi], cache=c, document_ids=docs[:, lo:hi]))
    m = (docs[:, :, None] == docs[:, None, :])[:, None]
    return torch.cat(outs, 2), _per_row(encs, q, k, v, p, mask=m), 1e-9

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
            return lp.attention(q, k, v, enc, p, p, **kw), _ssmax_full(enc, torch.tensor([2.0], dtype=F64), q, k, v, p, n), 2e-2
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


def main(argv: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    only = [a[len("--only="):] for a in argv if a.startswith("--only=")]
    for name, fn in ATTACKS:
        if only and not any(name.startswith(o) for o in only):
            continue
        v, detail = verdict(fn)
        counts[v] = counts.get(v, 0) + 1
        if v in ("WRONG", "CRASH") or "-v" in argv:
            print(f"{v:6} {name}: {detail}")
    print(sum(counts.values()), "attempts", counts)
    return counts


if __name__ == "__main__":
    sys.exit(1 if {"WRONG", "CRASH"} & set(main(sys.argv)) else 0)
