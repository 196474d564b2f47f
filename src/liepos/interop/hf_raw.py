"""The raw-key attention of a patched layer: :func:`liepos.attention` at the times kept beside HF's cache.

Layers whose encoding is not a fixed rotation (xPos, RetNet, ALiBi's slots, dynamic NTK, LongRoPE,
Jordan blocks) leave q and k raw; HF's cache keeps raw keys and :func:`key_times` their times beside it.
:func:`raw_attention` is the attention those layers run, causal by token order under HF's mask: a decode
step through keys kept encoded at a cache origin (:mod:`liepos.interop.hf_decode`), anything else through
:func:`liepos.attention`. :func:`packed_attention` runs a layer's attention once per packed document.
"""

from __future__ import annotations

from typing import Any

import torch

from liepos.interop.hf_decode import attend, hf_visible, remember
from liepos.interop.hf_packed import check_row, per_document
from liepos.interop.hf_state import Layer

__all__ = ["raw_attention", "packed_attention", "key_times"]

_TIMES = "_liepos_times"


def packed_attention(fn: Any, module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
                     **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The layer's attention ``fn`` once per packed document (:mod:`liepos.interop.hf_packed`)."""
    state: Layer = module._liepos
    cu = state.call["cu"]
    check_row(cu, q.shape[0], q.shape[2], state.call["seen"])
    if state.length is not None:
        raise NotImplementedError(
            f"packed sequences with {state.length.rule!r}: transformers computes a dynamic or longrope rope at the "
            "length of the whole row, so a packed document would not see the frequencies it sees alone"
        )
    pos, cache, raw = state.call.get("pos"), state.call["cache"], state.call.get("raw")
    row = state.positions.tables
    memos = row.setdefault(("documents",), {})  # what every layer reads at one document's times

    def enter(a: int, b: int) -> None:
        # the document alone: its times, its tables, and (raw keys) a cache of its own that the row's
        # never sees, so that it takes the path of a prefill of its own
        state.call["pos"] = None if pos is None else pos[:, a:b]
        state.call["cache"], state.call["raw"] = (None if cache is None else _Scratch()), None
        state.positions.tables = memos.setdefault((a, b), {})

    try:
        return per_document(fn, module, q, k, v, attention_mask, cu, kwargs, enter)
    finally:
        state.call["pos"], state.call["cache"], state.call["raw"] = pos, cache, raw
        state.positions.tables = row


class _Scratch:
    """A packed document's stand-in for HF's cache on the raw-key path: only its ``__dict__`` is read (key times, stores)."""


# ---------------------------------------------------------------------- the raw-key path
def key_times(cache: Any, layer: int, pos: torch.Tensor, n_keys: int, seen: int) -> tuple[torch.Tensor, int]:
    """Times ``(B, n_keys)`` of the keys ``cache.update`` returned, and the absolute index of key 0.

    Kept beside the cache per layer. A dynamic cache returns the keys so far (a sliding one, the
    latest); a static one returns its whole buffer, the new keys written at ``seen …``.
    """
    store = cache.__dict__.setdefault(_TIMES, {})
    S = pos.shape[-1]
    buf, total = store.get(layer, (None, 0))  # buf (B, capacity): the first `total` are the times so far
    if seen == 0 or buf is None:
        buf, total = None, 0
    if seen < total:  # cropped: drop the latest times with it
        total = seen
    if seen != total:
        raise RuntimeError(
            f"layer {layer}: the cache holds {seen} tokens but liepos recorded the times of {total} "
            "(a cache filled by the unpatched model, or reordered); start from an empty cache"
        )
    B = pos.shape[0] if buf is None else max(buf.shape[0], pos.shape[0])
    if buf is None or buf.shape[0] != B or total + S > buf.shape[1]:  # grow by doubling: O(1) per step
        grown = pos.new_zeros(B, max(2 * (0 if buf is None else buf.shape[1]), total + S, 64))
        if total:
            grown[:, :total] = buf[:, :total]  # (1|B, total) broadcast to (B, total)
        buf = grown
    buf[:, total:total + S] = pos  # (1|B, S)
    times = buf[:, : total + S]  # (B, seen + S)
    store[layer] = (buf, total + S)
    if n_keys == seen + S:  # everything so far (dynamic): a view of the buffer, nothing copied
        return times, 0
    if n_keys > seen + S:  # a static buffer with unfilled slots
        pad = times.new_zeros(B, n_keys - seen - S)
        return torch.cat((times, pad), dim=-1), 0
    return times[:, times.shape[-1] - n_keys:], seen + S - n_keys  # a sliding window's latest keys


def raw_attention(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
                  scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The attention interface of raw-key layers: :func:`liepos.attention` at the recorded times."""
    from liepos.attend import attention

    state: Layer = module._liepos
    if dropout:
        raise NotImplementedError(
            f"attention_dropout={dropout} is not applied by the liepos attention path; set config.attention_dropout = 0.0"
        )
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{state.family.model_type}: {state.family.why}")
    pos = state.call["pos"]  # (1|B, S)
    if pos.dim() != 2:
        raise NotImplementedError("the raw-key path takes one position axis; M-RoPE runs as a pure rotation")
    B, S, Sk = q.shape[0], q.shape[2], k.shape[2]
    seen, cache, want = state.call["seen"], state.call["cache"], state.call.get("weights")
    if cache is not None:
        kpos, first = key_times(cache, module.layer_idx, pos, Sk, seen)
        if not want:  # a decode step: keys encoded at the cache's origin, only the new one encoded now
            out = attend(state, module.layer_idx, q, k, v, attention_mask, scaling, pos, kpos, cache, seen,
                         state.call.get("raw"))
            if out is not None:
                return out.transpose(1, 2).contiguous(), None  # (B, H, S, D) -> (B, S, H, D)
    else:
        kpos, first = pos, 0
    kpos = kpos.expand(B, -1)
    # causal by token order: query i (token seen + i) sees key j (token first + j) when first + j <= seen + i
    order = (torch.arange(Sk, device=q.device) + first)[None, :] <= (torch.arange(S, device=q.device) + seen)[:, None]
    filled = (torch.arange(Sk, device=q.device) < seen + S - first).expand(B, -1)  # (B, Sk): unfilled static slots
    mask = order[None, None]  # (1, 1, S, Sk)
    hf = hf_visible(attention_mask, Sk)
    if hf is not None:
        mask = mask & hf
    out = attention(q, k, v, state.encoding, positions=pos.expand(B, -1), key_positions=kpos, causal=True,
                    attn_mask=mask, key_padding_mask=filled, scale=scaling)
    weights = None
    if state.call.get("weights"):
        # the softmax weights themselves: the same attention applied to one-hot values
        eye = torch.eye(Sk, dtype=v.dtype, device=v.device).expand(B, k.shape[1], Sk, Sk)  # (B, Hk, Sk, Sk)
        weights = attention(q, k, eye, state.encoding, positions=pos.expand(B, -1), key_positions=kpos,
                            causal=True, attn_mask=mask, key_padding_mask=filled, scale=scaling)
    if cache is not None and first == 0 and Sk == seen + S and not want:  # a prefill: keep its keys encoded
        remember(state, module.layer_idx, k, v, kpos, cache, q.shape[1], pos)
    return out.transpose(1, 2).contiguous(), weights  # (B, S, H, D)
