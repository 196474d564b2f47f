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

The identity ``X P = P J`` is checked in :func:`real_jordan`'s doctest.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["real_jordan", "canonical_form"]

Block = tuple[float, float, int]

_EPS = float(np.finfo(np.float64).eps)
# above this, rational input takes the numeric path unless exact=True: sympy's Jordan form of a
# 20×20 integer matrix took 28–88 s, of 32×32 more than 900 s. With rational
# eigenvalues 8×8 takes 0.2 s; square-root eigenvalues cost more (0.25 s at 4×4, 1.5 s at 6×6,
# 2.8 s at 8×8 with one quadratic factor, 45 s with a repeated one), so they stop at 4×4.
_AUTO_EXACT_MAX_DIM = 8
_AUTO_EXACT_SURD_DIM = 4
# entries beyond 2^±500 are scaled by a power of two first: ‖X‖_F² stays finite (at 1e154 it
# overflowed and every rate was dropped)
_SCALE_FREE_EXPONENT = 500


# ---------------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JordanForm:
    """``X = P J P^{-1}``: the canonical blocks of J, the basis P, and how they were obtained.

    Attributes:
        blocks: ``(rate, freq, size)`` per block, ``freq >= 0`` (the blocks of J, in order).
        basis: P, a real invertible float64 matrix with ``X = P J P^{-1}``.
        exact: whether the zero tests were exact (the sympy path).
        signs: per block, (sign of the rate: −1, 0 or 1; whether the frequency is non-zero), as
            decided by the zero tests (exact, or within ``zero_tol``).
        zero_tol: the absolute tolerance under which a rate counted as 0 (0.0 when exact).
        noise: the relative backward error the numeric path assumed for X (0.0 when exact).

    Unpacks as ``blocks, P = real_jordan(X)``.

    >>> X = np.array([[0.0, 2.0], [0.0, 0.0]])
    >>> form = real_jordan(X)
    >>> P, J = form.basis, canonical_form(form.blocks)
    >>> form.blocks, form.signs, bool(np.allclose(P @ J @ np.linalg.inv(P), X))
    ([(0.0, 0.0, 2)], [(0, False)], True)
    """

    blocks: list[Block]
    basis: np.ndarray
    exact: bool
    signs: list[tuple[int, bool]] = field(default_factory=list)
    zero_tol: float = 0.0
    noise: float = 0.0

    def __iter__(self):
        return iter((self.blocks, self.basis))


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
    return _scaled_numeric_path(A, tol, _EPS if noise is None else max(noise, _EPS))


def canonical_form(blocks: list[Block]) -> np.ndarray:
    """The dense canonical real Jordan matrix J of ``blocks`` (float64), as in the conventions.

    >>> canonical_form([(-0.1, 0.7, 2)])
    array([[-0.1,  0.7,  1. ,  0. ],
           [-0.7, -0.1,  0. ,  1. ],
           [ 0. ,  0. , -0.1,  0.7],
           [ 0. ,  0. , -0.7, -0.1]])
    """
    widths = [int(n) * (2 if w != 0 else 1) for _, w, n in blocks]
    d = int(sum(widths))
    J = np.zeros((d, d))
    off = 0
    for (lam, om, n), width in zip(blocks, widths):
        n = int(n)
        if om != 0:
            for j in range(n):
                a = off + 2 * j
                J[a, a] = J[a + 1, a + 1] = lam
                J[a, a + 1] = om
                J[a + 1, a] = -om
                if j + 1 < n:
                    J[a, a + 2] = J[a + 1, a + 3] = 1.0
        else:
            for j in range(n):
                J[off + j, off + j] = lam
                if j + 1 < n:
                    J[off + j, off + j + 1] = 1.0
        off += width
    return J


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
# shared: normalising a chain and ordering blocks
# ---------------------------------------------------------------------------------------------
def _lead_index(v: np.ndarray) -> int:
    """First index whose magnitude is (up to rounding) the largest."""
    mag = np.abs(v)
    return int(np.flatnonzero(mag >= mag.max() * (1 - 1e-8))[0])


