"""Re-centring: every score of a query block evaluated relative to one origin, so every factor stays finite.

Encodings whose F and G grow with absolute time (decay, damped rotation, Jordan blocks, ALiBi's slots)
are applied as ``F(t − o)`` and ``G(s − o)`` with ``o`` an origin per query block; scores do not change
(``F(t − o)ᵀ G(s − o) = A(t − s)``). The general path takes ``o`` the latest query time of the block
(causally ``s − o ≤ 0`` for every visible key) and halves a block while ``|λ| · span`` would leave the
exponent budget or the polynomial parts would span more than :data:`POLY_SPAN` time units. The fused
path (equal, strictly increasing times) puts ``o`` in the block's middle, so a block covers twice that
span at the same bounds. Over a unit range of times (``t₀ + 0, 1, …``) it tiles the causal triangle
(:mod:`liepos.causal_tiling`): only the diagonal blocks keep the middle origin; every other
tile puts its origin between its keys and its queries (``s < p ≤ t``), where decays are ``≤ 1`` on
both sides and a Jordan block's binomial terms share their sign, so a tile may be as wide as half the
triangle. Under a linear bias (ALiBi) the blocks stay, and leave out, per head, the keys whose weight
is below the dtype's smallest normal times its rounding (:mod:`liepos.key_windows`). Values carried by a
generator follow the same origin: ``A_v(t − o) · Σ_s w_ts G_v(s − o) v_s = Σ_s w_ts A_v(t − s) v_s``.

A cache keeps its keys (and values) encoded at one origin, in its :class:`~liepos.cache.EncodedKeys`
store; a decode step encodes the new key only and appends it, until a query moves past the store's span
(then every key is encoded afresh from the raw keys, at a new origin: no transport, no drift).

This module is the dispatch (:func:`recentred`): the general path block by block, the fused path's
middle-origin blocks and the cache's origin; the budget, the tiling, the faded keys, the linear bias
and its key windows are modules of their own (:mod:`liepos.origin_budget`, :mod:`liepos.causal_tiling`,
:mod:`liepos.faded_keys`, :mod:`liepos.lag_bias`, :mod:`liepos.key_windows`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as Fn

from liepos.attention_call import Call, row_norms
from liepos.attention_pieces import available, fresh, pieces, pieces_by_heads, pieces_per_group, raw_clearing
from liepos.attention_sdpa import sdpa
from liepos.causal_tiling import FLASH_ROWS, tile_plan
from liepos.faded_keys import tiled_or_faded
from liepos.key_windows import window_starts
from liepos.lag_bias import bias_mask, constant_bias, key_bias, linear_bias, linear_bias_slopes
from liepos.masks import finish, visible
from liepos.origin_budget import (MAX_EXPONENT, POLY_ROUNDING, POLY_SPAN, allowed, budget, origin_span, poly_span,
                                  within)

# the dispatch lives here; the pieces it dispatches to are re-exported where callers have always read them
__all__ = ["takes_fused_bias", "recentred", "bias_mask", "constant_bias", "linear_bias", "origin_span", "MAX_EXPONENT",
           "POLY_SPAN", "POLY_ROUNDING", "poly_span", "tile_plan"]


def _attend(call: Call, qe, ke, ve, m, o, tq) -> torch.Tensor:
    """Attention of encoded queries over encoded keys, then ``A_v(t − o)`` on the output."""
    y = finish(sdpa(qe, ke, ve, m, call.c, sinks=call.sinks, finite=call.finite), m)
    if call.venc is not None:
        y = call.venc.key(y, o.unsqueeze(-1) - tq)  # A_v(t - o) = G_v(o - t)
    return y


def takes_fused_bias(call: Call) -> bool:
    """Whether :func:`recentred` attends the call on the fused linear-bias path (ALiBi's slots as the flash
    kernel's per-key mask, q and k of the content's head size), which reads a :attr:`Call.lazy` call's
    bfloat16 q, k, v as they are; the one decision :func:`liepos.attention` takes before the dispatch (every
    other call is widened there)."""
    return (call.cache is None and call.venc is None and call.enc.needs_recentring and call.simple
            and call.qpos.dim() == 2 and available(call.q) and linear_bias_slopes(call) is not None
            and constant_bias(call.enc, call.qpos, call.kpos))


def recentred(call: Call) -> torch.Tensor:
    """Attention with one origin per query block (re-centred encodings)."""
    ax = call.qpos.dim() == 3  # several axes: positions (B, S, axes), one origin per axis
    b = budget(call)
    if call.cache is not None and not ax:
        out = _from_cache_origin(call)
        if out is not None:
            return out
    if call.simple and not ax and available(call.q):
        slopes = linear_bias_slopes(call)
        out = tiled_or_faded(call, b) if slopes is None and call.venc is None else None
        if out is None:
            out = _blockwise(call, b, slopes)
        if call.cache is not None:
            _reset_cache_origin(call, b)
        return out
    sorted_keys = call.kord.shape[1] < 2 or bool((call.kord[:, 1:] >= call.kord[:, :-1]).all())
    outs: list[torch.Tensor] = []
    Sq = call.q.shape[2]
    for i in range(0, Sq, call.block_size):
        _run(call, i, min(i + call.block_size, Sq), ax, sorted_keys, b, outs)
    if call.cache is not None and not ax:
        _reset_cache_origin(call, b)
    return torch.cat(outs, dim=2)


def _run(call: Call, lo: int, hi: int, ax: bool, sorted_keys: bool, b, outs: list) -> None:
    """One query block ``lo:hi``, halved while it spans too much time for one origin."""
    rate, limit, poly_span = b
    tq = call.qpos[:, lo:hi]
    o = tq.amax(-2 if ax else -1)  # (B,) or (B, axes): origin per block, the latest query time
    span = float((o - tq.amin(-2 if ax else -1)).detach().max())
    if hi - lo > 1 and (rate * span > limit or span > poly_span):
        mid = (lo + hi) // 2
        _run(call, lo, mid, ax, sorted_keys, b, outs)
        _run(call, mid, hi, ax, sorted_keys, b, outs)
        return
    oq = call.qord[:, lo:hi].amax(-1)  # (B,) the block's last query in mask order
    n_keys = call.kpos.shape[1]
    if call.causal and sorted_keys:
        # keys after the block's last query are invisible: leave them out
        n_keys = int(torch.searchsorted(call.kord.contiguous(), oq.unsqueeze(-1), right=True).max())
        n_keys = max(n_keys, 1)
    oo = o.unsqueeze(-2) if ax else o.unsqueeze(-1)  # (B, 1, axes) or (B, 1)
    rel = call.kpos[:, :n_keys] - oo  # (B, n_keys[, axes]), ≤ 0 for every visible key when causal by time
    if call.causal:
        # invisible future keys are masked anyway; encode them at the origin so they stay finite
        hidden = call.kord[:, :n_keys] > oq.unsqueeze(-1)  # (B, n_keys)
        rel = torch.where(hidden.unsqueeze(-1) if ax else hidden, torch.zeros_like(rel), rel)
    qe = call.enc.query(call.q[:, :, lo:hi], tq - oo)
    ke = call.enc.key(call.k[:, :, :n_keys], rel)
    ve = call.v[:, :, :n_keys]
    if call.venc is not None:
        ve = call.venc.key(ve, rel)  # G_v(s - o) v
    m = visible(*call.mask_args(slice(lo, hi), n_keys))
    outs.append(_attend(call, qe, ke, ve, m, o, tq))


# query blocks of the re-centred path hold a whole multiple of the flash kernel's row blocks (but the last), which it
# runs markedly faster (ALiBi at T = 2048: blocks of 1025 and 1023 rows became 1024 and 1024:
# ``benchmarks/ab.py block-rows``)
BLOCK_ROWS = FLASH_ROWS


def _blocks(call: Call, b) -> list[tuple[int, int, torch.Tensor]]:
    """Greedy query blocks ``(lo, hi, origin)`` of increasing times, the origin in the block's middle.

    Every time of a block is within the allowed span of its origin (``|t − o| ≤ allowed``), so a
    block covers twice that span: e^{±|λ|·allowed} on both sides, and the polynomial parts span
    ``allowed`` on each side of ``o`` (keys before the block lie on the far side of every query after
    ``o``, where the binomial terms of ``(t − o)`` and ``(o − s)`` share their sign). Integer times
    keep an integer origin, so the positions ``s − o`` stay integer ranges (cached tables). A block of at least
    :data:`BLOCK_ROWS` rows but the last is cut to a whole multiple of them.
    """
    span = allowed(b)
    t = call.qpos.contiguous()  # (B, Sq), strictly increasing
    integer = bool((t == t.round()).all())
    reach = 2 * math.floor(span) if integer and math.isfinite(span) else 2 * span
    out, lo, Sq = [], 0, t.shape[1]
    while lo < Sq:
        if math.isinf(span):
            hi = Sq
        else:
            ends = torch.searchsorted(t, t[:, lo : lo + 1] + reach, right=True)  # (B, 1)
            hi = max(lo + 1, int(ends.min()))
            if BLOCK_ROWS <= hi - lo < Sq - lo:  # a whole multiple of the flash kernel's row blocks, but for the last
                hi = lo + (hi - lo) // BLOCK_ROWS * BLOCK_ROWS
        first, last = t[:, lo : lo + 1], t[:, hi - 1 : hi]  # (B, 1)
        half = (last - first) / 2
        o = first + (half.ceil() if integer else half)  # (B, 1): within `span` of every time of the block
        out.append((lo, hi, o))
        lo = hi
    return out


def _blockwise(call: Call, b, slopes: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The fused path block by block (values carried by a generator, a linear bias' windows).

    Under a linear bias whose slots need no gradient, q and k keep their content dims only and the
    bias rides as the flash kernel's per-key mask (:func:`key_bias`): the head size stays the
    content's (ALiBi: 64, not 66 with the slot columns, which alone costs ~1.15× in the kernel).
    """
    Dv = call.v.shape[-1]
    bias = slopes is not None and constant_bias(call.enc, call.qpos, call.kpos)
    D = call.enc.content_dim if bias else call.enc.dim
    narrow = call.venc is None and Dv < D
    if narrow:  # ALiBi's slots widen q and k: widen v once with zero columns, not every piece
        call = dataclasses.replace(call, v=Fn.pad(call.v, (0, D - Dv)))  # (B, Hk, Sk, D)
    knorm = None
    if slopes is not None:
        with torch.no_grad():  # every key's norm, once: each block's window reads its prefix
            knorm = row_norms(call.k)  # (B, Hk, Sk)
    # NoPE content under the bias (ALiBi's): tiles that read rows of q and k as they are take one pass over each
    # (once, on the first such block) for every tile's clearing bound, and whether it would change anything at all
    Dk = max(D, call.v.shape[-1])
    raw = functools.cache(lambda: raw_clearing(call.q, call.k, call.c, Dk)) if bias else None
    out = torch.cat([_diagonal(call, lo, hi, o, slopes, knorm, bias, raw) for lo, hi, o in _blocks(call, b)], dim=2)
    return out[..., :Dv] if narrow else out


