"""Faded keys: per head, the keys past a decay's fade taken as one key of score 0 (their count and mean value).

Where every block of a head keeps norms up to its fade (decay dims, damped rotation planes), a key further
back than the head's window scores within a rounding of 0 whatever the data; queries then see the few
blocks of keys before them as tiles and every earlier key as one key of weight their count carrying
their mean value (:func:`tiled_or_faded`), linear in the sequence past the fade. Heads whose window
reaches past a quarter of the sequence (:data:`WINDOW_SHARE`) keep the tiled triangle
(:mod:`liepos.causal_tiling`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial

import torch

from liepos.attention_call import LOW, Call, row_norms
from liepos.attention_pieces import Arena, Rows, Tile, made, row_source, slot
from liepos.causal_tiling import FLASH_ROWS, diagonal_budget, fade_rates, fading_bound, tile_plan, tile_size, tiled
from liepos.encoding import Encoding
from liepos.origin_budget import allowed

__all__ = ["tiled_or_faded", "FADE_ROWS", "WINDOW_SHARE"]

# rows of the faded path's query blocks at most (its near tiles pair blocks of this many queries and keys)
FADE_ROWS = 128
# a head takes the faded path when its window of key blocks spans at most this share of the sequence: its
# cost, T (m + 1) n_b scores in small tiles of one head's own calls, must undercut the tiled triangle's T²/2 by
# half (RetNet, 8 heads, dim 64, float32, 2 threads, T = 2048: head 0's window of 768 keys faded, 1.30× causal
# SDPA; the whole triangle tiled, 1.16–1.20×; at T = 4096, 1.11× and 1.04×; from T = 8192 on, within 2 %)
WINDOW_SHARE = 0.25


def _fade_plan(call: Call, b) -> tuple[int, dict[int, list[int]], list[int]] | None:
    """``(rows per block, {m: heads}, heads seen whole)`` when some head's keys fade out within the
    sequence, else None.

    Head ``h`` scores a key at lag ``d`` at most ``c |q̃_t| |k̃_s| ≤ c Q_h K_h e^{−r_h d}`` (``Q_h``,
    ``K_h``: the largest query and key norms of the head; every block keeps norms up to its fade, so
    encoded norms are the raw ones). Past ``W_h = log(c Q_h K_h / δ) / r_h`` every score is within
    ``δ`` (:data:`~liepos.attention_pieces.CLEAR_LOGIT`) of 0: such a key weighs ``e^0`` to a relative
    ``δ``, whatever the data. Query blocks of ``n_b`` rows see the ``m_h = ⌈W_h / n_b⌉`` blocks before
    them as keys and every earlier key as score 0 (:func:`_faded`); a head whose window reaches past
    :data:`WINDOW_SHARE` of the sequence keeps the tiled triangle."""
    rmin = fade_rates(call.enc)
    q, k = call.q, call.k
    B, H, T, _ = q.shape
    if rmin is None or float(rmin.max()) <= 0 or T < 4 * FLASH_ROWS:
        return None
    ramp = torch.arange(T, dtype=call.qpos.dtype, device=call.qpos.device)
    if not torch.equal(call.qpos - call.qpos[:, :1], ramp.expand(B, T)):
        return None
    from liepos.attention_pieces import CLEAR_LOGIT

    delta = CLEAR_LOGIT.get(q.dtype)
    if delta is None:
        return None
    size = tile_size(allowed(diagonal_budget(b, q.dtype)), T)
    rows = size if size < FLASH_ROWS else min(FADE_ROWS, size)
    # every SAMPLE-th row first: its norms bound the largest from below, so windows from them are at most the
    # true ones; when even those reach past the share for every head, no head fades (one pass saved)
    sampled = _windows(call, rmin, q[:, :, ::SAMPLE], k[:, :, ::SAMPLE], delta)
    if all(not math.isfinite(w) or max(1, math.ceil(w / rows)) * rows > WINDOW_SHARE * T for w in sampled):
        return None
    groups: dict[int, list[int]] = {}
    whole: list[int] = []
    for h, w in enumerate(_windows(call, rmin, q, k, delta)):
        m = max(1, math.ceil(w / rows)) if math.isfinite(w) else None
        if m is None or m * rows > WINDOW_SHARE * T:
            whole.append(h)
        else:
            groups.setdefault(m, []).append(h)
    return (rows, groups, whole) if groups else None


# the stride of the rows whose norms are read first (:func:`_fade_plan`)
SAMPLE = 16


def _windows(call: Call, rmin: torch.Tensor, q: torch.Tensor, k: torch.Tensor, delta: float) -> list[float]:
    """Per head, the lag ``W_h = log(c Q_h K_h / δ) / r_h`` past which every score of the head is within ``δ`` of
    0 (``Q_h``, ``K_h``: the largest norms of the rows of ``q`` and ``k`` given; inf for a head that does not fade)."""
    H = q.shape[1]
    with torch.no_grad():
        qn = row_norms(q).amax((0, 2)).double()  # (H,)
        kn = row_norms(k).amax((0, 2)).double()  # (Hk,)
        kn = kn.repeat_interleave(H // kn.shape[0])  # (H,)
        # room for the float32 norms and the encoding's rounding
        reach = torch.log((call.c * qn * kn * (1 + 1e-3) / delta).clamp_min(1.0))  # (H,)
        r = rmin.expand(H) if rmin.numel() == 1 else rmin
        W = torch.where(r > 0, reach / r.clamp_min(1e-300), torch.full_like(reach, math.inf))  # (H,)
    if k.shape[1] != H:  # grouped keys under a shared encoding: one window for every head
        W = W.amax().expand(H)
    return W.tolist()


# sub-encodings of a head subset by (encoding version, heads): built once per parameter state
_HEADS: dict[tuple, Encoding] = {}


def _heads(call: Call, hs: list[int]) -> Call:
    """The call restricted to the query heads ``hs`` (keys and values of the same heads when there are as
    many, else all of them; a per-head encoding's parameters of those heads)."""
    H = call.q.shape[1]
    if hs == list(range(H)):
        return call
    enc, g = call.enc, call.enc.generator
    if g.num_heads is not None:
        key = (enc.version, tuple(hs))
        learned = torch.is_grad_enabled() and (g.rates.requires_grad or g.freqs.requires_grad)
        sub = None if learned else _HEADS.get(key)
        if sub is None:
            sub = enc.replace(generator=g.with_params(rates=g.rates[hs], freqs=g.freqs[hs]))
            if not learned:
                if len(_HEADS) >= 64:
                    _HEADS.pop(next(iter(_HEADS)))
                _HEADS[key] = sub
        enc = sub
    same = call.k.shape[1] == H
    sinks = None if call.sinks is None else call.sinks[hs]
    return dataclasses.replace(call, q=take_heads(call.q, hs), enc=enc, sinks=sinks,
                               k=take_heads(call.k, hs) if same else call.k,
                               v=take_heads(call.v, hs) if same else call.v)


def take_heads(x: torch.Tensor, hs: list[int]) -> torch.Tensor:
    """The heads ``hs`` of ``x (B, H, T, ·)``: a view where they are a run ``h0, h0 + 1, …`` (no copy of the rows the
    tiles read again), else ``index_select``'s copy."""
    if hs == list(range(hs[0], hs[0] + len(hs))):
        return x[:, hs[0] : hs[0] + len(hs)]  # (B, len(hs), T, ·)
    return x.index_select(1, torch.tensor(hs, device=x.device))


def tiled_or_faded(call: Call, b) -> torch.Tensor | None:
    """:func:`_faded` for the heads whose keys fade within the sequence (per head: RetNet's fast heads
    get short windows), :func:`tiled` for the rest; None when the times are not a unit range."""
    plan = _fade_plan(call, b)
    if plan is None:
        return tiled(call, b)
    rows, groups, whole = plan
    parts = [(hs, _faded(_heads(call, hs), m, rows)) for m, hs in sorted(groups.items())]
    if whole:
        rest = tiled(_heads(call, whole), b)
        if rest is None:  # the fade plan checked the same unit range of times
            raise RuntimeError("faded keys: the heads kept whole have no tiling of their times")
        parts.append((whole, rest))
    order = [h for hs, _ in parts for h in hs]
    out = torch.cat([y for _, y in parts], dim=1)  # (B, H, T, Dv) in the order of the parts
    if order == sorted(order):
        return out
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return out.index_select(1, inverse.to(out.device))


def _faded(call: Call, m: int, n_b: int) -> torch.Tensor:
    """Causal attention over times ``t₀ + 0 … T − 1`` whose keys further back than ``m`` blocks of
    ``n_b`` rows score 0 to within :data:`~liepos.attention_pieces.CLEAR_LOGIT` (:func:`_fade_plan`).

    Three kinds of tiles, merged per row: the diagonal blocks (middle origin, causal); for each block
    distance ``d = 1 … m`` the queries of block ``i`` with the keys of block ``i − d`` at the origin
    ``p_i`` (the block's first query: ``F(t − p_i)`` and ``G(s − p_i)`` both fades, at least
    ``e^{−r(m + 1) n_b}`` on the slowest block); and every earlier key as one key of score 0 and weight
    their count (a per-key mask ``log n``) carrying their mean value (exact prefix sums in float64). Cost
    ``T (m + 1) n_b``: linear in ``T`` past the fade."""
    q, k, v, enc = call.q, call.k, call.v, call.enc
    B, H, T, D = q.shape
    n, rest = divmod(T, n_b)
    blocks = Rows(0, n, n_b, 0, n_b)
    last = Rows(n * n_b, 1, rest, 0, rest) if rest else None
    diag, _ = tile_plan(T, n_b)

    def key_blocks(d: int, tail: bool) -> Rows:  # the keys of block i − d for the queries of block i
        return Rows((n - d) * n_b, 1, n_b, 0, n_b) if tail else Rows(0, n - d, n_b, 0, n_b)

    # each tile's rows of q, k and v (for a gradient, as one autograd node per tensor: :func:`row_source`)
    krows = [dg[0] for dg in diag] + [key_blocks(d, t) for d in range(1, m + 1) for t in (False, True) if rest or not t]
    qs = row_source(q, [dg[0] for dg in diag] + [blocks] + ([last] if last is not None else []))
    ks, vs = row_source(k, krows), row_source(v, krows)
    qe = enc._span(qs(blocks), 0, "query", fade=True).unflatten(0, (B, n))  # (B, n, H, n_b, D): t − p_i ≥ 0
    work = torch.float32 if q.dtype in LOW else q.dtype

    bound = fading_bound(call)  # every block fades here (the plan's condition): the near tiles' thresholds

    def diagonal(rows: Rows, o: int, arena: Arena | None = None) -> Tile:  # within the diagonal budget: not cleared
        qd = enc._span(qs(rows), -o, "query", into=slot(arena, "q", q.device))
        kd = enc._span(ks(rows), -o, "key", into=slot(arena, "k", q.device))
        return Tile(rows, qd, kd, vs(rows), True, first=True, clean=True)

    def tail_queries(arena: Arena | None) -> torch.Tensor:  # the last, partial block's queries at its p_i
        return enc._span(qs(_last(last)), 0, "query", fade=True, into=slot(arena, "q", q.device))

    def near(d: int, tail: bool, arena: Arena | None = None) -> Tile:  # queries of block i, keys of block i − d, at p_i
        kb = key_blocks(d, tail)
        ke = enc._span(ks(kb), -d * n_b, "key", into=slot(arena, "k", q.device))  # s − p_i ∈ [−d n_b, −(d − 1) n_b)
        if tail:
            return Tile(_last(last), tail_queries(arena), ke, vs(kb), False, bound=bound)
        return Tile(Rows(d * n_b, n - d, n_b, 0, n_b), qe[:, d:].flatten(0, 1), ke, vs(kb), False, bound=bound)

    sums = v[:, :, : n * n_b].double().unflatten(2, (n, n_b)).sum(3).cumsum(2)  # (B, Hk, n, Dv): Σ_{s<(j+1)n_b}

    def far(tail: bool, arena: Arena | None = None) -> Tile:  # every key before block i − m: score 0, weight 1 each
        j = torch.arange(n - m - 1, device=q.device) if not tail else torch.tensor([n - m - 1], device=q.device)
        counts = ((j + 1) * n_b).double()  # (J,): keys s < (i − m) n_b
        mean = (sums[:, :, j] / counts.view(1, 1, -1, 1)).to(v.dtype)  # (B, Hk, J, Dv)
        J = j.numel()
        vt = mean.movedim(2, 1).flatten(0, 1).unsqueeze(2)  # (B·J, Hk, 1, Dv)
        bias = counts.log().to(work).view(1, J, 1, 1, 1).expand(B, J, H, 1, 1).flatten(0, 1)  # (B·J, H, 1, 1)
        kt = q.new_zeros(B * J, v.shape[1], 1, D)
        if tail:
            return Tile(_last(last), tail_queries(arena), kt, vt, False, bias=bias)
        return Tile(Rows((m + 1) * n_b, n - m - 1, n_b, 0, n_b), qe[:, m + 1 :].flatten(0, 1), kt, vt, False,
                    bias=bias)

    makers: list[Callable[..., Tile]] = [partial(diagonal, *dg) for dg in diag]
    g = enc.generator
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                           for x in (q, k, v, call.sinks, g.rates, g.freqs))
    if WINDOWED and m > 1 and not grad:  # streamed: a window of the m blocks of keys before each query block
        makers += _window_makers(call, qe, m, n_b, work, bound, (_last(last), tail_queries) if rest else None)
    else:
        makers += [partial(near, d, False) for d in range(1, m + 1)] + [partial(near, d, True) for d in range(1, m + 1)
                                                                        if rest]
    if n - m - 1 > 0:
        makers.append(partial(far, False))
    if rest and n - m - 1 >= 0:
        makers.append(partial(far, True))
    return made((B, H, T), makers, call.c, call.sinks)