def _normalize_chain(chain: np.ndarray, is_complex: bool) -> np.ndarray:
    """Fix the free scalar of a Jordan chain (columns p_1..p_n, p_1 the eigenvector).

    Complex chains: the phase makes Re p_1 ⟂ Im p_1 (the best conditioned real pair), or, when
    every phase does, makes the largest entry of p_1 real positive. Real chains: the largest entry
    of p_1 is positive. Then the largest column has unit norm. Returns real columns (complex chains:
    Re p_1, Im p_1, Re p_2, ...).
    """
    p1 = chain[:, 0]
    if is_complex:
        s = p1 @ p1  # unconjugated: ‖Re p‖² - ‖Im p‖² + 2i Re p·Im p
        if abs(s) > 1e-6 * float(np.vdot(p1, p1).real):
            chain = chain * np.exp(-0.5j * np.angle(s))  # now Re p_1 ⟂ Im p_1; sign still free
            re1 = chain[:, 0].real
            if re1[_lead_index(re1)] < 0:
                chain = -chain
        else:  # every phase gives Re p_1 ⟂ Im p_1 with equal norms
            i = _lead_index(p1)
            chain = chain * (abs(p1[i]) / p1[i])
        cols = np.empty((chain.shape[0], 2 * chain.shape[1]))
        cols[:, 0::2] = chain.real
        cols[:, 1::2] = chain.imag
    else:
        cols = np.real(chain).astype(np.float64)
        if cols[_lead_index(cols[:, 0]), 0] < 0:
            cols = -cols
    scale = float(np.linalg.norm(cols, axis=0).max())
    return cols / scale if scale > 0 else cols


def _order(items: list[tuple[Block, np.ndarray, tuple[int, bool]]]):
    """Sort blocks: frequency descending, then rate descending, then size descending."""
    return sorted(items, key=lambda it: (-it[0][1], -it[0][0], -it[0][2]))


def _assemble(items, d: int, *, exact: bool, zero_tol: float = 0.0, noise: float = 0.0) -> JordanForm:
    """A :class:`JordanForm` from ``(block, chain columns, signs)`` items, in canonical order."""
    items = _order(items)
    blocks = [b for b, _, _ in items]
    P = np.concatenate([c for _, c, _ in items], axis=1) if items else np.zeros((d, 0))  # (d, d)
    P = P + 0.0  # no negative zeros
    if P.shape != (d, d):  # pragma: no cover - an internal invariant
        raise RuntimeError(f"real_jordan built a basis of shape {P.shape} for a {d}x{d} matrix")
    return JordanForm(blocks, P, exact, [s for _, _, s in items], zero_tol, noise)


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
        cols = _normalize_chain(chain, im_sign > 0)
        items.append(((rate, freq, n), cols, (re_sign, im_sign > 0)))
        i += n
    return _assemble(items, d, exact=True)


# ---------------------------------------------------------------------------------------------
# numeric path (scipy)
# ---------------------------------------------------------------------------------------------
def _canonical_parse(A: np.ndarray) -> list[Block] | None:
    """The blocks when A already is exactly a canonical real Jordan matrix (then P = I)."""
    d = A.shape[0]
    blocks: list[Block] = []
    i = 0
    while i < d:
        lam = A[i, i]
        if i + 1 < d and A[i, i + 1] > 0 and A[i + 1, i] == -A[i, i + 1] and A[i + 1, i + 1] == lam:
            om = A[i, i + 1]
            n = 1
            while (
                i + 2 * n + 1 < d
                and A[i + 2 * n - 2, i + 2 * n] == 1
                and A[i + 2 * n, i + 2 * n] == lam
                and A[i + 2 * n, i + 2 * n + 1] == om
            ):
                n += 1
            blocks.append((float(lam), float(om), n))
            i += 2 * n
        else:
            n = 1
            while i + n < d and A[i + n - 1, i + n] == 1 and A[i + n, i + n] == lam:
                n += 1
            blocks.append((float(lam), 0.0, n))
            i += n
    if np.array_equal(canonical_form(blocks), A):
        return blocks
    return None


