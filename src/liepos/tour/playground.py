"""The playground: one block of a generator, every slider setting computed by liepos ahead of time.

The reader picks a rate λ, a frequency ω, a block size n, a coupling c and a lag range; the page shows
what liepos computed for that setting when the tour was written (the page only selects and draws):

* the trajectory of a fixed vector v under ``A(u) = exp(uX)`` (its first two coordinates),
* the spectral norm ``‖A(u)‖₂`` against the lag,
* the score ``vᵀ A(t − s) v`` against the lag, read from ``Encoding.query`` / ``Encoding.key``,
* the lookup table of encoded scores over (t, s), causal half,
* the eigenvalues λ ± iω on the spectrum plane with the row ``liepos.classify`` names.

The generator of a setting is ``X = D J D⁻¹``: ``J`` the canonical block (rate λ, frequency ω, size n),
``D = diag(1, c, c², …)`` (each power repeated over the plane of a rotation), so the coupling c is the
superdiagonal of the nilpotent part (c = 1: the canonical block itself). Then
``A(u) = D exp(uJ) D⁻¹``, with ``exp(uJ)`` from :meth:`liepos.Generator.exp`.

>>> import torch
>>> X, A = setting_matrices(-0.1, 0.5, 2, 2.0, torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64))
>>> bool(torch.allclose(A[2], torch.linalg.matrix_exp(3.0 * X), atol=1e-12))   # A(u) = exp(uX)
True
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos.classify import classify
from liepos.encoding import Encoding
from liepos.generator import Generator

__all__ = ["GRID", "PRESETS", "LAG_STEP", "TABLE_SIZE", "setting_key", "setting_matrices", "setting", "playground"]

f64 = torch.float64

# the slider grid: a few values each, so that the page stays lean (every setting is embedded)
GRID: dict[str, tuple[float, ...]] = {
    "rate": (-0.3, -0.1, -0.03, 0.0, 0.03, 0.1),
    "freq": (0.0, 0.1, 0.25, 0.5, 1.0),
    "size": (1, 2, 3),
    "coupling": (0.5, 1.0, 2.0),
    "lags": (10.0, 20.0, 40.0),
}
LAG_STEP = 0.5  # lag resolution of the curves (tokens); 1/LAG_STEP points per token
TABLE_SIZE = 8  # the lookup table covers t, s = 0 … TABLE_SIZE − 1
CANONICAL_COUPLING = 1.0  # the coupling of the canonical Jordan block; the only one a block of size 1 needs
DIGITS = 3  # significant digits kept in the embedded numbers (the page draws at screen resolution)

# preset -> slider values (rate, freq, size, coupling); each lands on the row its name says
PRESETS: dict[str, dict[str, float]] = {
    "NoPE": {"rate": 0.0, "freq": 0.0, "size": 1, "coupling": 1.0},
    "decay": {"rate": -0.1, "freq": 0.0, "size": 1, "coupling": 1.0},
    "RoPE": {"rate": 0.0, "freq": 0.5, "size": 1, "coupling": 1.0},
    "xPos": {"rate": -0.03, "freq": 0.5, "size": 1, "coupling": 1.0},
    "RetNet": {"rate": -0.1, "freq": 0.25, "size": 1, "coupling": 1.0},
    "ALiBi": {"rate": 0.0, "freq": 0.0, "size": 2, "coupling": 1.0},
    "growth": {"rate": 0.1, "freq": 0.0, "size": 1, "coupling": 1.0},
    "Jordan-3": {"rate": -0.1, "freq": 0.0, "size": 3, "coupling": 1.0},
}


def setting_key(rate: float, freq: float, size: int, coupling: float) -> str:
    """The key of a setting in the embedded data: its grid indices joined by ``_``."""
    return "_".join(str(GRID[k].index(v)) for k, v in (("rate", rate), ("freq", freq), ("size", size), ("coupling", coupling)))


def _generator(rate: float, freq: float, size: int) -> Generator:
    """The canonical part J: one block (rate, freq, size); a 1-dim block is doubled so v moves in a plane."""
    copies = 2 if freq == 0.0 and size == 1 else 1
    return Generator([rate] * copies, [freq] * copies, [size] * copies, allow_growth=rate > 0)


def _basis(size: int, coupling: float, freq: float) -> torch.Tensor:
    """D = diag(1, c, c², …), each power repeated over a rotation's plane (I for a block of size 1)."""
    if size == 1:
        return torch.eye(2, dtype=f64)
    powers = coupling ** torch.arange(size, dtype=f64)  # (size,)
    return torch.diag(powers.repeat_interleave(2 if freq != 0.0 else 1))  # (dim, dim)


