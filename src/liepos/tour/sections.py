"""The tour's sections as data: the theory's argument, measured live by liepos.

Every function here returns plain data (floats, lists, nested dicts) computed by liepos itself:
nothing is a frozen number. :mod:`liepos.tour.figures` draws them, :mod:`liepos.tour.page` writes
them to ``numbers.json`` and an HTML page. This module never imports matplotlib.

Measured identities carry their bound, ``{"value": err, "bound": b}``, so that a report (and the
tests) can say *passed* without re-deriving tolerances::

    A(0) = I,   A(u) A(v) = A(u + v),   F(t)ᵀ G(s) = A(t − s)

>>> r = group_identities()
>>> all(e["value"] <= e["bound"] for row in r["rows"].values() for e in row.values())
True
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos.attend import attention
from liepos.classification import NAMES, classify
from liepos.catalogue import CATALOGUE, alibi, alibi_slopes, rope, rope_freqs, xpos
from liepos.encoding import Encoding
from liepos.generator import Generator
from liepos.tables import reduced_angle

__all__ = [
    "ROWS", "ROW_LABELS", "ROW_PICTURES", "toy_generators", "classification",
    "where_position", "group_identities", "six_rows", "lookup_table", "clocks", "spectrum",
    "context_extension", "precision", "alibi_slide", "SECTIONS", "measured_errors", "json_safe",
]

f64 = torch.float64

# the theory's six rows, in the order of its table (defined once, in liepos.classification)
ROWS = NAMES
# the tour's words for each row: a name a reader knows, and the picture of A(u)v as the lag grows
# each row as the page labels it: the name liepos.classify gives it first, then what it is known as
# (a decaying Jordan block is "polynomial", like ALiBi's slide, not "ALiBi")
ROW_LABELS = {
    "growth": "growth",
    "nope": "nope (NoPE)",
    "decay": "decay",
    "rotation": "rotation (RoPE)",
    "damped_rotation": "damped_rotation (xPos, RetNet)",
    "polynomial": "polynomial (the slide: ALiBi, Jordan)",
}
ROW_PICTURES = {
    "growth": "the explosion",
    "nope": "standing still",
    "decay": "the fade",
    "rotation": "the circle",
    "damped_rotation": "the spiral",
    "polynomial": "the slide",
}


# ---------------------------------------------------------------------- helpers
def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| relative to max(1, max |b|)."""
    a, b = a.to(f64), b.to(f64)
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def _measured(value: float, bound: float) -> dict[str, float | bool]:
    return {"value": float(value), "bound": float(bound), "ok": bool(value <= bound)}


def _slots(x: torch.Tensor | None) -> list:
    """An encoding's slot constants as a list (an ALiBi encoding always has them)."""
    if x is None:
        raise ValueError("the encoding has no slots")
    return x.tolist()


def _mat(x: torch.Tensor, digits: int = 4) -> list[list[float]]:
    return [[round(float(v), digits) + 0.0 for v in row] for row in x.to(f64).tolist()]


def toy_generators() -> dict[str, Generator]:
    """One small generator per row of the six (2 dims each, so a trajectory is a plane curve)."""
    return {
        "growth": Generator([0.15, 0.08], [0.0, 0.0], [1, 1], allow_growth=True),
        "nope": Generator([0.0, 0.0], [0.0, 0.0], [1, 1]),
        "decay": Generator([-0.1, -0.25], [0.0, 0.0], [1, 1]),
        "rotation": Generator([0.0], [0.5], [1]),
        "damped_rotation": Generator([-0.08], [0.5], [1]),
        "polynomial": Generator([0.0], [0.0], [2]),
    }


def catalogue_examples(head_dim: int = 8, num_heads: int = 4) -> dict[str, tuple[str, Encoding]]:
    """For each row, the first catalogue entry of that row: ``row -> (entry name, encoding)``."""
    out: dict[str, tuple[str, Encoding]] = {}
    for name, entry in CATALOGUE.items():
        if entry.row in ROWS and entry.row not in out:
            out[entry.row] = (name, entry.build(head_dim, num_heads))
    return out


def classification(x: Any) -> dict[str, Any]:
    """``liepos.classify(x)`` as data: counts, blocks ``[rate, freq, size]``, their row names, the table."""
    c = classify(x)
    counts = {k: int(v) for k, v in dict(c.counts).items()}
    blocks = [[float(r), float(w), int(n)] for r, w, n in c.blocks]
    return {"counts": counts, "blocks": blocks, "names": list(c.names), "table": str(c)}


