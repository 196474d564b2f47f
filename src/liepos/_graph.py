"""Encodings inside ``torch.compile``: the whole application is one opaque custom op backed by the eager fast path.

Under ``torch.compile`` an :class:`liepos.Encoding` traces neither its float64 table building (exact
angle reduction, ``exp``, ``cos``/``sin``, ``lgamma``) nor its apply: the graph holds one opaque custom
op per side,

* ``torch.ops.liepos.encode(x, positions, origin, encoding id, side, with_slots) -> y`` — exactly the eager
  fast path (the positions and origin as the caller gave them, ``None`` or tensors of any real dtype,
  converted and checked on real data as ``Encoding._relative`` and :func:`liepos.tables.check_range` do
  eagerly, so the graph holds no conversion kernel and a compiled call refuses what an eager one refuses;
  :func:`liepos._fast.apply_fast` with the cached tables of :data:`liepos._fast.CACHE`, windows of
  integer positions shared by a prefill and every decode step, the one-pass compiled half-layout kernel
  of :mod:`liepos._kernels` included); its fake implementation gives y's shape, dtype and strides (x's
  memory order, last dim the content width plus the slots), so the graph needs no table and no copy;
* ``torch.ops.liepos.encode_transposed(g, positions, origin, id, side, with_slots, dtype)`` — its backward,
  ``Mᵀ g``: the same routine with the rotation conjugated and the coupling transposed, as
  :class:`liepos._fast._Apply` does eagerly (registered with ``torch.library.register_autograd``; only
  the positions and origin are saved, never x);
* ``torch.ops.liepos.encode_(x, positions, origin, id, side)`` — ``inplace=True`` (mutates x), used when no
  gradient flows into x (otherwise the out-of-place op and a ``copy_``).

Why not tables from an op and the elementwise apply traced: an op may not hand the graph its cached
tables (Inductor may reuse an op's output buffers), and fresh copies of them cost more than the whole
apply saves (measured 1.41-1.44x eager at (1, 32, 4096, 128) on the 2-core CPU).

The encoding is named by its structure (:func:`graph_id`: a JSON string of the generator, layout, slots,
scales and length rule, :mod:`liepos._graph_key`), a constant of the graph: one graph per encoding, none
per length (positions and x stay dynamic), and a program saved by ``torch.export`` runs in another
process, which rebuilds the encoding from that string.

Not taken (the traced readable path instead, differentiable in everything): learnable rates or
frequencies (``requires_grad``), positions that require grad, a change of basis, a plane partner that
is a gather, complex inputs (:func:`usable`).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from liepos._fast import apply_fast, empty_out, transform
from liepos.apply import LOW_PRECISION, work_dtype
from liepos.tables import check_range

__all__ = ["OP", "OP_INPLACE", "OP_TRANSPOSED", "Positions", "apply", "deferrable", "graph_id", "install", "meta", "usable",
           "constant_result", "encoding_of"]

OP, OP_TRANSPOSED, OP_INPLACE = "liepos::encode", "liepos::encode_transposed", "liepos::encode_"


def constant_result(fn: Callable) -> Callable:
    """``fn`` marked as a graph constant: ``torch.compiler.assume_constant_result(fn)`` without importing
    dynamo when liepos is imported (it costs a second): the decorator only sets this marker, which dynamo
    reads when it traces a call (``tests/test_compile.py`` checks that the public decorator still sets the same marker).
    ``fn`` runs with torch's dispatch modes off: ``torch.export`` (non-strict) runs it under its fake and
    proxy modes, and what it reads or memoises on the encoding (the plan, the structure) must be real."""

    @functools.wraps(fn)
    def real(*args: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return fn(*args)

    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(real)
    real._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return real


_lock = threading.RLock()  # re-entrant: a weakref callback may run inside a locked block (GC)
_registry: dict[str, list[weakref.ref]] = {}  # structure -> the live encodings of that structure
_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # encoding -> (version, its structure key)
_rebuilt: dict[str, Any] = {}  # structures met first in a graph (a loaded program): rebuilt once, kept
_hooks: dict[str, Callable] = {}  # "key" / "rebuild": liepos._graph_key's, installed when liepos is imported


def install(key: Callable[[Any], str], rebuild: Callable[[str], Any]) -> None:
    """Install the writer and reader of an encoding's structure (:mod:`liepos._graph_key`, a higher layer)."""
    _hooks.update(key=key, rebuild=rebuild)


def _hook(name: str) -> Callable:
    try:
        return _hooks[name]
    except KeyError:
        raise RuntimeError(
            "an encoding met torch.compile before liepos could name it: the structure writer "
            "(liepos._graph_key) is not loaded; `import liepos.attend` (or use any name of the liepos "
            "package, `lp.rope`, `lp.build`, ...) before compiling") from None