# a call of its own costs a block of queries about as much as this many more (query, key) pairs of one head: heads
# whose windows differ by fewer keys share a call, the later start lowered to the earlier (ALiBi at T = 2048 on two
# threads: heads 0 and 1 in one call of their earlier keys, not two: ``benchmarks/ab.py head-groups``)
MERGE_PAIRS = 1 << 19


def head_groups(starts: list[int], rows: int) -> list[tuple[int, int, int]]:
    """Adjacent heads ``[h0, h1)`` sharing one flash call and its first key, from each head's first key ``starts``
    (:func:`window_starts`) for a block of ``rows`` queries: runs of equal starts, then neighbouring runs merged
    while the keys the merge adds (each head of a run from its own start back to the group's earliest, times
    ``rows``) stay under :data:`MERGE_PAIRS`. A key a head's window leaves out weighs nothing any row can see, so
    a head may take more keys than its window, never fewer: the merged group starts at its earliest start."""
    runs: list[list[int]] = []  # [h0, h1, start]
    for h, st in enumerate(starts):
        if runs and runs[-1][2] == st:
            runs[-1][1] = h + 1
        else:
            runs.append([h, h + 1, st])
    groups = [runs[0]]
    for h0, h1, st in runs[1:]:
        g0, g1, gs = groups[-1]
        low = min(gs, st)
        added = sum(starts[h] - low for h in range(g0, h1)) * rows
        if added < MERGE_PAIRS:
            groups[-1] = [g0, h1, low]
        else:
            groups.append([h0, h1, st])
    return [(g0, g1, gs) for g0, g1, gs in groups]


