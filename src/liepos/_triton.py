"""Triton kernels for the fused apply: ``y = M x`` from the same :class:`liepos._fast.FastTables` the torch path reads.

Every canonical block maps a row ``x`` of q or k to ``y = M x`` with, per storage column ``d``,

* a plane (rotation, damped rotation: ``c = e^{λt} cos ωt``, ``s = e^{λt} sin ωt``):
  ``y₀ = c x₀ − s x₁``, ``y₁ = s x₀ + c x₁`` with ``(x₀, x₁)`` the columns ``(2k, 2k + 1)`` of a
  ``complex`` run (interleaved layout; the table is complex, ``c + i s``) or ``(k, k + P)`` of a
  ``halves`` run (half layout; the tables are ``(cos, sin)``);
* a real run (decay, the diagonal of a Jordan block): ``y = a ⊙ x``; a ``copy`` run: ``y = x``;
* a coupled encoding (Jordan blocks of size ≥ 2) as its shifted terms ``y[d] = Σ_j T_j[d] x[d + o_j]``
  (structural zeros masked);

and slots, whose values depend on the position alone, written into the last columns. The transpose
``Mᵀ`` (the backward) is the same kernel with ``s → −s`` and the transposed terms. Each run is one
launch over all rows ``(B·H·S)``; x, the output and every table are read through their own strides
(a broadcast table has stride 0), half precision is upcast in registers to the tables' dtype and
rounded once on the store.

:func:`apply` returns ``None`` where these kernels do not apply (in place, a dtype or device they do
not take, a structure they do not cover, triton missing): the caller then takes the torch path.
Triton is imported lazily, so ``import liepos`` never needs it; ``LIEPOS_TRITON=0`` turns these kernels
off; under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (how the suite tests them without a GPU).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

__all__ = ["available", "apply"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BLOCK_R = 16
# the triton modules, bound as globals on first use: the jitted functions resolve ``tl`` from this
# module's globals (which the interpreter patches), never from a closure
triton: Any = None
tl: Any = None


def available() -> bool:
    """Whether these kernels may run: triton importable (checked without importing it) and not turned off
    by ``LIEPOS_TRITON=0`` (read per call, so a benchmark can time the torch path beside them)."""
    return os.environ.get("LIEPOS_TRITON", "1") != "0" and _importable()


@functools.lru_cache(maxsize=1)
def _importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether triton kernels run under its interpreter (``TRITON_INTERPRET=1``: CPU tensors allowed)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.lru_cache(maxsize=2)
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The two jitted kernels, built on first use (the interpreter flag is read when they are decorated)."""
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def plane_kernel(x_ptr, o_ptr, c_ptr, s_ptr, R, H, S, n,
                     xb, xh, xs, xd, ob, oh, os_, od, cb, ch, cs, cj, sb, sh, ss, sj,
                     lo, step, shift, sign, REAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
        # rows r = (b, h, s) of x; planes j < n of one run starting at column lo
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        j = tl.arange(0, BLOCK_N)
        b, h, t = r // (H * S), (r // S) % H, r % S
        m = (r < R)[:, None] & (j < n)[None, :]
        c = tl.load(c_ptr + (b * cb + h * ch + t * cs)[:, None] + (j * cj)[None, :], mask=m, other=0.0)
        col0 = lo + j * step
        xrow, orow = (b * xb + h * xh + t * xs)[:, None], (b * ob + h * oh + t * os_)[:, None]
        x0 = tl.load(x_ptr + xrow + (col0 * xd)[None, :], mask=m, other=0.0).to(c.dtype)
        if REAL:
            tl.store(o_ptr + orow + (col0 * od)[None, :], (c * x0).to(o_ptr.dtype.element_ty), mask=m)
        else:
            s = tl.load(s_ptr + (b * sb + h * sh + t * ss)[:, None] + (j * sj)[None, :], mask=m, other=0.0) * sign
            col1 = col0 + shift
            x1 = tl.load(x_ptr + xrow + (col1 * xd)[None, :], mask=m, other=0.0).to(c.dtype)
            tl.store(o_ptr + orow + (col0 * od)[None, :], (c * x0 - s * x1).to(o_ptr.dtype.element_ty), mask=m)
            tl.store(o_ptr + orow + (col1 * od)[None, :], (s * x0 + c * x1).to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def terms_kernel(x_ptr, o_ptr, t_ptr, off_ptr, mask_ptr, R, H, S, D, J,
                     xb, xh, xs, xd, ob, oh, os_, od, tb, th, ts, tj, td,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        # y[d] = Σ_j T_j[d] x[d + o_j], masks[j][d] marking the terms that exist
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        d = tl.arange(0, BLOCK_D)
        b, h, t = r // (H * S), (r // S) % H, r % S
        rows = (r < R)[:, None]
        xrow, trow = (b * xb + h * xh + t * xs)[:, None], (b * tb + h * th + t * ts)[:, None]
        # term 0 is offset 0, the diagonal every column has (no tl.zeros: it is a jitted library function,
        # which the interpreter runs only when triton itself was imported under it)
        m0 = rows & (d < D)[None, :]
        acc = tl.load(t_ptr + trow + (d * td)[None, :], mask=m0, other=0.0)
        acc = acc * tl.load(x_ptr + xrow + (d * xd)[None, :], mask=m0, other=0.0).to(acc.dtype)
        for k in range(1, J):
            o = tl.load(off_ptr + k)
            live = tl.load(mask_ptr + k * D + d, mask=d < D, other=0) != 0
            m = rows & live[None, :]
            tk = tl.load(t_ptr + trow + k * tj + (d * td)[None, :], mask=m, other=0.0)
            xv = tl.load(x_ptr + xrow + ((d + o) * xd)[None, :], mask=m, other=0.0).to(tk.dtype)
            acc += tk * xv
        orow = (b * ob + h * oh + t * os_)[:, None]
        tl.store(o_ptr + orow + (d * od)[None, :], acc.to(o_ptr.dtype.element_ty), mask=rows & (d < D)[None, :])

    return plane_kernel, terms_kernel


def _as4(t: torch.Tensor) -> torch.Tensor:
    """A table (S, n), (H, S, n), (B, 1, S, n) or (B, H, S, n) as a 4-D view (no copy)."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _strides4(t: torch.Tensor, B: int, H: int, S: int) -> tuple[int, int, int, int]:
    """Strides (b, h, s, last) of a 4-D table expanded to (B, H, S, n): 0 on a broadcast axis."""
    t = t.expand(B, H, S, t.shape[-1])
    return tuple(t.stride())  # type: ignore[return-value]


def _usable(x: torch.Tensor, ft: Any, inplace: bool, out_dtype: torch.dtype) -> bool:
    """The preconditions of these kernels: 4-D float x on CUDA (or any device under the interpreter),
    a fresh output in x's dtype or the tables' one, tables in x's device, float32/float64 tables."""
    if inplace or x.dim() != 4 or x.dtype not in _FLOATS or out_dtype not in _FLOATS or not available():
        return False
    if not (x.is_cuda or interpreting()) or ft.dtype not in (torch.float32, torch.float64):
        return False
    if x.numel() == 0 or x.shape[-1] < ft.content or x.numel() >= 2**31:
        return False
    return all(r.kind in ("copy", "real", "complex", "halves") for r in ft.runs)


def apply(x: torch.Tensor, ft: Any, conj: bool = False, out_dtype: torch.dtype | None = None,
          terms: tuple | None = None, inplace: bool = False) -> torch.Tensor | None:
    """``M x`` (``Mᵀ x`` when ``conj``) with slots appended (not when ``conj``), as the torch path of
    :mod:`liepos._fast` gives it, or ``None`` where these kernels do not run.

    ``ft`` is the :class:`~liepos._fast.FastTables` of one side; ``terms`` the shifted terms to use for a
    coupled encoding (``ft.terms``, or their transpose when ``conj``: the caller supplies them).
    """
    out_dtype = out_dtype or x.dtype
    if not _usable(x, ft, inplace, out_dtype):
        return None
    if ft.coupling is not None and terms is None:
        return None
    B, H, S, _ = x.shape
    width = ft.content if conj else ft.width
    strides: list[int] = [x.stride(i) for i in range(3)]
    order = sorted(range(3), key=lambda i: -strides[i])  # outer -> inner: the output in x's memory order
    y = torch.empty([x.shape[i] for i in order] + [width], dtype=out_dtype, device=x.device)
    y = y.permute(*[order.index(i) for i in range(3)], 3)  # (B, H, S, width) in x's order
    plane, term = _kernels(interpreting())
    R = B * H * S
    grid = (-(-R // _BLOCK_R),)
    xs, ys = tuple(x.stride()), tuple(y.stride())
    if ft.coupling is not None and terms is not None:  # terms exist with a coupling (checked above)
        offsets, masks, T = terms
        while T.dim() < 5:
            T = T.unsqueeze(0)  # (S, J, D) ... -> (B|1, H|1, S, J, D)
        T = T.expand(B, H, S, *T.shape[3:])
        dev = x.device
        off = torch.tensor(offsets, dtype=torch.int32, device=dev)
        msk = torch.tensor(masks, dtype=torch.int32, device=dev)  # (J, D)
        D = ft.content
        term[grid](x, y, T, off, msk, R, H, S, D, len(offsets), *xs, *ys, *T.stride(),
                   BLOCK_R=_BLOCK_R, BLOCK_D=max(16, 1 << (D - 1).bit_length()))
    else:
        for run in ft.runs:
            _run(plane, grid, x, y, run, conj, B, H, S, xs, ys)
    if ft.slot_vals is not None and not conj:
        y[..., ft.content:].copy_(_as4(ft.slot_vals).expand(B, H, S, -1))
    return y


def _run(plane, grid, x, y, run, conj: bool, B: int, H: int, S: int, xs, ys) -> None:
    """One launch of the plane kernel for one run (a copy run is a torch copy)."""
    lo, hi = run.lo, run.hi
    if run.kind == "copy":
        y[..., lo:hi].copy_(x[..., lo:hi])
        return
    if run.kind == "complex":
        tab = torch.view_as_real(_as4(run.tab).resolve_conj())  # (..., S, n, 2): re, im
        c, s, n, step, shift = tab[..., 0], tab[..., 1], (hi - lo) // 2, 2, 1
    elif run.kind == "halves":
        c, s = (_as4(u) for u in run.tab)
        n = (hi - lo) // 2
        step, shift = 1, n
    else:  # real
        c = s = _as4(run.tab)
        n, step, shift = hi - lo, 1, 0
    plane[grid](x, y, c, s, B * H * S, H, S, n, *xs, *ys, *_strides4(c, B, H, S), *_strides4(s, B, H, S),
                lo, step, shift, -1.0 if conj else 1.0, REAL=run.kind == "real",
                BLOCK_R=_BLOCK_R, BLOCK_N=max(16, 1 << (n - 1).bit_length()))
