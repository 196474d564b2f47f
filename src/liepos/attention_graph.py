"""``lp.attention`` inside ``torch.compile`` / ``torch.export`` and on meta tensors: the whole eager call as one opaque op.

Eager ``lp.attention`` decides on real data — the sequence length a length-dependent encoding is resolved
at (``at_length`` of the largest time), whether keys are finite, the tiling of the causal triangle,
which keys a fading block can still see. Traced, each of those decisions is a data-dependent guard
("Could not guard on data-dependent expression"), a graph break, or a recompilation per length. So
under ``torch.compile`` (and for meta tensors) the call is one custom op,

* ``torch.ops.liepos.attention(q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask,
  document_ids, key_document_ids, scale, allow_bidirectional, block_size, sinks, enc, value_encoding)`` —
  exactly the eager call (every check on real data, with the eager messages), the encodings named by
  their structure (:func:`liepos._graph.graph_id`), so one graph serves every length and every
  length-dependent encoding, and a saved program rebuilds them in another process; its fake gives
  ``(B, H, q_seq, v_dim)`` in v's dtype (contiguous), which is also what a meta tensor gets;
* ``torch.ops.liepos.attention_backward(g, …)`` — its registered backward: the eager call run again
  with autograd on q, k, v (and the sinks), ``torch.autograd.grad`` against ``g`` (a recomputation, as
  activation checkpointing does: one more forward per backward, nothing saved but the inputs).

Not routed (the traced eager code instead, which may break the graph): a :class:`~liepos.KVCache`
(state the op cannot hold), positions given as lists or numbers rather than tensors, a ``scale`` that
is a tensor, positions that require grad, and encodings whose parameters require grad (a learned
generator: the op could not carry their gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import liepos._graph as _graph
import liepos._graph_key  # noqa: F401  (installs the structure writer/reader into _graph)

__all__ = ["OP", "OP_BACKWARD", "install", "routable", "run"]

OP, OP_BACKWARD = "liepos::attention", "liepos::attention_backward"
_EXCLUDED = torch._C._dispatch_tls_local_exclude_set()  # the dispatch keys excluded outside any op (autocast)
_eager: dict[str, Callable] = {}


def install(eager: Callable) -> None:
    """The eager ``lp.attention`` the op runs (installed by :mod:`liepos.attend`, a module that imports this one)."""
    _eager["attention"] = eager


def _call(q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids, key_document_ids,
          scale, allow_bidirectional, block_size, sinks, enc, venc) -> torch.Tensor:
    return _eager["attention"](
        q, k, v, _live(enc), positions, key_positions, causal, attn_mask=attn_mask,
        key_padding_mask=key_padding_mask, document_ids=document_ids, key_document_ids=key_document_ids, scale=scale,
        allow_bidirectional=allow_bidirectional, block_size=block_size, sinks=sinks,
        value_encoding=None if venc is None else _live(venc))


def _impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None,
          key_positions: torch.Tensor | None, causal: bool, attn_mask: torch.Tensor | None,
          key_padding_mask: torch.Tensor | None, document_ids: torch.Tensor | None,
          key_document_ids: torch.Tensor | None, scale: float | None, allow_bidirectional: bool, block_size: int,
          sinks: torch.Tensor | None, enc: str, venc: str | None) -> torch.Tensor:
    with torch.no_grad():
        out = _call(q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids,
                    key_document_ids, scale, allow_bidirectional, block_size, sinks, enc, venc)
    if not out.is_contiguous():
        out = out.contiguous()  # the fake's layout
    return out.clone() if _aliases(out, q, k, v) else out  # an op's output never aliases its inputs


def _aliases(out: torch.Tensor, *xs: torch.Tensor) -> bool:
    return any(out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in xs if x.numel())


def _fake(q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids, key_document_ids,
          scale, allow_bidirectional, block_size, sinks, enc, venc):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype)  # (B, H, q_seq, v_dim)


def _backward_impl(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None,
                   key_positions: torch.Tensor | None, causal: bool, attn_mask: torch.Tensor | None,
                   key_padding_mask: torch.Tensor | None, document_ids: torch.Tensor | None,
                   key_document_ids: torch.Tensor | None, scale: float | None, allow_bidirectional: bool,
                   block_size: int, sinks: torch.Tensor | None, enc: str, venc: str | None) -> list[torch.Tensor]:
    # an op runs below autograd (its dispatch keys excluded): restore them, so that the eager call records
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), _EXCLUDED), torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v, *(() if sinks is None else (sinks,)))]
        s = leaves[3] if sinks is not None else None
        out = _call(leaves[0], leaves[1], leaves[2], positions, key_positions, causal, attn_mask, key_padding_mask, document_ids,
                    key_document_ids, scale, allow_bidirectional, block_size, s, enc, venc)
        if not out.requires_grad:  # nothing to attend (no keys, no queries): zeros that depend on no input
            return [torch.zeros_like(t) for t in leaves]
        grads = torch.autograd.grad(out, leaves, g, allow_unused=True)
    return [torch.zeros_like(t) if d is None else d.contiguous() for t, d in zip(leaves, grads)]


def _backward_fake(g, q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids,
                   key_document_ids, scale, allow_bidirectional, block_size, sinks, enc, venc):
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in (q, k, v, *(() if sinks is None else (sinks,)))]


_op = torch.library.custom_op(OP, _impl, mutates_args=())
_op.register_fake(_fake)
_op_backward = torch.library.custom_op(OP_BACKWARD, _backward_impl, mutates_args=())
_op_backward.register_fake(_backward_fake)


def _setup(ctx, inputs, output) -> None:
    q, k, v, positions, key_positions, causal, attn_mask, kpm, docs, kdocs, scale, bidi, block, sinks, enc, venc = inputs
    ctx.save_for_backward(q, k, v, positions, key_positions, attn_mask, kpm, docs, kdocs, sinks)
    ctx.args = (causal, scale, bidi, block, enc, venc)


def _backward(ctx, g):
    q, k, v, positions, key_positions, attn_mask, kpm, docs, kdocs, sinks = ctx.saved_tensors
    causal, scale, bidi, block, enc, venc = ctx.args
    grads = torch.ops.liepos.attention_backward(g, q, k, v, positions, key_positions, causal, attn_mask, kpm, docs,
                                                kdocs, scale, bidi, block, sinks, enc, venc)
    gs = grads[3] if sinks is not None else None
    return (grads[0], grads[1], grads[2], None, None, None, None, None, None, None, None, None, None, gs, None, None)


_op.register_autograd(_backward, setup_context=_setup)


def _tensor_or_none(*xs: Any) -> bool:
    return all(x is None or isinstance(x, torch.Tensor) for x in xs)


def routable(q: Any, k: Any, v: Any, enc: Any, positions: Any, key_positions: Any, masks: tuple, cache: Any,
             scale: Any, sinks: Any, venc: Any, flags: tuple) -> bool:
    """Whether the call is the op: traced (``torch.compile``/``torch.export``) or on meta tensors, and every
    argument something the op can take (see the module docstring); ``flags``: causal, allow_bidirectional,
    block_size (of their types, else the eager call refuses them with its own message)."""
    if not isinstance(q, torch.Tensor) or not (torch.compiler.is_compiling() or q.is_meta):
        return False
    causal, bidi, block = flags
    if not (isinstance(causal, bool) and isinstance(bidi, bool) and type(block) is int):
        return False
    if cache is not None or not _tensor_or_none(k, v, positions, key_positions, *masks, sinks):
        return False
    if not (scale is None or isinstance(scale, (int, float)) and not isinstance(scale, bool)):
        return False
    if any(p is not None and p.requires_grad for p in (positions, key_positions)):
        return False
    encs = [e for e in (enc, venc) if e is not None]
    return all(hasattr(e, "_learned") for e in encs) and not any(_learned(e) for e in encs)


@_graph.constant_result
def _learned(enc: Any) -> bool:
    """Whether a parameter of the encoding needs a gradient, read as a constant of the graph (read traced, its
    tensors would become inputs of the graph, with symbolic sizes under ``dynamic=True``: a recompilation when
    one matches a length). The op checks it again on every call (:func:`_live`)."""
    return enc._learned()


def _live(key: str) -> Any:
    enc = _graph.encoding_of(key)
    if enc._learned():
        raise RuntimeError(f"liepos: {enc!r} has parameters that require grad since this graph was compiled, and the "
                           f"compiled attention op cannot carry their gradient: call torch._dynamo.reset() and compile "
                           f"again (the traced path then differentiates through the generator)")
    return enc


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enc: Any, positions: Any, key_positions: Any, masks: tuple,
        scale: Any, flags: tuple, sinks: Any, venc: Any) -> torch.Tensor:
    """The call as the op (``routable`` said yes): compiled, exported or on meta tensors."""
    attn_mask, key_padding_mask, document_ids, key_document_ids = masks
    causal, allow_bidirectional, block_size = flags
    return torch.ops.liepos.attention(
        q, k, v, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids, key_document_ids,
        None if scale is None else float(scale), allow_bidirectional, block_size, sinks,
        _graph.graph_id(enc), None if venc is None else _graph.graph_id(venc))
