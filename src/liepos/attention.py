"""Encoded attention that stays exact at any length, and caches that keep time.

:func:`attention` computes ``softmax(logit_scale · qᵀ A(t − s) k / √d) v`` on top of
``torch.nn.functional.scaled_dot_product_attention``:

* the causal mask follows the *times* (a key is visible when ``s ≤ t``), not the indices;
* encodings whose F and G grow with absolute time (decay, damped rotation, Jordan blocks, ALiBi's
  slots) are evaluated relative to an origin per query block, ``F(t − o)``, ``G(s − o)``, which
  leaves every score unchanged and keeps every factor finite, at positions of 10⁹ as at 0;
* ALiBi runs through its slots: no (seq × seq) bias is ever allocated;
* :class:`KVCache` stores keys with their times and re-encodes (or, for pure rotations, keeps the
  encoded keys of the current generator version), so prefill + decode equals the full forward.

:func:`attention_reference` is the readable float64 reference: scores from the lags
``u = t − s`` and the closed-form blocks of ``A(u)``, one block at a time.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as Fn

from liepos.encoding import Encoding, as_positions
from liepos.generator import Generator

__all__ = ["attention", "attention_reference", "KVCache"]

_LOW = (torch.float16, torch.bfloat16)
# largest |λ|·(time span of a query block) allowed, so e^{|λ| span} stays far from overflow
_MAX_EXPONENT = 30.0
# largest time span of the polynomial parts (Jordan blocks, slots) around one origin: binomial terms
# of (t - o) and (s - o) cancel, so the span bounds the rounding of near-lag scores
_POLY_SPAN = 256.0


class KVCache:
    """A key/value cache that keeps the *time* of every key.

    Keys are stored as the caller gave them (before encoding) together with their times, so
    that attention can encode them relative to any origin and under the current generator
    (length-dependent generators such as dynamic NTK change with the length: the cache never
    mixes keys encoded under another version). For pure rotations the encoded keys of the current
    version are kept too, so a decode step encodes one new key only.

    Times must not decrease: a key older than one already cached is an error.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.times: torch.Tensor | None = None  # (B, S) float64
        self.keep: torch.Tensor | None = None  # (B, S) bool: False for padding
        self.docs: torch.Tensor | None = None  # (B, S) long document ids
        self._enc_k: torch.Tensor | None = None
        self._enc_version: Any = None
        self._origin: torch.Tensor | None = None  # (B,) origin of _enc_k for re-centred encodings

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def reset(self) -> None:
        self.__init__()

    def append(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        times: torch.Tensor,
        keep: torch.Tensor,
        docs: torch.Tensor | None,
    ) -> None:
        """Append keys ``(B, H, S, D)``, values and their times ``(B, S)``; times must not go back."""
        if self.k is not None:
            if (self.docs is None) != (docs is None):
                raise ValueError("document ids must be given on every call to a KVCache or on none")
            if k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]:
                raise ValueError(
                    f"k of shape {tuple(k.shape)} does not match the cached keys {tuple(self.k.shape)}"
                )
            if times.dim() != self.times.dim():
                raise ValueError("key positions must keep one shape (with or without an axes dim) across calls")
        if self.k is not None and times.dim() == 3:
            # several axes (B, S, axes): no total order of times; the cache keeps token order
            self.k = torch.cat((self.k, k), dim=-2)
            self.v = torch.cat((self.v, v), dim=-2)
            self.times = torch.cat((self.times, times), dim=-2)
            self.keep = torch.cat((self.keep, keep), dim=-1)
            if docs is not None:
                self.docs = torch.cat((self.docs, docs), dim=-1)
        elif self.k is not None:
            last = torch.where(self.keep, self.times, torch.full_like(self.times, -math.inf)).amax(-1)
            first = torch.where(keep, times, torch.full_like(times, math.inf)).amin(-1)
            if bool((first < last).any()):
                b = int(torch.nonzero(first < last)[0, 0])
                raise ValueError(
                    f"key_positions go back in time: batch {b} appends a key at time {float(first[b])} "
                    f"after a cached key at time {float(last[b])}; a KVCache needs non-decreasing times"
                )
            self.k = torch.cat((self.k, k), dim=-2)
            self.v = torch.cat((self.v, v), dim=-2)
            self.times = torch.cat((self.times, times), dim=-1)
            self.keep = torch.cat((self.keep, keep), dim=-1)
            if docs is not None:
                self.docs = torch.cat((self.docs, docs), dim=-1)
        else:
            self.k, self.v, self.times, self.keep, self.docs = k, v, times, keep, docs


