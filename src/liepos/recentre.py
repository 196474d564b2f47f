"""Re-centring: every score of a query block evaluated relative to one origin, so every factor stays finite.

Encodings whose F and G grow with absolute time (decay, damped rotation, Jordan blocks, ALiBi's slots)
are applied as ``F(t − o)`` and ``G(s − o)`` with ``o`` an origin per query block; scores do not change
(``F(t − o)ᵀ G(s − o) = A(t − s)``). The general path takes ``o`` the latest query time of the block
(causally ``s − o ≤ 0`` for every visible key) and halves a block while ``|λ| · span`` would leave the
exponent budget or the polynomial parts would span more than :data:`POLY_SPAN` time units. The fused
path (equal, strictly increasing times) puts ``o`` in the block's middle, so a block covers twice that
span at the same bounds. Over a unit range of times (``t₀ + 0, 1, …``) it tiles the causal triangle
(:func:`tile_plan`, :func:`_tiled`): only the diagonal blocks keep the middle origin; every other
tile puts its origin between its keys and its queries (``s < p ≤ t``), where decays are ``≤ 1`` on
both sides and a Jordan block's binomial terms share their sign, so a tile may be as wide as half the
triangle. Under a linear bias (ALiBi) the blocks stay, and leave out, per head, the keys whose weight
is below the dtype's smallest normal times its rounding (:func:`_window_starts`). Values carried by a
generator follow the same origin: ``A_v(t − o) · Σ_s w_ts G_v(s − o) v_s = Σ_s w_ts A_v(t − s) v_s``.

A cache keeps its keys (and values) encoded at one origin, in its :class:`~liepos.cache.EncodedKeys`
store; a decode step encodes the new key only and appends it, until a query moves past the store's span
(then every key is encoded afresh from the raw keys, at a new origin: no transport, no drift).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from functools import partial

import torch
import torch.nn.functional as Fn

from liepos.attention_call import LOW, Call
from liepos.attention_pieces import Rows, Tile, available, made, pieces
from liepos.attention_sdpa import sdpa
from liepos.encoding import Encoding
from liepos.masks import finish, visible

__all__ = ["recentred", "bias_mask", "constant_bias", "linear_bias", "origin_span", "MAX_EXPONENT", "POLY_SPAN", "poly_span"]

# largest |λ|·(time span of a query block) allowed, so e^{|λ| span} stays far from overflow
MAX_EXPONENT = 30.0
# largest time span of the polynomial parts (Jordan blocks, slots) around one origin: binomial terms
# of (t - o) and (s - o) cancel, so the span bounds the rounding of near-lag scores; 512 is where
# ALiBi's degree-one slots in float32 meet POLY_ROUNDING (span · eps = 2^9 · 2^-23)
POLY_SPAN = 512.0
# relative rounding allowed from that cancellation: a Jordan block of degree n (size n + 1) computed in
# a dtype of unit roundoff eps loses about span^n · eps, so the span is at most (POLY_ROUNDING / eps)^(1/n)
POLY_ROUNDING = 2.0**-14


def _max_rate(enc: Encoding | None) -> float:
    if enc is None:
        return 0.0
    with torch.no_grad():
        r = enc.generator.rates
        return float(r.detach().abs().max()) if r.numel() else 0.0


def _limit(dtype: torch.dtype) -> float:
    """The exponent budget for inputs of ``dtype``: e^{±budget} factors on both sides stay far inside its range."""
    work = torch.float32 if dtype in LOW else dtype
    return min(MAX_EXPONENT, math.log(torch.finfo(dtype if dtype == torch.float16 else work).max) / 3)


def budget(call: Call) -> tuple[float, float, float]:
    """(max |λ|, exponent budget, time span allowed for polynomial parts) of the call's encodings."""
    rate = max(_max_rate(call.enc), _max_rate(call.venc))
    dtype = call.q.dtype
    work = torch.float32 if dtype in LOW else dtype
    return rate, _limit(dtype), poly_span(call.enc, work) if call.venc is None else min(
        poly_span(call.enc, work), poly_span(call.venc, work))


def origin_span(enc: Encoding, dtype: torch.dtype) -> float:
    """The largest ``|t − o|`` of a query or key around one origin for ``enc`` on inputs of ``dtype``:
    ``min(limit / max |λ|, poly span)``, the :func:`budget` of a call with this encoding as one number
    (a cache store's span, :class:`liepos.cache.EncodedKeys`)."""
    work = torch.float32 if dtype in LOW else dtype
    return _span((enc.generator.bounds()[0], _limit(dtype), poly_span(enc, work)))


