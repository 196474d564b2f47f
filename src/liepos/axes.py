"""Several position axes: commuting generators ``X_1 … X_m``, one per axis, ``A(u) = exp(Σ_a u_a X_a)``.

A position is a vector ``t = (t_1, …, t_m)`` (time, row, column, …); positions have shape
``(seq, axes)`` or ``(batch, seq, axes)``. When the generators commute, ``u ↦ exp(Σ_a u_a X_a)`` is a
group homomorphism of ℝ^m, so every score is relative in *every* axis at once::

    (F(t) q)ᵀ (G(s) k) = qᵀ exp(Σ_a (t_a − s_a) X_a) k

Commuting generators that share one canonical block structure (an :class:`AxesGenerator`) are, on each
block, ``X_a = λ_a I + ν_a N`` with the rotation ``ω_a`` (``C_a = [[λ_a, ω_a], [−ω_a, λ_a]]``), so per
block ``exp(Σ u_a X_a) = e^{Σ λ_a u_a} R(−Σ ω_a u_a) P(Σ ν_a u_a)``: the one-axis tables apply with the
effective exponent ``Σ_a λ_a t_a``, angle ``Σ_a ω_a t_a`` (each axis term reduced exactly in float64)
and polynomial time ``Σ_a ν_a t_a``.

The catalogue here: :func:`axial_rope` (torchtune's vision RoPE, CogVideo, lucidrains' axial
frequencies), :func:`rope_mixed` (Heo et al., RoPE-Mixed), :func:`mrope` (Qwen2-VL's M-RoPE) and
:func:`decay_axial_rope` (decay along one axis, rotation along all).

>>> import torch
>>> enc = axial_rope(8, axes=2)
>>> q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
>>> s1 = (enc.query(q, [[5.0, 1.0]]) * enc.key(k, [[2.0, 3.0]])).sum()
>>> s2 = (enc.query(q, [[105.0, -7.0]]) * enc.key(k, [[102.0, -5.0]])).sum()
>>> bool(torch.allclose(s1, s2))
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from liepos.encoding import Encoding, apply_in_basis, apply_tables
from liepos.generator import Generator, _as_param, check_params, conjugate, fill_exp_block
from liepos.tables import Plan, Tables, assemble_tables, reduced_angle

__all__ = [
    "AxesGenerator",
    "AxesEncoding",
    "as_axes_positions",
    "axial_rope",
    "rope_mixed",
    "mrope",
    "decay_axial_rope",
    "AXES_CATALOGUE",
]

F64 = torch.float64


class AxesGenerator:
    """Commuting generators ``X_a = P J_a P^{-1}``, one per position axis, sharing one block structure.

    Args:
        rates: λ per axis and block, shape ``(axes, blocks)`` or ``(heads, axes, blocks)``; ``λ > 0``
            on any axis is refused unless ``allow_growth=True``.
        freqs: ω per axis and block, same shape (any sign: a plane's frequency *vector*
            ``(ω_1, …, ω_m)`` points in the direction along which it rotates).
        sizes: Jordan size of each block (shared by all axes).
        nus: ν per axis and block, the coefficient of ``N`` in ``X_a`` (Jordan blocks only), shape
            ``(axes, blocks)``, shared across heads; default 1 on every axis.
        complex: which blocks are rotation blocks; default: any non-zero frequency.
        basis: the shared invertible basis P (dim × dim), or ``None``.

    The defining identity (checked in the tests)::

        exp(Σ_a (u_a + v_a) X_a) = exp(Σ_a u_a X_a) exp(Σ_a v_a X_a),   X_a X_b = X_b X_a
    """

    def __init__(
        self,
        rates: Any,
        freqs: Any,
        sizes: Sequence[int],
        *,
        nus: Any = None,
        complex: Sequence[bool] | None = None,  # noqa: A002 - the mathematical word
        basis: Any = None,
        allow_growth: bool = False,
    ) -> None:
        rates = _as_param(rates, "rates")
        freqs = _as_param(freqs, "freqs")
        rates, freqs, sizes = check_params(
            rates, freqs, sizes, (2, 3), "(axes, blocks) or (heads, axes, blocks)", allow_growth
        )
        A, nb = int(rates.shape[-2]), int(rates.shape[-1])
        if A < 1:
            raise ValueError("an AxesGenerator needs at least one axis")
        if nus is None:
            nus = torch.ones(A, nb, dtype=F64)
        nus = _as_param(nus, "nus")
        if tuple(nus.shape) != (A, nb):
            raise ValueError(f"nus must have shape (axes, blocks) = {(A, nb)}, got {tuple(nus.shape)}")
        if complex is None:
            with torch.no_grad():
                complex = tuple(bool(c) for c in (freqs != 0).reshape(-1, nb).any(0).tolist())
        # the structure: offsets, widths, basis validation (rates and freqs of the first axis)
        self.structure = Generator(
            torch.zeros(nb, dtype=F64), torch.zeros(nb, dtype=F64), sizes, complex=complex, basis=basis,
        )
        self.rates, self.freqs, self.nus = rates, freqs, nus
        self.sizes = sizes
        self.complex = self.structure.complex
        self.basis = self.structure.basis
        self.allow_growth = bool(allow_growth)

    # ------------------------------------------------------------------ structure
    @property
    def num_axes(self) -> int:
        return int(self.rates.shape[-2])

    @property
    def num_heads(self) -> int | None:
        return int(self.rates.shape[0]) if self.rates.dim() == 3 else None

    @property
    def head_shape(self) -> tuple[int, ...]:
        return tuple(self.rates.shape[:-2])

    @property
    def dim(self) -> int:
        return self.structure.dim

    @property
    def num_blocks(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.structure.offsets

    @property
    def widths(self) -> tuple[int, ...]:
        return self.structure.widths

    @property
    def is_orthogonal(self) -> bool:
        """Every ``exp(Σ u_a X_a)`` is orthogonal in the canonical basis: rates 0 and sizes 1."""
        with torch.no_grad():
            return all(n == 1 for n in self.sizes) and bool((self.rates == 0).all())

    def key(self) -> tuple:
        """A hashable identity of the structure and parameter values."""
        with torch.no_grad():
            flat = lambda t: tuple(t.detach().to(F64).reshape(-1).tolist())  # noqa: E731
            return (
                "axes", self.sizes, self.complex, tuple(self.rates.shape), flat(self.rates),
                flat(self.freqs), flat(self.nus),
                None if self.basis is None else hash(self.basis.detach().cpu().numpy().tobytes()),
            )

    def __repr__(self) -> str:
        heads = "" if self.num_heads is None else f", heads={self.num_heads}"
        basis = "" if self.basis is None else ", basis=P"
        kinds = ",".join(f"{'C' if c else 'R'}{n}" for n, c in zip(self.sizes, self.complex))
        return f"AxesGenerator(dim={self.dim}, axes={self.num_axes}{heads}, blocks=[{kinds}]{basis})"

    # ------------------------------------------------------------------ one-axis views
    def along(self, direction: Sequence[float] | torch.Tensor) -> Generator:
        """The one-axis generator ``Σ_a c_a X_a`` met by positions moving along ``c``: ``t = τ·c``.

        ``along(e_a)`` is the generator of axis ``a``; ``along(ones)`` the one of tokens whose axes
        advance together (M-RoPE's text tokens). A Jordan block whose N-coefficient ``Σ c_a ν_a`` is
        0 along ``c`` splits into size-1 blocks; one with a coefficient ``τ ≠ 1`` is expressed in
        the rescaled basis ``diag(τ^{-j})``.
        """
        c = torch.as_tensor(direction, dtype=F64)
        if c.shape != (self.num_axes,):
            raise ValueError(f"direction must have shape ({self.num_axes},), got {tuple(c.shape)}")
        rates = (self.rates * c.to(self.rates.dtype).unsqueeze(-1)).sum(-2)  # (*heads, blocks)
        freqs = (self.freqs * c.to(self.freqs.dtype).unsqueeze(-1)).sum(-2)
        tau = (self.nus.detach().to(F64) * c.unsqueeze(-1)).sum(-2).tolist()  # (blocks,)
        sizes, cplx, keep, scale = [], [], [], []
        for i, (n, cx) in enumerate(zip(self.sizes, self.complex)):
            w = 2 if cx else 1
            if n > 1 and tau[i] == 0.0:
                sizes += [1] * n
                cplx += [cx] * n
                keep += [i] * n
                scale += [1.0] * (n * w)
            else:
                sizes.append(n)
                cplx.append(cx)
                keep.append(i)
                t = tau[i] if n > 1 else 1.0
                scale += [t ** (-j) for j in range(n) for _ in range(w)]
        idx = torch.tensor(keep, dtype=torch.long)
        rates, freqs = rates.index_select(-1, idx), freqs.index_select(-1, idx)
        basis = self.basis
        if any(s != 1.0 for s in scale):
            D = torch.diag(torch.tensor(scale, dtype=F64))
            basis = D if basis is None else basis.to(F64) @ D
        growth = self.allow_growth or bool((c < 0).any())
        return Generator(rates, freqs, sizes, complex=cplx, basis=basis, allow_growth=growth)

    def axis(self, a: int) -> Generator:
        """The one-axis generator ``X_a``."""
        e = torch.zeros(self.num_axes, dtype=F64)
        e[a] = 1.0
        return self.along(e)

    # ------------------------------------------------------------------ dense views
    def _canonical(self, u: torch.Tensor | None) -> torch.Tensor:
        """``J_a`` for every axis (u None: shape (axes, *heads, d, d)) or ``exp(Σ u_a J_a)`` (*u[:-1], *heads, d, d)."""
        dtype = torch.promote_types(self.rates.dtype, F64 if u is None else u.dtype)
        hs = self.head_shape
        if u is None:
            # one "position" per axis: the unit vectors, read as generators below
            lead: tuple[int, ...] = (self.num_axes,)
        else:
            lead = tuple(u.shape[:-1])
        out = torch.zeros(*lead, *hs, self.dim, self.dim, dtype=dtype, device=self.rates.device)
        rates = self.rates.to(dtype).movedim(-2, 0)  # (A, *heads, blocks)
        freqs = self.freqs.to(dtype).movedim(-2, 0)
        nus = self.nus.to(dtype)  # (A, blocks)
        if u is not None:
            # (*lead, A) -> (A, *lead, 1...) so that it broadcasts against (*heads,)
            uu = u.to(dtype).movedim(-1, 0).reshape(self.num_axes, *lead, *(1,) * len(hs))
        for i, (n, cplx, off) in enumerate(zip(self.sizes, self.complex, self.offsets)):
            if u is None:
                lam = rates[..., i]  # (A, *heads) = (*lead, *heads)
                om = freqs[..., i]
                nu = nus[:, i].reshape(self.num_axes, *(1,) * len(hs)).expand(self.num_axes, *hs)
                for j in range(n):
                    if cplx:
                        a = off + 2 * j
                        out[..., a, a] = lam
                        out[..., a + 1, a + 1] = lam
                        out[..., a, a + 1] = om
                        out[..., a + 1, a] = -om
                        if j + 1 < n:
                            out[..., a, a + 2] = nu
                            out[..., a + 1, a + 3] = nu
                    else:
                        out[..., off + j, off + j] = lam
                        if j + 1 < n:
                            out[..., off + j, off + j + 1] = nu
                continue
            lam = rates[..., i].reshape(self.num_axes, *(1,) * len(lead), *hs)
            om = freqs[..., i].reshape(self.num_axes, *(1,) * len(lead), *hs)
            nu = nus[:, i].reshape(self.num_axes, *(1,) * (len(lead) + len(hs)))
            E, th, tau = (lam * uu).sum(0), (om * uu).sum(0), (nu * uu).sum(0)  # (*lead, *heads)
            fill_exp_block(out, off, n, cplx, torch.exp(E), tau, torch.cos(th), torch.sin(th))
        return out

    def _conjugate(self, m: torch.Tensor) -> torch.Tensor:
        return conjugate(self.basis, m)

    def matrices(self) -> torch.Tensor:
        """The dense generators ``X_a = P J_a P^{-1}``, shape ``(axes, *heads, d, d)``."""
        return self._conjugate(self._canonical(None))

    def exp(self, u: Any) -> torch.Tensor:
        """Dense ``exp(Σ_a u_a X_a)`` for offsets ``u`` of shape ``(..., axes)``: ``(..., *heads, d, d)``."""
        if not isinstance(u, torch.Tensor):
            u = torch.as_tensor(u, dtype=F64)
        if not u.is_floating_point():
            u = u.to(F64)
        if u.dim() == 0 or u.shape[-1] != self.num_axes:
            raise ValueError(f"u must have shape (..., {self.num_axes}), got {tuple(u.shape)}")
        return self._conjugate(self._canonical(u))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_matrices(
        cls, matrices: Any, *, tol: float = 1e-9, allow_growth: bool = True
    ) -> AxesGenerator:
        """Simultaneous real Jordan decomposition of commuting matrices ``X_1 … X_m``.

        Refuses non-commuting matrices: ``‖[X_a, X_b]‖_F > tol·‖X_a‖_F‖X_b‖_F`` is a ``ValueError``
        that reports the commutator norm. A generic combination ``Σ c_a X_a`` is decomposed with
        :func:`liepos._jordan.real_jordan`; each ``P^{-1} X_a P`` must then be block-canonical
        (``λ_a I + ν_a N`` with rotation ``ω_a`` on every block of the combination), else a
        ``ValueError`` says which axis and block is not.

        >>> import torch
        >>> from liepos.catalogue import rope
        >>> X = rope(4).generator.matrix()
        >>> g = AxesGenerator.from_matrices([X, 2 * X])
        >>> bool(torch.allclose(g.exp([1.0, 0.5]), rope(4).generator.exp(2.0)))
        True
        """
        from liepos._jordan import real_jordan

        if isinstance(matrices, torch.Tensor) and matrices.dim() == 3:
            mats = list(matrices)
        else:
            mats = list(matrices)
        if not mats:
            raise ValueError("from_matrices needs at least one matrix")
        Xs = []
        for a, X in enumerate(mats):
            try:
                X = torch.as_tensor(np.asarray(X.detach() if isinstance(X, torch.Tensor) else X, dtype=np.float64))
            except (TypeError, ValueError) as err:
                raise TypeError(f"matrix {a} must be a real square matrix, got {type(X).__name__}") from err
            if X.dim() != 2 or X.shape[0] != X.shape[1]:
                raise ValueError(f"matrix {a} must be square, got shape {tuple(X.shape)}")
            if not bool(torch.isfinite(X).all()):
                raise ValueError(f"matrix {a} must be finite")
            Xs.append(X)
        d = Xs[0].shape[0]
        if any(X.shape != (d, d) for X in Xs):
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
        rng = np.random.default_rng(12345)
        last_err: Exception | None = None
        for _ in range(4):
            coef = rng.uniform(0.5, 1.5, size=len(Xs))
            G = sum(float(ca) * X for ca, X in zip(coef, Xs))
            blocks, P = real_jordan(G.numpy(), exact=False)
            try:
                return cls._read_blocks(Xs, blocks, np.asarray(P, dtype=np.float64), tol, allow_growth)
            except ValueError as err:
                last_err = err
        assert last_err is not None
        raise last_err

    @classmethod
    def _read_blocks(cls, Xs, blocks, P, tol, allow_growth) -> AxesGenerator:
        sizes = [int(b[2]) for b in blocks]
        cplx = [float(b[1]) != 0.0 for b in blocks]
        widths = [n * (2 if c else 1) for n, c in zip(sizes, cplx)]
        offsets = [int(sum(widths[:i])) for i in range(len(widths))]
        Pinv = np.linalg.inv(P)
        rtol = max(tol, 1e-9) * 1e3 * max(1.0, float(np.linalg.cond(P)))
        R, W, V = [], [], []
        for a, X in enumerate(Xs):
            M = Pinv @ X.numpy() @ P
            scale = max(float(np.linalg.norm(M)), 1e-300)
            rebuilt = np.zeros_like(M)
            rr, ww, vv = [], [], []
            for i, (n, cx, off, w) in enumerate(zip(sizes, cplx, offsets, widths)):
                S = M[off : off + w, off : off + w]
                if cx:
                    lam = float(np.mean(np.diag(S)))
                    om = float(np.mean([(S[2 * j, 2 * j + 1] - S[2 * j + 1, 2 * j]) / 2 for j in range(n)]))
                    nu = float(np.mean([(S[2 * j, 2 * j + 2] + S[2 * j + 1, 2 * j + 3]) / 2
                                        for j in range(n - 1)])) if n > 1 else 0.0
                else:
                    lam = float(np.mean(np.diag(S)))
                    om = 0.0
                    nu = float(np.mean([S[j, j + 1] for j in range(n - 1)])) if n > 1 else 0.0
                snap = lambda x: 0.0 if abs(x) <= 1e-12 * scale else x  # noqa: E731
                lam, om, nu = snap(lam), snap(om), snap(nu)
                B = rebuilt[off : off + w, off : off + w]
                for j in range(n):
                    if cx:
                        p = off + 2 * j
                        rebuilt[p, p] = rebuilt[p + 1, p + 1] = lam
                        rebuilt[p, p + 1], rebuilt[p + 1, p] = om, -om
                        if j + 1 < n:
                            rebuilt[p, p + 2] = rebuilt[p + 1, p + 3] = nu
                    else:
                        rebuilt[off + j, off + j] = lam
                        if j + 1 < n:
                            rebuilt[off + j, off + j + 1] = nu
                del B
                rr.append(lam)
                ww.append(om)
                vv.append(nu if n > 1 else 1.0)
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
        basis = torch.as_tensor(P, dtype=F64)
        if torch.equal(basis, torch.eye(basis.shape[0], dtype=F64)):
            basis = None
        return cls(
            torch.tensor(R, dtype=F64), torch.tensor(W, dtype=F64), sizes,
            nus=torch.tensor(V, dtype=F64), complex=cplx, basis=basis, allow_growth=allow_growth,
        )


# ---------------------------------------------------------------------- positions and tables
def as_axes_positions(
    positions: Any, seq: int, batch: int | None, axes: int, name: str = "positions"
) -> torch.Tensor:
    """Validate positions ``(seq, axes)`` or ``(batch, seq, axes)``; float64. ``None``: ``t_a = 0 … seq−1`` on every axis."""
    if positions is None:
        return torch.arange(seq, dtype=F64).unsqueeze(-1).expand(seq, axes)
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions, dtype=F64)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor of positions, got {type(positions).__name__}") from err
    if positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be real (integer or floating), got dtype {positions.dtype}")
    if positions.dim() not in (2, 3) or positions.shape[-1] != axes:
        raise ValueError(
            f"{name} must have shape (seq, {axes}) or (batch, seq, {axes}) for an encoding with {axes} "
            f"position axes, got shape {tuple(positions.shape)}"
        )
    if positions.shape[-2] != seq:
        raise ValueError(
            f"{name} has {positions.shape[-2]} positions but the sequence has {seq} tokens "
            f"(shape {tuple(positions.shape)})"
        )
    if positions.dim() == 3 and batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(f"{name} has batch size {positions.shape[0]} but the tensor has batch size {batch}")
    out = positions.to(F64) if not positions.requires_grad else positions.double()
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(out.detach()).all()):
        raise ValueError(f"{name} must be finite")
    return out


def build_axes_tables(g: AxesGenerator, plan: Plan, pos: torch.Tensor, side: str) -> Tables:
    """Float64 tables of F (``side="query"``) or G (``side="key"``) at positions ``(…, seq, axes)``.

    Per dimension: scale ``e^{±Σ_a λ_a t_a}``, angle ``Σ_a reduced_angle(ω_a, t_a)`` and, for Jordan
    blocks, coupling coefficients ``(±Σ_a ν_a t_a)^k / k!``: the one-axis tables of
    :func:`liepos.tables.build_tables` with effective parameters. Shapes as there.
    """
    if side not in ("query", "key"):
        raise ValueError(f"side must be 'query' or 'key', got {side!r}")
    pos = pos.to(F64)
    dev = pos.device
    pp = pos.unsqueeze(-1)  # (…, seq, axes, 1)
    if pos.dim() == 3:
        pp = pp.unsqueeze(1)  # (batch, 1, seq, axes, 1)
    block_of, inv = plan.block_of.to(dev), plan.inv.to(dev)
    rates, freqs = g.rates.to(F64), g.freqs.to(F64)
    # per storage dim: (*heads, axes, d), then (*heads, 1, axes, d) to meet (…, seq, axes, 1)
    rate_d = rates.index_select(-1, block_of).index_select(-1, inv)
    freq_d = freqs.index_select(-1, block_of).index_select(-1, inv)
    if g.num_heads is not None:
        rate_d, freq_d = rate_d.unsqueeze(-3), freq_d.unsqueeze(-3)
    with torch.no_grad():
        any_rate = True if torch.compiler.is_compiling() else bool((rates != 0).any())
    tau = None
    if plan.has_coupling:
        dst = plan.dst.to(dev)
        blk = block_of.index_select(0, inv.index_select(0, dst))  # block of every coupling pair
        nu_p = g.nus.to(F64).to(dev).index_select(-1, blk)  # (axes, pairs)
        tau = (nu_p * pp).sum(-2)  # (…, seq, pairs)
    return assemble_tables(
        plan, side, dev,
        exponent=(rate_d * pp).sum(-2) if any_rate else None,  # (…, seq, d)
        angle=reduced_angle(freq_d, pp).sum(-2) if plan.planes > 0 else None,  # each axis reduced exactly
        tau=tau,
    )


# ---------------------------------------------------------------------- the encoding
class AxesEncoding(Encoding):
    """An :class:`~liepos.Encoding` over several position axes: positions ``(…, seq, axes)``.

    ``enc.query(q, t)ᵀ enc.key(k, s) = [q; slots]ᵀ exp(Σ_a (t_a − s_a) X_a) [k; slots]``, so shifting
    every position by the same vector along any axis leaves every score unchanged.
    ``enc.generator`` is the one-axis generator along the diagonal ``Σ_a X_a`` (tokens whose axes
    advance together, e.g. M-RoPE's text); ``enc.axes_generator`` holds the axes.
    """

    def __init__(
        self,
        generator: AxesGenerator,
        layout: str = "interleaved",
        *,
        query_slots: Any = None,
        key_slots: Any = None,
        logit_scale: float = 1.0,
        name: str | None = None,
        length_rule: Any = None,
    ) -> None:
        if not isinstance(generator, AxesGenerator):
            raise TypeError(f"generator must be a liepos.AxesGenerator, got {type(generator).__name__}")
        self.axes_generator = generator
        super().__init__(
            generator.along(torch.ones(generator.num_axes, dtype=F64)), layout,
            query_slots=query_slots, key_slots=key_slots, logit_scale=logit_scale, name=name,
            length_rule=length_rule,
        )

    @property
    def num_axes(self) -> int:
        return self.axes_generator.num_axes

    @property
    def is_relative_everywhere(self) -> bool:
        return self.axes_generator.is_orthogonal and self.num_slots == 0

    @property
    def _source(self) -> AxesGenerator:
        return self.axes_generator

    def __repr__(self) -> str:
        name = f"{self.name!r}, " if self.name else ""
        slots = f", slots={self.num_slots}" if self.num_slots else ""
        return f"AxesEncoding({name}{self.axes_generator!r}, layout={self.layout!r}{slots})"

    # ------------------------------------------------------------------ application
    def _relative(self, positions: Any, x: torch.Tensor, origin: Any, name: str) -> torch.Tensor:
        pos = as_axes_positions(positions, x.shape[-2], x.shape[0], self.num_axes, name)
        if origin is not None:
            o = torch.as_tensor(origin, dtype=F64, device=pos.device)
            if not bool(torch.isfinite(o).all()):
                raise ValueError(f"origin must be finite, got {o.tolist()}")
            if o.dim() == 2 and pos.dim() == 3:
                o = o.unsqueeze(-2)  # a per-batch origin (batch, axes)
            pos = pos - o
        return pos.to(x.device)

    def tables(self, positions: torch.Tensor, side: str) -> Tables:
        return build_axes_tables(self.axes_generator, self.plan, positions, side)

    def _apply(
        self, x: torch.Tensor, pos: torch.Tensor, side: str, slots: bool = False, inplace: bool = False
    ) -> torch.Tensor:
        if inplace:
            raise ValueError("inplace=True is not available for several position axes")
        if slots:
            x = self._with_slots(x, self.query_slots if side == "query" else self.key_slots)
        t = self.tables(pos, side)  # of the canonical blocks (the basis is applied around them)
        if not torch.compiler.is_compiling():
            self._check_finite(t, x.dtype, pos, side)
        if self.axes_generator.basis is not None:
            return apply_in_basis(x, self.axes_generator.basis, self.plan.inv, t, side)
        return apply_tables(x, t)

    def transport(self, x: torch.Tensor, delta: Any) -> torch.Tensor:
        """``exp(Σ_a Δ_a X_a) x`` on encoded keys; ``delta`` of shape ``(axes,)`` or ``(seq, axes)``."""
        self._check(x, "x", full=True)
        d = torch.as_tensor(delta, dtype=F64, device=x.device)
        if d.dim() == 1:
            d = d.expand(x.shape[-2], self.num_axes)
        return self._apply(x, as_axes_positions(-d, x.shape[-2], x.shape[0], self.num_axes, "delta"), "key")

    def _dense(self, pos: torch.Tensor, side: str) -> torch.Tensor:
        g = self.axes_generator
        A = g.exp(pos if side == "query" else -pos)  # (*pos[:-1], *heads, d, d)
        if side == "query":
            A = A.transpose(-1, -2)
        if g.num_heads is not None:
            A = A.movedim(-3, -4)  # (S, H, d, d) -> (H, S, d, d); (B, S, H, …) -> (B, H, S, …)
        elif pos.dim() == 3:
            A = A.unsqueeze(1)  # (B, 1, S, d, d)
        inv = self.plan.inv.to(A.device)
        return A.index_select(-1, inv).index_select(-2, inv)


# ---------------------------------------------------------------------- the catalogue
def _check_even(dim: int, multiple: int, name: str = "dim") -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"{name} must be a positive int, got {dim!r}")
    if dim % multiple:
        raise ValueError(f"{name} must be a multiple of {multiple}, got {dim}")


def _freqs(dim: int, base: float) -> torch.Tensor:
    from liepos.catalogue import rope_freqs

    return rope_freqs(dim, base)


def axial_rope(dim: int, axes: int = 2, base: float = 10000.0, layout: str = "interleaved") -> AxesEncoding:
    """Axial RoPE: axis ``a`` owns the planes ``[a·P, (a+1)·P)``, ``P = dim/(2·axes)``, with
    ``ω_k = base^(−2k/(dim/axes))``. torchtune's ``VisionRotaryPositionalEmbeddings(dim=head_dim/2)``
    with (x + 1, y + 1) patch positions for ``axes=2`` (its CLS token sits at (0, 0)); CogVideo-style 3D
    with ``axes=3`` (equal thirds).

    >>> enc = axial_rope(8, axes=2)
    >>> enc.axes_generator.freqs.tolist()
    [[1.0, 0.01, 0.0, 0.0], [0.0, 0.0, 1.0, 0.01]]
    """
    _check_even(dim, 2 * axes)
    P = dim // (2 * axes)
    w = _freqs(dim // axes, base)  # (P,)
    freqs = torch.zeros(axes, axes * P, dtype=F64)
    for a in range(axes):
        freqs[a, a * P : (a + 1) * P] = w
    g = AxesGenerator(torch.zeros_like(freqs), freqs, [1] * (axes * P), complex=[True] * (axes * P))
    return AxesEncoding(g, layout=layout, name=f"axial_rope{axes}d")


def rope_mixed(
    dim: int, num_heads: int, base: float = 10.0, *, angles: Any = None, seed: int = 0,
    layout: str = "interleaved",
) -> AxesEncoding:
    """RoPE-Mixed (Heo et al., 2024, naver-ai/rope-vit ``init_2d_freqs``): 2D frequency vectors.

    Head h has a direction angle φ_h; plane k < dim/4 rotates along ``(cos φ_h, sin φ_h)`` and plane
    ``k + dim/4`` along ``(cos(φ_h + π/2), sin(φ_h + π/2))``, both with magnitude ``base^(−4k/dim)``.
    ``angles``: the φ_h ``(num_heads,)``; default uniform on [0, 2π) from ``seed``. The generators of x
    and y are diagonal in the same planes, so they commute: exactly relative in 2D. Learned in
    :class:`liepos.learnable.LearnableEncoding` (``init="mixed"``).
    """
    _check_even(dim, 4)
    if angles is None:
        angles = torch.rand(num_heads, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 * math.pi
    phi = torch.as_tensor(angles, dtype=F64).reshape(num_heads, 1)  # (H, 1)
    mag = base ** (-torch.arange(0, dim, 4, dtype=F64)[: dim // 4] / dim)  # (dim/4,)
    fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(math.pi / 2 + phi)], dim=-1)  # (H, dim/2)
    fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(math.pi / 2 + phi)], dim=-1)
    freqs = torch.stack([fx, fy], dim=1)  # (H, 2, dim/2)
    g = AxesGenerator(torch.zeros_like(freqs), freqs, [1] * (dim // 2), complex=[True] * (dim // 2))
    return AxesEncoding(g, layout=layout, name="rope_mixed")


def mrope(
    dim: int, sections: Sequence[int] = (16, 24, 24), base: float = 10000.0, layout: str = "half"
) -> AxesEncoding:
    """M-RoPE (Qwen2-VL): RoPE's planes split into sections; section i follows axis ``i % 3`` (t, h, w).

    Plane k keeps RoPE's ``ω_k = base^(−2k/dim)`` and rotates with the axis of the section holding
    it, as in transformers' ``Qwen2VLRotaryEmbedding`` (``sum(sections) == dim/2``; Hugging Face's
    half layout by default). Positions ``(…, seq, 3)``; a text token has equal axes, so text-only input
    is exactly ``rope(dim, base, layout)``.
    """
    _check_even(dim, 2)
    sections = [int(s) for s in sections]
    if sum(sections) != dim // 2 or any(s < 0 for s in sections):
        raise ValueError(f"sections must be non-negative and sum to dim/2 = {dim // 2}, got {sections}")
    w = _freqs(dim, base)
    freqs = torch.zeros(3, dim // 2, dtype=F64)
    start = 0
    for i, s in enumerate(sections):
        freqs[i % 3, start : start + s] = w[start : start + s]
        start += s
    g = AxesGenerator(torch.zeros_like(freqs), freqs, [1] * (dim // 2), complex=[True] * (dim // 2))
    return AxesEncoding(g, layout=layout, name="mrope")


def decay_axial_rope(
    dim: int, axes: int = 3, base: float = 10000.0, rates: Any = None, decay_axis: int = 0,
    layout: str = "interleaved",
) -> AxesEncoding:
    """Decay along one axis, rotation along all: axial RoPE whose every plane also fades along
    ``decay_axis`` (e.g. time in a video) at rate ``rates[k] ≥ 0`` (default: from 1/2 to 1/2048).

    The generators commute (each is diagonal in the same planes), so scores are relative in every
    axis; along ``decay_axis`` plane k weighs a lag u by ``e^{−rate_k u}``. Causal along that axis
    keeps it in the family (a key later on the decay axis grows instead of fading).
    """
    enc = axial_rope(dim, axes, base, layout)
    P = dim // 2
    if rates is None:
        from liepos.catalogue import default_decay_rates

        rates = default_decay_rates(P)
    r = torch.as_tensor(rates, dtype=F64)
    if r.shape != (P,) or bool((r < 0).any()) or not bool(torch.isfinite(r).all()):
        raise ValueError(f"rates must be {P} finite non-negative numbers, got {r.tolist()}")
    R = torch.zeros(axes, P, dtype=F64)
    R[decay_axis] = -r
    g = AxesGenerator(R, enc.axes_generator.freqs, [1] * P, complex=[True] * P)
    return AxesEncoding(g, layout=layout, name="decay_axial_rope")


AXES_CATALOGUE = {
    "axial_rope": axial_rope,
    "rope_mixed": rope_mixed,
    "mrope": mrope,
    "decay_axial_rope": decay_axial_rope,
}
