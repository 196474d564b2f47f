"""Applying position tables to queries and keys: the readable path, the path in a basis, the dense reference.

Three ways to compute the same ``F(t) x`` (or ``G(s) x``), each the check of the next:

* :func:`apply_dense` multiplies by the dense matrix ``exp(tX)ᵀ`` (``exp(−sX)``) of every position,
  from :meth:`Generator.exp`: O(d²) per token and a d×d matrix per position; the reference;
* :func:`apply_tables` is ``couple(a ⊙ x + b ⊙ partner(x))`` from :func:`liepos.tables.build_tables`:
  O(d) per token, readable, differentiable in the tables (the fast kernels of :mod:`liepos._fast`
  compute the same in fewer passes);
* :func:`apply_in_basis` wraps :func:`apply_tables` in a fixed change of basis ``X = P J P⁻¹``.

>>> import torch, liepos as lp
>>> from liepos.tables import build_tables, make_plan
>>> g = lp.xpos(8).generator
>>> plan, t = make_plan(g, "half"), torch.tensor([0.0, 3.0, 7.5], dtype=torch.float64)
>>> x = torch.randn(1, 1, 3, 8, dtype=torch.float64)
>>> fast = apply_tables(x, build_tables(g, plan, t, "query"))
>>> bool(torch.allclose(fast, apply_dense(x, g, plan, t, "query")))
True
"""

from __future__ import annotations

import torch

from liepos.generator import Generator
from liepos.tables import Plan, Tables

__all__ = ["LOW_PRECISION", "apply_dense", "apply_in_basis", "apply_tables", "work_dtype"]

# the half-precision dtypes, computed in float32 (:func:`work_dtype`) and cast back once
LOW_PRECISION = (torch.float16, torch.bfloat16)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype tables are applied in: float32 for float16/bfloat16 inputs (8 or 11 bits of angle are too few), else ``dtype``."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _partner(x: torch.Tensor, t: Tables) -> torch.Tensor:
    if t.partner == "pairs":
        # (..., d) -> (..., d/2, 2) -> swap the two components of each plane -> (..., d)
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (..., d) -> (..., d/2, 2) -> (..., d)
    if t.partner == "halves":
        P = t.planes
        return torch.cat((x[..., P : 2 * P], x[..., :P], x[..., 2 * P :]), dim=-1)
    return x.index_select(-1, t.partner_index)


def apply_tables(x: torch.Tensor, t: Tables) -> torch.Tensor:
    """``y = couple(a ⊙ x + b ⊙ partner(x))``: the readable eager form of the fast path.

    ``x``: (batch, heads, seq, dim); tables broadcast against it. Half-precision inputs are
    computed in float32 and cast back once.
    """
    if t.a is None and t.b is None and t.coef is None:
        return x
    work = work_dtype(x.dtype)
    t = t.to(work, x.device)
    xw = x.to(work)
    z = xw if t.a is None else xw * t.a
    if t.b is not None:
        z = z + _partner(xw, t) * t.b
    if t.coef is not None:
        # y[dst] += c · z[src] (sparse lower/upper triangular part of the Jordan blocks)
        z = z.index_add(-1, t.dst, t.coef * z.index_select(-1, t.src))
    return z.to(x.dtype)


def apply_in_basis(x: torch.Tensor, basis: torch.Tensor, inv: torch.Tensor, t: Tables, side: str) -> torch.Tensor:
    """F or G of ``x`` for ``X = P J P^{-1}`` from the tables ``t`` of the canonical J, in O(d²) per token.

    In storage order (``Q = Π P Πᵀ``): ``F(t) = Q^{-T} F_J(t) Qᵀ`` and ``G(s) = Q G_J(s) Q^{-1}``;
    differentiable in P (the dense reference path builds a d×d matrix per position instead).
    """
    work = work_dtype(x.dtype)
    inv = inv.to(basis.device)
    Q = basis.index_select(0, inv).index_select(1, inv).to(device=x.device, dtype=work)
    Qi = torch.linalg.inv(Q)
    xw = x.to(work)
    if side == "query":
        return (apply_tables(xw @ Q, t) @ Qi).to(x.dtype)
    return (apply_tables(xw @ Qi.transpose(-1, -2), t) @ Q.transpose(-1, -2)).to(x.dtype)


def dense_transform(generator: Generator, plan: Plan, pos: torch.Tensor, side: str) -> torch.Tensor:
    """Dense F (``side="query"``) or G per position in storage order, ``(…, seq, d, d)`` broadcastable to x."""
    A = generator.exp(pos if side == "query" else -pos)  # (*pos[:seq], *heads, d, d)
    if side == "query":
        A = A.transpose(-1, -2)
    batched = pos.dim() == (2 if generator.num_axes is None else 3)
    if generator.num_heads is not None:
        A = A.movedim(-3, -4)  # (S, H, d, d) -> (H, S, d, d); (B, S, H, d, d) -> (B, H, S, d, d)
    elif batched:
        A = A.unsqueeze(1)  # (B, S, d, d) -> (B, 1, S, d, d)
    # storage[perm[c]] = canonical[c]: permute rows and columns
    inv = plan.inv.to(A.device)
    return A.index_select(-1, inv).index_select(-2, inv)


def apply_dense(x: torch.Tensor, generator: Generator, plan: Plan, pos: torch.Tensor, side: str) -> torch.Tensor:
    """The reference: ``M x`` with ``M`` the dense :func:`dense_transform` (float64 when it is)."""
    M = dense_transform(generator, plan, pos.to(x.device), side)
    work = torch.float64 if M.dtype == torch.float64 else M.dtype
    return (M.to(work) @ x.to(work).unsqueeze(-1)).squeeze(-1).to(x.dtype)  # (…, d, d) @ (…, d, 1) -> (…, d)