def _diagonal(call: Call, lo: int, hi: int, o: torch.Tensor, slopes: tuple[torch.Tensor, torch.Tensor] | None,
              knorm: torch.Tensor | None, bias: bool,
              raw: Callable[[], tuple[tuple[float, float], bool] | None] | None = None) -> torch.Tensor:
    """Equal, strictly increasing query and key times: the block ``lo:hi`` sees every key before it
    (no mask) and its own keys causally (``is_causal``), two fused kernels merged exactly.

    ``o (B, 1)``: the block's origin, in its middle; keys after it grow (by at most the factor the
    budget allows) and only the diagonal piece sees them, where the causal kernel overwrites every
    masked score (an overflow there is never read). ``slopes``: a linear bias (ALiBi), whose keys
    far before the block are left out per head (:func:`window_starts`, from the keys' norms ``knorm``);
    ``bias``: it rides as a per-key mask (:func:`key_bias`) on the content dims, not in slot columns. ``raw``:
    :func:`~liepos.attention_pieces.raw_clearing` of the call's q and k (computed once), taken where the block's
    tiles read them as they are."""
    tq = call.qpos[:, lo:hi]
    enc = call.enc
    qe = enc._content(call.q[:, :, lo:hi], tq - o, "query") if bias else enc.query(call.q[:, :, lo:hi], tq - o)
    starts = None if slopes is None or knorm is None or lo == 0 else window_starts(call, qe, lo, slopes[0], knorm)
    first = 0 if starts is None else min(starts)
    rel = call.kpos[:, first:hi] - o  # (B, hi - first): every key the block may weigh
    ke = enc._content(call.k[:, :, first:hi], rel, "key") if bias else enc.key(call.k[:, :, first:hi], rel)
    ve = call.v[:, :, first:hi] if call.venc is None else call.venc.key(call.v[:, :, first:hi], rel)
    beta, sinks = key_bias(call, slopes, rel, tq, o) if bias and slopes is not None else (None, call.sinks)
    if beta is not None and call.content_dtype is not None:
        # only the slots needed float32, and they ride as the float32 mask: the flash kernel reads the
        # content (rotations, which keep norms) in the caller's bfloat16, rounded once here
        qe, ke, ve = qe.to(call.content_dtype), ke.to(call.content_dtype), ve.to(call.content_dtype)
    cut = lo - first

    def before(hs: slice, a: int) -> tuple:  # the heads' keys a … cut − 1 (before the block)
        return ke[:, hs, a:cut], ve[:, hs, a:cut], False, None if beta is None else beta[:, hs, :, a:cut]

    own = (ke[:, :, cut:], ve[:, :, cut:], True, None if beta is None else beta[:, :, :, cut:])  # the block's keys
    r = None if raw is None or fresh(qe, call.q) or fresh(ke, call.k) else raw()
    bound, clean = (None, False) if r is None else r
    groups = [(0, qe.shape[1], first)] if starts is None else head_groups(starts, hi - lo)
    if len(groups) == 1:
        y = pieces(qe, [before(slice(None), groups[0][2] - first), own], call.c, sinks, bound, clean)
    else:
        # per-head windows (keys per head: a per-head bias has its keys repeated to every head), the heads of a group
        # (adjacent: ALiBi's slopes fall with the head) sharing the call of their earlier keys, as views. Streamed, the
        # block's own keys are one call over every head (a call per group of an odd head count splits its causal row
        # blocks unevenly over the threads); under a gradient each group takes its share of them
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qe, ke, ve, beta, sinks))
        attend = pieces_per_group if grad else pieces_by_heads
        y = attend(qe, own, [(h0, h1, before(slice(h0, h1), start - first)) for h0, h1, start in groups], call.c,
                   sinks, bound, clean)
    if call.venc is not None:
        y = call.venc.key(y, o - tq)  # A_v(t - o) = G_v(o - t)
    return y




