"""The fast application path: one pass over q or k per block kind, a transposed backward, a bounded table cache.

Applying ``F(t)`` or ``G(s)`` is memory-bound, so what matters is how many times each element of ``x``
is read and written. The readable form (:func:`liepos.encoding.apply_tables`) builds ``a ⊙ x``,
``partner(x)``, ``b ⊙ partner(x)`` and their sum: about five passes. Here the storage dims are cut once
(per encoding, at table-build time) into *runs*:

* ``complex`` — consecutive rotation planes (2k, 2k+1) (interleaved layout): the pair is a complex number
  and the whole run is one complex multiply ``y = c · x``, ``c = e^{λt}(cos ωt + i sin ωt)``, written
  straight into the output (``torch.mul(..., out=)``: one read of x, one write of y);
* ``halves`` — planes (k, k + P) (half layout): ``y₀ = a x₀ − s x₁``, ``y₁ = s x₀ + a x₁`` as one
  Inductor-compiled loop (:mod:`liepos._kernels`: one read of x, one write of y, in x's dtype), or, where
  that kernel does not run (small inputs, ``LIEPOS_KERNELS=0``, no compiler), two ``mul(out=)`` and two
  ``addcmul_`` per cache-sized slab;
* ``real`` — decays and the diagonal of real Jordan blocks: ``y = a ⊙ x``;
* ``copy`` — NoPE dims (``a ≡ 1``): a copy (nothing at all in place);

then Jordan blocks of size ≥ 2 add their nilpotent coupling ``y[dst] += c · z[src]`` on their few
columns only. That coupling is one ``addcmul_`` per pair on a strided column (63 for
``build("jordan", 64)``), so a coupled encoding is also expanded into *shifted terms* (:func:`_terms`)
and applied in one native pass (:func:`liepos._kernels.apply_terms`) where that kernel runs; the runs
and the coupling are its fallback. Slots never go through ``torch.cat``: their encoded values depend
on the position alone and are written into the output's last columns.

Because every canonical block's transform is ``e^{λt} P(t)ᵀ ⊗ R(ωt)`` (commuting parts), the backward,
``Mᵀ g``, is the same routine with the rotation conjugated and the coupling transposed: only the tables
are saved, never the input (:class:`_Apply`). Half-precision inputs are processed in float32 in chunks
of a few heads (a cache-sized float32 scratch, cast back once), so bfloat16 costs about one pass too.

Tables for integer position ranges are cached in a small LRU (:data:`CACHE`) keyed by device, dtype,
encoding version, side and a power-of-two *window* of positions, so a decode step reads one row of a
cached window instead of rebuilding anything, and the cache never grows with each new length.

Everything else here is plain PyTorch on strided views: the same ``FastTables`` are what a GPU kernel
(Triton/CUDA) consumes — a per-(position, run) complex or real table plus a coupling list.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

import liepos._kernels as _kernels
import liepos._pages as _pages
import liepos._triton as _triton
from liepos.tables import Tables

__all__ = ["FastTables", "TableCache", "CACHE", "fast_tables", "apply_fast", "transform", "empty_out", "table_window",
           "arange_start", "clear_small", "term_growth"]

_LOW = (torch.float16, torch.bfloat16)
# float32 scratch per chunk when a half-precision input is processed (elements)
_CHUNK_ELEMS = 1 << 19
# bytes of one slab of rows in the half-layout rotation, about a core's L2 cache (measured best of
# 64 KiB - 1 MiB - unslabbed on the 2-core CPU: 1 MiB, half layout in place 287 -> 113 ms at (1, 32, 4096, 128))
_SLAB_BYTES = 1 << 20


@dataclass
class Run:
    kind: str  # "complex" | "halves" | "real" | "copy"
    lo: int
    hi: int
    # complex: (..., S, (hi-lo)/2) complex; halves: (cos, sin) each (..., S, P); real: (..., S, hi-lo)
    tab: Any = None


@dataclass
class FastTables:
    """Tables of one side at given positions, cut into runs (see the module docstring).

    ``width``: the transformed width (content + slots when ``slots`` are given); ``content``: the
    width taken from the input; ``runs`` cover ``[0, content)`` of the transform; ``coupling`` is
    ``(dst, src, coef)`` (python lists and a ``(..., S, pairs)`` table) or ``None``; ``slot_vals``
    ``(..., S, slots)`` are the encoded slot values; ``rowmax`` is the largest magnitude per row
    (float64) for the overflow check.
    """

    width: int
    content: int
    runs: list[Run]
    coupling: tuple[list[int], list[int], torch.Tensor] | None
    slot_vals: torch.Tensor | None
    rowmax: torch.Tensor | None
    dtype: torch.dtype
    identity: bool = False
    extra: dict = field(default_factory=dict)
    # the whole transform as shifted terms (coupled encodings only, see :func:`_terms`): offsets,
    # structural masks and the tables (..., S, J, content)
    terms: tuple[tuple[int, ...], tuple[tuple[int, ...], ...], torch.Tensor] | None = None

    def rows(self, lo: int, hi: int) -> FastTables:
        """The tables of rows ``lo:hi`` of the position axis (views, nothing copied)."""
        sl = lambda t: None if t is None else t[..., lo:hi, :]  # noqa: E731
        runs = []
        for r in self.runs:
            if r.kind == "halves":
                runs.append(Run(r.kind, r.lo, r.hi, (sl(r.tab[0]), sl(r.tab[1]))))
            else:
                runs.append(Run(r.kind, r.lo, r.hi, sl(r.tab)))
        cp = None
        if self.coupling is not None:
            cp = (self.coupling[0], self.coupling[1], self.coupling[2][..., lo:hi, :])
        terms = None if self.terms is None else (*self.terms[:2], self.terms[2][..., lo:hi, :, :])
        return FastTables(
            self.width, self.content, runs, cp, sl(self.slot_vals),
            None if self.rowmax is None else self.rowmax[..., lo:hi], self.dtype, self.identity, terms=terms,
        )

    def nbytes(self) -> int:
        n = 0
        for r in self.runs:
            for t in (r.tab if isinstance(r.tab, tuple) else (r.tab,)):
                if t is not None:
                    n += t.numel() * t.element_size()
        extra = (None if self.coupling is None else self.coupling[2], None if self.terms is None else self.terms[2])
        for t in (self.slot_vals, self.rowmax, *extra):
            if t is not None:
                n += t.numel() * t.element_size()
        return n


# ---------------------------------------------------------------------- building
def _segments(flags: list[bool]) -> list[tuple[int, int, bool]]:
    out: list[tuple[int, int, bool]] = []
    for i, f in enumerate(flags):
        if out and out[-1][2] == f and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1, f)
        else:
            out.append((i, i + 1, f))
    return out


def fast_tables(t: Tables, content: int, work: torch.dtype, slot_vals: torch.Tensor | None = None) -> FastTables | None:
    """Cut float64 :class:`Tables` (storage order, width ≥ ``content``) into runs cast to ``work``.

    Returns ``None`` when the structure has no fast form (a plane partner that is neither an adjacent
    pair nor a half-split), so the caller falls back to the readable path.
    """
    cdtype = torch.complex64 if work == torch.float32 else torch.complex128
    rowmax = None
    for tab in (t.a, t.coef):
        if tab is not None and tab.numel():
            m = tab.detach().abs().amax(-1)
            rowmax = m if rowmax is None else torch.maximum(rowmax, m)
    if t.a is None and t.b is None and t.coef is None:
        return FastTables(content, content, [Run("copy", 0, content)], None, slot_vals, rowmax, work, identity=True)
    a = t.a[..., :content] if t.a is not None else None
    b = t.b[..., :content] if t.b is not None else None
    runs: list[Run] = []
    real_lo = 0
    if b is not None and t.planes > 0:
        if a is None:
            raise RuntimeError("liepos: rotation tables with a sine part but no cosine part; this is a bug")
        if t.partner == "pairs":
            pidx = t.partner_index.tolist()
            # a storage dim rotates when its partner is another dim; planes are (2k, 2k+1)
            rot_pair = [pidx[2 * j] == 2 * j + 1 for j in range(content // 2)]
            if content % 2:
                rot_pair.append(False)
            for lo2, hi2, rot in _segments(rot_pair):
                lo, hi = 2 * lo2, min(2 * hi2, content)
                if rot:
                    c = torch.complex(a[..., lo:hi:2], b[..., lo + 1 : hi : 2]).to(cdtype)
                    runs.append(Run("complex", lo, hi, c))
                else:
                    runs.extend(_real_runs(a, lo, hi, work))
        elif t.partner == "halves":
            P = t.planes
            if 2 * P > content:
                return None
            runs.append(Run("halves", 0, 2 * P, (a[..., :P].to(work), b[..., P : 2 * P].to(work))))
            real_lo = 2 * P
            runs.extend(_real_runs(a, real_lo, content, work))
        else:
            return None
    else:
        runs.extend(_real_runs(a, 0, content, work))
    cp = None
    if t.coef is not None:
        dst, src = t.dst.tolist(), t.src.tolist()
        keep = [i for i, d in enumerate(dst) if d < content]
        if keep:
            cp = ([dst[i] for i in keep], [src[i] for i in keep], t.coef[..., keep].to(work))
    terms = _terms(t, content, work) if cp is not None else None
    return FastTables(content, content, runs, cp, slot_vals, rowmax, work, terms=terms)


def _terms(t: Tables, D: int, work: torch.dtype):
    """The transform of the first ``D`` storage columns as shifted terms, for the one-pass kernel.

    ``y = couple(z)``, ``z = a ⊙ x + b ⊙ x[π]`` (π the plane partner), ``y[d] = z[d] + Σ_p c_p z[src_p]``
    over the pairs with ``dst_p = d``, expanded into ``y[d] = Σ_j T_j[d] · x[d + o_j]``: one term per
    distinct offset ``o = (source column) − d``, with ``T_0 = a``, ``T_{π(d)−d} = b`` and ``c_p a[s]``,
    ``c_p b[s]`` at offsets ``s − d`` and ``π(s) − d``. ``masks[j][d]`` marks the terms that exist (a
    structural zero), so the kernel reads no column a term does not have. Returns ``(offsets, masks,
    T)`` with ``T`` ``(..., S, J, D)`` in ``work`` (products taken in float64, rounded once), or None
    when a pair reaches past column ``D``.
    """
    rot = t.b is not None and t.planes > 0
    st = _term_structure(tuple(t.partner_index.tolist()), tuple(t.dst.tolist()), tuple(t.src.tolist()), D, rot)
    if st is None:
        return None
    offsets, masks, vsrc, csrc, flat = st
    a = t.a[..., :D] if t.a is not None else None
    b = t.b[..., :D] if rot and t.b is not None else None
    ref = next(u for u in (a, b, t.coef) if u is not None)
    dev = ref.device
    lead = torch.broadcast_shapes(*(u.shape[:-1] for u in (a, b, t.coef) if u is not None))  # (..., S)
    ones = torch.ones(*lead, D, dtype=torch.float64, device=dev)
    # (..., S, 2D): a's columns, then b's (ones where a table is absent: a is the identity's scale)
    vals = torch.cat([(ones if a is None else a).expand(*lead, D), (ones if b is None else b).expand(*lead, D)], -1)
    v = vals.index_select(-1, torch.tensor(vsrc, device=dev))  # (..., S, entries)
    if t.coef is not None:
        cidx = torch.tensor([max(c, 0) for c in csrc], device=dev)
        c = t.coef.expand(*lead, t.coef.shape[-1]).index_select(-1, cidx)  # (..., S, entries)
        v = v * torch.where(torch.tensor(csrc, device=dev) >= 0, c, 1.0)
    T = torch.zeros(*lead, len(offsets) * D, dtype=torch.float64, device=dev)
    T.index_add_(-1, torch.tensor(flat, device=dev), v)
    T = T.unflatten(-1, (len(offsets), D))  # (..., S, J*D) -> (..., S, J, D)
    return offsets, masks, T.to(work)


@functools.lru_cache(maxsize=64)
def _term_structure(pidx: tuple[int, ...], dst: tuple[int, ...], src: tuple[int, ...], D: int, rot: bool):
    """The structural part of :func:`_terms` (it depends on the plan only, so real positions, whose tables
    are built per call, do not redo it): ``(offsets, masks, vsrc, csrc, flat)`` — per entry the value
    column (``e`` for ``a[e]``, ``D + e`` for ``b[e]``), the coupling pair (−1: none) and the flat index
    ``j·D + d`` into the tables; None when a pair reaches past column ``D``."""
    if any(d < D <= s for d, s in zip(dst, src)):
        return None
    cols, offs, vsrc, csrc = [], [], [], []
    for d in range(D):
        cols.append(d)
        offs.append(0)
        vsrc.append(d)
        csrc.append(-1)
        if rot and pidx[d] != d:
            cols.append(d)
            offs.append(pidx[d] - d)
            vsrc.append(D + d)
            csrc.append(-1)
    for p, (d, s) in enumerate(zip(dst, src)):
        if d >= D:
            continue
        cols.append(d)
        offs.append(s - d)
        vsrc.append(s)
        csrc.append(p)
        if rot and pidx[s] != s:
            cols.append(d)
            offs.append(pidx[s] - d)
            vsrc.append(D + s)
            csrc.append(p)
    offsets = tuple(sorted(set(offs), key=lambda o: (o != 0, abs(o), o)))
    j_of = {o: j for j, o in enumerate(offsets)}
    masks = [[0] * D for _ in offsets]
    for d, o in zip(cols, offs):
        masks[j_of[o]][d] = 1
    flat = tuple(j_of[o] * D + d for d, o in zip(cols, offs))
    return offsets, tuple(tuple(m) for m in masks), tuple(vsrc), tuple(csrc), flat


def _real_runs(a: torch.Tensor | None, lo: int, hi: int, work: torch.dtype) -> list[Run]:
    if hi <= lo:
        return []
    if a is None:
        return [Run("copy", lo, hi)]
    seg = a[..., lo:hi]
    ones = (seg == 1.0).reshape(-1, hi - lo).all(0).tolist()
    out = []
    for l2, h2, one in _segments(ones):
        out.append(Run("copy", lo + l2, lo + h2) if one else Run("real", lo + l2, lo + h2, seg[..., l2:h2].to(work)))
    return out


# ---------------------------------------------------------------------- applying
def _as4(t: torch.Tensor) -> torch.Tensor:
    """A table (S, n), (H, S, n), (B, 1, S, n) or (B, H, S, n) as a 4-D broadcastable view."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _chunk(t: Any, b: int, h0: int, h1: int) -> Any:
    if t is None:
        return None
    if isinstance(t, tuple):
        return tuple(_chunk(u, b, h0, h1) for u in t)
    t = _as4(t)
    t = t[b : b + 1] if t.shape[0] > 1 else t
    return t[:, h0:h1] if t.shape[1] > 1 else t