def _expand_batch(p: torch.Tensor, B: int, axes: int | None = None) -> torch.Tensor:
    """(S,) or (1|B, S) -> (B, S); with several axes (S, A) or (1|B, S, A) -> (B, S, A)."""
    if p.dim() == (1 if axes is None else 2):
        p = p.unsqueeze(0)
    return p.expand(B, *p.shape[1:])


def _bool_mask(m: Any, name: str, shape: tuple[int, int]) -> torch.Tensor:
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor (True = attend), got {type(m).__name__} "
                        f"{getattr(m, 'dtype', '')}")
    if tuple(m.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(m.shape)}")
    return m


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    enc: Encoding,
    positions: Any = None,
    key_positions: Any = None,
    causal: bool = True,
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    key_document_ids: torch.Tensor | None = None,
    cache: KVCache | None = None,
    scale: float | None = None,
    allow_bidirectional: bool = False,
    block_size: int = 256,
) -> torch.Tensor:
    """Attention with a positional encoding: ``softmax(c · qᵀ A(t − s) k + b) v``, ``c = logit_scale/√d``.

    ``b`` is the bias the slots carry (``slots_qᵀ A(t − s) slots_k``, ALiBi's ``−m (t − s)``): it
    is added unscaled, as in Press et al.

    Args:
        q: queries ``(batch, heads, q_seq, dim)``; ``dim`` is the encoding's content dim.
        k, v: keys and values ``(batch, kv_heads, k_seq, dim)`` / ``(…, v_dim)``; ``kv_heads``
            divides ``heads`` (grouped-query attention).
        enc: the :class:`~liepos.Encoding`.
        positions: query times ``(q_seq,)`` or ``(batch, q_seq)``, integer or real. Default: the
            last ``q_seq`` key times (bottom-right aligned).
        key_positions: key times ``(k_seq,)`` or ``(batch, k_seq)``. Default ``0 … k_seq − 1``,
            continuing after the cached keys when ``cache`` is given.
        causal: a key is visible to a query when ``s ≤ t`` (by time, not by index). With several
            position axes (an encoding with ``num_axes``; positions ``(…, seq, axes)``) times have no
            total order and causal masks by token order instead (query i of q_seq sees keys
            j ≤ k_seq_total − q_seq + i, cached keys first), as Qwen2-VL does; pass ``attn_mask`` for
            any other visibility.
        attn_mask: optional boolean ``(q_seq, k_seq_total)`` or broadcastable 4-D mask, True = attend.
        key_padding_mask: ``(batch, k_seq)``, True for real tokens, False for padding.
        document_ids / key_document_ids: ``(batch, seq)`` ids for packed sequences; a query sees
            only keys of its own document.
        cache: a :class:`KVCache`; ``k`` and ``v`` are appended to it and attention runs over all
            cached keys.
        scale: the SDPA scale before ``logit_scale`` (default ``1/√(content dim)``, also with slots).
        allow_bidirectional: with ``causal=False``, encodings that are not orthogonal (decay,
            growth, Jordan blocks, ALiBi slots) leave the family because the lag changes sign;
            they are refused unless this is True.
        block_size: queries per block for re-centred encodings and materialised masks.

    Queries with no visible key return zeros.

    The identity it implements, checked against :func:`attention_reference`::

        attention(q, k, v, enc, t, s)[i] = Σ_j softmax_j(c · q_iᵀ exp((t_i − s_j) X) k_j) v_j

    >>> import torch, liepos as lp
    >>> q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    >>> far = torch.arange(5) + 10**6                      # xPos far from 0, re-centred ...
    >>> out = attention(q, k, v, lp.xpos(8), far, far)
    >>> ref = attention_reference(q, k, v, lp.xpos(8), torch.arange(5), torch.arange(5))
    >>> bool(torch.allclose(out, ref))                      # ... equals the lag reference at 0
    True
    """
    if not isinstance(enc, Encoding):
        raise TypeError(f"enc must be a liepos.Encoding, got {type(enc).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, seq, dim), got {tuple(x.shape)}")
    B, H, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must share heads and sequence length")
    if k.shape[-1] != D:
        raise ValueError(f"q has head dim {D} but k has {k.shape[-1]}")
    Hk = k.shape[1]
    if H % Hk:
        raise ValueError(f"key/value heads ({Hk}) must divide query heads ({H}) for grouped-query attention")
    if not causal and enc.needs_recentring and not allow_bidirectional:
        raise ValueError(
            f"bidirectional attention (causal=False) with {enc!r}: its generator is not orthogonal "
            f"(decay, growth, a Jordan block or slots), so A(t - s) for t < s grows instead of fading and "
            f"the encoding leaves the family; pass allow_bidirectional=True to run it anyway"
        )
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    dev = q.device
    axes = getattr(enc, "num_axes", None)  # several position axes: positions (…, seq, axes)

    def _pos(p: Any, n: int, name: str) -> torch.Tensor:
        if axes is None:
            return as_positions(p, n, B, name)
        from liepos.axes import as_axes_positions

        return as_axes_positions(p, n, B, axes, name)

    # ---- times, padding, documents of the new keys
    past = len(cache) if cache is not None else 0
    if key_positions is None:
        kpos = torch.arange(past, past + k.shape[2], dtype=torch.float64)
        if cache is not None and cache.times is not None:
            # continue each row after its own last cached time (several axes: after the largest
            # coordinate, on every axis, as M-RoPE's text after an image)
            last = cache.times.amax(-1, keepdim=True) if axes is None else cache.times.amax((-2, -1))[:, None]
            kpos = last + 1 + torch.arange(k.shape[2], dtype=torch.float64)
        if axes is not None:
            kpos = kpos.unsqueeze(-1).expand(*kpos.shape, axes)
    else:
        kpos = _pos(key_positions, k.shape[2], "key_positions")
    kpos = _expand_batch(kpos, B, axes).to(dev)
    keep = torch.ones(B, k.shape[2], dtype=torch.bool, device=dev)
    if key_padding_mask is not None:
        keep = _bool_mask(key_padding_mask, "key_padding_mask", (B, k.shape[2])).to(dev)
    kdocs = None
    if key_document_ids is not None or document_ids is not None:
        kd = key_document_ids if key_document_ids is not None else document_ids
        if key_document_ids is None and k.shape[2] != Sq:
            raise ValueError("document_ids without key_document_ids needs as many keys as queries")
        if not isinstance(kd, torch.Tensor) or tuple(kd.shape) != (B, k.shape[2]):
            raise ValueError(f"key_document_ids must be a tensor of shape {(B, k.shape[2])}, got "
                             f"{tuple(getattr(kd, 'shape', ()))}")
        kdocs = kd.to(dev)

    # validate everything before the cache is touched: a refused call leaves it unchanged
    Sk = past + k.shape[2]
    if positions is None and Sq > Sk:
        raise ValueError(f"{Sq} queries but only {Sk} keys: pass positions explicitly")
    qpos = None if positions is None else _expand_batch(_pos(positions, Sq, "positions"), B, axes).to(dev)
    qdocs = None
    if document_ids is not None:
        if not isinstance(document_ids, torch.Tensor) or tuple(document_ids.shape) != (B, Sq):
            raise ValueError(f"document_ids must be a tensor of shape {(B, Sq)}, got "
                             f"{tuple(getattr(document_ids, 'shape', ()))}")
        qdocs = document_ids.to(dev)
        if kdocs is None:
            raise ValueError("document_ids for the queries need document ids for the keys")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
            raise TypeError("attn_mask must be a boolean tensor (True = attend)")
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, Sq, Sk))
        except RuntimeError as err:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(B, H, Sq, Sk)}"
            ) from err

    if cache is not None:
        cache.append(k, v, kpos, keep, kdocs)
        k_all, v_all, kpos, keep, kdocs = cache.k, cache.v, cache.times, cache.keep, cache.docs
    else:
        k_all, v_all = k, v
    if qpos is None:
        qpos = kpos[:, Sk - Sq :]

    # ---- the generator for this length (dynamic NTK, longrope, ...)
    length = int(math.floor(max(float(qpos.detach().max()), float(kpos.detach().max())))) + 1
    enc = enc.at_length(length)
    c = (1.0 / math.sqrt(enc.content_dim) if scale is None else float(scale)) * enc.logit_scale
    if enc.num_slots:
        # slots carry an additive bias (ALiBi's -m(t - s)), which is not a temperature: scale the
        # content of q instead of the scores, so the score is c·qᵀA k + slotsᵀA slots
        q = q * c
        c = 1.0

    # ---- grouped queries: keep kv heads when parameters are shared, else expand
    per_head = enc.num_heads is not None
    if per_head and enc.num_heads != H:
        raise ValueError(f"the encoding has per-head parameters for {enc.num_heads} heads but q has {H}")
    if Hk != H and per_head:
        k_all = k_all.repeat_interleave(H // Hk, dim=1)
        v_all = v_all.repeat_interleave(H // Hk, dim=1)
        Hk = H
    gqa = Hk != H

    simple = (
        causal and attn_mask is None and key_padding_mask is None and cache is None
        and document_ids is None and key_document_ids is None and positions is None
        and key_positions is None and Sq == Sk
    )
    # the order the causal mask follows: the times, or with several axes the token order
    qord, kord = qpos, kpos
    if axes is not None:
        kord = torch.arange(Sk, dtype=torch.float64, device=dev).expand(B, Sk)
        qord = kord[:, Sk - Sq :] if Sq <= Sk else torch.arange(Sk - Sq, Sk, dtype=torch.float64, device=dev).expand(B, Sq)
    if not enc.needs_recentring:
        qe = enc.query(q, qpos)
        ke = _cached_keys(enc, k_all, kpos, cache)
        if simple or (not causal and attn_mask is None and key_padding_mask is None and kdocs is None):
            return _sdpa(qe, ke, v_all, None, c, gqa, is_causal=simple)
        return _blocked(qe, ke, v_all, qord, kord, keep, qdocs, kdocs, attn_mask, causal, c, gqa, block_size)

    # ---- re-centred path: one origin per query block
    return _recentred(
        q, k_all, v_all, enc, qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, c, gqa, block_size,
        cache=cache, n_new=k.shape[2], qord=qord, kord=kord,
    )


def _cached_keys(enc: Encoding, k_all: torch.Tensor, kpos: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Encoded keys at absolute times; a cache keeps them per generator version (rotations only)."""
    if cache is None or k_all.shape[1] != cache.k.shape[1]:
        return enc.key(k_all, kpos)
    version = enc.version
    n_old = 0 if cache._enc_k is None or cache._enc_version != version else cache._enc_k.shape[-2]
    if n_old == k_all.shape[-2]:
        return cache._enc_k
    new = enc.key(k_all[..., n_old:, :], kpos[:, n_old:])
    ke = new if n_old == 0 else torch.cat((cache._enc_k, new), dim=-2)
    cache._enc_k, cache._enc_version = ke, version
    return ke


def _sdpa(q, k, v, mask, c, gqa, is_causal=False):
    out_dtype = v.dtype
    if v.dtype != q.dtype:
        # half-precision inputs with slots: encoded q and k stay float32 (bfloat16 cannot hold the
        # slot values t and m·s exactly); values follow and the output is cast back once
        v = v.to(q.dtype)
    if mask is not None and mask.dtype == torch.bool:
        # an additive float mask: SDPA on the CPU is ~100x slower with a boolean mask (torch 2.13)
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, -math.inf)
    if gqa:
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    return Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=c).to(out_dtype)


def _visible(qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, rows: slice, H: int) -> torch.Tensor:
    """Boolean mask (B, 1|H, rows, Sk) for one block of query rows."""
    m = keep[:, None, None, :]  # (B, 1, 1, Sk)
    if causal:
        m = m & (kpos[:, None, None, :] <= qpos[:, None, rows, None])
    if qdocs is not None:
        m = m & (kdocs[:, None, None, :] == qdocs[:, None, rows, None])
    if attn_mask is not None:
        am = attn_mask
        while am.dim() < 4:
            am = am.unsqueeze(0)
        am = am[..., rows, :] if am.shape[-2] != 1 else am
        m = m & am
    return m


def _finish(out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Queries that see no key return zeros instead of NaN."""
    none = ~mask.any(-1, keepdim=True)  # (B, 1|H, rows, 1)
    if bool(none.any()):
        out = torch.where(none, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


def _blocked(qe, ke, v, qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, c, gqa, block_size):
    Sq = qe.shape[2]
    outs = []
    for i in range(0, Sq, block_size):
        rows = slice(i, min(i + block_size, Sq))
        m = _visible(qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, rows, qe.shape[1])
        outs.append(_finish(_sdpa(qe[:, :, rows], ke, v, m, c, gqa), m))
    return torch.cat(outs, dim=2)


def _max_rate(g: Generator) -> float:
    with torch.no_grad():
        return float(g.rates.detach().abs().max()) if g.rates.numel() else 0.0


def _budget(enc: Encoding, dtype: torch.dtype) -> tuple[float, float, float]:
    """(max |λ|, exponent budget, time span allowed for polynomial parts) for re-centring."""
    rate = _max_rate(enc.generator)
    work = torch.float32 if dtype in _LOW else dtype
    # e^{±budget} factors on both sides must stay far inside the dtype's range
    budget = min(_MAX_EXPONENT, math.log(torch.finfo(dtype if dtype == torch.float16 else work).max) / 3)
    poly = enc.plan.has_coupling or enc.num_slots > 0
    return rate, budget, (_POLY_SPAN if poly else math.inf)


def _recentred(q, k, v, enc, qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, c, gqa, block_size,
               cache=None, n_new=0, qord=None, kord=None):
    B, H, Sq, _ = q.shape
    # several axes: positions (B, S, axes), one origin per axis; the mask follows qord/kord
    ax = qpos.dim() == 3
    if qord is None:
        qord, kord = qpos, kpos
    rate, budget, poly_span = _budget(enc, q.dtype)
    if cache is not None and not ax:
        out = _from_cache_origin(q, k, v, enc, qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, c,
                                 gqa, cache, n_new, rate, budget, poly_span)
        if out is not None:
            return out
    sorted_keys = bool((kord[:, 1:] >= kord[:, :-1]).all()) if kord.shape[1] > 1 else True
    outs = []

    def run(lo: int, hi: int) -> None:
        tq = qpos[:, lo:hi]
        o = tq.amax(-2 if ax else -1)  # (B,) or (B, axes): origin per block, the latest query time
        span = float((o - tq.amin(-2 if ax else -1)).detach().max())
        oq = qord[:, lo:hi].amax(-1)  # (B,) the block's last query in mask order
        if hi - lo > 1 and (rate * span > budget or span > poly_span):
            mid = (lo + hi) // 2
            run(lo, mid)
            run(mid, hi)
            return
        rows = slice(lo, hi)
        n_keys = kpos.shape[1]
        if causal and sorted_keys:
            # keys after the block's last query are invisible: leave them out
            n_keys = int(torch.searchsorted(kord.contiguous(), oq.unsqueeze(-1), right=True).max())
            n_keys = max(n_keys, 1)
        kp = kpos[:, :n_keys]
        oo = o.unsqueeze(-2) if ax else o.unsqueeze(-1)
        rel = kp - oo  # (B, n_keys[, axes]), ≤ 0 for every visible key when causal by time
        if causal:
            # invisible future keys are masked anyway; encode them at the origin so they stay finite
            hidden = kord[:, :n_keys] > oq.unsqueeze(-1)  # (B, n_keys)
            rel = torch.where(hidden.unsqueeze(-1) if ax else hidden, torch.zeros_like(rel), rel)
        qe = enc.query(q[:, :, rows], tq - oo)
        ke = enc.key(k[:, :, :n_keys], rel)
        m = _visible(qord, kord[:, :n_keys], keep[:, :n_keys], qdocs, None if kdocs is None else kdocs[:, :n_keys],
                     None if attn_mask is None else attn_mask[..., :n_keys], causal, rows, H)
        outs.append(_finish(_sdpa(qe, ke, v[:, :, :n_keys], m, c, gqa), m))

    for i in range(0, Sq, block_size):
        run(i, min(i + block_size, Sq))
    if cache is not None and not ax:
        _reset_cache_origin(enc, cache, k, kpos, qpos, rate, budget, poly_span)
    return torch.cat(outs, dim=2)


def _within(times: torch.Tensor, origin: torch.Tensor, rate: float, budget: float, poly_span: float) -> bool:
    """Whether every time is close enough to its row's origin for F/G factors to stay finite and exact."""
    if times.numel() == 0:
        return True
    d = float((times - origin.unsqueeze(-1)).detach().abs().max())
    return rate * d <= budget and d <= poly_span


def _reset_cache_origin(enc, cache, k, kpos, qpos, rate, budget, poly_span) -> None:
    """Encode every cached key at a new origin (the latest query time of each row) for later steps."""
    o = qpos.amax(-1)  # (B,)
    ahead = torch.maximum(kpos, o.unsqueeze(-1))  # keys later than the origin grow: bound them
    if not _within(ahead, o, rate, budget, poly_span):
        cache._enc_k, cache._enc_version, cache._origin = None, None, None
        return
    cache._enc_k = enc.key(k, kpos - o.unsqueeze(-1))
    cache._enc_version, cache._origin = enc.version, o


def _from_cache_origin(q, k, v, enc, qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, c, gqa, cache,
                       n_new, rate, budget, poly_span):
    """Decode fast path: keys stay encoded at the cache's origin while the new times remain close to it.

    Old keys are never re-encoded until a query moves ``budget/|λ|`` away from the origin (then every
    key is encoded afresh from the stored raw keys, at the new origin: no transport, no drift).
    """
    o = cache._origin
    if cache._enc_k is None or o is None or cache._enc_version != enc.version or k.shape[1] != cache.k.shape[1]:
        return None
    n_old = cache._enc_k.shape[-2]
    if n_old + n_new != kpos.shape[1]:
        return None
    new_times = kpos[:, n_old:]
    if not (_within(qpos, o, rate, budget, poly_span) and _within(new_times, o, rate, budget, poly_span)):
        return None
    ke = torch.cat((cache._enc_k, enc.key(k[:, :, n_old:], new_times - o.unsqueeze(-1))), dim=-2)
    cache._enc_k = ke
    qe = enc.query(q, qpos - o.unsqueeze(-1))
    m = _visible(qpos, kpos, keep, qdocs, kdocs, attn_mask, causal, slice(None), q.shape[1])
    return _finish(_sdpa(qe, ke, v, m, c, gqa), m)


# ---------------------------------------------------------------------- reference
def _block_generators(g: Generator) -> list[tuple[Generator, int, int]]:
    out = []
    for i, (n, cplx, off, w) in enumerate(zip(g.sizes, g.complex, g.offsets, g.widths)):
        sub = Generator(
            g.rates[..., i : i + 1], g.freqs[..., i : i + 1], [n], complex=[cplx], allow_growth=True
        )
        out.append((sub, off, w))
    return out


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    enc: Encoding,
    positions: Any = None,
    key_positions: Any = None,
    causal: bool = True,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Float64 reference: scores ``qᵀ exp((t − s) X) k`` from the lags, one closed-form block at a time.

    Independent of the fast path: no tables, no F/G factorisation, no re-centring; only
    :meth:`Generator.exp` of each block at the lags ``u = t − s``. Memory ``O(q_seq · k_seq · heads)``
    per block; meant for tests and small inputs. ``mask``: optional boolean (B|1, H|1, Sq, Sk).
    """
    B, H, Sq, D = q.shape
    Hk = k.shape[1]
    if Hk != H:
        k = k.repeat_interleave(H // Hk, dim=1)
        v = v.repeat_interleave(H // Hk, dim=1)
    Sk = k.shape[2]
    qp = _expand_batch(as_positions(positions, Sq, B, "positions") if positions is not None
                       else torch.arange(Sk - Sq, Sk, dtype=torch.float64), B)
    kp = _expand_batch(as_positions(key_positions, Sk, B, "key_positions"), B)
    c = (1.0 / math.sqrt(enc.content_dim) if scale is None else scale) * enc.logit_scale
    q64, k64, v64 = q.double() * c, k.double(), v.double()  # the slots below are not scaled
    n = enc.num_slots
    if n:
        qs = enc.query_slots.double().reshape(1, -1, 1, n).expand(B, H, Sq, n)
        ks = enc.key_slots.double().reshape(1, -1, 1, n).expand(B, H, Sk, n)
        q64, k64 = torch.cat((q64, qs), -1), torch.cat((k64, ks), -1)
    # canonical coordinates: storage index perm[c] holds canonical c
    perm = enc.plan.perm
    q64, k64 = q64.index_select(-1, perm), k64.index_select(-1, perm)
    lags = qp[:, :, None] - kp[:, None, :]  # (B, Sq, Sk)
    g = enc.generator
    scores = torch.zeros(B, H, Sq, Sk, dtype=torch.float64)
    if g.basis is not None:
        A = g.exp(lags)  # (B, Sq, Sk, *heads, d, d)
        if g.num_heads is None:
            A = A.unsqueeze(3)
        A = A.permute(0, 3, 1, 2, 4, 5)  # (B, H, Sq, Sk, d, d)
        scores = torch.einsum("bhtd,bhtsde,bhse->bhts", q64, A, k64)
    else:
        for sub, off, w in _block_generators(g):
            A = sub.exp(lags)  # (B, Sq, Sk, *heads, w, w)
            if sub.num_heads is None:
                A = A.unsqueeze(3)
            A = A.permute(0, 3, 1, 2, 4, 5)  # (B, H, Sq, Sk, w, w)
            qb, kb = q64[..., off : off + w], k64[..., off : off + w]
            scores = scores + torch.einsum("bhtd,bhtsde,bhse->bhts", qb, A, kb)
    vis = torch.ones(B, 1, Sq, Sk, dtype=torch.bool)
    if causal:
        vis = vis & (lags >= 0).unsqueeze(1)
    if mask is not None:
        vis = vis & mask
    scores = scores.masked_fill(~vis, -math.inf)
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return w @ v64