def _version(call: Call) -> tuple:
    return ("origin", call.enc.version, None if call.venc is None else call.venc.version, call.q.dtype)


def _reset_cache_origin(call: Call, b) -> None:
    """Encode every cached key (and value) afresh at a new origin, the latest query time of each row."""
    store = call.cached().encoded
    o = call.qpos.amax(-1)  # (B,)
    ahead = torch.maximum(call.kpos, o.unsqueeze(-1))  # keys later than the origin grow: bound them
    if call.k.shape[1] != call.cached().held()[0].shape[1] or not within(ahead, o, b):
        store.clear()
        return
    rel = call.kpos - o.unsqueeze(-1)  # (B, Sk)
    keys = {"k": call.enc.key(call.k, rel)}
    if call.venc is not None:
        keys["v"] = call.venc.key(call.v, rel)
    store.reencode(_version(call), o, allowed(b), **keys)


def _from_cache_origin(call: Call) -> torch.Tensor | None:
    """Decode fast path: keys stay encoded at the cache's origin while the new times remain within its span."""
    store = call.cached().encoded
    o = store.origin
    if o is None or store.version != _version(call) or call.k.shape[1] != call.cached().held()[0].shape[1]:
        return None
    n_old = len(store)
    if n_old + call.n_new != call.kpos.shape[1]:
        return None
    new_times = call.kpos[:, n_old:]
    if not (store.within(call.qpos) and store.within(new_times)):
        return None
    rel = new_times - o.unsqueeze(-1)  # (B, n_new)
    new = {"k": call.enc.key(call.k[:, :, n_old:], rel)}
    if call.venc is not None:
        new["v"] = call.venc.key(call.v[:, :, n_old:], rel)
    store.append(**new)
    ve = call.v if call.venc is None else store.get("v")
    qe = call.enc.query(call.q, call.qpos - o.unsqueeze(-1))
    m = visible(*call.mask_args(slice(None)))
    return _attend(call, qe, store.get("k"), ve, m, o, call.qpos)
