"""The tiling of the causal triangle: diagonal blocks around a middle origin, off-diagonal tiles whose origin
lies between their keys and their queries.

Over a unit range of times (``t₀ + 0, 1, …``) the causal triangle is cut by :func:`tile_plan`: diagonal
blocks keep their origin in their middle (bounded by :func:`diagonal_budget`); every other tile puts its
origin ``p`` between its keys and its queries (``s < p ≤ t``), where decays are ``≤ 1`` on both sides
and a Jordan block's binomial terms share their sign, so a tile may be as wide as half the triangle.
:func:`tiled` runs the plan, one flash call per family of equal tiles, merged per row by log-sum-exp.
"""

from __future__ import annotations

import functools
import math
from functools import partial

import torch

from liepos.attention_call import Call
from liepos.attention_pieces import Arena, Rows, Tile, absmax, clear_thresholds, fresh, made, row_source, slot
from liepos.encoding import Encoding
from liepos.origin_budget import allowed
from liepos.recentred_kernel import block_rows, edge_rows, pays, recentred_flash, terms_fade, usable

__all__ = ["tile_plan", "tile_size", "diagonal_budget", "tiled", "fade_rates", "fading_bound", "term_bounds",
           "FLASH_ROWS", "DIAGONAL_EXPONENT", "TERM_MARGIN"]


def fade_rates(enc: Encoding) -> torch.Tensor | None:
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


def fading_bound(call: Call) -> tuple[float, float] | None:
    """Upper bounds ``(Q, K)`` of every entry of ``F(t − p) q`` and ``G(s − p) k`` over tiles whose origin lies
    between their keys and their queries (``s ≤ p ≤ t``), when every block of the encoding fades
    (:func:`fade_rates` ``≥ 0`` for every head): a decay dim scales an entry by a factor ``≤ 1`` and a damped
    rotation plane turns a pair by a rotation of norm ``≤ 1`` (``|y| ≤ |x₀| + |x₁|``), so ``2‖q‖_∞`` and
    ``2‖k‖_∞`` (one pass over the raw q and k for every tile) bound them (:attr:`Tile.bound`); None when a
    block may grow there (Jordan blocks' binomial terms, rising rates)."""
    r = fade_rates(call.enc)
    if r is None or float(r.min()) < 0:
        return None
    return 2 * absmax(call.q), 2 * absmax(call.k)


# room for the rounding of an encoded entry above its exact bound: float32 sums of a few terms (2^-22 each) and
# a half precision output's rounding (2^-8)
TERM_MARGIN = 1.0 + 2.0**-6


def term_bounds(call: Call, rq: Rows, rk: Rows, raw: tuple[float, float]) -> tuple[float, float] | None:
    """Upper bounds ``(Q, K)`` of every entry of a between tile's ``F(t − p) q`` and ``G(s − p) k`` (queries ``rq``
    at ``t − p = 0 … w − 1``, keys ``rk`` at ``s − p = −w' … −1``) for an encoding applied as shifted terms (Jordan
    blocks, coupled planes): ``|(M x)_d| ≤ Σ_j |T_j| · ‖x‖_∞``, the tables' largest row sum
    (:meth:`liepos.Encoding._span_growth`) times ``raw = (max |q|, max |k|)``, with :data:`TERM_MARGIN` for the
    rounding; None where the tiles' encodings are not those tables alone."""
    enc = call.enc
    gq = enc._span_growth(call.q[:1, :1, : rq.width], 0, "query", fade=True)  # (1, 1, w, D): the tile's times
    gk = enc._span_growth(call.k[:1, :1, : rk.width], -rk.width, "key")
    if gq is None or gk is None:
        return None
    return gq * raw[0] * TERM_MARGIN, gk * raw[1] * TERM_MARGIN


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
# e^{λ(s − o)} each ≥ e^{−32} ≈ 2^-46.2, so every product of two of them the kernel forms, e^{−λ(t − s)}, is
# at least e^{−64} ≈ 2^-92.3: a normal float32 / bfloat16 number (no microcode assist), and so is its product
# with any two raw entries whose own product is at least 2^-34. At the catalogue decay's fastest rate, 1/2,
# blocks of 128 rows (e^{±22} gave 64: one more flash call, one more encoding and merge of every row)
DIAGONAL_EXPONENT = 32.0


def diagonal_budget(b: tuple[float, float, float], dtype: torch.dtype) -> tuple[float, float, float]:
    """The budget of a tiled diagonal block: its factors ``e^{±λ|t − o|}`` may reach
    :data:`DIAGONAL_EXPONENT` (at most the square root of the dtype's range) instead of the cube root of
    the range. Only the causal kernel reads them, and it overwrites every masked score (``s > t``, where
    ``F(t − o)ᵀ G(s − o)`` grows) before the softmax, while every visible product is at most the true
    ``e^{−λ(t − s)}`` and at least ``e^{−64}``: neither factor nor product of factors is a subnormal number. The
    general path adds its mask and keeps the cube root."""
    rate, _, poly_span = b
    work = dtype if dtype in (torch.float16, torch.float64, torch.float32) else torch.float32
    return rate, min(DIAGONAL_EXPONENT, math.log(torch.finfo(work).max) / 2), poly_span


