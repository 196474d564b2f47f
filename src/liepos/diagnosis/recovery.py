"""Recovering the generator from the probed group: ``X = log A(δ) / δ``, refined, verified, decomposed.

On real positions ``X`` starts from the principal logarithm at the smallest δ and is refined along a
ladder of larger δ with the branch-safe step ``X ← X + log(exp(−δX) A(δ)) / δ`` (the residual
``exp(−δX) A(δ)`` is near I, so its principal logarithm is the right correction even when a frequency
passes π per δ); the best candidate must reproduce ``A(u) = exp(uX)`` at other offsets. On integer
positions ``A(1)`` is all there is: a negative real eigenvalue (a half-turn) has no real logarithm,
and the encoding is a discrete group.

>>> import numpy as np
>>> X = np.array([[0.0, -5.0], [5.0, 0.0]])  # 5 rad per step: beyond π
>>> r = recover(lambda u: expm(X, u), "real", 1e-9, [2.0**-6, 2.0**-2, 1.0, 4.0], [1.0, 2.0, 3.0, 7.0])
>>> bool(np.allclose(r.matrix, X)), r.findings
(True, [])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from liepos.diagnosis.probes import TINY, rel
from liepos.diagnosis.report import DISCRETE_GROUP, NO_GENERATOR, Finding

__all__ = ["Recovery", "expm", "generator_from_matrix", "logm_real", "negative_eigen", "recover"]

# an imaginary part of logm below this (relative to the real part) is round-off of a real logarithm
_REAL_LOG = 1e-6
# a candidate on the ladder replaces the current one while its fit is within this factor of the best
_LADDER_SLACK = 1.5
# entries of X below snap * this are round-off and set to 0 before the decomposition
_ROUND_OFF = 1e-3
# the smallest clustering tolerance of the decomposition
_MIN_TOL = 1e-9


def logm_real(A: np.ndarray) -> np.ndarray | None:
    """The principal real logarithm of A, or ``None`` when it has none (or A is not finite)."""
    from scipy.linalg import logm

    if not np.isfinite(A).all():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns when the result is inaccurate; the fit checks it
        try:
            L = np.asarray(logm(A))
        except (ValueError, np.linalg.LinAlgError):
            return None
    if not np.isfinite(L).all():
        return None
    if np.iscomplexobj(L):
        if np.abs(L.imag).max(initial=0.0) > _REAL_LOG * max(1.0, np.abs(L.real).max(initial=0.0)):
            return None
        L = L.real
    return L


def expm(X: np.ndarray, u: float) -> np.ndarray:
    """``exp(uX)``, silent on overflow (an overflowing candidate is rejected by its fit)."""
    from scipy.linalg import expm as _expm

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return _expm(u * X)


def negative_eigen(A: np.ndarray, tol: float) -> list[tuple[float, int]]:
    """Real negative eigenvalues of A with their multiplicities (clustered within ``10·tol·|A|``)."""
    ev = np.linalg.eigvals(A)
    scale = max(np.abs(ev).max(initial=0.0), TINY)
    neg = sorted(float(z.real) for z in ev if abs(z.imag) <= tol * scale and z.real < -tol * scale)
    out: list[tuple[float, int]] = []
    for v in neg:
        if out and abs(v - out[-1][0]) <= max(tol, 1e-6) * scale * 10:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def generator_from_matrix(X: np.ndarray, snap: float):
    """``Generator.from_matrix`` with rates below ``snap`` (measurement noise) set to 0.

    A complex block whose frequency is noise stays complex (its basis was built that way)."""
    from liepos.generator import Generator

    Xs = np.where(np.abs(X) < snap * _ROUND_OFF, 0.0, X)  # clean round-off entries
    g = Generator.from_matrix(torch.as_tensor(Xs), tol=max(snap, _MIN_TOL), exact=False, allow_growth=True)
    # (a growing encoder is named growth, not refused)
    rates = g.rates.detach().clone()
    rates[rates.abs() < snap] = 0.0
    return g.with_params(rates=rates, freqs=g.freqs.detach().clone())


@dataclass
class Recovery:
    """What :func:`recover` found: ``matrix`` X (or None), ``step`` A(1) on integers, its ``fit``
    ``max_u rel(exp(uX), A(u))``, and the findings and notes it adds."""

    matrix: np.ndarray | None = None
    step: np.ndarray | None = None
    fit: float | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def recover(A: Callable[[float], np.ndarray], domain: str, tol: float,
            ladder: Sequence[float], verify: Sequence[float]) -> Recovery:
    """X with ``exp(uX) = A(u)``: from ``A(1)`` on integer positions, along ``ladder`` on real ones;
    verified at the offsets ``verify``."""
    with np.errstate(all="ignore"):
        return _on_integers(A, tol, verify) if domain == "integer" else _on_reals(A, tol, ladder, verify)


def _fit(X: np.ndarray, A: Callable[[float], np.ndarray], offsets: Sequence[float]) -> float:
    return max(rel(expm(X, u), A(u)) for u in offsets)


def _on_integers(A: Callable[[float], np.ndarray], tol: float, verify: Sequence[float]) -> Recovery:
    A1 = A(1.0)
    neg = negative_eigen(A1, max(tol, 1e-6))
    if neg:
        vals = ", ".join(f"{v:.4g} (multiplicity {m})" for v, m in neg)
        why = ("a negative real eigenvalue of odd multiplicity has no real logarithm"
               if any(m % 2 for _, m in neg) else
               "a negative real eigenvalue (a half-turn) has no principal real logarithm")
        return Recovery(step=A1, findings=[Finding(
            DISCRETE_GROUP,
            f"the encoding is defined at integer positions and its one-step matrix A(1) has the eigenvalue(s) "
            f"{vals}: {why}, so A(n) = A(1)^n is a discrete group (like the alternating sign (-1)^n), outside "
            "the continuous family exp(uX). No generator is forced.",
            float(min(v for v, _ in neg)), breaks_relativity=False)])
    L = logm_real(A1)
    if L is None:
        return Recovery(step=A1, findings=[Finding(
            DISCRETE_GROUP, "A(1) has no real logarithm: a discrete group, no generator.", 1.0,
            breaks_relativity=False)])
    fit = _fit(L, A, verify)
    out = Recovery(matrix=L, step=A1, fit=fit, notes=[
        "integer positions determine each frequency only modulo 2*pi: the principal logarithm of A(1) is "
        "reported (|freq| <= pi)"])
    if fit > tol:
        out.findings.append(Finding(NO_GENERATOR, f"exp(n log A(1)) differs from A(n) by {fit:.3g}: no "
                                    "generator fits.", fit, breaks_relativity=False))
    return out


def _on_reals(A: Callable[[float], np.ndarray], tol: float, ladder: Sequence[float],
              verify: Sequence[float]) -> Recovery:
    X = best = None
    best_fit = math.inf
    quick = [verify[2], verify[-3], verify[-1]]  # the ladder compares candidates on three offsets
    for delta in ladder:
        Ad = A(delta)
        if X is None:
            L = logm_real(Ad)
            Xn = None if L is None else L / delta
        else:
            R = logm_real(expm(X, -delta) @ Ad)  # branch-safe: exp(-δX) A(δ) is near I
            Xn = None if R is None else X + R / delta
        if Xn is None:
            continue
        fit = _fit(Xn, A, quick)
        if best is None or fit <= best_fit * _LADDER_SLACK:
            X = Xn
            if fit < best_fit:
                best, best_fit = Xn, fit
    if best is None:
        return Recovery(findings=[Finding(NO_GENERATOR, "no real logarithm of A(δ) was found at any δ.", 1.0)])
    fit = _fit(best, A, verify)
    out = Recovery(matrix=best, fit=fit)
    if fit > tol:
        out.findings.append(Finding(
            NO_GENERATOR,
            f"the best generator X = log A(δ)/δ misses A(u) = exp(uX) by {fit:.3g} at u in {list(verify)}: "
            "the probe is not a one-parameter group; X is shown for reference.", fit, breaks_relativity=False))
    return out
