"""The block structure of a generator, and the only writer of the dense matrices J and exp(uJ).

A generator in canonical real Jordan form is a direct sum of blocks, each a triple (rate λ,
frequency ω, size n). Its *structure* is the part that does not change when the parameters are
trained or rescaled: the sizes and which blocks are complex (2n×2n, a rotation plane per Jordan
step). With several position axes every axis has its own (λ_a, ω_a) and a coefficient ν_a of the
nilpotent part ``N``, on the same structure::

    J = λI + νN                                   (real block, n×n)
    J = I_n ⊗ [[λ, ω], [−ω, λ]] + ν N ⊗ I₂          (complex block, 2n×2n)
    exp(J) = e^{λ} Σ_{k<n} ν^k/k! N^k (⊗ R(−ω))     (λ, ω, ν the block's exponent, angle and
                                                     polynomial time; R rotates counter-clockwise)

Blocks of one structure commute whatever their parameters, so ``exp(Σ_a u_a J_a)`` is the last line
with ``λ = Σ_a λ_a u_a``, ``ω = Σ_a ω_a u_a``, ``ν = Σ_a ν_a u_a``: :func:`dense_exp` takes exactly
those three numbers per block.

>>> import torch
>>> s = Structure((2,), (False,))
>>> one = torch.ones(1, dtype=torch.float64)
>>> J = dense_generator(s, 0 * one, 0 * one, one)       # the 2×2 nilpotent block N
>>> bool(torch.equal(dense_exp(s, 0 * one, 0 * one, 3 * one), torch.eye(2, dtype=torch.float64) + 3 * J))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Structure", "conjugate", "dense_exp", "dense_generator", "fill_exp_block"]


@dataclass(frozen=True)
class Structure:
    """Sizes and kinds of the canonical blocks: ``sizes[i]`` Jordan steps, ``complex[i]`` 2 dims per step."""

    sizes: tuple[int, ...]
    complex: tuple[bool, ...]

    @property
    def widths(self) -> tuple[int, ...]:
        """Number of dimensions of each block (n, or 2n for a complex block)."""
        return tuple(n * (2 if c else 1) for n, c in zip(self.sizes, self.complex))

    @property
    def offsets(self) -> tuple[int, ...]:
        """Canonical index of the first dimension of each block."""
        w = self.widths
        return tuple(sum(w[:i]) for i in range(len(w)))

    @property
    def dim(self) -> int:
        return sum(self.widths)

    def __len__(self) -> int:
        return len(self.sizes)


def fill_exp_block(
    out: torch.Tensor, off: int, n: int, cplx: bool, scale: torch.Tensor, tau: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor,
) -> None:
    """Write one canonical block of ``exp(uJ) = e^{λu} Σ_k τ^k/k! N^k (⊗ R(−ωu))`` into ``out``.

    ``out``: (..., d, d); the block starts at ``off``; ``scale = e^{λu}``, ``tau`` the polynomial time
    (``νu``), ``cos``/``sin`` of ωu, each broadcastable to ``out[..., 0, 0]``.
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


def _empty(s: Structure, *params: torch.Tensor) -> torch.Tensor:
    lead = torch.broadcast_shapes(*(p.shape[:-1] for p in params))
    dtype = params[0].dtype
    for p in params[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    return torch.zeros(*lead, s.dim, s.dim, dtype=dtype, device=params[0].device)


def dense_generator(s: Structure, rates: torch.Tensor, freqs: torch.Tensor, nus: torch.Tensor) -> torch.Tensor:
    """The dense canonical J of ``s`` with per-block ``λ``, ``ω``, ``ν`` of shape ``(..., blocks)``: ``(..., d, d)``.

    >>> import torch
    >>> one = torch.ones(1, dtype=torch.float64)
    >>> dense_generator(Structure((1,), (True,)), -0.5 * one, 2 * one, one).tolist()
    [[-0.5, 2.0], [-2.0, -0.5]]
    """
    out = _empty(s, rates, freqs, nus)
    for i, (n, cplx, off) in enumerate(zip(s.sizes, s.complex, s.offsets)):
        lam, om, nu = rates[..., i], freqs[..., i], nus[..., i]
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
    return out


def dense_exp(s: Structure, exponent: torch.Tensor, angle: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``exp`` of the canonical J whose blocks have ``λ = exponent``, ``ω = angle``, ``ν = tau``, each ``(..., blocks)``.

    Closed form per block, ``e^{λ} Σ_{k<n} ν^k/k! N^k (⊗ R(−ω))``; differentiable in all three.

    >>> import torch
    >>> s, x = Structure((1,), (True,)), torch.tensor([0.7], dtype=torch.float64)
    >>> bool(torch.allclose(dense_exp(s, 0 * x, x, 0 * x), torch.linalg.matrix_exp(dense_generator(s, 0 * x, x, 0 * x))))
    True
    """
    out = _empty(s, exponent, angle, tau)
    for i, (n, cplx, off) in enumerate(zip(s.sizes, s.complex, s.offsets)):
        E, th, nu = exponent[..., i], angle[..., i], tau[..., i]
        fill_exp_block(out, off, n, cplx, torch.exp(E), nu, torch.cos(th), torch.sin(th))
    return out


def conjugate(P: torch.Tensor | None, m: torch.Tensor) -> torch.Tensor:
    """``P m P^{-1}`` (``m`` unchanged when ``P`` is ``None``, the canonical basis)."""
    if P is None:
        return m
    P = P.to(m.dtype)
    return P @ m @ torch.linalg.inv(P)