def _parts(rate: float, freq: float, size: int, coupling: float) -> tuple[Generator, torch.Tensor, torch.Tensor]:
    """``(J as a Generator, D, D⁻¹)`` of a setting."""
    D = _basis(size, coupling, freq)
    return _generator(rate, freq, size), D, torch.linalg.inv(D)


def setting_matrices(rate: float, freq: float, size: int, coupling: float, lags: torch.Tensor):
    """``(X, A)`` of a setting: the dense generator and ``A(u) = D exp(uJ) D⁻¹`` at ``lags``, shape (L, d, d)."""
    g, D, Dinv = _parts(rate, freq, size, coupling)
    return D @ g.matrix().to(f64) @ Dinv, D @ g.exp(lags) @ Dinv


def _vector(dim: int) -> torch.Tensor:
    """The fixed vector v: (0.6, 0.8) in its first two coordinates, a little in the rest, |v| = 1."""
    v = torch.full((dim,), 0.3, dtype=f64)
    v[:2] = torch.tensor([0.6, 0.8], dtype=f64)
    return v / v.norm()


def _r(x: torch.Tensor) -> list:
    """Rounded to :data:`DIGITS` significant digits, as nested lists of Python floats."""
    def one(v: float) -> float:
        return 0.0 if v == 0 or not math.isfinite(v) else float(f"{v:.{DIGITS}g}")
    flat = [one(v) for v in x.reshape(-1).tolist()]  # row-major
    if x.dim() == 1:
        return flat
    width = x.shape[-1]
    return [flat[i:i + width] for i in range(0, len(flat), width)]  # (rows, width)


def setting(rate: float, freq: float, size: int, coupling: float) -> dict[str, Any]:
    """Everything the page draws for one setting, computed by liepos."""
    lags = torch.arange(0.0, max(GRID["lags"]) + LAG_STEP / 2, LAG_STEP, dtype=f64)
    g, D, Dinv = _parts(rate, freq, size, coupling)
    _, A = setting_matrices(rate, freq, size, coupling, lags)  # (L, d, d)
    v = _vector(g.dim)
    traj = A @ v  # (L, d)
    norm = torch.linalg.matrix_norm(A, ord=2)  # (L,)
    # scores through the encoding: F(t) (Dᵀv) · G(s) (D⁻¹v) = vᵀ D exp((t−s)J) D⁻¹ v
    enc = Encoding(g)
    q = (D.T @ v).reshape(1, 1, 1, -1).expand(1, 1, len(lags), -1)  # (1, 1, L, d)
    k = (Dinv @ v).reshape(1, 1, 1, -1)  # (1, 1, 1, d): the key at s = 0
    score = (enc.query(q, lags) * enc.key(k, [0.0])).sum(-1)[0, 0]  # (L,)
    pos = torch.arange(TABLE_SIZE, dtype=f64)
    qt = (D.T @ v).expand(1, 1, TABLE_SIZE, -1)  # (1, 1, T, d)
    kt = (Dinv @ v).expand(1, 1, TABLE_SIZE, -1)  # (1, 1, T, d)
    table = (enc.query(qt, pos) @ enc.key(kt, pos).transpose(-1, -2))[0, 0]  # (t, s)
    causal = [[float(x) for x in row[: t + 1]] for t, row in enumerate(_r(table))]  # lower triangle, s ≤ t
    c = classify(g)
    return {
        "x": _r(traj[:, 0]), "y": _r(traj[:, 1]), "norm": _r(norm), "score": _r(score), "table": causal,
        "eig": [{"rate": r, "freq": w, "size": n, "row": name} for (r, w, n), name in zip(c.blocks, c.names)],
    }


def playground() -> dict[str, Any]:
    """The slider grid, the presets and every setting's data: what the page's playground embeds."""
    settings = {}
    for rate in GRID["rate"]:
        for freq in GRID["freq"]:
            for size in GRID["size"]:
                for coupling in GRID["coupling"]:
                    if size == 1 and coupling != CANONICAL_COUPLING:
                        continue  # a block of size 1 has no coupling: one setting stands for all
                    settings[setting_key(rate, freq, size, coupling)] = setting(rate, freq, size, coupling)
    return {"grid": {k: list(v) for k, v in GRID.items()}, "presets": PRESETS, "lag_step": LAG_STEP,
            "table_size": TABLE_SIZE, "settings": settings}