def tile_size(allowed: float, T: int) -> int:
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


def tiled(call: Call, b) -> torch.Tensor | None:
    """Equal times ``t₀ + 0, 1, …, T − 1`` (per batch row): diagonal blocks with their origin in their
    middle, and the rest of the causal triangle in tiles whose origin lies *between* their keys and their
    queries (``s < p ≤ t``), one flash call per family of equal tiles, merged per row (:func:`made`).

    With ``s ≤ p ≤ t`` every factor of ``F(t − p)ᵀ G(s − p) = A(t − s)`` is a decay ``≤ 1`` (an
    underflow drops a term below the dtype's smallest normal), and a Jordan block's binomial terms of
    ``(t − p)`` and ``(p − s)`` share their sign, so the product rounds like ``A(t − s)`` itself: a tile
    may be as large as the triangle. Only the diagonal blocks are bounded by the span of one origin
    (:func:`diagonal_budget`); one block may hold them all. None when the times are not such a range.
    """
    q, k, v, enc = call.q, call.k, call.v, call.enc
    B, H, T, _ = q.shape
    t = call.qpos
    ramp = torch.arange(T, dtype=t.dtype, device=t.device)
    size = min(T, tile_size(allowed(diagonal_budget(b, q.dtype)), T))  # T: one causal block
    if not torch.equal(t - t[:, :1], ramp.expand(B, T)):
        return None
    diag, off = tile_plan(T, size)
    if off:  # more than one block: one native kernel re-centres every pair of blocks where it can
        r, terms, a = fade_rates(enc), terms_fade(enc), allowed(diagonal_budget(b, q.dtype))
        w, halves = (edge_rows(a, b[0], DIAGONAL_EXPONENT) or (None, False)) if terms else (block_rows(a, T), False)
        fading = r is not None and float(r.min()) >= 0 and b[0] > 0 or terms
        if w is not None and pays(q.dtype, T, size, terms) and usable(call, fading, w):
            out = recentred_flash(call, w, halves)
            if out is not None:
                return out
    bound = fading_bound(call) if off else None  # the between tiles' thresholds, from one pass over q and k
    # streamed (no gradient), the between tiles' encodings are cleared in their own pass (Tile.clean)
    width = max(q.shape[-1], v.shape[-1])
    taus = None if bound is None else clear_thresholds(q.dtype, width, call.c, bound)
    raw: list[tuple[float, float]] = []  # (max |q|, max |k|) for the shifted terms' bounds, found once

    def terms_clearing(rq: Rows, rk: Rows) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        # a tile of an encoding of shifted terms: its own bound and thresholds, when their products stay normal
        if not raw:
            raw.append((absmax(q), absmax(k)))
        b = term_bounds(call, rq, rk, raw[0])
        t = None if b is None else clear_thresholds(q.dtype, width, call.c, b)
        return (b, t) if t is not None and t[0] * t[1] >= torch.finfo(torch.float32).tiny else (None, None)
    # each tile's rows of q, k and v (for a gradient, as one autograd node per tensor: :func:`row_source`)
    krows = [d[0] for d in diag] + [t[1] for t in off]
    qs = row_source(q, [d[0] for d in diag] + [t[0] for t in off])
    ks, vs = row_source(k, krows), row_source(v, krows)

    def diagonal(rows: Rows, o: int, arena: Arena | None = None) -> Tile:
        # the block's times from its origin: −o … width − 1 − o
        qe = enc._span(qs(rows), -o, "query", into=slot(arena, "q", q.device))
        ke = enc._span(ks(rows), -o, "key", into=slot(arena, "k", q.device))
        # every factor within e^{±DIAGONAL_EXPONENT}: nothing underflows, nothing to clear
        return Tile(rows, qe, ke, vs(rows), True, first=True, owned=fresh(qe, q, k, v) and fresh(ke, q, k, v),
                    clean=True)

    def between(rq: Rows, rk: Rows, arena: Arena | None = None) -> Tile:
        tb, ts = (bound, taus) if bound is not None or arena is None else terms_clearing(rq, rk)
        tq, tk = (0.0, 0.0) if arena is None or ts is None else ts
        qe = enc._span(qs(rq), 0, "query", fade=True, into=slot(arena, "q", q.device), clear=tq)  # t − p ≥ 0
        ke = enc._span(ks(rk), -rk.width, "key", into=slot(arena, "k", q.device), clear=tk)  # s − p < 0
        return Tile(rq, qe, ke, vs(rk), False, owned=fresh(qe, q, k, v) and fresh(ke, q, k, v), bound=tb,
                    clean=tq > 0)

    makers = [partial(diagonal, *d) for d in diag] + [partial(between, *t) for t in off]
    return made((B, H, T), makers, call.c, call.sinks)
