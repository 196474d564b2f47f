"""The real Jordan decomposition ``X = P J P^{-1}`` of a real square matrix.

``J`` is the canonical real Jordan form of the conventions (docs/guide/conventions.md), a direct sum of blocks given by triples
(rate λ, frequency ω, size n):

* ω = 0: the n×n block ``λI + N`` (N: ones on the superdiagonal);
* ω > 0: the 2n×2n block with ``C = [[λ, ω], [-ω, λ]]`` on its 2×2 diagonal blocks and ``I₂`` on
  the 2×2 blocks above them (chain index major, plane component minor); eigenvalues λ ± iω. A
  conjugate pair appears once, always with ω > 0.

Two paths:

* **exact** (rational entries where that is cheap, or ``exact=True``): sympy's
  ``Matrix.jordan_form``, converted to the real form; sizes and zero tests are exact.
* **numeric** (floats, or ``exact=False``): scipy's real Schur form. Eigenvalues are clustered
  with a radius from their condition numbers, ``‖X‖_F`` and float64 eps (or ``tol``), the Schur
  form is reordered to isolate each cluster's invariant subspace, the cluster mean (which is as
  accurate as the trace) is the eigenvalue, Jordan sizes come from the numerical ranks of
  ``(X - λI)^k`` restricted to that subspace, and the chains are built there. A cluster whose
  rank sequence is not that of a nilpotent matrix is split at its widest gap and tried again.

The identity ``X P = P J`` is checked in :func:`real_jordan`'s doctest. This module is the entry point,
the input handling and the exact path; the form itself (``JordanForm``, ``canonical_form``, the chains'
normalisation) is :mod:`liepos._jordan_form`, the numeric path :mod:`liepos._jordan_numeric`.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from liepos._jordan_form import EPS, JordanForm, assemble, canonical_form, normalize_chain
from liepos._jordan_numeric import scaled_numeric_path

__all__ = ["real_jordan", "canonical_form"]


# above this, rational input takes the numeric path unless exact=True: sympy's Jordan form of a
# 20×20 integer matrix took 28–88 s, of 32×32 more than 900 s. With rational
# eigenvalues 8×8 takes 0.2 s; square-root eigenvalues cost more (0.25 s at 4×4, 1.5 s at 6×6,
# 2.8 s at 8×8 with one quadratic factor, 45 s with a repeated one), so they stop at 4×4.
_AUTO_EXACT_MAX_DIM = 8
_AUTO_EXACT_SURD_DIM = 4


# ---------------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------------
def real_jordan(
    X: Any, *, tol: float | None = None, noise: float | None = None, exact: bool | None = None
) -> JordanForm:
    """The real Jordan decomposition ``X = P J P^{-1}`` of a real square matrix.

    Args:
        X: a real square matrix: numpy array, torch tensor (any floating dtype, bfloat16 included),
            or nested lists of ints, floats, ``fractions.Fraction`` or sympy numbers.
        tol: absolute tolerance of the numeric path: eigenvalues closer than ``tol`` are one
            eigenvalue (single linkage; a pair with ``|Im λ| <= tol`` is real), rates within
            ``tol`` of 0 are 0, and singular values of ``(X - λI)^k`` below ``tol^k`` count as
            zero.
        noise: the relative backward error δ the numeric path assumes for X (X is known to within
            ``δ·‖X‖_F``; default: float64 eps, i.e. X is exact up to rounding). Default rules (with
            ``η = max(eps, δ)·‖X‖_F``, ``κ_i`` the condition number of eigenvalue ``λ_i``):
            ``λ_i`` and ``λ_j`` are one eigenvalue when ``|λ_i - λ_j| <= ρ_i + ρ_j + 64·d·η``
            with ``ρ_i = min(10·κ_i·η, max(eps^(1/8), δ^(1/d))·‖X‖_F)`` (an n-fold defective
            eigenvalue perturbed by δ spreads by about ``δ^(1/n)‖X‖``, and κ·η is of that order);
            a cluster whose Jordan chains do not reproduce it within
            ``max(sqrt(eps)·‖X‖_F, 10·η)`` is split at its widest gap; a rate is 0 when
            ``|λ| <= max(1000·d·η₀, 1000·η₀/s, 10·η/s)`` (η₀ = eps·‖X‖_F; capped at
            ``max(sqrt(eps)·‖X‖_F, 10·η)``; ``s``: LAPACK's reciprocal condition number of the
            cluster mean); singular values of ``N^k`` count when above
            ``100·d·k·η·max(1, ‖N‖)^(k-1)``. Scale invariant: ``real_jordan(c·X)`` has rates and
            frequencies ``c`` times those of ``X``; entries beyond ``2^±500`` are scaled by a
            power of two first (exactly), so no norm overflows, even at ``|X_ij| ~ 1e300``.
        exact: ``True`` forces the exact sympy path (floats are converted exactly; it can take
            minutes for d > 8 and irreducible factors of degree ≥ 3), ``False`` the numeric
            path; default: exact when every entry is rational and sympy is cheap: ``dim <= 8``
            with rational eigenvalues, or ``dim <= 4`` with simple quadratic factors of the
            characteristic polynomial too; numeric otherwise.

    Returns:
        a :class:`JordanForm`; ``blocks, P = real_jordan(X)`` unpacks its blocks and basis.

    >>> blocks, P = real_jordan([[1, 1], [0, 1]])      # ints: the exact path
    >>> blocks
    [(1.0, 0.0, 2)]
    >>> B = np.array([[1.0, 2.0], [0.0, 1.0]])
    >>> X = B @ np.array([[0.0, 1.0], [-1.0, 0.0]]) @ np.linalg.inv(B)   # a rotation, disguised
    >>> blocks, P = real_jordan(X)
    >>> [(rate, round(freq, 12), n) for rate, freq, n in blocks]   # the rate is exactly 0
    [(0.0, 1.0, 1)]
    >>> bool(np.allclose(X @ P, P @ canonical_form(blocks)))
    True
    """
    tol = _check_tolerance("tol", tol)
    noise = _check_tolerance("noise", noise)
    if exact not in (None, True, False):
        raise TypeError(f"exact must be None, True or False, got {exact!r}")
    A, rational = _parse(X)
    d = A.shape[0]
    if exact is True:
        if rational is None:
            _check_finite(A)
            rational = [[Fraction(float(v)) for v in row] for row in A.tolist()]
        return _exact_path(rational, strict=True)
    if exact is None and rational is not None and d <= _AUTO_EXACT_MAX_DIM and _cheap_exact(rational):
        out = _exact_path(rational, strict=False)
        if out is not None:
            return out
    _check_finite(A)
    return scaled_numeric_path(A, tol, EPS if noise is None else max(noise, EPS))


# ---------------------------------------------------------------------------------------------
# input handling
# ---------------------------------------------------------------------------------------------
def _is_sympy(e: Any) -> bool:
    return type(e).__module__.split(".")[0] == "sympy"


def _entry(e: Any, where: tuple[int, int]) -> tuple[Any, bool]:
    """(value, is_rational): an int/Fraction (rational) or a float."""
    if isinstance(e, (bool, np.bool_)):
        raise TypeError(f"X must contain real numbers, got the bool {e!r} at {where}")
    if isinstance(e, numbers.Integral):
        return int(e), True
    if isinstance(e, Fraction):
        return e, True
    if _is_sympy(e):
        if getattr(e, "is_Rational", False):
            return Fraction(int(e.p), int(e.q)), True
        if getattr(e, "is_number", False):
            if e.is_extended_real:
                return float(e), False
            if e.is_extended_real is False:
                raise TypeError(f"X must be real, got the complex entry {e} at {where}")
            try:
                return float(e), False
            except TypeError as err:
                raise TypeError(f"X must be real, got the entry {e} at {where}") from err
        raise TypeError(f"X must contain numbers, got {e!r} at {where}")
    if isinstance(e, numbers.Real):
        return float(e), False
    if isinstance(e, numbers.Complex):
        raise TypeError(f"X must be real, got the complex entry {e!r} at {where}")
    if hasattr(e, "item") and hasattr(e, "shape") and tuple(e.shape) == ():  # 0-d array/tensor
        return _entry(e.item(), where)
    raise TypeError(f"X must contain real numbers, got {type(e).__name__} {e!r} at {where}")


def _shape_error(shape: tuple[int, ...]) -> ValueError:
    if len(shape) == 2 and shape[0] == shape[1] == 0:
        return ValueError("X must be a non-empty square matrix, got shape (0, 0)")
    return ValueError(f"X must be a square matrix, got shape {tuple(shape)}")


def _parse(X: Any) -> tuple[np.ndarray, list[list[Any]] | None]:
    """(float array, rational entries or None). Raises on bad input."""
    if type(X).__module__.split(".")[0] == "torch" and hasattr(X, "detach"):
        import torch

        if X.is_complex():
            raise TypeError(f"X must be real, got a complex tensor of dtype {X.dtype}")
        if X.dtype == torch.bool:
            raise TypeError("X must contain real numbers, got a bool tensor")
        X = X.detach().cpu()
        X = (X.to(torch.float64) if X.is_floating_point() else X.to(torch.int64)).numpy()  # bf16 too
    if isinstance(X, np.ndarray) and X.dtype != object:
        kind = X.dtype.kind
        if kind == "c":
            raise TypeError(f"X must be real, got a complex array of dtype {X.dtype}")
        if kind not in "iuf":
            raise TypeError(f"X must contain real numbers, got an array of dtype {X.dtype}")
        shape = tuple(X.shape)
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] == 0:
            raise _shape_error(shape)
        A = X.astype(np.float64)
        rational = [[int(v) for v in row] for row in X.tolist()] if kind in "iu" else None
        return A, rational
    # nested sequences (or an object array)
    if isinstance(X, np.ndarray):
        X = X.tolist()
    if _is_sympy(X) and hasattr(X, "tolist"):  # a sympy Matrix
        X = X.tolist()
    if not isinstance(X, (list, tuple)):
        if isinstance(X, numbers.Real) and not isinstance(X, bool):
            raise ValueError(f"X must be a square matrix, got the scalar {X!r} (shape ())")
        if isinstance(X, (numbers.Number, str, bytes)) or X is None:
            raise TypeError(f"X must be a real square matrix, got {type(X).__name__} {X!r}")
        try:
            X = [list(r) for r in X]
        except TypeError as err:
            raise TypeError(f"X must be a real square matrix, got {type(X).__name__}") from err
    rows = list(X)
    if len(rows) == 0:
        raise ValueError("X must be a non-empty square matrix, got an empty sequence (shape (0,))")
    if not all(isinstance(r, (list, tuple, np.ndarray)) for r in rows):
        if any(isinstance(r, (list, tuple, np.ndarray)) for r in rows):
            raise ValueError("X must be a square matrix, got a ragged nested sequence")
        raise _shape_error((len(rows),))
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise ValueError(f"X must be a square matrix, got rows of lengths {sorted(lengths)}")
    shape = (len(rows), lengths.pop())
    if shape[0] != shape[1] or shape[0] == 0:
        raise _shape_error(shape)
    vals: list[list[Any]] = []
    all_rational = True
    for i, r in enumerate(rows):
        row = []
        for j, e in enumerate(r):
            if isinstance(e, (list, tuple, np.ndarray)) and not (
                isinstance(e, np.ndarray) and e.shape == ()
            ):
                raise ValueError(f"X must be a 2-D square matrix, got a nested entry at {(i, j)}")
            v, is_rat = _entry(e, (i, j))
            all_rational &= is_rat
            row.append(v)
        vals.append(row)
    A = np.array([[float(v) for v in row] for row in vals], dtype=np.float64)
    return A, (vals if all_rational else None)


def _check_finite(A: np.ndarray) -> None:
    bad = np.argwhere(~np.isfinite(A))
    if len(bad):
        where = ", ".join(f"{(int(i), int(j))}={A[i, j]}" for i, j in bad[:8])
        more = "" if len(bad) <= 8 else f" and {len(bad) - 8} more"
        raise ValueError(f"X must be finite; non-finite entries (row, col)=value: {where}{more}")


def _check_tolerance(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _cheap_exact(rational: list[list[Any]]) -> bool:
    """Whether sympy's Jordan form is cheap (see :data:`_AUTO_EXACT_MAX_DIM`): the characteristic
    polynomial factors over ℚ into linear factors (rational eigenvalues, any multiplicity), or,
    up to 4×4, also simple quadratic ones (a conjugate pair or two real square roots). Cubic and
    higher factors bring nested radicals whose simplification takes minutes."""
    import sympy as sp

    lam = sp.Symbol("lam")
    _, factors = sp.factor_list(sp.Matrix(rational).charpoly(lam).as_expr(), lam)
    degrees = [(sp.degree(f, lam), m) for f, m in factors]
    if all(deg == 1 for deg, _ in degrees):
        return True
    return len(rational) <= _AUTO_EXACT_SURD_DIM and all(deg == 1 or (deg, m) == (2, 1) for deg, m in degrees)


# ---------------------------------------------------------------------------------------------
# exact path (sympy)
# ---------------------------------------------------------------------------------------------
def _exact_path(rational: list[list[Any]], *, strict: bool):
    import sympy as sp

    d = len(rational)
    M = sp.Matrix(
        d, d, [sp.Rational(v.numerator, v.denominator) if isinstance(v, Fraction) else sp.Integer(v)
               for row in rational for v in row]
    )
    try:
        from sympy.matrices.exceptions import MatrixError
    except ImportError:  # sympy < 1.13
        from sympy.matrices.common import MatrixError
    try:
        Pm, Jm = M.jordan_form()
    except (MatrixError, NotImplementedError, ValueError) as err:
        if strict:
            raise ValueError(
                f"exact=True, but sympy cannot compute the Jordan form of X exactly ({err}); "
                f"use exact=False for the numeric path"
            ) from err
        return None

    def sign(x) -> int:
        x = sp.nsimplify(x) if x.is_Float else x
        z = x.is_zero
        if z is None:
            z = x.equals(0)
        if z:
            return 0
        pos = x.is_positive
        if pos is None:
            pos = bool(sp.N(x, 50) > 0)
        return 1 if pos else -1

    def num(x) -> complex:
        return complex(sp.N(x, 30))

    items = []
    i = 0
    while i < d:
        lam = Jm[i, i]
        n = 1
        while i + n < d and Jm[i + n - 1, i + n] == 1:
            n += 1
        re, im = sp.re(lam), sp.im(lam)
        im_sign = sign(sp.simplify(im))
        if im_sign < 0:
            i += n
            continue
        re_sign = sign(sp.simplify(re))
        chain = np.array([[num(Pm[r, i + j]) for j in range(n)] for r in range(d)])
        rate = 0.0 if re_sign == 0 else float(sp.N(re, 30))
        freq = float(sp.N(im, 30)) if im_sign > 0 else 0.0
        cols = normalize_chain(chain, im_sign > 0)
        items.append(((rate, freq, n), cols, (re_sign, im_sign > 0)))
        i += n
    return assemble(items, d, exact=True)
