"""Encodings inside ``torch.compile``: the tables come from outside the graph, the graph only applies them.

Under ``torch.compile`` an :class:`liepos.Encoding` does not trace its float64 table building
(exact angle reduction, ``exp``, ``cos``/``sin``, ``lgamma``): the tables of the given positions come
from one opaque custom op, ``torch.ops.liepos.tables(positions, encoding id, side, dtype, slots)``,
whose implementation is the eager cached path (windows of integer positions in
:data:`liepos._fast.CACHE`, so a prefill and every decode step share them) and whose fake
implementation gives their shapes from the encoding's structure. The graph then holds only the
elementwise apply, which Inductor fuses into one loop::

    y = couple(a ⊙ x + b ⊙ partner(x)) ‖ slot values            (the readable form of liepos.apply)

The encoding id is a Python int (:func:`graph_id`, an entry in a registry of live encodings held by
weak reference), a constant of the graph: one graph per encoding, none per length (positions and x
stay dynamic). The structure (:func:`structure`: which tables exist, the partner mode, the coupling
columns) depends on the encoding alone, never on the positions' values.

Not taken (the traced readable path instead, differentiable in everything): learnable rates or
frequencies (``requires_grad``), positions that require grad, a change of basis, a plane partner that
is a gather, complex inputs. The tables carry no gradient, so the backward through the compiled graph
is the transposed elementwise apply, from autograd.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from liepos._fast import CACHE, _arange_start, _as4, _window
from liepos.apply import LOW_PRECISION

__all__ = ["OP", "Structure", "apply", "graph_id", "structure"]

OP = "liepos::tables"
# a window of cached tables may take at most this fraction of the cache's byte bound (as the eager path)
_WINDOW_SHARE = 4


def _constant(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result(fn)`` without importing dynamo when liepos is imported
    (it costs a second): the decorator only sets this marker, which dynamo reads when it traces a
    call (``tests/test_compile.py`` checks that the public decorator still sets the same marker)."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


_lock = threading.Lock()
_ids = itertools.count(1)
_registry: dict[int, weakref.ref] = {}


@_constant
def graph_id(enc: Any) -> int:
    """The encoding's id in the registry (assigned once; a graph constant, so one graph per encoding)."""
    with _lock:
        i = enc.__dict__.get("_graph_id")
        ref = _registry.get(i)
        if ref is None or ref() is not enc:  # new, or a copy (copy/pickle carry the attribute along)
            i = next(_ids)
            enc.__dict__["_graph_id"] = i
            _registry[i] = weakref.ref(enc, lambda _, i=i: _registry.pop(i, None))
        return i


def _encoding(i: int) -> Any:
    ref = _registry.get(i)
    enc = None if ref is None else ref()
    if enc is None:
        raise RuntimeError(f"liepos: the encoding with graph id {i} no longer exists (a compiled graph outlived it)")
    return enc


class Structure(NamedTuple):
    """What the tables of one (encoding, side, slots) are, independent of the positions."""

    content: int  # columns transformed from x
    partner: str  # "none" | "pairs" | "halves"
    planes: int
    has_a: bool
    has_b: bool
    narrow: bool  # the planes fill storage [0, 2P): tables c, s (…, P) and the rest's scale, not a, b (…, d)
    dst: tuple[int, ...]  # coupling y[dst] += c · z[src] (already transposed for the key)
    src: tuple[int, ...]
    slots: int  # slot values appended (0: none)
    heads: int  # heads of a, b, coef (1 when shared)
    slot_heads: int


_structures: dict[tuple, Structure | None] = {}


@_constant
def structure(i: int, side: str, with_slots: bool) -> Structure | None:
    """The :class:`Structure`, or ``None`` when the tables have no elementwise form here (a gather partner)."""
    key = (i, side, with_slots)
    if key not in _structures:
        enc = _encoding(i)
        plan = enc.plan
        if plan.partner == "gather":
            _structures[key] = None
            return None
        probe = enc.tables(torch.zeros(1, dtype=torch.float64), side)  # for the coupling pairs of this side
        content = enc.content_dim if with_slots else enc.dim
        dst, src = probe.dst.tolist(), probe.src.tolist()
        keep = [p for p, d in enumerate(dst) if d < content]
        heads = enc.generator.num_heads or 1
        P = plan.planes
        pidx = plan.partner_index.tolist()
        narrow = P > 0 and 2 * P <= content and all(pidx[j] != j for j in range(2 * P))
        _structures[key] = Structure(
            # always a scale table (ones without rates): the structure follows the plan, never the values,
            # so rates changed in place later cannot leave a graph without its scale
            content, plan.partner, P, True, P > 0, narrow,
            tuple(dst[p] for p in keep), tuple(src[p] for p in keep),
            enc.num_slots if with_slots else 0, heads, enc.num_heads or 1,
        )
    return _structures[key]