@constant_result
def graph_id(enc: Any) -> str:
    """The encoding as a graph constant: its structure written out (:func:`liepos._graph_key.key`), so one
    graph per structure, none per length, and a saved program (``torch.export``) names the encoding itself,
    never an id of one process. Written once per version of the encoding (a learned generator's step
    changes it)."""
    version = enc.version
    with _lock:
        memo = _keys.get(enc)
    if memo is not None and memo[0] == version:
        key = memo[1]
    else:
        key = _hook("key")(enc)
        with _lock:
            _keys[enc] = (version, key)
    with _lock:
        refs = [r for r in _registry.get(key, ()) if r() is not None]
        if not any(r() is enc for r in refs):  # every live twin is kept: one dying leaves the others found
            refs.append(weakref.ref(enc, functools.partial(_forgotten, key)))
        _registry[key] = refs
    return key


def _forgotten(key: str, _ref: weakref.ref) -> None:
    """The callback of an encoding's weak reference: its structure's registry entry loses the dead ones."""
    _forget(key)


def _forget(key: str) -> None:
    with _lock:
        refs = [r for r in _registry.get(key, ()) if r() is not None]
        if refs:
            _registry[key] = refs
        else:
            _registry.pop(key, None)


def _live(key: str) -> Any:
    for ref in tuple(_registry.get(key, ())):
        enc = ref()
        if enc is not None:
            return enc
    return None


def encoding_of(key: str) -> Any:
    """A live encoding of the structure ``key``, else one rebuilt from it (a program saved elsewhere).
    The rebuild runs with torch's dispatch modes off: an op's fake implementation (``opcheck``,
    ``torch.export``, AOT dispatch) may be the first to meet the key, and the encoding it builds (its
    tables, its plan) must be made of real tensors, not fake or traced ones."""
    enc = _live(key)
    if enc is None:
        with _lock:
            enc = _rebuilt.get(key)
            if enc is None:
                from torch.utils._python_dispatch import _disable_current_modes

                with _disable_current_modes():
                    enc = _rebuilt[key] = _hook("rebuild")(key)
    return enc


@constant_result
def usable(i: str) -> bool:
    """Whether the encoding's plan has a fast form (not a gather partner); the rest (grads, basis,
    complex x) the caller checks on the tensors it traces."""
    return encoding_of(i).plan.partner != "gather"


def _out_dtype(enc: Any, x: torch.Tensor, with_slots: bool) -> torch.dtype:
    # slots stay float32 for half-precision inputs (ALiBi's slot values need more than 8 bits)
    return work_dtype(x.dtype) if with_slots and enc.num_slots and x.dtype in LOW_PRECISION else x.dtype


def _width(enc: Any, x: torch.Tensor, with_slots: bool) -> int:
    return x.shape[-1] + (enc.num_slots if with_slots else 0)


# ---------------------------------------------------------------------- the ops (run outside the graph)
class Positions:
    """Under ``torch.compile``: the positions as the caller gave them (``None``, or a tensor of any real
    dtype) and the origin (``None`` or a tensor), handed to the op unconverted, so that the graph holds
    no conversion (an int64 → float64 ``to``, an ``arange``, ``− origin``: each a tiny Inductor kernel
    whose OpenMP region waits on a descheduled thread of a loaded machine). The op converts and checks
    them eagerly, on real data, as ``Encoding._relative`` does outside a graph (NaN and inf refused with
    the eager message). Anything else that reads them (the reference path's ``pos.to(device)``) gets
    the traced float64 tensor: every other attribute is that of ``convert()``, built on first use."""

    def __init__(self, positions: torch.Tensor | None, origin: torch.Tensor | None, convert: Callable) -> None:
        self.positions, self.origin, self.convert = positions, origin, convert

    def __getattr__(self, name: str) -> Any:
        if "converted" not in self.__dict__:
            self.converted = self.convert()
        return getattr(self.converted, name)


def deferrable(positions: Any, origin: Any) -> bool:
    """Whether the op can take the positions and origin as given (tensors or None; numbers and lists are
    converted in the graph, as constants)."""
    return (positions is None or isinstance(positions, torch.Tensor)) and (
        origin is None or isinstance(origin, torch.Tensor))


def _relative(enc: Any, x: torch.Tensor, positions: torch.Tensor | None, origin: torch.Tensor | None,
              side: str, checked: bool = True) -> torch.Tensor:
    """The float64 positions relative to the origin, checked as eagerly (values, length rule, range)."""
    pos = enc._relative(positions, x, origin, "positions")
    if checked:
        check_range(enc.generator, pos, side, x.dtype)
    return pos


