"""Generators of one-parameter groups, A(u) = exp(uX), in real Jordan form, for one or several position axes.

A :class:`Generator` is a real matrix ``X = P J P^{-1}`` stored as its canonical real Jordan
blocks ``J = J_1 ⊕ ... ⊕ J_m`` and a basis ``P`` (``None`` means the identity). Each block is a
triple (rate λ, frequency ω, size n):

* a *real* block (ω = 0) is the n×n matrix ``λI + N`` (N: ones on the superdiagonal);
* a *complex* block (ω ≠ 0) is the 2n×2n matrix with ``C = [[λ, ω], [-ω, λ]]`` on the diagonal
  and ``I₂`` above it, eigenvalues λ ± iω.

The exponential is closed form per block (:mod:`liepos.structure` writes it)::

    exp(u J) = e^{λu} · Σ_{k<n} u^k/k! N^k          (real block)
    exp(u J) = e^{λu} · Σ_{k<n} u^k/k! N^k ⊗ R(-ωu)  (complex block, R counter-clockwise)

and satisfies the group law ``A(u + v) = A(u) A(v)``, ``A(0) = I``.

Two optional leading axes of the parameters:

* a *heads* axis: ``rates``/``freqs`` of shape ``(heads, blocks)``, one parameter set per head with
  the same block structure;
* a *position-axes* axis (``axes=m``): ``rates``/``freqs`` of shape ``(axes, blocks)`` or
  ``(heads, axes, blocks)``, one commuting generator ``X_a = P (λ_a I + ν_a N ⊕ ω_a) P^{-1}`` per
  axis of a position vector ``t = (t_1 … t_m)`` (time, row, column), and
  ``A(u) = exp(Σ_a u_a X_a)``. ``nus`` ``(axes, blocks)`` holds ν_a (default 1).

>>> import torch
>>> g = Generator([0.0], [1.0], [1])
>>> u, v = torch.tensor(0.3, dtype=torch.float64), torch.tensor(1.1, dtype=torch.float64)
>>> bool(torch.allclose(g.exp(u + v), g.exp(u) @ g.exp(v)))
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from liepos._angles import reduced_angle
from liepos._checks import check_bool, check_int, check_ints, check_real, check_real_tensor, describe
from liepos.structure import Structure, conjugate, dense_exp, dense_generator

__all__ = ["Generator", "direct_sum"]

F64 = torch.float64

# A basis whose condition number passes 1e12 loses more than 12 of float64's ~16 digits when P⁻¹ is
# applied: its encodings would no longer be relative to any useful precision.
MAX_BASIS_CONDITION = 1e12

# from_matrices decomposes a random combination Σ c_a X_a (c_a uniform in [0.5, 1.5]): a generic
# combination separates every joint eigenvalue; an unlucky draw that merges two is retried. Seeded, so
# the result is reproducible; four draws make a miss astronomically unlikely.
_COMBINATION_SEED = 12345
_COMBINATION_DRAWS = 4


def _as_param(x: Any, name: str, ndim: tuple[int, ...]) -> torch.Tensor:
    """A real tensor (TypeError for complex/str, ValueError for NaN/inf); floating tensors kept as is."""
    t = check_real_tensor(name, x, dtype=None if isinstance(x, torch.Tensor) else F64)
    if not t.is_floating_point():
        t = t.to(F64)
    if t.dim() == 0 and 1 in ndim:
        t = t.reshape(1)  # () -> (1,): one block
    if t.dim() not in ndim:
        shapes = "(blocks,) or (heads, blocks)" if ndim == (1, 2) else "(axes, blocks) or (heads, axes, blocks)"
        raise ValueError(f"`{name}` must have shape {shapes}, got shape {tuple(t.shape)}")
    return t


class Generator:
    """A real generator ``X = P J P^{-1}`` in canonical real Jordan form (one or several position axes).

    Args:
        rates: λ per block, shape ``(blocks,)`` or ``(heads, blocks)``; with ``axes``, ``(axes, blocks)``
            or ``(heads, axes, blocks)``. ``λ > 0`` (growth) is refused unless ``allow_growth=True``.
        freqs: ω per block, same shape as ``rates`` (broadcast against it).
        sizes: the Jordan size n of each block (ints ≥ 1; ``1.7`` is refused, never rounded).
        complex: whether each block is a 2n×2n complex block; default: ``freqs != 0`` on some axis.
        basis: the invertible matrix P (dim × dim), or ``None`` for the canonical basis.
        allow_growth: accept positive rates.
        axes: ``None`` for one position axis (positions ``(…, seq)``), else the number of position
            axes m (positions ``(…, seq, m)``).
        nus: with ``axes``, ν per axis and block (the coefficient of N in ``X_a``), shape ``(axes, blocks)``.

    The defining identity, checked in the tests for every block type::

        exp((u + v) X) = exp(uX) exp(vX),   exp(0 X) = I,   X_a X_b = X_b X_a
    """

    def __init__(
        self,
        rates: Any,
        freqs: Any,
        sizes: Sequence[int],
        *,
        complex: Sequence[bool] | None = None,  # noqa: A002 - the mathematical word
        basis: Any = None,
        allow_growth: bool = False,
        axes: int | None = None,
        nus: Any = None,
    ) -> None:
        self.allow_growth = check_bool("allow_growth", allow_growth)
        self.num_axes = None if axes is None else check_int("axes", axes, min=1)
        ndim = (1, 2) if axes is None else (2, 3)
        rates, freqs = _as_param(rates, "rates", ndim), _as_param(freqs, "freqs", ndim)
        try:
            shape = torch.broadcast_shapes(rates.shape, freqs.shape)
        except RuntimeError as err:
            raise ValueError(
                f"`rates` of shape {tuple(rates.shape)} and `freqs` of shape {tuple(freqs.shape)} do not broadcast"
            ) from err
        rates, freqs = rates.expand(shape), freqs.expand(shape)  # (*heads, [axes,] blocks)
        sizes = tuple(check_ints("sizes", sizes, min=1))
        if not sizes:
            raise ValueError("`sizes` must name at least one block, got []")
        if len(sizes) != shape[-1]:
            raise ValueError(f"`sizes` has {len(sizes)} entries but `rates`/`freqs` have {shape[-1]} blocks")
        if axes is not None and shape[-2] != self.num_axes:
            raise ValueError(f"`rates` must have {self.num_axes} rows (one per axis), got shape {tuple(shape)}")
        if not self.allow_growth:
            with torch.no_grad():
                if bool((rates > 0).any()):
                    raise ValueError(
                        f"`rates` must be <= 0 (a positive rate is growth, which explodes with the lag), got "
                        f"positive rates {rates[rates > 0].tolist()}; pass allow_growth=True to build it anyway"
                    )
        self.rates, self.freqs, self.sizes = rates, freqs, sizes
        self.complex = self._kinds(complex)
        self.structure = Structure(self.sizes, self.complex)
        self.dim = self.structure.dim
        self.nus = None if axes is None else self._nus(nus)
        if axes is None and nus is not None:
            raise ValueError("`nus` needs `axes` (ν is the coefficient of N on each of several position axes)")
        self.basis = None if basis is None else self._basis(basis)

    def _kinds(self, complex: Sequence[bool] | None) -> tuple[bool, ...]:  # noqa: A002
        nb = len(self.sizes)
        with torch.no_grad():
            nonzero = (self.freqs != 0).reshape(-1, nb).any(dim=0).tolist()  # (rows, blocks) -> (blocks,)
        if complex is None:
            return tuple(bool(c) for c in nonzero)
        if isinstance(complex, (str, bytes)) or not all(isinstance(c, bool) for c in complex):
            raise TypeError(f"`complex` must be a sequence of True/False, got {describe(complex)}")
        kinds = tuple(complex)
        if len(kinds) != nb:
            raise ValueError(f"`complex` has {len(kinds)} entries but there are {nb} blocks")
        wrong = [i for i, (c, nz) in enumerate(zip(kinds, nonzero)) if not c and nz]
        if wrong:
            raise ValueError(f"blocks {wrong} are marked real (complex=False) but have non-zero freqs")
        return kinds

    def _nus(self, nus: Any) -> torch.Tensor:
        if self.num_axes is None:
            raise ValueError("`nus` belong to a generator with several position axes (axes=...)")
        want = (self.num_axes, len(self.sizes))
        if nus is None:
            return torch.ones(want, dtype=F64)
        nus = _as_param(nus, "nus", (2,))
        if tuple(nus.shape) != want:
            raise ValueError(f"`nus` must have shape (axes, blocks) = {want}, got {tuple(nus.shape)}")
        return nus

    def _basis(self, basis: Any) -> torch.Tensor:
        basis = check_real_tensor("basis", basis, ndim=2, dtype=None if isinstance(basis, torch.Tensor) else F64)
        basis = basis if basis.is_floating_point() else basis.to(F64)
        if tuple(basis.shape) != (self.dim, self.dim):
            raise ValueError(
                f"`basis` must be a ({self.dim}, {self.dim}) matrix for this generator, got shape {tuple(basis.shape)}"
            )
        with torch.no_grad():
            cond = torch.linalg.cond(basis.detach().to(F64))
        if not bool(torch.isfinite(cond)) or float(cond) > MAX_BASIS_CONDITION:
            raise ValueError(f"`basis` must be invertible, got condition number {float(cond):.3g}")
        return basis

    # ------------------------------------------------------------------ structure
    @property
    def num_heads(self) -> int | None:
        """Number of heads of the leading heads axis, or ``None`` when the parameters are shared."""
        return int(self.rates.shape[0]) if len(self.head_shape) else None

    @property
    def head_shape(self) -> tuple[int, ...]:
        return tuple(self.rates.shape[: -1 if self.num_axes is None else -2])

    @property
    def num_blocks(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Canonical index of the first dimension of each block."""
        return self.structure.offsets

    @property
    def widths(self) -> tuple[int, ...]:
        """Number of dimensions of each block (n, or 2n for a complex block)."""
        return self.structure.widths

    @property
    def blocks(self) -> list[tuple[float, float, int]]:
        """``(rate, freq, size)`` of every block, head-major (and axis-major within a head with ``axes``)."""
        r = self.rates.detach().reshape(-1, self.num_blocks).tolist()  # (rows, blocks)
        w = self.freqs.detach().reshape(-1, self.num_blocks).tolist()  # (rows, blocks)
        return [(float(rr[i]), float(ww[i]), self.sizes[i]) for rr, ww in zip(r, w) for i in range(self.num_blocks)]

    def forget_memos(self) -> None:
        """Drop every value memoised from the parameters (after a new storage of the same values' tensors)."""
        self.__dict__.pop("_memos", None)

    def _memo(self, name: str, compute: Any) -> Any:
        """``compute()`` cached until a parameter tensor changes: in place (torch's version counter) or by a
        new storage (``p.data = …`` keeps the counter, so the storage's address is part of the stamp)."""
        stamp = tuple((t.data_ptr(), t._version) for t in (self.rates, self.freqs, self.nus, self.basis) if t is not None)
        cached = self.__dict__.get("_memos", {}).get(name)
        if cached is None or cached[0] != stamp:
            cached = (stamp, compute())
            self.__dict__.setdefault("_memos", {})[name] = cached
        return cached[1]

    @property
    def is_orthogonal(self) -> bool:
        """True when every A(u) is orthogonal in the canonical basis: all rates 0, all sizes 1."""
        def compute() -> bool:
            with torch.no_grad():
                return all(n == 1 for n in self.sizes) and bool((self.rates == 0).all())

        return self._memo("orthogonal", compute)

    @property
    def is_identity(self) -> bool:
        """True when every ``A(u) = I`` (NoPE): no basis, all sizes 1, all rates and frequencies 0, none of them
        learnable (a learnable zero frequency still has a gradient, ``∂A/∂ω = uJ``)."""
        if self.basis is not None or any(p.requires_grad for p in (self.rates, self.freqs)):
            return False

        def compute() -> bool:
            with torch.no_grad():
                return all(n == 1 for n in self.sizes) and not bool(self.rates.any()) and not bool(self.freqs.any())

        return self._memo("identity", compute)

    def bounds(self) -> tuple[float, float]:
        """``(max |λ|, max |ν|)`` over every block, head and axis (for range checks)."""
        def compute() -> tuple[float, float]:
            with torch.no_grad():
                nu = 1.0 if self.nus is None else float(self.nus.detach().abs().max())
                return float(self.rates.detach().abs().max()), nu

        return self._memo("bounds", compute)

    def key(self) -> tuple:
        """A hashable identity of the structure and parameter values (for table caches)."""
        flat = lambda t: None if t is None else tuple(t.detach().to(F64).reshape(-1).tolist())  # noqa: E731
        return self._memo("key", lambda: (
            self.sizes, self.complex, self.num_axes, tuple(self.rates.shape), flat(self.rates), flat(self.freqs),
            flat(self.nus), None if self.basis is None else hash(self.basis.detach().cpu().numpy().tobytes()),
        ))

    def _fields(self) -> dict[str, Any]:
        return dict(complex=self.complex, basis=self.basis, allow_growth=self.allow_growth, axes=self.num_axes,
                    nus=self.nus)

    def with_params(self, *, rates: Any = None, freqs: Any = None) -> Generator:
        """The same block structure, axes and basis with new rates and/or frequencies."""
        return Generator(self.rates if rates is None else rates, self.freqs if freqs is None else freqs,
                         self.sizes, **self._fields())

    def with_basis(self, basis: Any) -> Generator:
        """The same canonical blocks in another basis (``X = P J P^{-1}``)."""
        return Generator(self.rates, self.freqs, self.sizes, **{**self._fields(), "basis": basis})

    def __repr__(self) -> str:
        axes = "" if self.num_axes is None else f", axes={self.num_axes}"
        heads = "" if self.num_heads is None else f", heads={self.num_heads}"
        basis = "" if self.basis is None else ", basis=P"
        kinds = [f"{'C' if c else 'R'}{n}" for n, c in zip(self.sizes, self.complex)]
        runs: list[list] = []  # consecutive equal kinds, printed once with their count: RoPE-64 is [32×C1]
        for kind in kinds:
            if runs and runs[-1][0] == kind:
                runs[-1][1] += 1
            else:
                runs.append([kind, 1])
        blocks = ",".join(kind if n == 1 else f"{n}×{kind}" for kind, n in runs)
        return f"Generator(dim={self.dim}{axes}{heads}, blocks=[{blocks}]{basis})"

    # ------------------------------------------------------------------ several axes
    def axis_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rates and freqs ``(*heads, axes, blocks)`` and nus ``(axes, blocks)``, one axis included."""
        if self.nus is None:  # one axis (nus are set exactly when num_axes is)
            one = torch.ones(1, self.num_blocks, dtype=F64, device=self.rates.device)
            return self.rates.unsqueeze(-2), self.freqs.unsqueeze(-2), one  # (*heads, 1, blocks)
        return self.rates, self.freqs, self.nus.to(self.rates.device)

    def along(self, direction: Sequence[float] | torch.Tensor) -> Generator:
        """The one-axis generator ``Σ_a c_a X_a`` met by positions moving along ``c``: ``t = τ·c``.

        ``along(e_a)`` is the generator of axis ``a``; ``along(ones)`` the one of tokens whose axes
        advance together (M-RoPE's text tokens). A Jordan block whose N-coefficient ``Σ c_a ν_a`` is
        0 along ``c`` splits into size-1 blocks; one with a coefficient ``τ ≠ 1`` is expressed in
        the rescaled basis ``diag(τ^{-j})``.

        >>> import torch, liepos as lp
        >>> g = lp.axial_rope(8, axes=2).generator
        >>> X = g.matrix()                                  # (axes, d, d)
        >>> bool(torch.allclose(g.along([0.5, 2.0]).matrix(), 0.5 * X[0] + 2.0 * X[1]))
        True
        """
        if self.num_axes is None or self.nus is None:
            raise ValueError("`along` needs a generator with several position axes (axes=...)")
        c = check_real_tensor("direction", direction, ndim=1)
        if c.shape != (self.num_axes,):
            raise ValueError(f"`direction` must have shape ({self.num_axes},), got {tuple(c.shape)}")
        rates = (self.rates * c.to(self.rates.dtype).unsqueeze(-1)).sum(-2)  # (*heads, axes, blocks) -> (*heads, blocks)
        freqs = (self.freqs * c.to(self.freqs.dtype).unsqueeze(-1)).sum(-2)
        tau = (self.nus.detach().to(F64) * c.unsqueeze(-1)).sum(-2).tolist()  # (axes, blocks) -> (blocks,)
        sizes, cplx, keep, scale = [], [], [], []
        for i, (n, cx) in enumerate(zip(self.sizes, self.complex)):
            w = 2 if cx else 1
            split = n > 1 and tau[i] == 0.0
            sizes += [1] * n if split else [n]
            cplx += [cx] * n if split else [cx]
            keep += [i] * n if split else [i]
            t = tau[i] if n > 1 and not split else 1.0
            scale += [t ** (-j) for j in range(n) for _ in range(w)]
        idx = torch.tensor(keep, dtype=torch.long)
        basis = self.basis
        if any(s != 1.0 for s in scale):
            D = torch.diag(torch.tensor(scale, dtype=F64))
            basis = D if basis is None else basis.to(F64) @ D
        growth = self.allow_growth or bool((c < 0).any())
        return Generator(rates.index_select(-1, idx), freqs.index_select(-1, idx), sizes, complex=cplx,
                         basis=basis, allow_growth=growth)

    def axis(self, a: int) -> Generator:
        """The one-axis generator ``X_a`` of position axis ``a``."""
        if self.num_axes is None:
            raise ValueError("`axis` needs a generator with several position axes (axes=...)")
        a = check_int("a", a, min=0, max=self.num_axes - 1)
        return self.along(torch.eye(self.num_axes, dtype=F64)[a])

    # ------------------------------------------------------------------ dense views
    def canonical_matrix(self) -> torch.Tensor:
        """The dense canonical form J: ``(*heads, d, d)``; with axes ``(axes, *heads, d, d)``, one J_a per axis."""
        rates, freqs, nus = self.axis_params()
        nh = len(self.head_shape)
        lam = rates.movedim(-2, 0)  # (*heads, A, blocks) -> (A, *heads, blocks)
        om = freqs.movedim(-2, 0)  # (*heads, A, blocks) -> (A, *heads, blocks)
        nu = nus.reshape(nus.shape[0], *(1,) * nh, nus.shape[-1]).to(lam.dtype)  # (A, 1…, blocks)
        J = dense_generator(self.structure, lam, om, nu)  # (A, *heads, d, d)
        return J[0] if self.num_axes is None else J

    def matrix(self) -> torch.Tensor:
        """The dense generator ``X = P J P^{-1}``: ``(*heads, d, d)``; with axes ``(axes, *heads, d, d)``."""
        return conjugate(self.basis, self.canonical_matrix())

    def exp(self, u: Any) -> torch.Tensor:
        """Dense ``A(u) = exp(uX)`` for a tensor of offsets u: ``(*u.shape, *heads, d, d)``.

        With axes, ``u`` has shape ``(..., axes)`` and the result ``exp(Σ_a u_a X_a)`` has shape
        ``(*u.shape[:-1], *heads, d, d)``. Closed form per block; differentiable in u and in the
        parameters; each angle ``ω u`` is reduced mod 2π from the exact product (float64), so ``A(u)`` is
        exact at any lag, as the fast path's tables are. For inspection and tests: the fast path never builds it.
        """
        u = check_real_tensor("u", u, dtype=None if isinstance(u, torch.Tensor) else F64)
        u = u if u.is_floating_point() else u.to(F64)
        if self.num_axes is None:
            u = u.unsqueeze(-1)  # (..., 1): one axis
        elif u.dim() == 0 or u.shape[-1] != self.num_axes:
            raise ValueError(f"`u` must have shape (..., {self.num_axes}), got {tuple(u.shape)}")
        rates, freqs, nus = self.axis_params()
        dtype = torch.promote_types(rates.dtype, u.dtype)
        nh = len(self.head_shape)
        uu = u.to(dtype).reshape(*u.shape[:-1], *(1,) * nh, u.shape[-1], 1)  # (*U, 1…, A, 1) against (*heads, A, blocks)
        E = (rates.to(dtype) * uu).sum(-2)  # (*U, *heads, blocks)
        # the angles ω·u mod 2π from the exact product (as the fast path's tables): exact at any lag
        th = (reduced_angle(freqs, uu).to(dtype) if dtype == F64 else freqs.to(dtype) * uu).sum(-2)
        tau = (nus.to(dtype) * uu).sum(-2)  # (*U, 1…, blocks)
        return conjugate(self.basis, dense_exp(self.structure, E, th, tau))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_matrix(
        cls, X: Any, *, tol: float | None = None, exact: bool | None = None, allow_growth: bool = False,
    ) -> Generator:
        """The real Jordan decomposition ``X = P J P^{-1}`` of any real square matrix.

        Eigenvalues are clustered with a tolerance derived from the norm of X and the precision
        of float64 (or ``tol``); Jordan sizes come from the ranks of ``(X - λI)^k``. Matrices with
        rational entries (ints, ``fractions.Fraction``, sympy rationals) take an exact sympy path
        unless ``exact=False``. Growth (λ > 0) is refused unless ``allow_growth=True``, as everywhere.

        >>> import torch
        >>> X = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]], dtype=torch.float64)
        >>> g = Generator.from_matrix(X)
        >>> bool(torch.allclose(g.matrix(), X)), bool(torch.allclose(g.exp(1.5), torch.linalg.matrix_exp(1.5 * X)))
        (True, True)
        """
        from liepos._jordan import real_jordan

        allow_growth = check_bool("allow_growth", allow_growth)
        blocks, P = real_jordan(X, tol=tol, exact=exact)
        basis: torch.Tensor | None = torch.as_tensor(P, dtype=F64)
        if basis is not None and basis.shape[0] and torch.equal(basis, torch.eye(basis.shape[0], dtype=F64)):
            basis = None
        rates, freqs, sizes = [b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks]
        if not allow_growth and any(r > 0 for r in rates):
            raise ValueError(
                f"`X` has eigenvalues with positive real part {[r for r in rates if r > 0]} (growth, which "
                f"explodes with the lag); pass allow_growth=True to decompose it anyway"
            )
        return cls(rates, freqs, sizes, basis=basis, allow_growth=allow_growth)

    @classmethod
    def from_matrices(cls, matrices: Any, *, tol: float = 1e-9, allow_growth: bool = False) -> Generator:
        """Simultaneous real Jordan decomposition of commuting matrices ``X_1 … X_m``: a Generator with ``axes=m``.

        Refuses non-commuting matrices: ``‖[X_a, X_b]‖_F > tol·‖X_a‖_F‖X_b‖_F`` is a ``ValueError``
        that reports the commutator norm. A generic combination ``Σ c_a X_a`` is decomposed with
        :func:`liepos._jordan.real_jordan`; each ``P^{-1} X_a P`` must then be block-canonical
        (``λ_a I + ν_a N`` with rotation ``ω_a`` on every block of the combination), else a
        ``ValueError`` says which axis is not.

        >>> import torch, liepos as lp
        >>> X = lp.rope(4).generator.matrix()
        >>> g = Generator.from_matrices([X, 2 * X])
        >>> bool(torch.allclose(g.exp([1.0, 0.5]), lp.rope(4).generator.exp(2.0)))
        True
        """
        from liepos._jordan import real_jordan

        tol = check_real("tol", tol, nonnegative=True)
        allow_growth = check_bool("allow_growth", allow_growth)
        Xs = _commuting(matrices, tol)
        rng = np.random.default_rng(_COMBINATION_SEED)
        last_err: Exception | None = None
        for _ in range(_COMBINATION_DRAWS):
            coef = rng.uniform(0.5, 1.5, size=len(Xs))
            G = torch.zeros_like(Xs[0])
            for ca, X in zip(coef, Xs):  # Σ c_i X_i, summed in order
                G = G + float(ca) * X
            blocks, P = real_jordan(G.numpy(), exact=False)
            try:
                return _read_blocks(Xs, blocks, np.asarray(P, dtype=np.float64), tol, allow_growth)
            except ValueError as err:
                last_err = err
        raise last_err  # type: ignore[misc]


def _commuting(matrices: Any, tol: float) -> list[torch.Tensor]:
    """The matrices as float64 tensors, checked square, finite, of one shape and pairwise commuting."""
    mats = list(matrices)
    if not mats:
        raise ValueError("`matrices` must hold at least one matrix, got none")
    Xs = []
    for a, X in enumerate(mats):
        X = check_real_tensor(f"matrices[{a}]", X.detach() if isinstance(X, torch.Tensor) else X, ndim=2)
        if X.shape[0] != X.shape[1]:
            raise ValueError(f"`matrices[{a}]` must be square, got shape {tuple(X.shape)}")
        Xs.append(X)
    if any(X.shape != Xs[0].shape for X in Xs):
        raise ValueError(f"the matrices must share one shape, got {[tuple(X.shape) for X in Xs]}")
    norms = [float(torch.linalg.norm(X)) for X in Xs]
    for a in range(len(Xs)):
        for b in range(a + 1, len(Xs)):
            c = float(torch.linalg.norm(Xs[a] @ Xs[b] - Xs[b] @ Xs[a]))
            den = norms[a] * norms[b]
            if c > tol * den:
                raise ValueError(
                    f"the generators of axes {a} and {b} do not commute: ‖[X_{a}, X_{b}]‖ = {c:.3g} "
                    f"(relative {c / den:.3g} > tol {tol:g}); exp(t_{a} X_{a}) exp(t_{b} X_{b}) then "
                    f"depends on the order of the moves and no encoding of the joint position is relative"
                )
    return Xs


# parameters read off P⁻¹ X_a P below this fraction of its norm are rounding noise and snap to 0
_SNAP = 1e-12
# the rebuilt block-canonical matrix may differ from P⁻¹ X_a P by tol · cond(P) times this margin
_RESIDUAL_MARGIN = 1e3


def _read_blocks(Xs: list[torch.Tensor], blocks: list, P: np.ndarray, tol: float, allow_growth: bool) -> Generator:
    """Per axis, ``(λ_a, ω_a, ν_a)`` of every joint block of ``P⁻¹ X_a P``; ValueError if not block-canonical."""
    s = Structure(tuple(int(b[2]) for b in blocks), tuple(float(b[1]) != 0.0 for b in blocks))
    Pinv = np.linalg.inv(P)
    rtol = max(tol, 1e-9) * _RESIDUAL_MARGIN * max(1.0, float(np.linalg.cond(P)))
    R, W, V = [], [], []
    for a, X in enumerate(Xs):
        M = Pinv @ X.numpy() @ P
        scale = max(float(np.linalg.norm(M)), 1e-300)
        rr, ww, vv = [], [], []
        for n, cx, off, w in zip(s.sizes, s.complex, s.offsets, s.widths):
            S = M[off : off + w, off : off + w]
            lam = float(np.mean(np.diag(S)))
            if cx:
                om = float(np.mean([(S[2 * j, 2 * j + 1] - S[2 * j + 1, 2 * j]) / 2 for j in range(n)]))
                nus = [(S[2 * j, 2 * j + 2] + S[2 * j + 1, 2 * j + 3]) / 2 for j in range(n - 1)]
            else:
                om, nus = 0.0, [S[j, j + 1] for j in range(n - 1)]
            nu = float(np.mean(nus)) if n > 1 else 1.0
            snap = lambda x, scale=scale: 0.0 if abs(x) <= _SNAP * scale else x  # noqa: E731
            rr.append(snap(lam))
            ww.append(snap(om))
            vv.append(snap(nu) if n > 1 else 1.0)
        t = lambda v: torch.tensor(v, dtype=F64)  # noqa: E731
        rebuilt = dense_generator(s, t(rr), t(ww), t(vv)).numpy()
        resid = float(np.linalg.norm(M - rebuilt))
        if resid > rtol * scale:
            raise ValueError(
                f"the generator of axis {a} is not block-canonical in the joint Jordan basis (residual "
                f"{resid / scale:.3g} relative): liepos supports commuting generators whose every joint "
                f"block is λI + νN with one rotation ω per axis (a Jordan block whose N-coefficient "
                f"rotates, or N² terms, are not supported)"
            )
        R.append(rr)
        W.append(ww)
        V.append(vv)
    basis: torch.Tensor | None = torch.as_tensor(P, dtype=F64)
    if basis is not None and torch.equal(basis, torch.eye(basis.shape[0], dtype=F64)):
        basis = None
    return Generator(torch.tensor(R, dtype=F64), torch.tensor(W, dtype=F64), s.sizes, nus=torch.tensor(V, dtype=F64),
                     complex=s.complex, basis=basis, allow_growth=allow_growth, axes=len(Xs))


def direct_sum(*generators: Generator) -> Generator:
    """Block-diagonal sum ``X = X_1 ⊕ X_2 ⊕ ...``; so ``exp(uX) = exp(uX_1) ⊕ exp(uX_2) ⊕ ...``.

    Generators with a heads axis must agree on it; a shared generator is broadcast to the heads.
    Generators with several position axes must have the same number of axes.

    >>> import torch
    >>> g1, g2 = Generator([0.0], [1.0], [1]), Generator([-0.5], [0.0], [1])
    >>> g = direct_sum(g1, g2)
    >>> bool(torch.allclose(g.exp(0.7), torch.block_diag(g1.exp(0.7), g2.exp(0.7))))
    True
    """
    if not generators:
        raise ValueError("direct_sum needs at least one generator")
    for i, g in enumerate(generators):
        if not isinstance(g, Generator):
            raise TypeError(f"direct_sum argument {i} must be a Generator, got {describe(g)}")
    heads = {g.num_heads for g in generators if g.num_heads is not None}
    if len(heads) > 1:
        raise ValueError(f"direct_sum of generators with different head counts {sorted(heads)}")
    axes = {g.num_axes for g in generators}
    if len(axes) > 1:
        raise ValueError(f"direct_sum of generators with different numbers of position axes {sorted(axes, key=str)}")
    A = axes.pop()
    H = heads.pop() if heads else None
    tail = 1 if A is None else 2

    def lift(t: torch.Tensor) -> torch.Tensor:
        t = t.to(F64)
        return t if H is None or t.dim() > tail else t.expand(H, *t.shape)  # (H, [axes,] blocks)

    rates = torch.cat([lift(g.rates) for g in generators], dim=-1)
    freqs = torch.cat([lift(g.freqs) for g in generators], dim=-1)
    # several axes (A): every generator has its nus
    nus = None if A is None else torch.cat([g.nus for g in generators if g.nus is not None], dim=-1)
    basis = None
    if any(g.basis is not None for g in generators):
        eye = lambda g: torch.eye(g.dim, dtype=F64) if g.basis is None else g.basis.to(F64)  # noqa: E731
        basis = torch.block_diag(*[eye(g) for g in generators])
    return Generator(
        rates, freqs, [n for g in generators for n in g.sizes], complex=[c for g in generators for c in g.complex],
        basis=basis, allow_growth=any(g.allow_growth for g in generators), axes=A, nus=nus,
    )
