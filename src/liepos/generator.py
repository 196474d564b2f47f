"""Generators of one-parameter groups, A(u) = exp(uX), in real Jordan form.

A :class:`Generator` is a real matrix ``X = P J P^{-1}`` stored as its canonical real Jordan
blocks ``J = J_1 ⊕ ... ⊕ J_m`` and a basis ``P`` (``None`` means the identity). Each block is a
triple (rate λ, frequency ω, size n):

* a *real* block (ω = 0) is the n×n matrix ``λI + N`` (N: ones on the superdiagonal);
* a *complex* block (ω ≠ 0) is the 2n×2n matrix with ``C = [[λ, ω], [-ω, λ]]`` on the diagonal
  and ``I₂`` above it, eigenvalues λ ± iω.

The exponential is closed form per block::

    exp(u J) = e^{λu} · Σ_{k<n} u^k/k! N^k          (real block)
    exp(u J) = e^{λu} · Σ_{k<n} u^k/k! N^k ⊗ R(-ωu)  (complex block, R counter-clockwise)

and satisfies the group law ``A(u + v) = A(u) A(v)``, ``A(0) = I``.

Parameters may carry a leading heads axis: ``rates`` and ``freqs`` of shape ``(heads, blocks)``
give one parameter set per head with the same block structure.

>>> import torch
>>> g = Generator([0.0], [1.0], [1])
>>> u, v = torch.tensor(0.3, dtype=torch.float64), torch.tensor(1.1, dtype=torch.float64)
>>> bool(torch.allclose(g.exp(u + v), g.exp(u) @ g.exp(v)))
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Generator", "direct_sum"]

Tensorish = Any


def _as_param(x: Tensorish, name: str) -> torch.Tensor:
    """Float64 tensor, or a floating tensor kept as is (so learnable parameters stay leaves)."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            x = x.to(torch.float64)
        return x
    try:
        t = torch.as_tensor(x, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{name} must be a sequence of real numbers, got {x!r}") from err
    return t


def fill_exp_block(
    out: torch.Tensor, off: int, n: int, cplx: bool, scale: torch.Tensor, tau: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor,
) -> None:
    """Write one canonical block of ``exp(uJ) = e^{λu} Σ_k τ^k/k! N^k (⊗ R(−ωu))`` into ``out``.

    ``out``: (..., d, d); the block starts at ``off``; ``scale = e^{λu}``, ``tau`` the polynomial time
    (u), ``cos``/``sin`` of ωu, each broadcastable to ``out[..., 0, 0]``.
    """
    for k in range(n):  # superdiagonal k carries τ^k / k!
        poly = scale * tau**k / math.factorial(k)
        for j in range(n - k):
            if cplx:
                a, b = off + 2 * j, off + 2 * (j + k)
                # R(-ωu) = [[cos, sin], [-sin, cos]]
                out[..., a, b] = poly * cos
                out[..., a, b + 1] = poly * sin
                out[..., a + 1, b] = -poly * sin
                out[..., a + 1, b + 1] = poly * cos
            else:
                out[..., off + j, off + j + k] = poly


def conjugate(P: torch.Tensor | None, m: torch.Tensor) -> torch.Tensor:
    """``P m P^{-1}`` (``m`` unchanged when ``P`` is ``None``, the canonical basis)."""
    if P is None:
        return m
    P = P.to(m.dtype)
    return P @ m @ torch.linalg.inv(P)


def check_params(
    rates: torch.Tensor, freqs: torch.Tensor, sizes: Sequence[int], dims: tuple[int, ...], shapes: str,
    allow_growth: bool,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Validate block parameters (shapes, sizes, finiteness, no growth unless allowed); broadcast rates and freqs."""
    if rates.dim() not in dims or freqs.dim() not in dims:
        raise ValueError(
            f"rates and freqs must have shape {shapes}, got rates {tuple(rates.shape)} and freqs {tuple(freqs.shape)}"
        )
    if rates.shape != freqs.shape:
        try:
            shape = torch.broadcast_shapes(rates.shape, freqs.shape)
        except RuntimeError as err:
            raise ValueError(f"rates shape {tuple(rates.shape)} and freqs shape {tuple(freqs.shape)} differ") from err
        rates, freqs = rates.expand(shape), freqs.expand(shape)
    sizes = tuple(int(n) for n in sizes)
    if len(sizes) != rates.shape[-1]:
        raise ValueError(f"sizes has {len(sizes)} entries but rates/freqs have {rates.shape[-1]} blocks")
    if any(n < 1 for n in sizes):
        raise ValueError(f"sizes must be positive integers, got {sizes}")
    with torch.no_grad():
        if not bool(torch.isfinite(rates).all()):
            raise ValueError(f"rates must be finite, got {rates.tolist()}")
        if not bool(torch.isfinite(freqs).all()):
            raise ValueError(f"freqs must be finite, got {freqs.tolist()}")
        if not allow_growth and bool((rates > 0).any()):
            raise ValueError(
                f"rates must be <= 0 (a positive rate is growth, which explodes with the lag); "
                f"got positive rates {rates[rates > 0].tolist()}. Pass allow_growth=True to build it anyway."
            )
    return rates, freqs, sizes


class Generator:
    """A real generator ``X = P J P^{-1}`` in canonical real Jordan form.

    Args:
        rates: λ per block, shape ``(blocks,)`` or ``(heads, blocks)``. ``λ > 0`` (growth) is
            refused unless ``allow_growth=True``.
        freqs: ω per block, same shape as ``rates``.
        sizes: the Jordan size n of each block (ints ≥ 1).
        complex: whether each block is a 2n×2n complex block; default: ``freqs != 0``.
        basis: the invertible matrix P (dim × dim), or ``None`` for the canonical basis.
        allow_growth: accept positive rates.

    The defining identity, checked in the tests for every block type::

        exp((u + v) X) = exp(uX) exp(vX),   exp(0 X) = I
    """

    def __init__(
        self,
        rates: Tensorish,
        freqs: Tensorish,
        sizes: Sequence[int],
        *,
        complex: Sequence[bool] | None = None,  # noqa: A002 - the mathematical word
        basis: Tensorish | None = None,
        allow_growth: bool = False,
    ) -> None:
        rates = _as_param(rates, "rates")
        freqs = _as_param(freqs, "freqs")
        if rates.dim() == 0:
            rates = rates.reshape(1)
        if freqs.dim() == 0:
            freqs = freqs.reshape(1)
        rates, freqs, sizes = check_params(rates, freqs, sizes, (1, 2), "(blocks,) or (heads, blocks)", allow_growth)
        if complex is None:
            with torch.no_grad():
                nz = (freqs != 0).reshape(-1, len(sizes)).any(dim=0)
            complex = tuple(bool(c) for c in nz.tolist())
        else:
            complex = tuple(bool(c) for c in complex)
            if len(complex) != len(sizes):
                raise ValueError(
                    f"complex has {len(complex)} entries but there are {len(sizes)} blocks"
                )
            with torch.no_grad():
                real_nonzero = [
                    i for i, c in enumerate(complex)
                    if not c and bool((freqs[..., i] != 0).any())
                ]
            if real_nonzero:
                raise ValueError(
                    f"blocks {real_nonzero} are marked real (complex=False) but have non-zero freqs"
                )
        self.rates = rates
        self.freqs = freqs
        self.sizes = sizes
        self.complex = complex
        self.allow_growth = bool(allow_growth)
        widths = [n * (2 if c else 1) for n, c in zip(sizes, complex)]
        self._widths = tuple(widths)
        self._offsets = tuple(int(sum(widths[:i])) for i in range(len(widths)))
        self.dim = int(sum(widths))
        if basis is not None:
            basis = _as_param(basis, "basis")
            if basis.shape != (self.dim, self.dim):
                raise ValueError(
                    f"basis must be a ({self.dim}, {self.dim}) matrix for this generator, "
                    f"got shape {tuple(basis.shape)}"
                )
            with torch.no_grad():
                if not bool(torch.isfinite(basis).all()):
                    raise ValueError("basis must be finite")
                cond = torch.linalg.cond(basis.detach().to(torch.float64))
                if not bool(torch.isfinite(cond)) or float(cond) > 1e12:
                    raise ValueError(f"basis must be invertible, got condition number {float(cond):.3g}")
        self.basis = basis

    # ------------------------------------------------------------------ structure
    @property
    def num_heads(self) -> int | None:
        """Number of heads of the leading heads axis, or ``None`` when the parameters are shared."""
        return int(self.rates.shape[0]) if self.rates.dim() == 2 else None

    @property
    def head_shape(self) -> tuple[int, ...]:
        return tuple(self.rates.shape[:-1])

    @property
    def num_blocks(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Canonical index of the first dimension of each block."""
        return self._offsets

    @property
    def widths(self) -> tuple[int, ...]:
        """Number of dimensions of each block (n, or 2n for a complex block)."""
        return self._widths

    @property
    def blocks(self) -> list[tuple[float, float, int]]:
        """``(rate, freq, size)`` of every block; head-major over all heads when there is a heads axis."""
        r = self.rates.detach().reshape(-1, self.num_blocks).tolist()
        w = self.freqs.detach().reshape(-1, self.num_blocks).tolist()
        return [
            (float(rr[i]), float(ww[i]), self.sizes[i])
            for rr, ww in zip(r, w)
            for i in range(self.num_blocks)
        ]

    @property
    def is_orthogonal(self) -> bool:
        """True when every A(u) is orthogonal in the canonical basis: all rates 0, all sizes 1."""
        with torch.no_grad():
            return all(n == 1 for n in self.sizes) and bool((self.rates == 0).all())

    def key(self) -> tuple:
        """A hashable identity of the structure and parameter values (for table caches)."""
        with torch.no_grad():
            return (
                self.sizes,
                self.complex,
                tuple(self.rates.detach().to(torch.float64).reshape(-1).tolist()),
                tuple(self.freqs.detach().to(torch.float64).reshape(-1).tolist()),
                tuple(self.rates.shape),
                None if self.basis is None else hash(self.basis.detach().cpu().numpy().tobytes()),
            )

    def with_params(self, *, rates: Tensorish | None = None, freqs: Tensorish | None = None) -> Generator:
        """The same block structure and basis with new rates and/or frequencies."""
        return Generator(
            self.rates if rates is None else rates,
            self.freqs if freqs is None else freqs,
            self.sizes,
            complex=self.complex,
            basis=self.basis,
            allow_growth=self.allow_growth,
        )

    def with_basis(self, basis: Tensorish | None) -> Generator:
        """The same canonical blocks in another basis (``X = P J P^{-1}``)."""
        return Generator(
            self.rates, self.freqs, self.sizes, complex=self.complex, basis=basis,
            allow_growth=self.allow_growth,
        )

    def __repr__(self) -> str:
        heads = "" if self.num_heads is None else f", heads={self.num_heads}"
        basis = "" if self.basis is None else ", basis=P"
        kinds = ",".join(f"{'C' if c else 'R'}{n}" for n, c in zip(self.sizes, self.complex))
        return f"Generator(dim={self.dim}{heads}, blocks=[{kinds}]{basis})"

    # ------------------------------------------------------------------ dense views
    def _canonical(self, u: torch.Tensor | None) -> torch.Tensor:
        """Dense J (u is None) or exp(uJ), shape (*u.shape, *heads, d, d)."""
        dtype = torch.promote_types(self.rates.dtype, torch.float64 if u is None else u.dtype)
        ushape = () if u is None else tuple(u.shape)
        hshape = self.head_shape
        out = torch.zeros(*ushape, *hshape, self.dim, self.dim, dtype=dtype, device=self.rates.device)
        if u is not None:
            # (*u, 1...) so that it broadcasts against (*heads,)
            uu = u.to(dtype).reshape(tuple(ushape) + (1,) * len(hshape))
        for i, (n, cplx, off) in enumerate(zip(self.sizes, self.complex, self.offsets)):
            lam = self.rates[..., i].to(dtype)  # (*heads,)
            om = self.freqs[..., i].to(dtype)
            if u is None:
                scal = lam.expand(*ushape, *hshape) if ushape else lam
                if cplx:
                    for j in range(n):
                        a = off + 2 * j
                        out[..., a, a] = scal
                        out[..., a + 1, a + 1] = scal
                        out[..., a, a + 1] = om
                        out[..., a + 1, a] = -om
                        if j + 1 < n:
                            out[..., a, a + 2] = 1.0
                            out[..., a + 1, a + 3] = 1.0
                else:
                    for j in range(n):
                        out[..., off + j, off + j] = scal
                        if j + 1 < n:
                            out[..., off + j, off + j + 1] = 1.0
                continue
            fill_exp_block(out, off, n, cplx, torch.exp(lam * uu), uu, torch.cos(om * uu), torch.sin(om * uu))
        return out

    def _conjugate(self, m: torch.Tensor) -> torch.Tensor:
        return conjugate(self.basis, m)

    def matrix(self) -> torch.Tensor:
        """The dense generator X = P J P^{-1}, shape ``(*heads, d, d)``."""
        return self._conjugate(self._canonical(None))

    def canonical_matrix(self) -> torch.Tensor:
        """The dense canonical form J, shape ``(*heads, d, d)``."""
        return self._canonical(None)

    def exp(self, u: Tensorish) -> torch.Tensor:
        """Dense A(u) = exp(uX) for a tensor of offsets u, shape ``(*u.shape, *heads, d, d)``.

        Closed form per block; differentiable in u and in the rates and frequencies. For
        inspection and tests: the fast path never builds it.
        """
        if not isinstance(u, torch.Tensor):
            u = torch.as_tensor(u, dtype=torch.float64)
        if not u.is_floating_point():
            u = u.to(torch.float64)
        return self._conjugate(self._canonical(u))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_matrix(
        cls, X: Tensorish, *, tol: float | None = None, exact: bool | None = None,
        allow_growth: bool = True,
    ) -> Generator:
        """The real Jordan decomposition ``X = P J P^{-1}`` of any real square matrix.

        Eigenvalues are clustered with a tolerance derived from the norm of X and the precision
        of float64 (or ``tol``); Jordan sizes come from the ranks of ``(X - λI)^k``. Matrices with
        rational entries (ints, ``fractions.Fraction``, sympy rationals) take an exact sympy path
        unless ``exact=False``. Growth (λ > 0) is accepted here, since it is a description.

        >>> import torch
        >>> g = Generator.from_matrix([[0.0, 1.0], [0.0, 0.0]])
        >>> g.blocks
        [(0.0, 0.0, 2)]
        """
        from liepos._jordan import real_jordan

        blocks, P = real_jordan(X, tol=tol, exact=exact)
        rates = [b[0] for b in blocks]
        freqs = [b[1] for b in blocks]
        sizes = [b[2] for b in blocks]
        basis = torch.as_tensor(P, dtype=torch.float64)
        if basis.shape[0] and torch.equal(basis, torch.eye(basis.shape[0], dtype=torch.float64)):
            basis = None
        return cls(rates, freqs, sizes, basis=basis, allow_growth=allow_growth)

    @classmethod
    def from_matrices(cls, matrices: Any, *, tol: float = 1e-9, allow_growth: bool = True) -> Any:
        """Commuting generators, one per position axis -> :class:`liepos.axes.AxesGenerator`.

        Refuses matrices whose commutator ``‖[X_a, X_b]‖ > tol·‖X_a‖‖X_b‖`` with a ``ValueError``
        that reports its norm; see :meth:`liepos.axes.AxesGenerator.from_matrices`.
        """
        from liepos.axes import AxesGenerator

        return AxesGenerator.from_matrices(matrices, tol=tol, allow_growth=allow_growth)


def direct_sum(*generators: Generator) -> Generator:
    """Block-diagonal sum ``X = X_1 ⊕ X_2 ⊕ ...``; so ``exp(uX) = exp(uX_1) ⊕ exp(uX_2) ⊕ ...``.

    Generators with a heads axis must agree on it; a shared generator is broadcast to the heads.

    >>> g = direct_sum(Generator([0.0], [1.0], [1]), Generator([-0.5], [0.0], [1]))
    >>> g.dim, g.sizes, g.complex
    (3, (1, 1), (True, False))
    """
    if not generators:
        raise ValueError("direct_sum needs at least one generator")
    for i, g in enumerate(generators):
        if not isinstance(g, Generator):
            raise TypeError(f"direct_sum argument {i} must be a Generator, got {type(g).__name__}")
    heads = {g.num_heads for g in generators} - {None}
    if len(heads) > 1:
        raise ValueError(f"direct_sum of generators with different head counts {sorted(heads)}")
    H = heads.pop() if heads else None

    def lift(t: torch.Tensor) -> torch.Tensor:
        return t if H is None or t.dim() == 2 else t.unsqueeze(0).expand(H, -1)

    rates = torch.cat([lift(g.rates.to(torch.float64)) for g in generators], dim=-1)
    freqs = torch.cat([lift(g.freqs.to(torch.float64)) for g in generators], dim=-1)
    sizes = [n for g in generators for n in g.sizes]
    cplx = [c for g in generators for c in g.complex]
    if all(g.basis is None for g in generators):
        basis = None
    else:
        basis = torch.block_diag(
            *[
                torch.eye(g.dim, dtype=torch.float64) if g.basis is None else g.basis.to(torch.float64)
                for g in generators
            ]
        )
    return Generator(
        rates, freqs, sizes, complex=cplx, basis=basis,
        allow_growth=any(g.allow_growth for g in generators),
    )