# the faded path's near keys as one tile per query block of the m blocks before it (False: a tile per block distance,
# the form the gradient takes; `benchmarks/ab.py windowed-keys`), the windows' encoded keys of one flash call within
# WINDOW_BYTES (a window holds m blocks of keys: m times the keys of a tile per distance)
WINDOWED, WINDOW_BYTES = True, 32 << 20


def _window_makers(call: Call, qe: torch.Tensor, m: int, n_b: int, work: torch.dtype,
                   bound: tuple[float, float] | None, tail: tuple[Rows, Callable] | None) -> list[Callable[..., Tile]]:
    """:func:`_faded`'s near tiles as windows: query blocks ``1 … n − 1`` (``qe (B, n, H, n_b, D)``, encoded at their
    first queries) over the ``m`` blocks of keys before each (:func:`_key_windows`), as many blocks per tile as keep
    its encoded keys within :data:`WINDOW_BYTES`; ``tail``: the last, partial block's rows and its queries' maker."""
    k, n = call.k, qe.shape[1]
    wk, wv, wb = _key_windows(k, call.v, n, m, n_b, work)
    per = max(1, WINDOW_BYTES // (k.shape[0] * k.shape[1] * m * n_b * k.shape[-1] * k.element_size()))
    makers: list[Callable[..., Tile]] = []
    for a in range(1, n, per):  # blocks a … b − 1
        b = min(n, a + per)
        makers.append(partial(_window_tile, call.enc, Rows(a * n_b, b - a, n_b, 0, n_b), partial(_blocks_of, qe, a, b),
                              wk(slice(a, b)), wv(slice(a, b)), wb(slice(a, b)), -m * n_b, bound))
    if tail is not None:
        makers.append(partial(_window_tile, call.enc, tail[0], tail[1], wk(slice(n, n + 1)), wv(slice(n, n + 1)),
                              wb(slice(n, n + 1)), -m * n_b, bound))
    return makers


def _blocks_of(qe: torch.Tensor, a: int, b: int, arena: Arena | None = None) -> torch.Tensor:
    """Query blocks ``a … b − 1`` of ``qe (B, n, H, n_b, D)`` as a tile's batch ``(B·(b − a), H, n_b, D)``."""
    return qe[:, a:b].flatten(0, 1)


def _key_windows(k: torch.Tensor, v: torch.Tensor, n: int, m: int, n_b: int, work: torch.dtype) -> tuple:
    """For query blocks ``i`` of ``n_b`` rows, the keys and values of blocks ``i − m … i − 1`` as windows of ``m·n_b``
    rows: functions of a slice of ``i`` (``1 ≤ i ≤ n``, block ``n`` being the last, partial one) giving the keys and
    values ``(B·count, Hk, m·n_b, ·)`` (views of ``k`` and ``v`` after ``m·n_b`` rows of zeros, overlapping from window
    to window; copies when ``B > 1``) and the per-key bias ``(B·count, 1, 1, m·n_b)``: 0, or −inf on the rows before
    time 0 (blocks ``i < m`` see only ``i`` blocks of keys). Window ``i`` row ``j`` is key ``(i − m)·n_b + j``."""
    B, Hk, T, _ = k.shape
    W = m * n_b
    kp = torch.cat([k.new_zeros(B, Hk, W, k.shape[-1]), k[:, :, : n * n_b]], 2)  # (B, Hk, W + n·n_b, D)
    vp = torch.cat([v.new_zeros(B, Hk, W, v.shape[-1]), v[:, :, : n * n_b]], 2)  # (B, Hk, W + n·n_b, Dv)
    start = torch.arange(n + 1, device=k.device).unsqueeze(-1) * n_b + torch.arange(W, device=k.device)  # (n+1, W)
    bias = torch.zeros(n + 1, W, dtype=work, device=k.device).masked_fill_(start < W, -math.inf)  # (n + 1, W)

    def windows(x: torch.Tensor, sl: slice) -> torch.Tensor:  # (B, Hk, W + n·n_b, ·) -> (B·count, Hk, W, ·)
        st = x.stride()
        count = len(range(n + 1)[sl])
        y = x.as_strided((B, Hk, count, W, x.shape[-1]), (st[0], st[1], n_b * st[2], st[2], st[3]),
                         x.storage_offset() + sl.start * n_b * st[2])  # (B, Hk, count, W, ·): window i at row i·n_b
        return y.movedim(2, 1).flatten(0, 1)  # (B·count, Hk, W, ·)

    def biases(sl: slice) -> torch.Tensor:
        b = bias[sl]  # (count, W)
        return b.view(1, -1, 1, 1, W).expand(B, -1, 1, 1, W).flatten(0, 1)  # (B·count, 1, 1, W)

    return partial(windows, kp), partial(windows, vp), biases


def _window_tile(enc: Encoding, rows: Rows, queries: Callable[[Arena | None], torch.Tensor], keys: torch.Tensor,
                 values: torch.Tensor, bias: torch.Tensor, p0: int, bound: tuple[float, float] | None,
                 arena: Arena | None = None) -> Tile:
    """The tile of query blocks ``rows`` (encoded at their first time ``p_i``: ``queries(arena)``) over the windows of
    keys before them (:func:`_key_windows`), each window encoded at ``s − p_i = p0 … −1``, the same times for every
    block; ``bias``: −inf on a window's rows before time 0."""
    qe = queries(arena)  # (B·count, H, w, D)
    ke = enc._span(keys, p0, "key", into=slot(arena, "k", keys.device))  # (B·count, Hk, W, D)
    return Tile(rows, qe, ke, values, False, bound=bound, bias=bias.expand(-1, qe.shape[1], 1, -1))


def _last(rows: Rows | None) -> Rows:
    """The last, partial block of queries, which a tail tile needs (there whenever the times leave a rest)."""
    if rows is None:
        raise RuntimeError("faded keys: a tail tile without a last, partial block of queries")
    return rows