# ---------------------------------------------------------------------- 1. where position enters
def where_position(seq: int = 8, dim: int = 8, seed: int = 0) -> dict[str, Any]:
    """One attention head: raw scores qᵀk, RoPE-encoded scores (F(t)q)ᵀ(G(s)k)/√d, the causal mask."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, seq, dim, generator=g, dtype=f64)
    k = torch.randn(1, 1, seq, dim, generator=g, dtype=f64)
    v = torch.randn(1, 1, seq, dim, generator=g, dtype=f64)
    enc = rope(dim)
    pos = torch.arange(seq, dtype=f64)
    raw = (q @ k.transpose(-1, -2))[0, 0] / math.sqrt(dim)  # (seq, seq)
    qe, ke = enc.query(q, pos), enc.key(k, pos)
    scores = (qe @ ke.transpose(-1, -2))[0, 0] / math.sqrt(dim)  # (t, s)
    mask = torch.ones(seq, seq, dtype=torch.bool).tril()  # True: key s ≤ t is visible
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    out_manual = weights @ v[0, 0]
    out = attention(q, k, v, enc)[0, 0]
    # the same scores from the lags alone: qᵀ A(t − s) k
    lag = pos[:, None] - pos[None, :]
    A = enc.generator.exp(lag)  # (t, s, d, d)
    from_lags = torch.einsum("td,tsde,se->ts", q[0, 0], A, k[0, 0]) / math.sqrt(dim)
    return {
        "seq": seq, "dim": dim, "encoding": "rope(8)",
        "raw_scores": _mat(raw), "scores": _mat(scores), "mask": mask.int().tolist(),
        "weights": _mat(weights),
        "errors": {
            "scores_vs_lag_form": _measured(_err(scores, from_lags), 1e-12),
            "attention_vs_manual_softmax": _measured(_err(out, out_manual), 1e-12),
        },
    }


# ---------------------------------------------------------------------- 2. the group
def _FG(g: Generator, t: float, s: float, origin: float | None = None) -> torch.Tensor:
    """F(t)ᵀ G(s) measured through ``Encoding.query``/``key`` on the basis vectors."""
    enc = Encoding(g)
    d = g.dim
    E = torch.eye(d, dtype=f64).reshape(d, 1, 1, d)  # (d, 1, 1, d): a batch of the basis vectors e_i
    MF = enc.query(E, [t], origin=origin)[:, 0, 0, :]  # row i = F(t) e_i, so MF = F(t)ᵀ
    MG = enc.key(E, [s], origin=origin)[:, 0, 0, :]  # MG = G(s)ᵀ
    return MF @ MG.T


def group_identities(seed: int = 0) -> dict[str, Any]:
    """Measured errors of the group law for one generator per row and for a random dense X."""
    gens = dict(toy_generators())
    gens["rope(16)"] = rope(16).generator
    gens["xpos(16)"] = xpos(16).generator
    gens["jordan(3, rate=-0.1, freq=0.7)"] = Generator([-0.1], [0.7], [3])
    us = torch.tensor([0.0, 0.5, 1.0, 3.0, 7.25, 12.0], dtype=f64)
    rows: dict[str, dict[str, Any]] = {}
    for name, g in gens.items():
        d = g.dim
        A0 = g.exp(torch.tensor(0.0, dtype=f64))
        law = max(_err(g.exp(u) @ g.exp(v), g.exp(u + v)) for u in us for v in -us[:4])
        fg = max(_err(_FG(g, t, s), g.exp(torch.tensor(t - s, dtype=f64))) for t, s in [(5.0, 2.0), (3.5, 3.5), (9.0, 0.25)])
        far = _err(_FG(g, 1e6 + 5.0, 1e6 + 2.0, origin=1e6), g.exp(torch.tensor(3.0, dtype=f64)))
        rows[name] = {
            "A(0) = I": _measured(_err(A0, torch.eye(d, dtype=f64)), 1e-15),
            "A(u)A(v) = A(u+v)": _measured(law, 1e-12),
            "F(t)^T G(s) = A(t-s)": _measured(fg, 1e-12),
            "F(t)^T G(s) at t, s ~ 1e6 (re-centred)": _measured(far, 1e-12),
        }
    # a random dense generator: from_matrix, then closed-form exp against torch.linalg.matrix_exp
    gen = torch.Generator().manual_seed(seed)
    X = 0.4 * torch.randn(5, 5, generator=gen, dtype=f64)
    g = Generator.from_matrix(X, allow_growth=True)  # a random matrix may grow: this checks exp, not the row
    expm = max(_err(g.exp(torch.tensor(u, dtype=f64)), torch.linalg.matrix_exp(u * X)) for u in (0.5, 1.0, 2.0, -1.5))
    recon = _err(g.matrix(), X)
    return {
        "rows": rows,
        "random_X": {
            "blocks": [list(b) for b in g.blocks],
            "errors": {
                "P J P^-1 = X": _measured(recon, 1e-10),
                "closed-form exp(uX) = matrix_exp(uX)": _measured(expm, 1e-10),
            },
        },
    }


# ---------------------------------------------------------------------- 3. the six rows
HEAD_DIM = 8  # the head dim of the shipped examples of the six rows (ALiBi adds 2 slot dims to it)


def six_rows(max_lag: float = 40.0, points: int = 801) -> dict[str, Any]:
    """For each row: the toy generator X, its classification, and A(u)v for a fixed v as u grows.

    The window reaches u = 40 so that growth's exponential overtakes the slide's straight line
    (|A(u)v| ≈ 0.6 e^{0.15u} against ≈ 0.8u: they cross near u = 23)."""
    v = torch.tensor([0.6, 0.8], dtype=f64)
    u = torch.linspace(0.0, max_lag, points, dtype=f64)
    out: dict[str, Any] = {"vector": v.tolist(), "lags": u.tolist(), "rows": {}}
    examples = catalogue_examples(HEAD_DIM)
    for name, g in toy_generators().items():
        traj = g.exp(u) @ v  # (points, 2)
        entry, enc = examples[name]
        out["rows"][name] = {
            "label": ROW_LABELS[name],
            "picture": ROW_PICTURES[name],
            "X": _mat(g.matrix()),
            "blocks": [list(b) for b in g.blocks],
            "classification": classification(g),
            "example": {"entry": entry, "head_dim": HEAD_DIM, "classification": classification(enc)},
            "trajectory": [[round(float(a), 6), round(float(b), 6)] for a, b in traj.tolist()],
            "norm": [round(float(n), 6) for n in traj.norm(dim=-1).tolist()],
        }
    return out


# ---------------------------------------------------------------------- 4. the lookup table
def _diagonal_spread(M: torch.Tensor, lower_only: bool = False) -> float:
    """max over diagonals of (max − min) along the diagonal: 0 for a function of t − s."""
    n = M.shape[0]
    spread = 0.0
    for off in range(-(n - 1), n):
        if lower_only and off > 0:
            continue
        d = torch.diagonal(M, offset=off)
        spread = max(spread, float(d.max() - d.min()))
    return spread


def lookup_table(n: int = 16, dim: int = 8, seed: int = 1) -> dict[str, Any]:
    """A(t − s) and encoded scores over (t, s): constant diagonals; an absolute encoding breaks them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(dim, generator=gen, dtype=f64)
    k = torch.randn(dim, generator=gen, dtype=f64)
    pos = torch.arange(n, dtype=f64)
    lag = pos[:, None] - pos[None, :]
    g = Generator([0.0], [0.5], [1])
    entry = g.exp(lag)[..., 0, 0]  # (t, s): cos(0.5 (t − s))
    qs = q.expand(1, 1, n, dim)  # (1, 1, n, dim): the same q at every position
    ks = k.expand(1, 1, n, dim)  # (1, 1, n, dim)
    enc = rope(dim)
    rope_scores = (enc.query(qs, pos) @ enc.key(ks, pos).transpose(-1, -2))[0, 0]
    al = alibi(dim, num_heads=1, slopes=[0.25])
    alibi_scores = (al.query(qs, pos) @ al.key(ks, pos).transpose(-1, -2))[0, 0]
    # an absolute encoding: sinusoidal vectors added to q and k (Vaswani et al.)
    ang = pos[:, None] * rope_freqs(dim)[None, :]
    P = torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)  # (n, dim)
    abs_scores = (q + P) @ (k + P).T
    causal = (lag >= 0)
    return {
        "n": n,
        "A_entry": _mat(entry), "rope_scores": _mat(rope_scores),
        "alibi_scores": _mat(alibi_scores.masked_fill(~causal, float("nan"))),
        "absolute_scores": _mat(abs_scores),
        "distinct_A": int(2 * n - 1), "cells": n * n,
        "diagonal_spread": {
            "A(t-s)[0,0]": _measured(_diagonal_spread(entry), 1e-14),
            "RoPE scores": _measured(_diagonal_spread(rope_scores), 1e-12),
            "ALiBi scores (causal)": _measured(_diagonal_spread(alibi_scores, lower_only=True), 1e-12),
            "absolute (sinusoidal added)": {"value": _diagonal_spread(abs_scores), "bound": None,
                                            "ok": None, "note": "large on purpose: not a function of t - s"},
        },
    }


