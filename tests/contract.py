"""The precision contract of docs/guide/precision.md, measured: the table is parsed from the page and
each row's bound is checked here (tests/test_adversarial.py) against mpmath."""

from __future__ import annotations

import re
from pathlib import Path

import mpmath
import torch

import liepos as lp

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "precision.md"
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
# one encoding per block type of the table (its blocks are all of that type)
ENCODINGS = {
    "rotation": lambda: lp.rope(8),
    "damped_rotation": lambda: lp.xpos(8),
    "decay": lambda: lp.decay([0.5, 0.01]),
    "polynomial": lambda: lp.jordan(3, rate=-0.1),
}


def contract_rows() -> list[dict]:
    """Rows of the contract table: dtype, block, exact, bound (float), limit kind ('t' or 'λt'), limit."""
    rows = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] not in DTYPES:
            continue
        dtype, block, exact, bound, limit = cells
        m = re.fullmatch(r"`abs\((t|λt)\) ≤ ([0-9.e+]+)`", limit)
        if m is None:
            raise ValueError(f"unparsed limit {limit!r} in {PAGE}")
        rows.append({"dtype": dtype, "block": block.strip("`"), "exact": exact,
                     "bound": float(bound.strip("`")), "kind": m.group(1), "limit": float(m.group(2))})
    return rows


def positions_for(enc: lp.Encoding, kind: str, limit: float) -> list[float]:
    """Log-spaced positions up to the limit (on t, or on |λ t| for the slowest-fading block)."""
    if kind == "λt":
        rates = enc.generator.rates.abs()
        limit = limit / float(rates[rates > 0].max())
    return [0.0, 1.0, 7.0] + [float(round(limit * f)) for f in (1e-6, 1e-3, 0.37, 1.0)]


def exact_entries(enc: lp.Encoding, t: float) -> tuple[list[float], list[float], list[float]]:
    """(a, b, c) of the query table at time t in 200-bit arithmetic, in the storage order of enc."""
    g = enc.generator
    with mpmath.workprec(200):
        tm = mpmath.mpf(t)
        a, b, c = [], [], []
        for lam, om, n, cplx in zip(g.rates.tolist(), g.freqs.tolist(), g.sizes, g.complex):
            s = mpmath.exp(mpmath.mpf(lam) * tm)
            ang = mpmath.mpf(om) * tm
            for _ in range(n):
                if cplx:
                    a += [s * mpmath.cos(ang)] * 2
                    b += [-s * mpmath.sin(ang), s * mpmath.sin(ang)]
                else:
                    a.append(s)
                    b.append(mpmath.mpf(0))
            for j in range(n):
                for k in range(1, j + 1):
                    c += [tm**k / mpmath.factorial(k)] * (2 if cplx else 1)
        return a, b, c


def measured_error(block: str, dtype: str, kind: str, limit: float) -> float:
    """max |table − exact| / scale over the positions: scale e^{λt} for a and b, |c_k| for c_k."""
    enc = ENCODINGS[block]()
    worst = 0.0
    for t in positions_for(enc, kind, limit):
        tab = enc.tables(torch.tensor([t], dtype=torch.float64), "query").to(DTYPES[dtype])
        a, b, c = exact_entries(enc, t)
        got_a = tab.a[0].double().tolist()
        got_b = [0.0] * len(a) if tab.b is None else tab.b[0].double().tolist()
        for ga, gb, ea, eb in zip(got_a, got_b, a, b):
            scale = float(mpmath.sqrt(ea**2 + eb**2)) or 1.0
            worst = max(worst, float(abs(ga - ea)) / scale, float(abs(gb - eb)) / scale)
        if tab.coef is not None:
            for gc, ec in zip(tab.coef[0].double().tolist(), c):
                worst = max(worst, float(abs(gc - ec) / max(abs(ec), mpmath.mpf(1e-300))))
    return worst


if __name__ == "__main__":  # print the measured errors of every row (the figures of the page)
    for r in contract_rows():
        err = measured_error(r["block"], r["dtype"], r["kind"], r["limit"])
        print(f"{r['dtype']:9s} {r['block']:16s} measured {err:.2e}  bound {r['bound']:.1e}  "
              f"{'ok' if err <= r['bound'] else 'VIOLATED'}")