# ---------------------------------------------------------------------- the op (runs outside the graph)
class _Window:
    """Cached dense tables of a window of positions (what :class:`liepos._fast.TableCache` bounds)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def _build(enc: Any, st: Structure, pos: torch.Tensor, side: str, work: torch.dtype) -> list[torch.Tensor]:
    """The tables ``[a][, b][, coef][, slot values]`` at ``pos``, each ``(B|1, H|1, S, n)`` in ``work``."""
    t = enc.tables(pos, side)
    c = st.content
    out = []
    if st.has_a:  # a is None when nothing scales or rotates: ones
        a = t.a[..., :c] if t.a is not None else torch.ones(pos.shape[-1 if enc.num_axes is None else -2], c)
        out.append(_as4(a).to(device=pos.device, dtype=work))
    if st.narrow:  # a = (c, c) on each plane, b = (−s, s): keep c, s and the real dims' a
        P, a = st.planes, out.pop()
        if st.partner == "pairs":
            cs, sn = a[..., 0 : 2 * P : 2], _as4(t.b)[..., 1 : 2 * P : 2].to(work)
        else:
            cs, sn = a[..., :P], _as4(t.b)[..., P : 2 * P].to(work)
        out += [cs, sn] + ([a[..., 2 * P :]] if c > 2 * P else [])
    elif st.has_b:
        out.append(_as4(t.b[..., :c]).to(work))
    if st.dst:
        keep = [p for p, d in enumerate(t.dst.tolist()) if d < c]
        out.append(_as4(t.coef[..., keep]).to(work))
    if st.slots:
        out.append(_as4(enc._slot_values(pos, side, work)))
    return [t.contiguous() for t in out]  # a window keeps only what the graph reads


def _tables_impl(pos: torch.Tensor, enc_id: int, side: str, work: torch.dtype, with_slots: bool) -> list[torch.Tensor]:
    enc, st = _encoding(enc_id), structure(enc_id, side, with_slots)
    p0 = _arange_start(pos) if enc.num_axes is None else None
    S = pos.shape[-1] if enc.num_axes is None else pos.shape[-2]
    if p0 is None:
        got = _build(enc, st, pos, side, work)
    else:
        base, end = _window(p0, S)
        rows = (end - base) * (enc.num_heads or 1)
        estimate = rows * (2 * enc.dim + len(st.dst)) * torch.finfo(work).bits // 8
        if estimate * _WINDOW_SHARE > CACHE.max_bytes:
            got = _build(enc, st, pos, side, work)
        else:
            key = (pos.device, work, enc.version, side, with_slots, base, end, st)
            arange = lambda: torch.arange(base, end, dtype=torch.float64, device=pos.device)  # noqa: E731
            window = CACHE.get(key, lambda: _Window(_build(enc, st, arange(), side, work)))
            got = [w[..., p0 - base : p0 - base + S, :] for w in window.tensors]
    shapes = _shapes(st, pos, enc.num_axes)
    # fresh contiguous tensors: a graph may reuse an op's output buffers, so never hand out the cache
    return [g.expand(shape).clone(memory_format=torch.contiguous_format) for g, shape in zip(got, shapes)]


def _shapes(st: Structure, pos: torch.Tensor, axes: int | None) -> list[tuple]:
    batched = pos.dim() == (2 if axes is None else 3)
    B = pos.shape[0] if batched else 1
    S = pos.shape[-1] if axes is None else pos.shape[-2]
    out = []
    if st.narrow:
        out += [(B, st.heads, S, st.planes)] * 2 + ([(B, st.heads, S, st.content - 2 * st.planes)]
                                                    if st.content > 2 * st.planes else [])
    elif st.has_b:
        out += [(B, st.heads, S, st.content)] * 2
    elif st.has_a:
        out.append((B, st.heads, S, st.content))
    if st.dst:
        out.append((B, st.heads, S, len(st.dst)))
    if st.slots:
        out.append((B, st.slot_heads, S, st.slots))
    return out


_op = torch.library.custom_op(OP, _tables_impl, mutates_args=())


@_op.register_fake
def _tables_fake(pos, enc_id, side, work, with_slots):
    st = structure(enc_id, side, with_slots)
    return [pos.new_empty(shape, dtype=work) for shape in _shapes(st, pos, _encoding(enc_id).num_axes)]


# ---------------------------------------------------------------------- the graph (traced)
def _rotate_narrow(x: torch.Tensor, ts: list[torch.Tensor], st: Structure) -> torch.Tensor:
    """Planes in storage [0, 2P): ``y₀ = c x₀ − s x₁``, ``y₁ = s x₀ + c x₁``, then the real dims scaled."""
    P = st.planes
    cs, sn = ts.pop(0), ts.pop(0)
    if st.partner == "pairs":
        xv = x[..., : 2 * P].unflatten(-1, (P, 2))  # (…, 2P) -> (…, P, 2)
        x0, x1 = xv[..., 0], xv[..., 1]
        y = torch.stack((x0 * cs - x1 * sn, x1 * cs + x0 * sn), -1).flatten(-2)  # (…, P, 2) -> (…, 2P)
    else:
        x0, x1 = x[..., :P], x[..., P : 2 * P]
        y = torch.cat((x0 * cs - x1 * sn, x1 * cs + x0 * sn), -1)
    return y if st.content == 2 * P else torch.cat((y, x[..., 2 * P :] * ts.pop(0)), -1)


def _scale_rotate(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, st: Structure) -> torch.Tensor:
    """``a ⊙ x + b ⊙ partner(x)`` written plane by plane, so Inductor emits one loop over the planes
    with plain loads and one store per component (a ``cat``/``flip`` of x would index every column)."""
    if st.partner == "pairs":
        n = 2 * (x.shape[-1] // 2)
        xv, av, bv = (t[..., :n].unflatten(-1, (-1, 2)) for t in (x, a, b))  # (…, d) -> (…, d/2, 2)
        y0 = xv[..., 0] * av[..., 0] + xv[..., 1] * bv[..., 0]
        y1 = xv[..., 1] * av[..., 1] + xv[..., 0] * bv[..., 1]
        y = torch.stack((y0, y1), -1).flatten(-2)  # (…, d/2, 2) -> (…, d)
        return y if n == x.shape[-1] else torch.cat((y, x[..., n:] * a[..., n:]), -1)
    P = st.planes
    x0, x1, rest = x[..., :P], x[..., P : 2 * P], x[..., 2 * P :]
    y0 = x0 * a[..., :P] + x1 * b[..., :P]
    y1 = x1 * a[..., P : 2 * P] + x0 * b[..., P : 2 * P]
    return torch.cat((y0, y1, rest * a[..., 2 * P :]), -1)


def apply(enc: Any, x: torch.Tensor, pos: torch.Tensor, side: str, with_slots: bool, work: torch.dtype,
          st: Structure) -> torch.Tensor:
    """F or G of ``x`` (content columns; slot values appended when ``with_slots``) from the op's tables."""
    ts = list(torch.ops.liepos.tables(pos, graph_id(enc), side, work, with_slots))
    xw = x.to(work)
    if st.narrow:
        z = _rotate_narrow(xw, ts, st)
    elif st.has_b:  # planes rotate (has_b implies has_a)
        a, b = ts.pop(0), ts.pop(0)
        z = _scale_rotate(xw, a, b, st)
    else:
        z = xw * ts.pop(0) if st.has_a else xw
    if st.dst:
        coef = ts.pop(0)
        dst = torch.tensor(st.dst, device=x.device)
        src = torch.tensor(st.src, device=x.device)
        z = z.index_add(-1, dst, coef * z.index_select(-1, src))  # y[dst] += c · z[src]
    if st.slots:
        sv = ts.pop(0)
        z = torch.cat((z, sv.expand(*x.shape[:-1], st.slots)), dim=-1)
        # slots stay float32 for half-precision inputs (ALiBi's slot values need more than 8 bits)
        return z if x.dtype in LOW_PRECISION else z.to(x.dtype)
    return z.to(x.dtype)