def _real_schur_eigs(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of a real (standardised) Schur form, exact conjugate pairs, and partners."""
    d = T.shape[0]
    w = np.empty(d, dtype=complex)
    partner = np.arange(d)
    i = 0
    while i < d:
        if i + 1 < d and T[i + 1, i] != 0:
            a, b, c, e = T[i, i], T[i, i + 1], T[i + 1, i], T[i + 1, i + 1]
            re = 0.5 * (a + e)
            im = math.sqrt(abs(b)) * math.sqrt(abs(c)) if a == e else math.sqrt(
                max(-(0.25 * (a - e) ** 2 + b * c), 0.0)
            )
            w[i], w[i + 1] = complex(re, im), complex(re, -im)
            partner[i], partner[i + 1] = i + 1, i
            i += 2
        else:
            w[i] = T[i, i]
            i += 1
    return w, partner


def _eig_condition(Tc: np.ndarray) -> np.ndarray:
    """Condition number ‖x‖‖y‖/|yᴴx| of each eigenvalue of an upper-triangular matrix."""
    from scipy.linalg import LinAlgError, solve_triangular

    d = Tc.shape[0]
    kappa = np.empty(d)
    with np.errstate(all="ignore"):
        for i in range(d):
            t = Tc[i, i]
            try:
                xn2 = 1.0
                if i > 0:
                    x = solve_triangular(Tc[:i, :i] - t * np.eye(i), -Tc[:i, i], check_finite=False)
                    xn2 += float(np.vdot(x, x).real)
                yn2 = 1.0
                if i + 1 < d:
                    y = solve_triangular(
                        (Tc[i + 1:, i + 1:] - t * np.eye(d - i - 1)).conj().T,
                        -Tc[i, i + 1:].conj(), lower=True, check_finite=False,
                    )
                    yn2 += float(np.vdot(y, y).real)
                k = math.sqrt(xn2 * yn2)
            except (LinAlgError, OverflowError, ValueError):
                k = math.inf
            kappa[i] = k if math.isfinite(k) else math.inf
    return kappa


def _components(link: np.ndarray) -> list[list[int]]:
    """Connected components of the graph with adjacency ``link`` (m, m), ordered by first member."""
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(link, directed=False)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(labels.tolist()):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def _split_widest(w: np.ndarray, members: list[int]) -> list[list[int]]:
    """Single-linkage components of ``members`` with the longest spanning-tree edges removed."""
    m = len(members)
    z = w[members]
    dist = np.abs(z[:, None] - z[None, :])  # (m, m) pairwise distances
    # Prim's algorithm for the minimum spanning tree edge lengths
    in_tree = np.zeros(m, bool)
    in_tree[0] = True
    best = dist[0].copy()
    longest = 0.0
    for _ in range(m - 1):
        best_masked = np.where(in_tree, np.inf, best)
        j = int(np.argmin(best_masked))
        longest = max(longest, float(best_masked[j]))
        in_tree[j] = True
        best = np.minimum(best, dist[j])
    return [[members[k] for k in g] for g in _components(dist < longest * (1 - 1e-12))]


def _ranks(N: np.ndarray, thresholds) -> list[int] | None:
    """r_0 = m, r_k = numerical rank of N^k, until 0; None if N is not numerically nilpotent."""
    from scipy.linalg import svdvals

    m = N.shape[0]
    ranks = [m]
    Nk = np.eye(m, dtype=N.dtype)
    normN = max(float(np.linalg.norm(N, 2)) if m else 0.0, 1.0)
    for k in range(1, m + 1):
        Nk = Nk @ N
        s = svdvals(Nk, check_finite=False)
        r = int(np.sum(s > thresholds(k, normN)))
        ranks.append(r)
        if r == 0:
            break
    if ranks[-1] != 0:
        return None
    diffs = [ranks[k - 1] - ranks[k] for k in range(1, len(ranks))]
    if any(x < 0 for x in diffs) or any(diffs[k] > diffs[k - 1] for k in range(1, len(diffs))):
        return None
    return ranks


def _chains(N: np.ndarray, ranks: list[int]) -> list[np.ndarray]:
    """Jordan chains of a nilpotent N with the given rank sequence: arrays (m, k), p_1 first."""
    from scipy.linalg import svd

    m = N.shape[0]
    s = len(ranks) - 1  # index of nilpotency
    ext = ranks + [0]
    kernels: list[np.ndarray] = [np.zeros((m, 0), dtype=N.dtype)]
    Nk = np.eye(m, dtype=N.dtype)
    for k in range(1, s + 1):
        Nk = Nk @ N
        _, _, Vh = svd(Nk, check_finite=False)
        kernels.append(Vh.conj().T[:, ranks[k]:])
    heads: list[tuple[int, np.ndarray]] = []
    level: list[np.ndarray] = []  # vectors of the current level inherited from longer chains
    for k in range(s, 0, -1):
        c = (ext[k - 1] - ext[k]) - (ext[k] - ext[k + 1])
        if c > 0:
            K = kernels[k]
            W = np.concatenate(
                # the kernel and each inherited vector as an (m, 1) column
                [kernels[k - 1]] + [v[:, None] / max(np.linalg.norm(v), 1e-300) for v in level],
                axis=1,
            )
            if W.shape[1]:
                U, sv, _ = svd(W, full_matrices=False, check_finite=False)
                Q = U[:, : int(np.sum(sv > sv[0] * 1e-10))] if sv.size and sv[0] > 0 else U[:, :0]
                M = K - Q @ (Q.conj().T @ K)
            else:
                M = K
            _, _, Vh = svd(M, check_finite=False)
            new = K @ Vh.conj().T[:, :c]
            for v in new.T:
                heads.append((k, v))
                level.append(v)
        level = [N @ v for v in level]
    chains = []
    for k, x in heads:
        cols = [x]
        for _ in range(k - 1):
            cols.append(N @ cols[-1])
        chains.append(np.stack(cols[::-1], axis=1))
    return chains


def _chains_fit(N: np.ndarray, chains: list[np.ndarray], fit_tol: float) -> bool:
    """Whether ``Y S Y^{-1}`` reproduces N within ``fit_tol`` (Y: the chains, S: their shifts)."""
    Y = np.concatenate(chains, axis=1)
    S = np.zeros((Y.shape[1], Y.shape[1]))
    off = 0
    for ch in chains:
        k = ch.shape[1]
        S[off:off + k - 1, off + 1:off + k] += np.eye(k - 1)
        off += k
    E = N @ Y - Y @ S
    try:
        err = float(np.linalg.norm(np.linalg.solve(Y.T, E.T)))
    except np.linalg.LinAlgError:
        return False
    return bool(math.isfinite(err) and err <= fit_tol)


def _scaled_numeric_path(A: np.ndarray, tol: float | None, noise: float) -> JordanForm:
    """The numeric path, on ``2^-k A`` with ``max|A_ij|`` in [½, 1) when the entries are beyond
    ``2^±_SCALE_FREE_EXPONENT`` (so ‖A‖² neither overflows nor underflows); the scaling is exact.

    ``A = 2^k A'`` and ``A' P' = P' J'`` give ``A P = P J`` with rates and frequencies ``2^k`` those of
    J', and each Jordan chain's j-th vector scaled by ``2^(−kj)`` (the ones above the diagonal).
    """
    peak = float(np.abs(A).max())
    k = math.frexp(peak)[1] if peak > 0.0 else 0
    if abs(k) <= _SCALE_FREE_EXPONENT:
        return _numeric_path(A, tol, noise)
    form = _numeric_path(np.ldexp(A, -k), None if tol is None else math.ldexp(tol, -k), noise)
    P = form.basis.copy()
    off = 0
    for _, freq, n in form.blocks:
        w = 2 if freq != 0 else 1  # columns per chain vector
        chain = P[:, off:off + w * n]  # (d, w·n), a view
        for j in range(1, n):
            chain[:, w * j:w * (j + 1)] = np.ldexp(chain[:, w * j:w * (j + 1)], -k * j)
        chain /= np.linalg.norm(chain, axis=0).max()
        off += w * n
    blocks = [(math.ldexp(r, k), math.ldexp(f, k), n) for r, f, n in form.blocks]
    return JordanForm(blocks, P, False, form.signs, math.ldexp(form.zero_tol, k), noise)


def _numeric_path(A: np.ndarray, tol: float | None, noise: float) -> JordanForm:
    from scipy.linalg import lapack, rsf2csf, schur

    d = A.shape[0]
    normX = float(np.linalg.norm(A))
    eta0 = _EPS * normX  # rounding
    eta = noise * normX  # the assumed backward error (>= rounding)
    zero_tol_default = max(1000.0 * d * eta0, 10.0 * eta)

    # already canonical (and no tolerance to merge with): P = I
    canon = _canonical_parse(A) if tol is None else None
    if canon is not None and all(om == 0 or om > zero_tol_default for _, om, _ in canon):
        items = []
        off = 0
        for lam, om, n in canon:
            lam = 0.0 if abs(lam) <= zero_tol_default else lam
            width = n * (2 if om else 1)
            cols = np.eye(d)[:, off:off + width]
            items.append(((lam, om, n), cols, (int(np.sign(lam)), om != 0)))
            off += width
        return _assemble(items, d, exact=False, zero_tol=zero_tol_default, noise=noise)

    T, Z = schur(A, output="real")
    w, partner = _real_schur_eigs(T)
    Tc, _ = rsf2csf(T, Z)
    kappa = _eig_condition(Tc)
    kappa = np.maximum(kappa, kappa[partner])  # λ and its conjugate have one condition number

    # --- clustering: λ_i ~ λ_j when their uncertainty discs touch
    if tol is None:
        cap = normX * max(_EPS ** 0.125, noise ** (1.0 / d))
        rho = np.minimum(10.0 * kappa * eta, cap)
        floor = 64.0 * d * eta
        radius = rho[:, None] + rho[None, :] + floor  # (d, d)
    else:
        radius = np.full((d, d), tol)
    dist = np.abs(w[:, None] - w[None, :])  # (d, d) pairwise distances
    link = dist <= radius
    for i in range(d):  # a pair within the radius of the real axis is a real eigenvalue
        if partner[i] != i and 2 * abs(w[i].imag) <= (
            radius[i, partner[i]] if tol is None else 2 * tol
        ):
            link[i, partner[i]] = link[partner[i], i] = True
    clusters = _components(link)

    # a cluster's chains must reproduce its restriction B = μI + N this well (else: split it)
    fit_tol = max(math.sqrt(_EPS) * normX, 10.0 * eta, 0.0 if tol is None else 10.0 * tol)

    def rank_thresholds(k: int, normN: float) -> float:
        t = 100.0 * d * k * eta * normN ** (k - 1)
        if tol is not None:
            t = max(t, tol ** k)
        return t

    items = []
    todo = [sorted(c) for c in clusters]
    seen: set[tuple[int, ...]] = set()
    while todo:
        c = todo.pop()
        key = tuple(c)
        if key in seen:
            continue
        cset = set(c)
        conj = sorted(int(partner[i]) for i in c)
        is_real = set(conj) == cset
        if not is_real:
            if np.mean(w[c].imag) < 0:  # handle each conjugate pair of clusters once, from above
                continue
            seen.add(tuple(conj))
        seen.add(key)
        select = np.zeros(d, dtype=np.int32)
        select[list(cset | set(conj))] = 1
        k_sel = int(select.sum())
        lwork = max(1, 2 * k_sel * (d - k_sel))
        ts, qs, _, _, msel, s_recip, _, info = lapack.dtrsen(
            select, T, Z, job="E", lwork=lwork, liwork=max(1, k_sel * (d - k_sel))
        )
        if info != 0 or msel != k_sel:  # pragma: no cover - LAPACK refused to separate them
            raise np.linalg.LinAlgError(
                f"real_jordan: could not separate the eigenvalues near {complex(np.mean(w[c]))} "
                f"(LAPACK trsen info={info}); try a larger tol"
            )
        Q = qs[:, :k_sel]
        B = ts[:k_sel, :k_sel]
        m = len(c)
        if is_real:
            mu: complex = float(np.trace(B)) / m  # real here; complex in the other branch
            N = B - mu * np.eye(m)
            Qs = Q
        else:
            Tb, Zb = schur(B, output="complex")
            sel = (Tb.diagonal().imag > 0).astype(np.int32)
            if int(sel.sum()) != m:
                sel = np.zeros(k_sel, np.int32)
                sel[np.argsort(-Tb.diagonal().imag)[:m]] = 1
            tb, zb, _, _, _, _, info2 = lapack.ztrsen(sel, Tb, Zb, job="N")
            if info2 != 0:  # pragma: no cover
                raise np.linalg.LinAlgError(f"real_jordan: ztrsen failed (info={info2})")
            Bs = tb[:m, :m]
            mu = complex(np.trace(Bs)) / m
            N = Bs - mu * np.eye(m)
            Qs = Q @ zb[:, :m]
        ranks = _ranks(N, rank_thresholds)
        chains = None if ranks is None else _chains(N, ranks)
        if chains is None or not _chains_fit(N, chains, fit_tol):
            # not one eigenvalue: split the cluster at its widest gap and try the parts
            parts = _split_widest(w, c) if m > 1 else [c]
            if len(parts) == 1:  # pragma: no cover - cannot happen for m > 1
                raise np.linalg.LinAlgError(f"real_jordan: cannot resolve the cluster {w[c]}")
            todo.extend(sorted(p) for p in parts)
            seen.discard(key)
            if not is_real:
                seen.discard(tuple(conj))
            continue
        # the mean of the selected eigenvalues (λ's cluster and its conjugate) is Re μ;
        # s_recip bounds its condition
        if tol is not None:
            zero_tol = tol
        else:
            cond = max(float(s_recip), 1e-300)
            zero_tol = min(
                max(1000.0 * eta0 / cond, 10.0 * eta / cond, zero_tol_default),  # ≥ 10η
                max(math.sqrt(_EPS) * normX, 10.0 * eta),
            )
        rate = float(np.real(mu))
        if abs(rate) <= zero_tol:
            rate = 0.0
        freq = 0.0 if is_real else float(np.imag(mu))
        for chain in chains:
            cols = _normalize_chain(Qs @ chain, not is_real)
            items.append(((rate, freq, chain.shape[1]), cols, (int(np.sign(rate)), freq != 0)))
    return _assemble(items, d, exact=False, noise=noise,
                     zero_tol=tol if tol is not None else zero_tol_default)
