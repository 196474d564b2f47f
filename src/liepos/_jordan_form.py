"""The canonical real Jordan form ``J`` and its basis ``P`` (``X = P J P^{-1}``), whichever path found them.

``J`` is a direct sum of blocks ``(rate λ, frequency ω, size n)`` (docs/guide/conventions.md):
:func:`canonical_form` writes it; :class:`JordanForm` holds the blocks and the basis; the two paths of
:func:`liepos._jordan.real_jordan` hand their chains to :func:`normalize_chain` (the free scalar of a
chain fixed) and :func:`assemble` (the blocks in canonical order, ``P`` from their chains).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Block", "EPS", "JordanForm", "canonical_form", "normalize_chain", "assemble"]

Block = tuple[float, float, int]

EPS = float(np.finfo(np.float64).eps)  # float64's unit roundoff: the numeric path's default noise


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

    >>> from liepos._jordan import real_jordan
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



def _lead_index(v: np.ndarray) -> int:
    """First index whose magnitude is (up to rounding) the largest."""
    mag = np.abs(v)
    return int(np.flatnonzero(mag >= mag.max() * (1 - 1e-8))[0])


def normalize_chain(chain: np.ndarray, is_complex: bool) -> np.ndarray:
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


def assemble(items, d: int, *, exact: bool, zero_tol: float = 0.0, noise: float = 0.0) -> JordanForm:
    """A :class:`JordanForm` from ``(block, chain columns, signs)`` items, in canonical order."""
    items = _order(items)
    blocks = [b for b, _, _ in items]
    P = np.concatenate([c for _, c, _ in items], axis=1) if items else np.zeros((d, 0))  # (d, d)
    P = P + 0.0  # no negative zeros
    if P.shape != (d, d):  # pragma: no cover - an internal invariant
        raise RuntimeError(f"real_jordan built a basis of shape {P.shape} for a {d}x{d} matrix")
    return JordanForm(blocks, P, exact, [s for _, _, s in items], zero_tol, noise)