def _encode_impl(x: torch.Tensor, positions: torch.Tensor | None, origin: torch.Tensor | None, enc_id: str,
                 side: str, with_slots: bool) -> torch.Tensor:
    enc = encoding_of(enc_id)
    pos = _relative(enc, x, positions, origin, side)
    ft = enc._fast_tables(pos, side, work_dtype(x.dtype), with_slots)
    y = apply_fast(x, ft, out_dtype=_out_dtype(enc, x, with_slots))
    return y.clone() if y is x else y  # never an alias of the input


def _encode_fake(x, positions, origin, enc_id, side, with_slots):
    enc = encoding_of(enc_id)
    return empty_out(x, _width(enc, x, with_slots), _out_dtype(enc, x, with_slots))


def _transposed_impl(g: torch.Tensor, positions: torch.Tensor | None, origin: torch.Tensor | None, enc_id: str,
                     side: str, with_slots: bool, dtype: torch.dtype) -> torch.Tensor:
    enc = encoding_of(enc_id)
    pos = _relative(enc, g, positions, origin, side, checked=False)  # the forward checked the same positions
    ft = enc._fast_tables(pos, side, work_dtype(dtype), with_slots)
    if g.dtype != dtype and g.dtype != ft.dtype:
        g = g.to(ft.dtype)
    y = transform(g, ft, False, conj=True, out_dtype=dtype)
    return y.clone() if y is g else y


def _transposed_fake(g, positions, origin, enc_id, side, with_slots, dtype):
    return empty_out(g, g.shape[-1], dtype)


def _inplace_impl(x: torch.Tensor, positions: torch.Tensor | None, origin: torch.Tensor | None, enc_id: str,
                  side: str) -> None:
    enc = encoding_of(enc_id)
    ft = enc._fast_tables(_relative(enc, x, positions, origin, side), side, work_dtype(x.dtype), False)
    apply_fast(x, ft, inplace=True)


_encode = torch.library.custom_op(OP, _encode_impl, mutates_args=())
_encode.register_fake(_encode_fake)
_transposed = torch.library.custom_op(OP_TRANSPOSED, _transposed_impl, mutates_args=())
_transposed.register_fake(_transposed_fake)
_inplace = torch.library.custom_op(OP_INPLACE, _inplace_impl, mutates_args=("x",))
_inplace.register_fake(lambda x, positions, origin, enc_id, side: None)


def _setup(ctx, inputs, output) -> None:
    x, positions, origin, enc_id, side, with_slots = inputs
    ctx.save_for_backward(positions, origin)
    ctx.args = (enc_id, side, with_slots, x.dtype, x.shape[-1])


def _backward(ctx, g):
    positions, origin = ctx.saved_tensors
    enc_id, side, with_slots, dtype, content = ctx.args
    gx = torch.ops.liepos.encode_transposed(g[..., :content], positions, origin, enc_id, side, with_slots, dtype)
    return gx, None, None, None, None, None


_encode.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------------- the graph (traced)
def apply(enc: Any, x: torch.Tensor, pos: Any, side: str, with_slots: bool, inplace: bool) -> torch.Tensor:
    """F or G of ``x`` (content columns; slot values appended when ``with_slots``) as one op in the graph;
    ``pos``: the :class:`Positions` of ``Encoding._relative`` (else float64 positions, already relative)."""
    i = graph_id(enc)
    raw, origin = (pos.positions, pos.origin) if isinstance(pos, Positions) else (pos, None)
    if inplace:
        width = _width(enc, x, with_slots)
        if width != x.shape[-1]:
            raise ValueError(f"inplace needs an output as wide as the input ({x.shape[-1]}); slots make it {width}")
        if not (torch.is_grad_enabled() and x.requires_grad):
            torch.ops.liepos.encode_(x, raw, origin, i, side)
            return x
        return x.copy_(torch.ops.liepos.encode(x, raw, origin, i, side, with_slots))
    return torch.ops.liepos.encode(x, raw, origin, i, side, with_slots)


def meta(enc: Any, x: torch.Tensor, with_slots: bool, inplace: bool) -> torch.Tensor:
    """F or G of a meta tensor: no values, the output's shape, dtype and strides as the op's fake gives them."""
    width = _width(enc, x, with_slots)
    if inplace:
        if width != x.shape[-1]:
            raise ValueError(f"inplace needs an output as wide as the input ({x.shape[-1]}); slots make it {width}")
        return x
    return empty_out(x, width, _out_dtype(enc, x, with_slots))
