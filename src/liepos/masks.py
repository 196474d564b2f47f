"""Which keys a query sees: by time, padding, document and an explicit mask, one block of rows at a time.

A key at time ``s`` is visible to a query at time ``t`` when ``s ≤ t`` (causal, by time, not by index),
it is not padding, it belongs to the query's document and ``attn_mask`` allows it:

>>> import torch
>>> t = torch.tensor([[0.0, 1.0, 2.0]])
>>> keep = torch.ones(1, 3, dtype=torch.bool)
>>> m = visible(t, t, keep, None, None, None, True, slice(None))
>>> bool(torch.equal(m[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()))
True
"""

from __future__ import annotations

import torch

__all__ = ["visible", "finish", "strictly_increasing"]


def visible(qord: torch.Tensor, kord: torch.Tensor, keep: torch.Tensor, qdocs: torch.Tensor | None,
            kdocs: torch.Tensor | None, attn_mask: torch.Tensor | None, causal: bool, rows: slice) -> torch.Tensor:
    """Boolean mask ``(B, 1|H, rows, Sk)`` of the keys each query of ``rows`` sees.

    ``qord (B, Sq)`` / ``kord (B, Sk)``: the order the causal mask follows (the times, or the token
    order with several axes); ``keep (B, Sk)``: False for padding; ``qdocs``/``kdocs (B, Sq|Sk)``:
    document ids; ``attn_mask``: boolean, broadcastable to ``(B, H, Sq, Sk)``.
    """
    m = keep[:, None, None, :]  # (B, 1, 1, Sk)
    if causal:
        m = m & (kord[:, None, None, :] <= qord[:, None, rows, None])  # (B, 1, rows, Sk)
    if qdocs is not None:
        if kdocs is None:
            raise ValueError("query document ids need key document ids (kdocs) to mask by document")
        m = m & (kdocs[:, None, None, :] == qdocs[:, None, rows, None])  # (B, 1, rows, Sk)
    if attn_mask is not None:
        am = attn_mask
        while am.dim() < 4:
            am = am.unsqueeze(0)  # (…, Sq, Sk) -> (1, …, Sq, Sk)
        am = am[..., rows, :] if am.shape[-2] != 1 else am
        m = m & am
    return m


def finish(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Queries that see no key return zeros instead of NaN."""
    if mask is None:
        return out
    none = ~mask.any(-1, keepdim=True)  # (B, 1|H, rows, 1)
    if bool(none.any()):
        out = torch.where(none, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


def strictly_increasing(t: torch.Tensor) -> bool:
    """Whether every row of ``t (B, S)`` strictly increases (then ``s ≤ t`` by time is ``j ≤ i`` by index)."""
    return t.shape[-1] < 2 or bool((t[:, 1:] > t[:, :-1]).all())