def _span(b: tuple[float, float, float]) -> float:
    """The largest ``|t − o|`` the budget ``b`` allows around one origin: a cache store's span."""
    rate, limit, span = b
    return min(limit / rate if rate > 0 else math.inf, span)


def poly_span(enc: Encoding, work: torch.dtype) -> float:
    """The time span one origin may cover for the polynomial parts of ``enc`` computed in ``work``:
    ``min(POLY_SPAN, (POLY_ROUNDING / eps)^(1/n))`` for a largest Jordan block of degree ``n`` (slots: degree
    one) in a dtype of unit roundoff ``eps``, where the cancelling binomial terms of ``(t − o)`` and ``(s − o)``
    keep near-lag scores within ``POLY_ROUNDING``; infinite when ``enc`` has neither coupling nor slots."""
    if not (enc.plan.has_coupling or enc.num_slots):
        return math.inf
    degree = max(enc.generator.sizes) - 1
    return min(POLY_SPAN, (POLY_ROUNDING / torch.finfo(work).eps) ** (1.0 / max(degree, 1)))


def _within(times: torch.Tensor, origin: torch.Tensor, b: tuple[float, float, float]) -> bool:
    """Whether every time is close enough to its row's origin for F/G factors to stay finite and exact."""
    if times.numel() == 0:
        return True
    rate, limit, poly_span = b
    d = float((times - origin.unsqueeze(-1)).detach().abs().max())
    return rate * d <= limit and d <= poly_span


def _attend(call: Call, qe, ke, ve, m, o, tq) -> torch.Tensor:
    """Attention of encoded queries over encoded keys, then ``A_v(t − o)`` on the output."""
    y = finish(sdpa(qe, ke, ve, m, call.c, sinks=call.sinks, finite=call.finite), m)
    if call.venc is not None:
        y = call.venc.key(y, o.unsqueeze(-1) - tq)  # A_v(t - o) = G_v(o - t)
    return y


def recentred(call: Call) -> torch.Tensor:
    """Attention with one origin per query block (re-centred encodings)."""
    ax = call.qpos.dim() == 3  # several axes: positions (B, S, axes), one origin per axis
    b = budget(call)
    if call.cache is not None and not ax:
        out = _from_cache_origin(call)
        if out is not None:
            return out
    if call.simple and not ax and available(call.q):
        slopes = _linear_bias_slopes(call)
        out = _tiled_or_faded(call, b) if slopes is None and call.venc is None else None
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


def _blocks(call: Call, b) -> list[tuple[int, int, torch.Tensor]]:
    """Greedy query blocks ``(lo, hi, origin)`` of increasing times, the origin in the block's middle.

    Every time of a block is within the allowed span of its origin (``|t − o| ≤ allowed``), so a
    block covers twice that span: e^{±|λ|·allowed} on both sides, and the polynomial parts span
    ``allowed`` on each side of ``o`` (keys before the block lie on the far side of every query after
    ``o``, where the binomial terms of ``(t − o)`` and ``(o − s)`` share their sign). Integer times
    keep an integer origin, so the positions ``s − o`` stay integer ranges (cached tables).
    """
    allowed = _allowed(b)
    t = call.qpos.contiguous()  # (B, Sq), strictly increasing
    integer = bool((t == t.round()).all())
    reach = 2 * math.floor(allowed) if integer and math.isfinite(allowed) else 2 * allowed
    out, lo, Sq = [], 0, t.shape[1]
    while lo < Sq:
        if math.isinf(allowed):
            hi = Sq
        else:
            ends = torch.searchsorted(t, t[:, lo : lo + 1] + reach, right=True)  # (B, 1)
            hi = max(lo + 1, int(ends.min()))
        first, last = t[:, lo : lo + 1], t[:, hi - 1 : hi]  # (B, 1)
        half = (last - first) / 2
        o = first + (half.ceil() if integer else half)  # (B, 1): within `allowed` of every time of the block
        out.append((lo, hi, o))
        lo = hi
    return out


def _allowed(b: tuple[float, float, float]) -> float:
    """How far from its origin a time may lie: the exponent budget over the rate, and the polynomial span."""
    rate, limit, poly_span = b
    return min(limit / rate if rate > 0 else math.inf, poly_span)


