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


WHERE: dict[str, str] = {}  # attack name -> the file that registered it


def attack(name):
    """Register an attack: a function returning ``(got, want, tolerance)`` (run by :func:`main`). A file imported
    twice (pytest's doctest collection imports it under a second module name) registers its attacks once; one
    name in two places is an error."""
    def deco(fn):
        where = fn.__code__.co_filename
        if WHERE.setdefault(name, where) != where:
            raise ValueError(f"attack {name!r} is registered by {WHERE[name]} and by {where}")
        if not any(n == name for n, _ in ATTACKS):
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


def main(argv: list[str]) -> dict[str, int]:
    import attacks_inputs  # noqa: F401 (their attacks join the table on import)
    import attacks_layers  # noqa: F401

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
    import attacks as table  # the module the other attack files register into, not this script's copy

    sys.exit(1 if {"WRONG", "CRASH"} & set(table.main(sys.argv)) else 0)