# ---------------------------------------------------------------------- 5. a bank of clocks
# the score at gap 3 of the theory's worked example (d = 16, base 10000), as printed there to 3 decimals
WORKED_EXAMPLE_SCORE = 5.543


def clocks(bases: tuple[float, ...] = (100.0, 10000.0, 500000.0), dim: int = 64, max_gap: int = 30000) -> dict[str, Any]:
    """RoPE frequencies for several bases, score against gap, and the theory's worked example (d = 16)."""
    freqs = {f"{b:g}": rope_freqs(dim, b).tolist() for b in bases}
    gaps = torch.unique(torch.cat([
        torch.arange(0, 64, dtype=f64),
        torch.logspace(math.log10(64), math.log10(max_gap), 700, dtype=f64).round(),
    ]))
    curves = {}
    for b in bases:
        w = rope_freqs(dim, b)
        # q = k = (1, 0) in every plane: score(u) = Σ_k cos(ω_k u), normalised by the planes
        curves[f"{b:g}"] = (torch.cos(reduced_angle(w[None, :], gaps[:, None])).sum(-1) / (dim // 2)).tolist()
    # the theory's worked example: d = 16, base 10000, every plane of q and k = (1, 0)
    enc = rope(16)
    q = torch.zeros(1, 1, 1, 16, dtype=f64)
    q[..., 0::2] = 1.0
    def score(t: float, s: float) -> float:
        return float((enc.query(q, [t]) * enc.key(q, [s])).sum())
    pairs = [(5, 2), (13, 10), (103, 100), (1_000_003, 1_000_000), (9, 2)]
    table = [{"t": t, "s": s, "gap": t - s, "score": score(t, s)} for t, s in pairs]
    closed = float(torch.cos(rope_freqs(16) * 3.0).sum())
    w16 = rope_freqs(16)
    return {
        "dim": dim, "bases": [float(b) for b in bases], "freqs": freqs,
        "gaps": gaps.tolist(), "score_vs_gap": curves,
        "worked_example": {
            "dim": 16, "base": 10000.0, "pairs": table, "closed_form_gap3": closed,
            "planes": [{"k": i, "freq": float(w), "turn_every": float(2 * math.pi / w)} for i, w in enumerate(w16.tolist())],
            "theory_value": WORKED_EXAMPLE_SCORE,
            "errors": {
                "score(5,2) vs the theory's 5.543 (3 decimals)": _measured(abs(table[0]["score"] - WORKED_EXAMPLE_SCORE), 5e-4),
                "score(5,2) vs closed form Σcos(3ω_k)": _measured(abs(table[0]["score"] - closed), 1e-12),
                "score(t,s) shift-invariant (gap 3, t up to 1e6)": _measured(
                    max(abs(r["score"] - table[0]["score"]) for r in table[:4]), 1e-9),
            },
        },
    }


# ---------------------------------------------------------------------- 6. fate and rhythm
def _points(x: Any) -> list[dict[str, Any]]:
    """The distinct blocks of ``x`` as points (rate λ, frequency |ω|, size) with the row ``classify`` names."""
    c = classify(x)
    pts = sorted({(round(r, 12), round(abs(w), 12), n, name) for (r, w, n), name in zip(c.blocks, c.names)})
    return [{"rate": r, "freq": w, "size": n, "row": name} for r, w, n, name in pts]


def spectrum(head_dim: int = 16, num_heads: int = 4) -> dict[str, Any]:
    """Every catalogue entry's blocks as points (rate λ, frequency ω) with their row, and the growth example."""
    entries = {}
    for name, entry in CATALOGUE.items():
        enc = entry.build(head_dim, num_heads)
        entries[name] = {"row": entry.row, "points": _points(enc), "classification": classification(enc)}
    growth = toy_generators()["growth"]  # diag(0.15, 0.08): the six rows' growth example
    entries["growth (example)"] = {"row": "growth", "points": _points(growth), "classification": classification(growth)}
    return {"head_dim": head_dim, "num_heads": num_heads, "entries": entries}


# ---------------------------------------------------------------------- 7. context extension
def context_extension(dim: int = 128, base: float = 500000.0, factor: float = 8.0, original: int = 8192) -> dict[str, Any]:
    """RoPE frequencies before and after linear, NTK, YaRN and Llama 3 scaling (``liepos.scaling``)."""
    from liepos import scaling

    enc = rope(dim, base)
    w = enc.generator.freqs
    maps = {
        "linear": lambda e: scaling.linear(e, factor=factor),
        "ntk": lambda e: scaling.ntk(e, factor=factor),
        "yarn": lambda e: scaling.yarn(e, factor=factor, original_max_position_embeddings=original),
        "llama3": lambda e: scaling.llama3(e, factor=factor, original_max_position_embeddings=original),
    }
    out: dict[str, Any] = {"dim": dim, "base": base, "factor": factor,
                           "original_max_position_embeddings": original, "before": w.tolist(), "after": {},
                           "logit_scale": {}, "wavelength": (2 * math.pi / w).tolist()}
    for name, f in maps.items():
        e2 = f(enc).at_length(original * int(factor))
        out["after"][name] = e2.generator.freqs.tolist()
        out["logit_scale"][name] = float(e2.logit_scale)
    return out


# ---------------------------------------------------------------------- 8. precision
def precision(dim: int = 128, base: float = 500000.0, planes: tuple[int, ...] | None = None,
              n_positions: int = 40, digits: int = 40) -> dict[str, Any]:
    """|cos − cos_ref| and |sin − sin_ref| against mpmath, for liepos and a float32 pipeline.

    The reference uses the exact frequency ``base^(−2k/d)`` at ``digits`` decimal digits. liepos:
    float64 frequency, exact reduction (:func:`~liepos.tables.reduced_angle`), cos in float64, cast
    to float32. The float32 pipeline is Hugging Face's: ``inv_freq`` in float32, ``t.float() * inv_freq``,
    cos in float32.
    """
    try:
        import mpmath
    except ImportError as err:  # mpmath comes with sympy (liepos[plot]); without it, say so
        return {"available": False, "note": f"mpmath is not available ({err}); install liepos[plot]"}
    P = dim // 2
    if planes is None:  # fastest, two in between, slowest: (0, 16, 40, 63) for d = 128
        planes = tuple(sorted({0, P // 4, (5 * P) // 8, P - 1}))
    # odd integers, log-spaced (powers of two would be exact in float32 and flatter the pipeline)
    pos = torch.logspace(0, math.log10(2**31 - 1), n_positions, dtype=f64).round()
    pos = torch.unique(pos + (pos % 2 == 0).to(f64)).clamp(max=2**31 - 1)
    pos[-1] = 2**31 - 1
    w64 = rope_freqs(dim, base)
    inv32 = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # HF, float32
    out: dict[str, Any] = {"available": True, "dim": dim, "base": base, "digits": digits, "positions": pos.tolist(),
                           "planes": {}}
    worst_liepos = 0.0
    with mpmath.workdps(digits):  # the working precision for this reference only, restored after
        for k in planes:
            wk = mpmath.power(mpmath.mpf(base), mpmath.mpf(-2 * k) / dim)
            ang = reduced_angle(w64[k].expand_as(pos), pos)  # (P,)
            lc, ls = torch.cos(ang).float(), torch.sin(ang).float()
            a32 = pos.float() * inv32[k]
            hc, hs = torch.cos(a32), torch.sin(a32)
            el, eh = [], []
            for i, t in enumerate(pos.tolist()):
                x = wk * mpmath.mpf(int(t))
                c, s = mpmath.cos(x), mpmath.sin(x)
                el.append(max(abs(float(mpmath.mpf(float(lc[i])) - c)), abs(float(mpmath.mpf(float(ls[i])) - s))))
                eh.append(max(abs(float(mpmath.mpf(float(hc[i])) - c)), abs(float(mpmath.mpf(float(hs[i])) - s))))
            worst_liepos = max(worst_liepos, max(el))
            out["planes"][str(k)] = {"freq": float(w64[k]), "liepos": el, "float32": eh}
    # float32 rounding of a number of size 1 is 2^-25 ≈ 3e-8; the float64 frequency adds |t ω| · 1.1e-16
    out["errors"] = {
        "liepos max error, positions <= 2^31-1": _measured(worst_liepos, 1e-6),
        "liepos max error, positions <= 2^16": _measured(max(
            e for p in out["planes"].values() for t, e in zip(pos.tolist(), p["liepos"]) if t <= 2**16), 1e-7),
    }
    out["float32_max_error"] = max(max(p["float32"]) for p in out["planes"].values())
    return out


# ---------------------------------------------------------------------- 9. ALiBi is a slide
def alibi_slide(num_heads: int = 8, head_dim: int = 4, n: int = 12, seed: int = 2) -> dict[str, Any]:
    """The nilpotent block, the slots, and the bias −m_h (t − s) they produce, against Press et al."""
    enc = alibi(head_dim, num_heads=num_heads)
    m = alibi_slopes(num_heads)
    pos = torch.arange(n, dtype=f64)
    zero = torch.zeros(1, num_heads, n, head_dim, dtype=f64)
    bias = enc.query(zero, pos) @ enc.key(zero, pos).transpose(-1, -2)  # (1, H, t, s)
    lag = pos[:, None] - pos[None, :]
    press = -m[:, None, None] * lag  # (H, t, s)
    # full attention: liepos's slots against an explicit additive bias (Press et al.'s formulation)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, num_heads, n, head_dim, generator=gen, dtype=f64) for _ in range(3))
    ours = attention(q, k, v, enc)
    # Press et al.: softmax(qᵀk/√d − m_h (t − s)), the bias added after the 1/√d scaling
    sc = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + press
    sc = sc.masked_fill(lag < 0, float("-inf"))
    ref = sc.softmax(-1) @ v
    N = enc.generator.canonical_matrix()[-2:, -2:]
    return {
        "num_heads": num_heads, "head_dim": head_dim, "n": n, "slopes": m.tolist(),
        "N": _mat(N), "query_slots": _slots(enc.query_slots), "key_slots": _slots(enc.key_slots),
        "exp_uN_at_u3": _mat(Generator([0.0], [0.0], [2]).exp(torch.tensor(3.0, dtype=f64))),
        "bias": [_mat(b) for b in bias[0]],
        "classification": classification(enc),
        "errors": {
            "slot bias = -m_h (t - s)": _measured(_err(bias[0], press), 1e-12),
            "attention with slots = attention with explicit bias": _measured(_err(ours, ref), 1e-12),
        },
    }


# name -> (title, function); the order of the tour
SECTIONS: dict[str, tuple[str, Any]] = {
    "attention": ("Where position enters", where_position),
    "group": ("The group", group_identities),
    "rows": ("The six rows", six_rows),
    "lookup": ("The lookup table", lookup_table),
    "clocks": ("A bank of clocks", clocks),
    "spectrum": ("Fate and rhythm", spectrum),
    "scaling": ("Context extension", context_extension),
    "precision": ("Precision", precision),
    "alibi": ("ALiBi is a slide", alibi_slide),
}


def json_safe(x: Any) -> Any:
    """A JSON-safe copy of section data: non-finite floats become None, tuples lists, keys strings.

    >>> json_safe({"a": (1.0, float("nan")), 2: [float("inf")]})
    {'a': [1.0, None], '2': [None]}
    """
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def measured_errors(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every ``{"value", "bound"}`` leaf of the section data, keyed ``section/path``."""
    found: dict[str, dict[str, Any]] = {}

    def walk(x: Any, path: str) -> None:
        if isinstance(x, dict):
            if "value" in x and "bound" in x and "ok" in x:
                found[path] = x
                return
            for k, v in x.items():
                walk(v, f"{path}/{k}" if path else str(k))

    walk(data, "")
    return found