def _cview(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _complex_ok(x: torch.Tensor, lo: int) -> bool:
    return x.stride(-1) == 1 and lo % 2 == 0 and x.storage_offset() % 2 == 0 and all(
        s % 2 == 0 for s in x.stride()[:-1]
    )


def _runs(x: torch.Tensor, out: torch.Tensor, ft: FastTables, conj: bool, inplace: bool, b=None, h0=0, h1=None) -> None:
    """``out[..., :content] = D x`` (or ``Dᵀ x`` when ``conj``), run by run; ``x`` may alias ``out``."""
    pick = (lambda t: t) if b is None else (lambda t: _chunk(t, b, h0, h1))  # noqa: E731
    for r in ft.runs:
        xs, os = x[..., r.lo : r.hi], out[..., r.lo : r.hi]
        if r.kind == "copy":
            if not inplace:
                os.copy_(xs)
        elif r.kind == "real":
            torch.mul(xs, pick(r.tab), out=os)
        elif r.kind == "complex":
            c = pick(r.tab)
            if conj:
                c = torch.conj_physical(c)  # not the lazy conj view: its bit can be lost under AOT dispatch
            if _complex_ok(xs, r.lo) and _complex_ok(os, r.lo):
                torch.mul(_cview(xs), c, out=_cview(os))
            else:  # odd strides: the same product on the two components
                x0, x1, o0, o1 = xs[..., 0::2], xs[..., 1::2], os[..., 0::2], os[..., 1::2]
                cr, ci = torch.view_as_real(c.resolve_conj()).unbind(-1)
                _rot(x0, x1, o0, o1, cr, ci, inplace)
        else:  # halves
            cs, sn = pick(r.tab)
            if conj:
                sn = -sn
            P = (r.hi - r.lo) // 2
            if _kernels.rotate_halves(xs, _as4(cs), _as4(sn), into=os) is None:  # one compiled pass, else ops
                _rot(xs[..., :P], xs[..., P:], os[..., :P], os[..., P:], cs, sn, inplace)


def _rot(x0, x1, o0, o1, cs, sn, inplace):
    """``o₀ = c x₀ − s x₁``, ``o₁ = s x₀ + c x₁`` without full-size temporaries.

    Done in slabs of rows that fit in the L2 cache (:data:`_SLAB_BYTES`): the second op of each pair
    reads what the first just wrote from the cache, and in place the saved ``x₀`` slab comes from the
    allocator's cache instead of fresh pages.
    """
    S = x0.shape[-2]
    row_bytes = max(1, x0[..., :1, :].numel() * x0.element_size())
    step = max(1, min(S, _SLAB_BYTES // row_bytes))
    for r0 in range(0, S, step):
        r = slice(r0, min(S, r0 + step))
        c, s_ = _rows(cs, r), _rows(sn, r)
        a0, a1, b0, b1 = x0[..., r, :], x1[..., r, :], o0[..., r, :], o1[..., r, :]
        if inplace:  # o₀ is x₀ and o₁ is x₁: keep x₀ for o₁
            a0 = a0.clone()
            b0.mul_(c).addcmul_(a1, s_, value=-1.0)
            b1.mul_(c).addcmul_(a0, s_)
        else:
            torch.mul(a0, c, out=b0).addcmul_(a1, s_, value=-1.0)
            torch.mul(a1, c, out=b1).addcmul_(a0, s_)


def _rows(t: torch.Tensor, r: slice) -> torch.Tensor:
    """Rows ``r`` of a table broadcast along the position axis (a size-1 axis stays whole)."""
    return t if t.shape[-2] == 1 else t[..., r, :]


def _couple(out: torch.Tensor, cp, transpose: bool, pick) -> None:
    """``y[dst] += c · z[src]`` (or the transpose) on the coupled columns only."""
    if cp is None:
        return
    dst, src, coef = cp
    if transpose:
        dst, src = src, dst
    coef = pick(coef)
    cols = sorted(set(src))
    where = {c: i for i, c in enumerate(cols)}
    if cols == list(range(cols[0], cols[-1] + 1)):
        z = out[..., cols[0] : cols[-1] + 1].clone()  # contiguous source columns: a slice, no gather
    else:
        z = out[..., cols]  # a copy of the source columns only (…, pairs): C reads z = D x, not y
    for p, (d, s) in enumerate(zip(dst, src)):
        out[..., d].addcmul_(z[..., where[s]], coef[..., p])


def empty_out(x: torch.Tensor, width: int, dtype: torch.dtype,
              take: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None) -> torch.Tensor:
    """An uninitialised tensor of ``x``'s shape with last dim ``width`` and dtype ``dtype``, its dimensions
    laid out in ``x``'s memory order (BHSD or BSHD, the last dim innermost): the output a kernel writes, so
    that the output of an encoding has the strides of its input. ``take``: a provider of the contiguous
    tensor in that order (given its shape and dtype; a buffer the caller reuses), else a fresh one."""
    if take is None and width == x.shape[-1] and dtype == x.dtype:
        return _pages.huge(torch.empty_like(x))
    strides: list[int] = [x.stride(i) for i in range(x.dim() - 1)]
    order = sorted(range(x.dim() - 1), key=lambda i: -strides[i])  # outer → inner, last dim stays last
    shape = [x.shape[i] for i in order] + [width]
    y = _pages.huge(torch.empty(shape, dtype=dtype, device=x.device)) if take is None else take(tuple(shape), dtype)
    inv = [0] * (x.dim() - 1)
    for pos, i in enumerate(order):
        inv[i] = pos
    return y.permute(*inv, x.dim() - 1)


def clear_small(x: torch.Tensor, tau: float, into: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with every entry below ``tau`` in magnitude set to +0 (every other entry, NaN included, as it is),
    half precision compared in float32: the native clear op (:func:`liepos._kernels.clear_below`; ``into``: x
    itself, cleared in place, or a contiguous buffer of its shape and dtype), else ``masked_fill`` (in place when
    ``into`` is x, else a fresh tensor)."""
    y = _kernels.clear_below(x, tau, into=into)
    if y is not None:
        return y
    a = x.abs()
    small = (a if a.dtype in (torch.float32, torch.float64) else a.float()) < tau
    return x.masked_fill_(small, 0) if into is x else x.masked_fill(small, 0)


def term_growth(ft: FastTables) -> float | None:
    """``g`` with ``|(M x)_d| ≤ g · ‖x‖_∞`` at every position of the tables, before the result is rounded: the
    largest ``Σ_j |T_j[u, d]|`` of the shifted terms ``y_d = Σ_j T_j[u, d] x_{d + o_j}`` (:func:`_terms`), worked
    out once per tables and kept beside them; None without terms or with slots appended (constant columns)."""
    if ft.terms is None or ft.slot_vals is not None:
        return None
    g = ft.extra.get("growth")
    if g is None:
        T = ft.terms[2].detach()  # (…, S, J, D) -> (…, S, D) row sums -> their largest
        g = ft.extra["growth"] = float(T.abs().sum(-2).amax()) if T.numel() else 0.0
    return g


def _cleared_in_pass(x: torch.Tensor, ft: FastTables, conj: bool, out_dtype: torch.dtype | None,
                     into: torch.Tensor | None, clear: float) -> torch.Tensor | None:
    """The transform and its clearing as one native pass, when it is one diagonal run (decay dims, or rotation
    planes of any damping) over every column: :func:`liepos._kernels.multiply` with ``clear``, or the shifted terms
    of a coupled encoding (:func:`_terms_pass`); else None."""
    # the shifted terms (not under Triton's interpreter, where the tests take Triton's own kernels)
    if ft.terms is not None and (out_dtype or x.dtype) == x.dtype and not _triton.interpreting():
        out = into if into is not None else empty_out(x, ft.width if not conj else ft.content, x.dtype)
        return out if _terms_pass(x, out, ft, conj, clear) else None
    r = ft.runs[0] if len(ft.runs) == 1 else None
    if (r is None or r.kind not in ("real", "complex") or r.lo != 0 or r.hi != x.shape[-1] or ft.coupling is not None
            or (ft.slot_vals is not None and not conj) or (out_dtype or x.dtype) != x.dtype):
        return None
    out = into if into is not None else empty_out(x, x.shape[-1], x.dtype)
    return _kernels.multiply(x, r.tab, out, conj=conj, clear=clear)


def transform(
    x: torch.Tensor, ft: FastTables, inplace: bool, conj: bool = False, out_dtype: torch.dtype | None = None,
    into: torch.Tensor | None = None, clear: float = 0.0,
) -> torch.Tensor:
    """``y = M x`` (``conj``: ``Mᵀ x``) of ``x``'s first ``ft.content`` columns, the slot values appended
    (not under ``conj``): the kernel dispatch of :func:`apply_fast` (Triton, the one-pass kernels, the torch
    ops) without its autograd and its input checks; ``inplace`` writes into ``x``, which the caller has
    checked can hold the result. ``into`` (out of place): a tensor of the result's shape and dtype, sharing no
    memory with ``x``, written instead of a fresh one (a caller's reused buffer, its pages already mapped);
    the result is what is returned, which a path with its own output (Triton) leaves ``into`` unwritten for.
    ``clear > 0`` (out of place): every entry of the result below it in magnitude is +0 (:func:`clear_small`),
    in the transform's own pass where that is one native kernel call."""
    width = ft.width if not conj else ft.content
    if into is not None and (inplace or into.shape != (*x.shape[:-1], width)
                             or into.dtype != (out_dtype or x.dtype) or into.device != x.device):
        raise ValueError(f"transform's into must be a tensor of the result's shape {(*x.shape[:-1], width)} and "
                         f"dtype {out_dtype or x.dtype} (out of place), got {tuple(into.shape)} {into.dtype}")
    if into is not None and into.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ValueError("transform's into must share no memory with x (inplace=True writes into x)")
    if clear:
        y = None if inplace else _cleared_in_pass(x, ft, conj, out_dtype, into, clear)
        if y is None:
            y = transform(x, ft, inplace, conj, out_dtype, into)
            y = clear_small(y, clear, into=y)
        return y
    # the Triton kernels on CUDA (on the CPU only under TRITON_INTERPRET=1, as the tests run them); None: the ops below
    if (x.is_cuda or _triton.interpreting()) and not inplace and _triton.available():
        terms = None if ft.terms is None else (_transposed_terms(ft) if conj else ft.terms)
        y = _triton.apply(x, ft, conj, out_dtype or x.dtype, terms)
        if y is not None:
            return y
    y = _one_pass(x, ft, inplace, conj, x.dtype if inplace else (out_dtype or x.dtype), into)
    if y is not None:
        return y
    out = x if inplace else into if into is not None else empty_out(x, width, out_dtype or x.dtype)
    if _terms_pass(x, out, ft, conj):
        return out
    if x.dtype == ft.dtype and out.dtype == ft.dtype:
        _runs(x, out, ft, conj, inplace)
        _couple(out, ft.coupling, conj, lambda t: t)
        if ft.slot_vals is not None and not conj:
            out[..., ft.content :].copy_(_as4(ft.slot_vals).expand(*x.shape[:-1], -1))
        return out
    if _native_runs(x, out, ft, conj, inplace):  # half precision read and written directly, float32 in registers
        _couple(out, ft.coupling, conj, lambda t: t)
        if ft.slot_vals is not None and not conj:
            out[..., ft.content :].copy_(_as4(ft.slot_vals).expand(*x.shape[:-1], -1))
        return out
    # half precision: float32 scratch over a few heads at a time, cast back once
    B, H, S, _ = x.shape
    step = max(1, min(H, _CHUNK_ELEMS // max(1, S * width)))
    for b in range(B):
        for h0 in range(0, H, step):
            h1 = min(H, h0 + step)
            xs = x[b : b + 1, h0:h1, :, : ft.content].to(ft.dtype)
            ws = torch.empty((1, h1 - h0, S, width), dtype=ft.dtype, device=x.device)
            pick = lambda t, b=b, h0=h0, h1=h1: _chunk(t, b, h0, h1)  # noqa: E731
            _runs(xs, ws, ft, conj, False, b, h0, h1)
            _couple(ws, ft.coupling, conj, pick)
            if ft.slot_vals is not None and not conj:
                ws[..., ft.content :].copy_(pick(ft.slot_vals).expand(1, h1 - h0, S, -1))
            out[b : b + 1, h0:h1].copy_(ws)
    return out


def _native_runs(x: torch.Tensor, out: torch.Tensor, ft: FastTables, conj: bool, inplace: bool) -> bool:
    """``out[..., :content] = D x`` (``Dᵀ x`` when ``conj``) run by run through the native kernels, for half
    precision ``x`` and ``out`` of x's dtype: real runs and rotation planes (:func:`liepos._kernels.multiply`),
    half-layout planes (:func:`liepos._kernels.rotate_halves`). False, with nothing written, when the first run
    that needs a kernel cannot take it (the caller takes the float32 scratch); a later run that cannot (its
    tables, not the machine, differ) goes through a float32 scratch of its columns."""
    if ft.coupling is not None or out.dtype != x.dtype:
        return False
    first = True
    for r in ft.runs:
        xs, os = x[..., r.lo : r.hi], out[..., r.lo : r.hi]
        if r.kind == "copy":
            if not inplace:
                os.copy_(xs)
            continue
        if r.kind == "halves":
            cs, sn = r.tab
            done = _kernels.rotate_halves(xs, _as4(cs), _as4(-sn if conj else sn), into=os) is not None
        else:
            done = _kernels.multiply(xs, r.tab, os, conj=conj) is not None
        if not done:
            if first:
                return False
            ws = torch.empty(xs.shape, dtype=ft.dtype, device=x.device)  # (B, H, S, w): this run's float32 scratch
            _runs(xs.to(ft.dtype), ws, dataclasses.replace(ft, runs=[dataclasses.replace(r, lo=0, hi=r.hi - r.lo)]),
                  conj, False)
            os.copy_(ws)
        first = False
    return True


def _transposed_terms(ft: FastTables):
    """The terms of ``Mᵀ``: ``(Mᵀ g)[e] = Σ_j T_j[e − o_j] g[e − o_j]``, i.e. offsets ``−o_j`` with the
    tables and masks shifted by ``o_j`` along the columns (a pass over the tables only, not over g)."""
    if ft.terms is None:
        raise ValueError("the transposed terms need tables with terms (a coupled encoding's)")
    offsets, masks, T = ft.terms
    D = T.shape[-1]
    Tt = torch.zeros_like(T)  # (..., S, J, D)
    for j, o in enumerate(offsets):
        if o >= 0:
            Tt[..., j, o:] = T[..., j, : D - o]
        else:
            Tt[..., j, : D + o] = T[..., j, -o:]
    return tuple(-o for o in offsets), _shifted_masks(offsets, masks), Tt


@functools.lru_cache(maxsize=64)
def _shifted_masks(offsets: tuple[int, ...], masks: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """``mask_j[e − o_j]`` (0 outside the row): the masks of the transposed terms."""
    D = len(masks[0])
    return tuple(tuple(m[e - o] if 0 <= e - o < D else 0 for e in range(D)) for o, m in zip(offsets, masks))


def _terms_pass(x: torch.Tensor, out: torch.Tensor, ft: FastTables, conj: bool, clear: float = 0.0) -> bool:
    """``out = M x`` (``Mᵀ x`` when ``conj``) as one native pass over the shifted terms of a coupled
    encoding, slots appended; False when it does not run (the caller takes the run-by-run ops). ``clear``: the
    terms' outputs below it in magnitude written as +0 in the same pass (no slots: their columns are not cleared)."""
    if ft.terms is None or out.dtype != x.dtype or x.shape[-1] != ft.content:
        return False
    if clear and ft.slot_vals is not None and not conj:
        return False
    offsets, masks, T = _transposed_terms(ft) if conj else ft.terms
    while T.dim() < 5:
        T = T.unsqueeze(0)  # (S, J, D), (H, S, J, D), (B, 1, S, J, D) -> (B|1, H|1, S, J, D)
    into = out if out.shape[-1] == ft.content else out[..., : ft.content]
    if _kernels.apply_terms(x, T, offsets, masks, into=into, clear=clear) is None:
        return False
    if ft.slot_vals is not None and not conj:
        out[..., ft.content :].copy_(_as4(ft.slot_vals).expand(*x.shape[:-1], -1))
    return True


def _one_pass(x: torch.Tensor, ft: FastTables, inplace: bool, conj: bool, out_dtype: torch.dtype,
              into: torch.Tensor | None = None) -> torch.Tensor | None:
    """The whole transform as one compiled kernel call when it is one half-layout rotation (RoPE in
    Hugging Face's layout): a fresh output (``into`` when given; x itself in place), half precision upcast in
    registers."""
    if len(ft.runs) != 1 or ft.runs[0].kind != "halves" or ft.coupling is not None or out_dtype != x.dtype:
        return None
    if (ft.slot_vals is not None and not conj) or ft.runs[0].hi != x.shape[-1]:
        return None
    cs, sn = (_as4(t) for t in ft.runs[0].tab)
    return _kernels.rotate_halves(x, cs, -sn if conj else sn, into=x if inplace else into)


class _Transposed(torch.autograd.Function):
    """``g ↦ Mᵀ g`` (the backward of :class:`_Apply`) as a differentiable op: its backward is ``M gg``
    restricted to the content columns (``Mᵀ`` maps content to content; the slots' rows of ``M`` carry
    constants, no dependence on ``g``)."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, ft: FastTables, out_dtype) -> torch.Tensor:
        ctx.ft, ctx.g_dtype = ft, g.dtype
        return transform(g, ft, False, conj=True, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, gg: torch.Tensor):
        ft: FastTables = ctx.ft
        y = apply_fast(gg, ft, out_dtype=ctx.g_dtype)  # differentiable again through _Apply when recorded
        return y[..., : ft.content], None, None


class _Apply(torch.autograd.Function):
    """``y = M x`` with a backward ``Mᵀ g`` from the saved tables only (the input is never saved).

    The backward is itself differentiable (double backward, ``create_graph=True``): with a graph to
    record it is :class:`_Transposed`, whose own backward is ``M`` again (the content columns)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ft: FastTables, inplace: bool, out_dtype) -> torch.Tensor:
        ctx.ft, ctx.in_dtype = ft, x.dtype
        y = transform(x, ft, inplace, out_dtype=out_dtype)
        if inplace:
            ctx.mark_dirty(x)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        ft: FastTables = ctx.ft
        g = g[..., : ft.content]
        if g.dtype != ctx.in_dtype and g.dtype != ft.dtype:
            g = g.to(ft.dtype)
        if torch.is_grad_enabled() and g.requires_grad:  # create_graph=True: record Mᵀ g as a differentiable op
            return _Transposed.apply(g, ft, ctx.in_dtype), None, None, None
        return transform(g, ft, False, conj=True, out_dtype=ctx.in_dtype), None, None, None


def _overlaps(x: torch.Tensor) -> bool:
    """Whether two indices of ``x`` may share memory: torch's own verdict (``_debug_has_internal_overlap``:
    0 no, 1 yes, 2 too hard to say), and where it cannot say, the sufficient test of strides sorted by
    size, each at least the extent of the ones below it (what fails it is taken as overlapping)."""
    verdict = torch._debug_has_internal_overlap(x)
    if verdict != 2:
        return verdict == 1
    dims = sorted((x.stride(i), x.shape[i]) for i in range(x.dim()) if x.shape[i] > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * size
    return False


def apply_fast(
    x: torch.Tensor, ft: FastTables, inplace: bool = False, out_dtype: torch.dtype | None = None,
    into: torch.Tensor | None = None, clear: float = 0.0,
) -> torch.Tensor:
    """``M x`` with slots appended; differentiable in ``x`` through :class:`_Apply`. ``into``: where to write
    the result when nothing needs a gradient (:func:`transform`'s); the returned tensor is the result.
    ``clear``: :func:`transform`'s, out of place and without a gradient only."""
    if clear and (inplace or (torch.is_grad_enabled() and x.requires_grad)):
        raise ValueError(f"apply_fast: clear={clear!r} needs an output of its own and no gradient (the cleared "
                         "entries would take none)")
    if inplace and ft.width != x.shape[-1]:
        raise ValueError(f"inplace needs an output as wide as the input ({x.shape[-1]}); slots make it {ft.width}")
    if inplace and _overlaps(x):
        # the native kernels write each row through x's strides: elements sharing memory would be
        # rotated twice (the torch ops refuse such a write too)
        raise ValueError(
            f"inplace=True needs a tensor whose elements have memory of their own, got shape {tuple(x.shape)} "
            f"with strides {x.stride()} (an expanded or self-overlapping view): pass x.contiguous(), or inplace=False")
    if ft.identity and ft.slot_vals is None:
        return x if inplace else clear_small(x, clear) if clear else x.clone()
    if torch.is_grad_enabled() and x.requires_grad:
        return _Apply.apply(x, ft, inplace, out_dtype)
    return transform(x, ft, inplace, out_dtype=out_dtype, into=into, clear=clear)


# ---------------------------------------------------------------------- the cache
class _Entry(Protocol):
    def nbytes(self) -> int: ...


_E = TypeVar("_E", bound=_Entry)


class TableCache:
    """A bounded LRU of :class:`FastTables` windows (entries and bytes), thread-safe.

    Keys are ``(device, dtype, encoding version, side, window start, window end)``; a window is a
    power-of-two range of integer positions, so prefill and every later decode step share entries and
    the number of entries never grows with the length. The entry bound is generous (256: one re-centred
    attention call of a decay or Jordan encoding holds a dozen windows, one per tile size and side, and a
    model or a benchmark alternates several encodings; at 32 they evicted each other every call and the
    tables were rebuilt each time); the byte bound is what limits memory.
    """

    def __init__(self, max_entries: int = 256, max_bytes: int = 512 << 20) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._d: OrderedDict[tuple, Any] = OrderedDict()  # FastTables, or another entry with nbytes()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.hits = self.misses = 0

    def get(self, key: tuple, build: Callable[[], _E]) -> _E:
        with self._lock:
            ft = self._d.get(key)
            if ft is not None:
                self._d.move_to_end(key)
                self.hits += 1
                return ft
        ft = build()
        with self._lock:
            self.misses += 1
            self._d[key] = ft
            self._d.move_to_end(key)
            total = sum(v.nbytes() for v in self._d.values())
            while len(self._d) > 1 and (len(self._d) > self.max_entries or total > self.max_bytes):
                _, old = self._d.popitem(last=False)
                total -= old.nbytes()
        return ft


CACHE = TableCache()


def table_window(p0: int, S: int) -> tuple[int, int]:
    """The window ``[base, end)`` of integer positions whose cached tables cover ``p0 … p0 + S − 1``: with
    ``cap`` the power of two ``>= S`` (at least 64), ``base = ⌊p0 / cap⌋ · cap`` and ``end = base + cap``, or
    ``base + 2 cap`` when the range crosses the boundary, so a prefill and every later decode step share
    windows (the :class:`TableCache` key) and their number never grows with the length."""
    cap = max(64, 1 << max(0, (S - 1)).bit_length())
    base = (p0 // cap) * cap
    end = base + cap if p0 + S <= base + cap else base + 2 * cap
    return base, end


def arange_start(pos: torch.Tensor) -> int | None:
    """``p0`` when ``pos`` (``(S,)`` or ``(1, S)``, float or integer) is ``p0, p0 + 1, …, p0 + S − 1`` with ``p0``
    an integer of magnitude at most 2⁵², else ``None``: the positions whose tables are rows of a cached window."""
    if pos.dim() == 2:
        if pos.shape[0] != 1:
            return None
        pos = pos[0]
    if pos.numel() == 0:
        return None
    p0 = float(pos[0])
    if p0 != math.floor(p0) or abs(p0) > 2**52:
        return None
    if pos.numel() > 1:
        ref = torch.arange(int(p0), int(p0) + pos.numel(), dtype=pos.dtype, device=pos.device)  # exact in either type
        if not bool(torch.equal(pos, ref)):
            return None
    return int(p0)
