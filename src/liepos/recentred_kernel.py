"""The causal attention of a fading encoding in one native kernel, re-centring every pair of blocks in registers.

The tiling of :mod:`liepos.causal_tiling` re-centres by encoding q and k again for every family of tiles
(diagonal blocks, then the tiles between keys and queries, level by level) and runs one flash call per family,
merged per row: at T = 2048, five encodings of every row, five flash calls (the diagonal ones as dear as the
full blocks: the flash kernel's causal mask saves nothing below 512 rows) and four merges. For an encoding whose
every block fades or rotates (decay dims, damped and plain rotation planes: :func:`~liepos.causal_tiling.
fade_rates` ≥ 0 for every head, some block fading), this module encodes q and k once each, at the middle of
their block of ``W`` rows (``W`` within the diagonal budget), and the native kernel
``liepos_native::recentred_flash`` (``native_flash.cpp``) forms every score from them by

    qᵀ A(t − s) k = (F(t − o_i) q)ᵀ A((i − j)·W) (G(s − o_j) k),      o_i = i·W + W/2,

correcting the query rows of block ``i`` by ``A((i − j)·W)`` for key block ``j`` (a few terms a dim: ``y_d =
Σ_p a_pd x_{partner_p(d)}``, a plane's pair or a Jordan chain, the corrections' exact entries from the encoding
itself in float64, rounded once to float32), then one online softmax per row in the kernel's own GEMMs (oneDNN's,
AMX for bfloat16). The corrections fade (``|A(mW)| ≤ 1``); one that underflows float32 (``λmW > 87``, so ``m ≥ 2``:
``λW ≤ 64``) leaves a product below ``e^{λW − λmW} ≤ e^{−43}`` of the row's scale (each block's factors within
``e^{±λW/2}``): nothing a softmax can see.

Fading Jordan blocks (:func:`terms_fade`: ``A(u) = e^{λu} Σ u^k/k! N^k``, λ < 0) take it too, in float32 (their half
precision is widened before, as for the tiling), with their origins where the tiling's tiles between keys and
queries put theirs: a block's queries at its start, its keys at its end, so that ``F``, ``G`` and the correction
``A((i − j − 1)·W)`` are all forward lags, whose binomial terms share their sign and round like ``A(t − s)``
itself (around a middle origin they would cancel, a rounding of ``(2W)^n·eps`` between neighbouring blocks). The
diagonal block sits at its middle, or where the polynomial span is shorter than half a block (the catalogue's 3×3
blocks in float32: 22.6) as two halves each at its own middle, the second half's queries with the first half's keys
both at their boundary (:func:`edge_rows`; five encodings of T rows in all). Up to :data:`TERMS_ROWS` rows.

Taken for a causal self-attention over a unit range of times (:attr:`Call.simple`) whose tiling has more than one
block, with nothing needing a gradient and no sinks, on x86 with oneDNN's GEMMs (:func:`gemms`): float32 wherever
it runs, bfloat16 where it pays (:func:`pays`), both on a CPU of the kind it was timed on (AMX: oneDNN packs
bfloat16); every other call keeps the tiling.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import torch

from liepos import _kernels
from liepos.attention_call import Call
from liepos.attention_pieces import Rows, arena, slot
from liepos.encoding import Encoding

__all__ = ["MAX_BLOCK", "HALF_DIAGONAL_ROWS", "HALF_BLOCKS", "TERMS_ROWS", "block_rows", "pays", "recentred_flash", "corrections",
           "usable", "kernel", "gemms", "measured_here", "terms_fade", "MAX_TERMS", "edge_rows"]

MAX_BLOCK = 256  # rows of a block at most (the kernel's buffers per thread grow with it; 128 and 256 measured alike)
# bfloat16: the flash kernel's AMX GEMMs make the tiling's large tiles cheaper than this kernel's own softmax
# (on a Xeon with AMX, from T = 4096 on for the catalogue decay, and for RetNet, whose tiling has diagonal blocks
# of 1024 rows, at every length tried), while the tiling's diagonal blocks of 128 rows and fewer are dear (the
# flash kernel's causal mask saves nothing below 512 rows): bfloat16 takes the kernel where they hold at most
# this many rows and the sequence at most HALF_BLOCKS of them (`benchmarks/ab.py native-kernel`: decay 0.78 of
# the tiling's time at T = 1024, 0.89 at 2048, on one thread). float32 takes it wherever it runs (decay 0.84
# at T = 2048 on one thread, 0.69 on two; 0.95–0.99 at T = 8192–16384; RetNet 0.88–0.95)
HALF_DIAGONAL_ROWS, HALF_BLOCKS = 128, 16
# Jordan blocks (queries at their block's start, keys at its end; blocks of 64 for the catalogue's, whose three terms a
# dim and diagonal halves cost the kernel ~1.1x SDPA's time on its own) take it up to this many rows, where it was as
# fast as the tiling's seven flash calls or faster (`benchmarks/ab.py native-kernel --encodings jordan`, float32 on a
# Xeon with AMX: T = 2048 0.86-0.88 of the tiling's time on two threads, 0.98-1.08 on one; 4096 0.93-0.99 / 0.99-1.04),
# not past it (1.03-1.07 at 8192 and 16384, where the tiling's tiles are large)
TERMS_ROWS = 4096
_LOG2E = 1.0 / math.log(2.0)
_DTYPES = (torch.float32, torch.bfloat16)
_CORRECTIONS: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor] | None] = OrderedDict()
_MEASURED: dict[str, bool] = {}
_KEEP = 32  # correction tables kept (per encoding, block, length, scale and scheme)
MAX_TERMS = 8  # terms of one dim's correction the kernel takes at most (its kMaxTerms)


def block_rows(allowed: float, T: int) -> int | None:
    """Rows of a block: the largest multiple of 64 up to :data:`MAX_BLOCK` whose times all lie within ``allowed``
    of its middle (``W/2 ≤ allowed``), or T rounded up to even when that is smaller; None below 64 rows."""
    w = min(MAX_BLOCK, int(2 * math.floor(allowed)) // 64 * 64) if math.isfinite(allowed) else MAX_BLOCK
    if w < 64:
        return None
    return min(w, T + T % 2)


def edge_rows(allowed: float, rate: float, exponent: float) -> tuple[int, bool] | None:
    """``(W, halves)`` for an encoding of Jordan blocks (queries at their block's start, keys at its end): the largest
    multiple of 64 up to :data:`MAX_BLOCK` whose off-diagonal factors stay within ``e^{−exponent}`` (``rate·W ≤
    exponent``, so none is subnormal) and whose diagonal block lies within ``allowed`` of its middle (``W/2 ≤
    allowed``) or, in two halves of ``W/2`` rows (``halves``: up to 128 rows), of theirs (``W/4 ≤ allowed``); None
    below 64 rows."""
    cap = float(MAX_BLOCK) if rate <= 0 else min(float(MAX_BLOCK), exponent / rate)
    if math.isfinite(allowed):
        cap = min(cap, max(2 * math.floor(allowed), min(4 * math.floor(allowed), 128)))
    w = int(cap) // 64 * 64
    return None if w < 64 else (w, w / 2 > allowed)


def measured_here() -> bool:
    """Whether this CPU is of the kind the kernel pays on: one where oneDNN packs bfloat16 (AMX). Elsewhere the
    tiling serves: on a 2-core AMD EPYC with AVX2 only this kernel took 1.6–2.0× the tiling's time in float32
    (decay and RetNet, T = 2048 and 8192, one and two threads: ``benchmarks/ab.py native-kernel --everywhere``),
    and an earlier kernel of this design over BLAS sgemm 1.45–1.56× SDPA's on an EPYC with AVX-512."""
    if "here" not in _MEASURED:
        ops = _kernels.library() and torch.ops.liepos_native
        _MEASURED["here"] = bool(ops and hasattr(ops, "packs_bfloat16") and ops.packs_bfloat16())
    return _MEASURED["here"]


def pays(dtype: torch.dtype, T: int, size: int, terms: bool = False) -> bool:
    """Whether the kernel is faster than the tiling whose diagonal blocks have ``size`` rows, for ``T`` rows of
    ``dtype`` (:data:`HALF_DIAGONAL_ROWS`, :data:`HALF_BLOCKS`; Jordan blocks, ``terms``: :data:`TERMS_ROWS`), on a
    CPU of the kind it was timed on (:func:`measured_here`)."""
    if not measured_here():
        return False
    if terms:
        return T <= TERMS_ROWS
    return dtype == torch.float32 or (size <= HALF_DIAGONAL_ROWS and T <= HALF_BLOCKS * size)


def gemms() -> bool:
    """Whether oneDNN's batch-reduce GEMMs run here: an x86 CPU with AVX2 or AVX-512 and oneDNN enabled (elsewhere
    the kernel's GEMMs would fall back to plain ones, a speed never measured: the tiling serves)."""
    return bool(torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and torch.backends.mkldnn.is_available()
                and torch.backends.mkldnn.enabled)


def terms_fade(enc: Encoding) -> bool:
    """Whether ``enc`` is an encoding of Jordan blocks the kernel takes: every block a decay dim, a rotation plane
    (damped or not) or a Jordan block (real or complex) that fades (rate < 0, so that ``A(u) ≥ 0`` entrywise up to
    its rotation and ``|A(u)| → 0``), some block coupled, nothing else (no slots, change of basis, several axes or
    query scale)."""
    g = enc.generator
    if (not enc.plan.has_coupling or enc.num_slots or g.basis is not None or g.num_axes is not None
            or enc.query_scale is not None):
        return False
    with torch.no_grad():
        rates = g.rates.detach().double().reshape(-1, g.num_blocks)  # (H or 1, blocks)
    chains = torch.tensor([n > 1 for n in g.sizes])  # (blocks,): the Jordan blocks
    return bool((rates <= 0).all()) and bool((rates[:, chains] < 0).all())


def usable(call: Call, fading: bool, block: int | None) -> bool:
    """Whether the kernel takes ``call``: CPU with oneDNN's GEMMs (:func:`gemms`), float32 or bfloat16 (bfloat16
    where oneDNN packs it: AMX), nothing
    needing a gradient, no sinks, an encoding of fading blocks (``fading``), the head size a multiple of 16 (at
    most 512), and more than one block of ``block`` rows."""
    q, k, v = call.q, call.k, call.v
    T = q.shape[2]
    if (block is None or not fading or T <= block or q.dtype not in _DTYPES or q.device.type != "cpu"
            or call.sinks is not None or call.venc is not None or not _kernels.enabled(q.device, native=True)
            or not gemms()):
        return False
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return False
    if (q.shape[-1] % 16 or q.shape[-1] > 512 or v.shape[-1] > 512 or q.shape[1] % k.shape[1]
            or v.stride(-1) != 1 or not (q.dtype == k.dtype == v.dtype)):
        return False
    ops = _kernels.library() and torch.ops.liepos_native
    if not ops or not hasattr(ops, "recentred_flash"):
        return False
    return q.dtype == torch.float32 or bool(ops.packs_bfloat16())


def corrections(enc: Encoding, block: int, nb: int, c: float, edges: bool = False,
                halves: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(corr, partner)`` of the kernel: for every ``m < nb`` the correction ``A(lag_m)`` of an encoded query row,
    as ``y_d = Σ_p corr[p, d] · x_{partner_p(d)}`` (``partner_0(d) = d``), float32 ``(H or 1, nb, P, D)`` times
    ``c·log2(e)``, and ``partner`` int64 ``(P − 1, D)`` (a dim's other terms: its plane's other dim, the rest of its
    Jordan chain; d itself with coefficient 0 where it has fewer). ``lag_m = m·block`` (origins at the blocks'
    middles), or with ``edges`` ``(m − 1)·block`` for ``m ≥ 1`` and 0 for the diagonal block (queries at their
    block's start, keys at their block's end); with ``halves`` (queries at the start of their half of the block) two
    tables per ``m``, ``(H or 1, 2·nb, P, D)``, the second half's lag ``block/2`` longer (``m ≥ 1``). None when a dim
    has more than :data:`MAX_TERMS` terms. Kept per encoding, block, length, scale and scheme (the last
    :data:`_KEEP`)."""
    key = (enc.version, block, nb, c, edges, halves)
    if key in _CORRECTIONS:
        _CORRECTIONS.move_to_end(key)
        return _CORRECTIONS[key]
    D, Hc, S = enc.dim, enc.num_heads or 1, 2 if halves else 1
    eye = torch.eye(D, dtype=torch.float64).expand(nb * S, Hc, D, D)  # (nb·S, Hc, D rows e_r, D)
    m = torch.arange(nb, dtype=torch.float64).repeat_interleave(S)  # (nb·S,): m of each table
    lag = ((m - 1).clamp(min=0) if edges else m) * block
    if halves:  # the second half's queries start block/2 later (the diagonal block's halves meet at lag 0)
        lag = lag + (m > 0) * torch.tensor([0.0, block / 2]).repeat(nb)
    with torch.no_grad():
        M = enc._query_after(eye, lag.unsqueeze(-1).expand(nb * S, D))  # (nb·S, Hc, D, D): M[m, h, r] = F(lag_m) e_r
    off = (M != 0).any(0).any(0) & ~torch.eye(D, dtype=torch.bool)  # (D, D): row r reaches column d (r ≠ d)
    found = None
    if int(off.sum(0).max()) < MAX_TERMS:
        P = 1 + int(off.sum(0).max())
        d = torch.arange(D)
        partner = d.expand(P, D).clone()  # (P, D): row 0 the dim itself, the rest its other terms (or itself)
        for col in range(D):
            rows = torch.nonzero(off[:, col]).flatten()
            partner[1 : 1 + rows.numel(), col] = rows
        corr = M[:, :, partner, d]  # (nb·S, Hc, P, D): M[partner[p, d], d], the p-th term's entry of column d
        corr[:, :, 1:] = torch.where(partner[1:] == d, 0.0, corr[:, :, 1:])  # padding terms weigh nothing
        found = ((corr.movedim(1, 0) * (c * _LOG2E)).float().contiguous(), partner[1:].contiguous())
    _CORRECTIONS[key] = found
    if len(_CORRECTIONS) > _KEEP:
        _CORRECTIONS.popitem(last=False)
    return found


def _encoded(enc: Encoding, x: torch.Tensor, block: int, side: str, at: int,
             into: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None) -> torch.Tensor:
    """``x (B, H, T, D)`` encoded at an origin ``at`` rows into each of its blocks of ``block`` rows (the last one
    partial): row ``i·block + a`` at time ``a − at``, as ``(B, H, T, D)``; a query of a block whose origin is its
    first row (``at = 0``) by :meth:`Encoding._query_after`, as the tiling's between tiles. ``into``: the provider of
    the whole blocks' output (a buffer of the thread's arena), else fresh."""
    B, H, T, D = x.shape
    full, tail = divmod(T, block)
    fade = side == "query" and at == 0
    parts = []
    if full:
        rows = Rows(0, full, block, 0, block)
        y = enc._span(rows.gather(x), -at, side, fade, into=into or _fresh)  # (B·full, H, block, D)
        parts.append(rows.scatter(y).reshape(B, H, full * block, D))  # (B, H, full, block, D) -> (B, H, T', D)
    if tail:
        rows = Rows(full * block, 1, tail, 0, tail)
        parts.append(rows.scatter(enc._span(rows.gather(x), -at, side, fade, into=_fresh)).reshape(B, H, tail, D))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def kernel(qe: torch.Tensor, ke: torch.Tensor, v: torch.Tensor, corr: torch.Tensor, partner: torch.Tensor,
           block: int, qd: torch.Tensor | None = None, kd: torch.Tensor | None = None,
           kx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``liepos_native::recentred_flash`` itself: ``(out, lse)`` (the one call of the op, which tests observe)."""
    return torch.ops.liepos_native.recentred_flash(qe, ke, v, corr, partner, block, qd, kd, kx)


def _fresh(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def recentred_flash(call: Call, block: int, halves: bool = False) -> torch.Tensor | None:
    """The call's causal attention ``(B, H, T, Dv)`` in q's dtype through the native kernel, blocks of ``block``
    rows; None when the encoding's correction has more terms per dim than the kernel takes (the caller tiles).

    A fading encoding's q and k sit at the middle of their blocks. An encoding of Jordan blocks (:func:`terms_fade`)
    has its binomial terms cancel around a middle origin (rounding of ``(2·block)^n·eps`` between neighbouring
    blocks): off the diagonal its queries sit at their block's start and its keys at their block's end, every
    factor a forward lag, and its diagonal blocks at their middles, within the diagonal budget as the tiling's.
    With ``halves`` (:func:`edge_rows`: a diagonal budget shorter than half a block) the diagonal block is two
    halves, each at its middle, and the second half's queries with the first half's keys, both encoded at the
    boundary of the halves; the queries then sit at the start of their half."""
    q, k, v, enc = call.q, call.k, call.v, call.enc
    T = q.shape[2]
    nb = -(-T // block)
    edges = enc.plan.has_coupling
    found = corrections(enc, block, nb, call.c, edges, halves)
    if found is None:
        return None
    corr, partner = found
    with arena() as buffers:
        def at(x: torch.Tensor, rows: int, side: str, origin: int, name: str) -> torch.Tensor:
            return _encoded(enc, x, rows, side, origin, slot(buffers, name, x.device))

        if not edges:
            out, _ = kernel(at(q, block, "query", block // 2, "q"), at(k, block, "key", block // 2, "k"), v, corr,
                            partner, block)
            return out
        sub = block // 2 if halves else block  # the diagonal's blocks
        qe, ke = at(q, sub, "query", 0, "q"), at(k, block, "key", block, "k")
        qd, kd = at(q, sub, "query", sub // 2, "qd"), at(k, sub, "key", sub // 2, "kd")
        kx = at(k, sub, "key", sub, "kx") if halves else None
        out, _ = kernel(qe, ke, v, corr, partner, block, qd, kd, kx)
        return out