def tile_plan(T: int, size: int) -> tuple[list[tuple[Rows, int]], list[tuple[Rows, Rows]]]:
    """The causal triangle of ``T`` rows cut into diagonal blocks of ``size`` rows and off-diagonal tiles.

    Diagonal: ``(rows, origin offset)`` per family of equal blocks (the origin ``offset = ⌊w / 2⌋`` rows
    into each block of ``w`` rows, its middle: every row within ``⌊w / 2⌋`` of it). Off-diagonal, a
    binary tiling: at level ℓ (half-width ``S = size·2^ℓ``) every node of ``2S`` rows pairs its second
    half's queries with its first half's keys, ``(query rows, key rows)``, the origin at the first
    query. Every pair ``s < t`` outside a diagonal block lies in exactly one tile; ``T log(T / size)``
    rows are encoded in all, not ``T² / size``.
    """
    diag, off = [], []
    full = T // size
    if full:
        diag.append((Rows(0, full, size, 0, size), size // 2))
    rest = T - full * size
    if rest:
        diag.append((Rows(full * size, 1, rest, 0, rest), rest // 2))
    S = size
    while S < T:
        n = T // (2 * S)  # whole nodes of 2S rows
        if n:
            off.append((Rows(0, n, 2 * S, S, 2 * S), Rows(0, n, 2 * S, 0, S)))
        start = n * 2 * S
        if T - start > S:  # the last node, its second half cut short
            w = T - start - S
            off.append((Rows(start + S, 1, w, 0, w), Rows(start, 1, S, 0, S)))
        S *= 2
    return diag, off


# the CPU flash kernel cuts queries in blocks of 32 (short sequences) and runs a whole multiple of 32
# rows markedly faster (float32, 8 heads, dim 64, 2048 rows as blocks of 30 / 32 / 119 / 128: 6.1 /
# 3.9 / 10.2 / 9.1 ms): diagonal blocks are a multiple of it when the span allows
FLASH_ROWS = 32


# largest |λ|·|t − o| of a tiled diagonal block: a query factor e^{−λ(t − o)} and a key factor
# e^{λ(s − o)} each ≥ e^{−22} ≈ 2^-31.7, so every product the kernel forms of them, e^{−λ(t − s)}, is at
# least 2^-63.5 times the raw entries' product: a normal float32 / bfloat16 number (no microcode assist)
DIAGONAL_EXPONENT = 22.0


def _diagonal_budget(b: tuple[float, float, float], dtype: torch.dtype) -> tuple[float, float, float]:
    """The budget of a tiled diagonal block: its factors ``e^{±λ|t − o|}`` may reach
    :data:`DIAGONAL_EXPONENT` (at most the square root of the dtype's range) instead of the cube root of
    the range. Only the causal kernel reads them, and it overwrites every masked score (``s > t``, where
    ``F(t − o)ᵀ G(s − o)`` grows) before the softmax, while every visible product is at most the true
    ``e^{−λ(t − s)}`` and at least ``e^{−44}``: neither factor nor product is a subnormal number. The
    general path adds its mask and keeps the cube root."""
    rate, _, poly_span = b
    work = dtype if dtype in (torch.float16, torch.float64, torch.float32) else torch.float32
    return rate, min(DIAGONAL_EXPONENT, math.log(torch.finfo(work).max) / 2), poly_span


def _tile_size(allowed: float, T: int) -> int:
    """Rows of a diagonal block: at most ``2⌊allowed⌋ + 1`` (every time within ``allowed`` of the middle
    origin). Below :data:`FLASH_ROWS` that; else the multiple of it giving the fewest flash calls (families
    of equal tiles, :func:`tile_plan`), the larger on a tie: each family encodes up to ``T`` rows of q and
    k and merges them once (T = 2048, decay at rate 1/2: blocks of 128 give 5 families, 96 gave 9)."""
    if not math.isfinite(allowed):
        return T
    top = 2 * math.floor(allowed) + 1
    return top if top < FLASH_ROWS or top >= T else _fewest_calls(top, T)


@functools.lru_cache(maxsize=256)
def _fewest_calls(top: int, T: int) -> int:
    def calls(w: int) -> int:
        diag, off = tile_plan(T, w)
        return len(diag) + len(off)

    return min(range(FLASH_ROWS, top + 1, FLASH_ROWS), key=lambda w: (calls(w), -w))


def _tiled(call: Call, b) -> torch.Tensor | None:
    """Equal times ``t₀ + 0, 1, …, T − 1`` (per batch row): diagonal blocks with their origin in their
    middle, and the rest of the causal triangle in tiles whose origin lies *between* their keys and their
    queries (``s < p ≤ t``), one flash call per family of equal tiles, merged per row (:func:`made`).

    With ``s ≤ p ≤ t`` every factor of ``F(t − p)ᵀ G(s − p) = A(t − s)`` is a decay ``≤ 1`` (an
    underflow drops a term below the dtype's smallest normal), and a Jordan block's binomial terms of
    ``(t − p)`` and ``(p − s)`` share their sign, so the product rounds like ``A(t − s)`` itself: a tile
    may be as large as the triangle. Only the diagonal blocks are bounded by the span of one origin
    (:func:`_diagonal_budget`); one block may hold them all. None when the times are not such a range.
    """
    q, k, v, enc = call.q, call.k, call.v, call.enc
    B, H, T, _ = q.shape
    t = call.qpos
    ramp = torch.arange(T, dtype=t.dtype, device=t.device)
    size = min(T, _tile_size(_allowed(_diagonal_budget(b, q.dtype)), T))  # T: one causal block
    if not torch.equal(t - t[:, :1], ramp.expand(B, T)):
        return None
    diag, off = tile_plan(T, size)

    def diagonal(rows: Rows, o: int) -> Tile:
        rel = ramp[: rows.width] - o  # the block's times from its origin
        return Tile(rows, enc.query(rows.gather(q), rel), enc.key(rows.gather(k), rel), rows.gather(v), True,
                    first=True)

    def between(rq: Rows, rk: Rows) -> Tile:
        qe = enc._query_after(rq.gather(q), ramp[: rq.width])  # t − p ≥ 0
        ke = enc.key(rk.gather(k), ramp[: rk.width] - rk.width)  # s − p < 0
        return Tile(rq, qe, ke, rk.gather(v), False)

    makers = [partial(diagonal, *d) for d in diag] + [partial(between, *t) for t in off]
    return made((B, H, T), makers, call.c, call.sinks)


def _blockwise(call: Call, b, slopes: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The fused path block by block (values carried by a generator, a linear bias' windows).

    Under a linear bias whose slots need no gradient, q and k keep their content dims only and the
    bias rides as the flash kernel's per-key mask (:func:`_key_bias`): the head size stays the
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
            knorm = call.k.detach().float().norm(dim=-1)  # (B, Hk, Sk)
    out = torch.cat([_diagonal(call, lo, hi, o, slopes, knorm, bias) for lo, hi, o in _blocks(call, b)], dim=2)
    return out[..., :Dv] if narrow else out


def constant_bias(enc: Encoding, *times: torch.Tensor) -> bool:
    """Whether the slots' bias may be read once as numbers (the kernel's mask has no gradient): nothing
    asks for one, neither the slots and generator nor the ``times`` (learned positions)."""
    g = enc.generator
    params = (enc.query_slots, enc.key_slots, g.rates, g.freqs, g.nus, *times)
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in params))


def bias_mask(slopes: torch.Tensor, rel: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-key part ``m_h (s − o)`` of a linear bias as the flash kernel's additive mask
    ``(B, H, 1, S)`` from the slopes ``(H,)`` and the keys' times from the origin ``rel (B, S)``, in the
    type the kernel reads with queries of ``dtype`` (float32 for half precision, else that dtype)."""
    work = torch.float32 if dtype in LOW else dtype
    return (slopes.view(1, -1, 1, 1) * rel.unsqueeze(1).unsqueeze(1)).to(work)  # (H,) ⊗ (B, S) -> (B, H, 1, S)


def _key_bias(call: Call, slopes: tuple[torch.Tensor, torch.Tensor], rel: torch.Tensor, tq: torch.Tensor,
              o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear bias ``b_h − m_h (t − s)`` split at the origin: ``m_h (s − o)`` per key, the flash
    kernel's additive mask ``(B, H, 1, S)`` (float32 for half precision), and ``r = b_h − m_h (t − o)``
    per row, which softmax does not see; only a sink does, so its logit becomes ``s_h − r`` per row
    ``(B, H, Sq)`` (None without sinks)."""
    m, b0 = slopes  # (H,) float64
    beta = bias_mask(m, rel, call.q.dtype)  # (B, H, 1, S)
    if call.sinks is None:
        return beta, None
    r = b0.view(1, -1, 1) - m.view(1, -1, 1) * (tq - o).unsqueeze(1)  # (B, H, Sq) float64
    s = call.sinks.float() if call.sinks.dtype in LOW else call.sinks  # r spans ±m·allowed: not in bfloat16
    return beta, s.view(1, -1, 1) - r.to(s.dtype)


def _diagonal(call: Call, lo: int, hi: int, o: torch.Tensor, slopes: tuple[torch.Tensor, torch.Tensor] | None,
              knorm: torch.Tensor | None, bias: bool) -> torch.Tensor:
    """Equal, strictly increasing query and key times: the block ``lo:hi`` sees every key before it
    (no mask) and its own keys causally (``is_causal``), two fused kernels merged exactly.

    ``o (B, 1)``: the block's origin, in its middle; keys after it grow (by at most the factor the
    budget allows) and only the diagonal piece sees them, where the causal kernel overwrites every
    masked score (an overflow there is never read). ``slopes``: a linear bias (ALiBi), whose keys
    far before the block are left out per head (:func:`_window_starts`, from the keys' norms ``knorm``);
    ``bias``: it rides as a per-key mask (:func:`_key_bias`) on the content dims, not in slot columns."""
    tq = call.qpos[:, lo:hi]
    enc = call.enc
    qe = enc._content(call.q[:, :, lo:hi], tq - o, "query") if bias else enc.query(call.q[:, :, lo:hi], tq - o)
    starts = None if slopes is None or knorm is None or lo == 0 else _window_starts(call, qe, lo, slopes[0], knorm)
    first = 0 if starts is None else min(starts)
    rel = call.kpos[:, first:hi] - o  # (B, hi - first): every key the block may weigh
    ke = enc._content(call.k[:, :, first:hi], rel, "key") if bias else enc.key(call.k[:, :, first:hi], rel)
    ve = call.v[:, :, first:hi] if call.venc is None else call.venc.key(call.v[:, :, first:hi], rel)
    beta, sinks = _key_bias(call, slopes, rel, tq, o) if bias and slopes is not None else (None, call.sinks)
    cut = lo - first

    def parts(hs: slice, a: int) -> list[tuple]:
        bb = (None, None) if beta is None else (beta[:, hs, :, a:cut], beta[:, hs, :, cut:])
        return [(ke[:, hs, a:cut], ve[:, hs, a:cut], False, bb[0]), (ke[:, hs, cut:], ve[:, hs, cut:], True, bb[1])]

    def head_sinks(hs: slice) -> torch.Tensor | None:
        return None if sinks is None else sinks[hs] if sinks.dim() == 1 else sinks[:, hs]

    if starts is None or all(st == first for st in starts):
        y = pieces(qe, parts(slice(None), 0), call.c, sinks)
    else:
        # per-head windows (keys per head: a per-head bias has its keys repeated to every head);
        # heads in a run of equal starts (ALiBi's slopes fall with the head) share one call, as views
        y = torch.empty(*qe.shape[:-1], ve.shape[-1], dtype=qe.dtype, device=qe.device)
        h0, H = 0, len(starts)
        for h1 in range(1, H + 1):
            if h1 < H and starts[h1] == starts[h0]:
                continue
            hs = slice(h0, h1)
            y[:, hs] = pieces(qe[:, hs], parts(hs, starts[h0] - first), call.c, head_sinks(hs))
            h0 = h1
    if call.venc is not None:
        y = call.venc.key(y, o - tq)  # A_v(t - o) = G_v(o - t)
    return y


# slopes by (encoding version, heads): read once per parameter state, not per call (a few ms each)
_SLOPES: dict[tuple, tuple[torch.Tensor, torch.Tensor] | None] = {}


def _linear_bias_slopes(call: Call) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`linear_bias` of the call's encoding at its query heads (None with values carried by a generator)."""
    if call.venc is not None or call.q.shape[0] == 0:
        return None
    return linear_bias(call.enc, call.q.shape[1])


def linear_bias(enc: Encoding, heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-head slopes ``m_h > 0`` and offsets ``b_h`` ``(heads,)`` float64 when every score is
    ``content + b_h − m_h (t − s)`` with orthogonal content (rotations or identity, which keep norms)
    and slots carrying a bias of degree one in the lag, as ALiBi's do; else None. The bias is read from
    the slots at lags 0 and 1 in float64, once per version of the encoding (its parameters' storages
    and in-place versions)."""
    if not enc.num_slots or enc.generator.basis is not None:
        return None
    key = (enc.version, heads)
    if key not in _SLOPES:
        if len(_SLOPES) >= 64:
            _SLOPES.pop(next(iter(_SLOPES)))
        _SLOPES[key] = _read_slopes(enc, heads)
    return _SLOPES[key]


def _read_slopes(enc: Encoding, H: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    g = enc.generator
    rates, freqs = g.rates.detach().reshape(-1, g.num_blocks), g.freqs.detach().reshape(-1, g.num_blocks)
    for i, (n, off) in enumerate(zip(g.sizes, g.offsets)):
        slot = off >= enc.content_dim
        if bool((rates[:, i] != 0).any()) or n > (2 if slot else 1) or (slot and bool((freqs[:, i] != 0).any())):
            return None
    with torch.no_grad():
        z = torch.zeros(1, H, 2, enc.content_dim, dtype=torch.float64)
        qs = enc.query(z, torch.tensor([0.0, 1.0], dtype=torch.float64))[..., enc.content_dim:]  # (1, H, 2, slots)
        ks = enc.key(z[:, :, :1], torch.tensor([0.0], dtype=torch.float64))[..., enc.content_dim:]  # (1, H, 1, slots)
        b = (qs * ks).sum(-1)[0]  # (H, 2): the bias at lags 0 and 1
    m = b[:, 0] - b[:, 1]  # (H,)
    return (m, b[:, 0]) if bool(torch.isfinite(b).all()) else None


# the weight a left-out key may have, relative to its row's largest, is below e^-(_DROP + log Sk): past
# the dtype's smallest normal times its unit roundoff, so leaving it out changes no output by a rounding
def _drop(dtype: torch.dtype, n_keys: int) -> float:
    info = torch.finfo(dtype)
    return -math.log(info.tiny) - math.log(info.eps) + math.log(max(n_keys, 1))


def _window_starts(call: Call, qe: torch.Tensor, lo: int, slopes: torch.Tensor, knorm: torch.Tensor) -> list[int]:
    """Per head, the first key the block ``lo:hi`` (``hi = lo + qe.shape[2]``) can weigh at all under a linear bias.

    Scores are ``c q̃ᵀk̃ + b − m d`` at lag ``d``, and ``|c q̃ᵀk̃| ≤ c |q̃||k|`` (orthogonal content: encoded
    norms are the raw ones). Every query ``t`` of the block sees its own key (equal times) and the
    nearest earlier key ``lo − 1``, so its row's largest score is at least ``b − low`` with
    ``low = min(C_own, C_near + m (t_last − s_{lo−1}))``: ``C_own`` from the block's own keys' norms,
    ``C_near`` from key ``lo − 1``'s, ``t_last`` the block's last query time. A key ``s`` before the block
    scores at most ``C_before + b − m (t₀ − s)`` (``t₀`` the block's first query time, ``C_before`` from
    the norms of the keys before it). Keys with ``m (t₀ − s) > C_before + low + _drop`` weigh less than
    the dtype's smallest normal times its rounding, relative to their row's largest, for any data: they
    are left out, exactly. Per batch row, the earliest start over the batch. ``knorm (B, Hk, Sk)``:
    every key's norm (float32), computed once per call.
    """
    D = call.enc.content_dim
    hi = lo + qe.shape[2]
    with torch.no_grad():
        H = qe.shape[1]
        qn = qe[..., :D].detach().float().norm(dim=-1).amax(2).double()  # (B, H): the block's largest query

        def per_head(kn: torch.Tensor) -> torch.Tensor:  # (B, Hk) -> (B, H), with room for the rounding
            return qn * kn.double().repeat_interleave(H // kn.shape[1], dim=1) * call.c * (1 + 1e-4)

        before = per_head(knorm[:, :, :lo].amax(2))  # (B, H)
        own = per_head(knorm[:, :, lo:hi].amax(2))  # (B, H)
        near = per_head(knorm[:, :, lo - 1])  # (B, H)
        m = slopes.clamp_min(0).view(1, -1)  # (1, H)
        gap = call.qpos[:, hi - 1 : hi] - call.kpos[:, lo - 1 : lo]  # (B, 1): the nearest earlier key's lag
        low = torch.minimum(own, near + m * gap)  # (B, H): the row's largest score is at least b − low
        reach = (before + low + _drop(qe.dtype, call.kpos.shape[1])) / m  # (B, H): lags that may weigh
        t0 = call.qpos[:, lo : lo + 1]  # (B, 1): the block's earliest query time
        cut = (t0 - reach).nan_to_num(-math.inf)  # (B, H)
        kp = call.kpos[:, :lo].contiguous()
        first = torch.searchsorted(kp, cut.contiguous(), side="left").amin(0)  # (H,): earliest over the batch
    return [int(x) for x in first]


def _version(call: Call) -> tuple:
    return ("origin", call.enc.version, None if call.venc is None else call.venc.version)


def _reset_cache_origin(call: Call, b) -> None:
    """Encode every cached key (and value) afresh at a new origin, the latest query time of each row."""
    store = call.cached().encoded
    o = call.qpos.amax(-1)  # (B,)
    ahead = torch.maximum(call.kpos, o.unsqueeze(-1))  # keys later than the origin grow: bound them
    if call.k.shape[1] != call.cached().held()[0].shape[1] or not _within(ahead, o, b):
        store.clear()
        return
    rel = call.kpos - o.unsqueeze(-1)  # (B, Sk)
    keys = {"k": call.enc.key(call.k, rel)}
    if call.venc is not None:
        keys["v"] = call.venc.key(call.v, rel)
    store.reencode(_version(call), o, _span(b), **keys)


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
    ve = call.v if call.venc is None else store.part("v")
    qe = call.enc.query(call.q, call.qpos - o.unsqueeze(-1))
    m = visible(*call.mask_args(slice(None)))
    return _attend(call, qe, store.part("k"), ve, m, o, call.qpos)


# ---------------------------------------------------------------------------------------------- faded keys
# rows of the faded path's query blocks at most (its near tiles pair blocks of this many queries and keys)
FADE_ROWS = 128


def _fade_rates(enc: Encoding) -> torch.Tensor | None:
    """Per head, the slowest decay ``r_h`` ``(H,)`` (or ``(1,)`` when shared), float64, when every block
    keeps norms up to its fade (decay dims and damped rotation planes: ``|A(u) x| ≤ e^{−r u} |x|``); else
    None. A head with a block that does not fade has ``r_h ≤ 0``."""
    g = enc.generator
    if (enc.num_slots or g.basis is not None or g.num_axes is not None or enc.plan.has_coupling
            or enc.query_scale is not None
            or any(n > 2 or (n == 2 and not c) for n, c in zip(g.sizes, g.complex))):
        return None
    with torch.no_grad():
        return (-g.rates.detach().double().reshape(-1, g.num_blocks)).amin(-1)  # (H or 1,)


def _fade_plan(call: Call, b) -> tuple[int, dict[int, list[int]], list[int]] | None:
    """``(rows per block, {m: heads}, heads seen whole)`` when some head's keys fade out within the
    sequence, else None.

    Head ``h`` scores a key at lag ``d`` at most ``c |q̃_t| |k̃_s| ≤ c Q_h K_h e^{−r_h d}`` (``Q_h``,
    ``K_h``: the largest query and key norms of the head; every block keeps norms up to its fade, so
    encoded norms are the raw ones). Past ``W_h = log(c Q_h K_h / δ) / r_h`` every score is within
    ``δ`` (:data:`~liepos.attention_pieces.CLEAR_LOGIT`) of 0: such a key weighs ``e^0`` to a relative
    ``δ``, whatever the data. Query blocks of ``n_b`` rows see the ``m_h = ⌈W_h / n_b⌉`` blocks before
    them as keys and every earlier key as score 0 (:func:`_faded`); a head whose window reaches past
    half the sequence keeps the tiled triangle."""
    rmin = _fade_rates(call.enc)
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
    size = _tile_size(_allowed(_diagonal_budget(b, q.dtype)), T)
    rows = size if size < FLASH_ROWS else min(FADE_ROWS, size)
    with torch.no_grad():
        qn = q.detach().float().norm(dim=-1).amax((0, 2)).double()  # (H,)
        kn = k.detach().float().norm(dim=-1).amax((0, 2)).double()  # (Hk,)
        kn = kn.repeat_interleave(H // kn.shape[0])  # (H,)
        # room for the float32 norms and the encoding's rounding
        reach = torch.log((call.c * qn * kn * (1 + 1e-3) / delta).clamp_min(1.0))  # (H,)
        r = rmin.expand(H) if rmin.numel() == 1 else rmin
        W = torch.where(r > 0, reach / r.clamp_min(1e-300), torch.full_like(reach, math.inf))  # (H,)
    if k.shape[1] != H:  # grouped keys under a shared encoding: one window for every head
        W = W.amax().expand(H)
    groups: dict[int, list[int]] = {}
    whole: list[int] = []
    for h, w in enumerate(W.tolist()):
        m = max(1, math.ceil(w / rows)) if math.isfinite(w) else None
        if m is None or m * rows > T // 2:
            whole.append(h)
        else:
            groups.setdefault(m, []).append(h)
    return (rows, groups, whole) if groups else None


# sub-encodings of a head subset by (encoding version, heads): built once per parameter state
_HEADS: dict[tuple, Encoding] = {}


def _heads(call: Call, hs: list[int]) -> Call:
    """The call restricted to the query heads ``hs`` (keys and values of the same heads when there are as
    many, else all of them; a per-head encoding's parameters of those heads)."""
    H = call.q.shape[1]
    if hs == list(range(H)):
        return call
    idx = torch.tensor(hs, device=call.q.device)
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
    return dataclasses.replace(call, q=call.q.index_select(1, idx), enc=enc, sinks=sinks,
                               k=call.k.index_select(1, idx) if same else call.k,
                               v=call.v.index_select(1, idx) if same else call.v)


def _tiled_or_faded(call: Call, b) -> torch.Tensor | None:
    """:func:`_faded` for the heads whose keys fade within the sequence (per head: RetNet's fast heads
    get short windows), :func:`_tiled` for the rest; None when the times are not a unit range."""
    plan = _fade_plan(call, b)
    if plan is None:
        return _tiled(call, b)
    rows, groups, whole = plan
    parts = [(hs, _faded(_heads(call, hs), m, rows)) for m, hs in sorted(groups.items())]
    if whole:
        parts.append((whole, _tiled(_heads(call, whole), b)))
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
    ramp = torch.arange(max(T, n_b), dtype=torch.float64, device=q.device)
    blocks = Rows(0, n, n_b, 0, n_b)
    last = Rows(n * n_b, 1, rest, 0, rest) if rest else None
    qe = enc._query_after(blocks.gather(q), ramp[:n_b]).unflatten(0, (B, n))  # (B, n, H, n_b, D): t − p_i ≥ 0
    work = torch.float32 if q.dtype in LOW else q.dtype

    def diagonal(rows: Rows, o: int) -> Tile:
        rel = ramp[: rows.width] - o
        return Tile(rows, enc.query(rows.gather(q), rel), enc.key(rows.gather(k), rel), rows.gather(v), True,
                    first=True)

    def near(d: int, tail: bool) -> Tile:  # queries of block i, keys of block i − d, both at p_i
        kb = Rows((n - d) * n_b, 1, n_b, 0, n_b) if tail else Rows(0, n - d, n_b, 0, n_b)
        ke = enc.key(kb.gather(k), ramp[:n_b] - d * n_b)  # s − p_i ∈ [−d n_b, −(d − 1) n_b)
        if tail and last is not None:  # tail: the last, partial block (there when rest)
            return Tile(last, enc._query_after(last.gather(q), ramp[:rest]), ke, kb.gather(v), False)
        return Tile(Rows(d * n_b, n - d, n_b, 0, n_b), qe[:, d:].flatten(0, 1), ke, kb.gather(v), False)

    sums = v[:, :, : n * n_b].double().unflatten(2, (n, n_b)).sum(3).cumsum(2)  # (B, Hk, n, Dv): Σ_{s<(j+1)n_b}

    def far(tail: bool) -> Tile:  # every key before block i − m: score 0, weight 1 each
        j = torch.arange(n - m - 1, device=q.device) if not tail else torch.tensor([n - m - 1], device=q.device)
        counts = ((j + 1) * n_b).double()  # (J,): keys s < (i − m) n_b
        mean = (sums[:, :, j] / counts.view(1, 1, -1, 1)).to(v.dtype)  # (B, Hk, J, Dv)
        J = j.numel()
        vt = mean.movedim(2, 1).flatten(0, 1).unsqueeze(2)  # (B·J, Hk, 1, Dv)
        bias = counts.log().to(work).view(1, J, 1, 1, 1).expand(B, J, H, 1, 1).flatten(0, 1)  # (B·J, H, 1, 1)
        kt = q.new_zeros(B * J, v.shape[1], 1, D)
        if tail and last is not None:  # tail: the last, partial block (there when rest)
            return Tile(last, enc._query_after(last.gather(q), ramp[:rest]), kt, vt, False, bias=bias)
        return Tile(Rows((m + 1) * n_b, n - m - 1, n_b, 0, n_b), qe[:, m + 1 :].flatten(0, 1), kt, vt, False,
                    bias=bias)

    diag, _ = tile_plan(T, n_b)
    makers = [partial(diagonal, *dg) for dg in diag]
    makers += [partial(near, d, False) for d in range(1, m + 1)] + [partial(near, d, True) for d in range(1, m + 1)
                                                                    if rest]
    if n - m - 1 > 0:
        makers.append(partial(far, False))
    if rest and n - m - 1 >= 0:
        makers.append(partial(far, True))
    return made((B, H, T), makers, call.c, call.sinks)
