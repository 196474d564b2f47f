"""Packed sequences in a patched model: documents from ``cu_seq_lens``, attention one document at a time.

Padding-free training (transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``)
flattens a batch into one row of ``N`` tokens and passes the document boundaries as
``FlashAttentionKwargs``: ``cu_seq_lens_q = cu_seq_lens_k = [0, n₁, n₁ + n₂, …, N]`` (document ``d``
is tokens ``cu[d] … cu[d + 1] − 1``), with or without ``position_ids``. transformers' flash-attention
varlen kernel reads them; its sdpa and eager backends ignore them (every token would see the
earlier documents). In a patched model they decide both what the encoding sees and what attends:

* times: token ``i`` of document ``d`` is at ``p_i − p_{cu[d]}`` (``p`` the ``position_ids``, or
  ``0 … N − 1`` when none are given), so every document starts at time 0 as it would alone; for a
  relative encoding ``A(t − s)`` the scores inside a document are those of the given positions;
* attention: the layer's attention function (upstream's backend, or liepos') runs once per
  document on that document's queries, keys and values, with the document's block of the mask.

So a packed row gives, bit for bit, the outputs of its documents run one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PACKED_KEYS", "check_row", "documents", "restarted", "per_document"]

# the FlashAttentionKwargs of a padding-free batch, consumed here (never passed on to a backend)
PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def documents(kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The boundaries ``cu`` ``(docs + 1,)`` int64 of the call's ``cu_seq_lens_q/k``, or None when neither is given."""
    cq, ck = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cq is None and ck is None:
        return None
    if cq is None or ck is None:
        raise ValueError("packed sequences need both cu_seq_lens_q and cu_seq_lens_k (one of them is None)")
    cu = []
    for name, c in (("cu_seq_lens_q", cq), ("cu_seq_lens_k", ck)):
        t = torch.as_tensor(c)
        if t.dim() != 1 or t.numel() < 2 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor [0, n₁, n₁ + n₂, …], got {c!r}")
        t = t.to("cpu", torch.int64)
        if int(t[0]) != 0 or bool((t.diff() <= 0).any()):
            raise ValueError(f"{name} must start at 0 and increase strictly, got {t.tolist()}")
        cu.append(t)
    if not torch.equal(cu[0], cu[1]):
        raise NotImplementedError(
            f"cu_seq_lens_q {cu[0].tolist()} differs from cu_seq_lens_k {cu[1].tolist()}: only self-attention "
            "over packed documents (queries and keys the same tokens) is supported"
        )
    return cu[0]


def check_row(cu: torch.Tensor, batch: int, seq: int, seen: int) -> None:
    """The documents cover exactly one row of ``seq`` new tokens, with nothing cached before them."""
    if batch != 1:
        raise ValueError(f"packed sequences are one flattened row, got a batch of {batch}")
    if int(cu[-1]) != seq:
        raise ValueError(f"cu_seq_lens ends at {int(cu[-1])} but the row has {seq} tokens")
    if seen:
        raise NotImplementedError(
            f"packed sequences after {seen} cached tokens: a cache holds one document per row; decode each "
            "document in its own row"
        )


def restarted(pos: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """``pos`` ``(1, N)`` with each document's first position subtracted from its tokens: ``p_i − p_{cu[d]}``."""
    lengths = cu.diff().to(pos.device)  # (docs,)
    first = pos[:, cu[:-1].to(pos.device)]  # (1, docs): each document's first position
    return pos - first.repeat_interleave(lengths, dim=-1)  # (1, docs) -> (1, N)


def _block(mask: Any, a: int, b: int) -> Any:
    """Document ``[a, b)``'s part of HF's mask (``(B, N)`` padding or ``(…, N, N)``), None for none."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"packed sequences need a tensor attention mask or None, got {type(mask).__name__}")
    if mask.dim() == 2:
        return mask[:, a:b]
    return mask[..., a:b, a:b]


def per_document(fn: Callable[..., Any], module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                 cu: torch.Tensor, kwargs: dict[str, Any], enter: Callable[[int, int], Any]) -> tuple[torch.Tensor, Any]:
    """``fn`` (an attention interface) on each document of ``q, k, v`` ``(1, H|Hk, N, D)``; outputs ``(1, N, H, Dv)``.

    ``enter(a, b)`` runs before the document ``[a, b)`` (the caller's per-document state); the weights,
    when ``fn`` returns them, come back block-diagonal ``(1, H, N, N)`` (zero across documents).
    """
    rest = {name: value for name, value in kwargs.items() if name not in PACKED_KEYS}
    outs, weights = [], []
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        enter(a, b)
        out, w = fn(module, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], _block(mask, a, b), **rest)
        outs.append(out)  # (1, b − a, H, Dv)
        weights.append(w)
    out = torch.cat(outs, dim=1)  # (1, N, H, Dv)
    if all(w is None for w in weights):
        return out, None
    N = q.shape[2]
    full = weights[0].new_zeros(*weights[0].shape[:2], N, N)  # (1, H, N, N)
    for (a, b), w in zip(zip(bounds[:-1], bounds[1:]), weights):
        full[..., a:b, a:b] = w
    return out, full
