"""Attention over keys split into pieces, each a fused kernel, merged exactly by their log-sum-exps.

A query block of a re-centred encoding sees the keys before it (every one of them: no mask) and the
keys of its own block (causally: ``is_causal``). Each piece runs the CPU flash kernel, which returns
its output ``o_i`` and log-sum-exp ``L_i``; the merge is exact::

    L = log(Σ_i e^{L_i} [+ e^{s_h}])          O = Σ_i e^{L_i − L} o_i

(a learned sink ``s_h`` joins the denominator only; per row, ``s_{h,t}``, when the pieces' scores
leave out a constant of the row). A piece may carry an additive per-key bias ``β (·, H, 1, S)``,
the flash kernel's broadcast mask: ALiBi's ``m_h (s − o)`` in the logits. The backward is the flash
backward of each piece with the *merged* ``O`` and ``L`` (the softmax probabilities and
``rowsum(dO ∘ O)`` of the whole row), summed over pieces; the sink's gradient is
``−Σ_t e^{s_h − L_t} rowsum(dO ∘ O)_t``. No ``(Sq × S)`` mask is ever materialised.

Pieces need not cover the same rows: a :class:`Tile` is a piece of attention for the rows
:class:`Rows` picks out of the output (a strided family of equal row ranges, one flash call for all of
them), and each output row merges the tiles that hold it (:func:`tiles`). :func:`pieces` is the case
where every tile holds every row.

>>> import torch
>>> q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
>>> seen = torch.ones(3, 6).tril(3).bool()          # queries at times 3, 4, 5 see keys up to theirs
>>> whole = torch.nn.functional.scaled_dot_product_attention(q[:, :, 3:], k, v, attn_mask=seen)
>>> split = pieces(q[:, :, 3:], [(k[:, :, :3], v[:, :, :3], False), (k[:, :, 3:], v[:, :, 3:], True)], 8 ** -0.5)
>>> bool(torch.allclose(whole, split))
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as Fn

from liepos import _kernels
from liepos._checks import DOUBLE_BACKWARD, DoubleBackwardError
from liepos._fast import clear_small

__all__ = ["CLEAR_LOGIT", "clear_thresholds", "raw_clearing", "pieces", "pieces_by_heads", "pieces_per_group",
           "available", "Rows", "Tile", "Arena", "ARENA_BYTES", "arena", "slot", "tiles", "row_source", "made", "fresh",
           "absmax"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def available(q: torch.Tensor) -> bool:
    """The merged-pieces kernel runs here: a CPU tensor, eager (the flash op's log-sum-exp is CPU-only)."""
    return q.device.type == "cpu" and not torch.compiler.is_compiling()


@dataclass(frozen=True)
class Rows:
    """Rows ``start + j·period + [a, b)`` for ``j < count`` of a ``(B, H, T, ·)`` tensor.

    A tile holding them has ``B·count`` batch rows of ``b − a`` rows each (``j`` inside the batch).
    """

    start: int
    count: int
    period: int
    a: int
    b: int

    def __post_init__(self) -> None:
        if not (self.start >= 0 and self.count >= 1 and 0 <= self.a < self.b <= self.period):
            raise ValueError(f"Rows needs start ≥ 0, count ≥ 1 and 0 ≤ a < b ≤ period, got {self}")

    @property
    def width(self) -> int:
        return self.b - self.a

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of ``x (B, H, T, *r)`` in place: ``(B, H, count, width, *r)``, a view (one ``as_strided`` where
        nothing records a gradient: a dozen of these per attention call, each three ops as slices)."""
        end = self.start + self.count * self.period
        if end > x.shape[2]:
            raise ValueError(f"{self} reaches row {end} of a tensor of {x.shape[2]} rows")
        if not (torch.is_grad_enabled() and x.requires_grad):
            st = x.stride()
            return x.as_strided((*x.shape[:2], self.count, self.b - self.a, *x.shape[3:]),  # (B, H, count, width, *r)
                                (st[0], st[1], self.period * st[2], *st[2:]),
                                x.storage_offset() + (self.start + self.a) * st[2])
        y = x[:, :, self.start : end]  # (B, H, count·period, *r)
        y = y.unflatten(2, (self.count, self.period))  # (B, H, count, period, *r)
        return y[:, :, :, self.a : self.b]  # (B, H, count, width, *r)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of ``x (B, H, T, *r)`` as a tile's batch ``(B·count, H, width, *r)`` (a view when B = 1)."""
        y = self.view(x).movedim(2, 1)  # (B, count, H, width, *r)
        return y.flatten(0, 1)  # (B·count, H, width, *r)

    def scatter(self, t: torch.Tensor) -> torch.Tensor:
        """A tile's ``(B·count, H, width, *r)`` as ``(B, H, count, width, *r)`` (a view), to meet :meth:`view`."""
        return t.unflatten(0, (-1, self.count)).movedim(2, 1)  # (B, count, H, …) -> (B, H, count, …)


@dataclass(frozen=True)
class Tile:
    """Attention of ``q (B·count, H, w, D)`` over ``k (B·count, H, S, D)``, ``v (B·count, H, S, Dv)`` for
    the output rows ``rows``; ``causal``: the square diagonal tile (``S = w``, key i visible from query ≥ i)."""

    rows: Rows
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    first: bool = False  # streamed (:func:`made`): no earlier tile holds these rows; written, not merged
    bias: torch.Tensor | None = None  # (B·count, H, 1, S), q's type (float32 for half): added to key s's scores
    owned: bool = False  # q and k were written for this tile alone (:func:`fresh`): cleared in place when streamed
    # clearing (:func:`_cleared`): ``bound = (Q, K)``, upper bounds of max |q| and max |k| its maker knows (the
    # thresholds from them, no pass to find the largest entries); ``clean``: no entry of q or k can underflow
    # into the subnormal range by the encoding (factors bounded away from 0, the diagonal budget), or its maker
    # cleared them already (in the encoding's own pass, :func:`clear_thresholds`): not cleared here
    bound: tuple[float, float] | None = None
    clean: bool = False
    # streamed only (:func:`pieces_by_heads`): the tile's query heads are the call's heads ``[h0, h1)``, merged into
    # those heads of the running state; None: every head
    heads: tuple[int, int] | None = None


class Arena:
    """The buffers that streamed tiles (:func:`made`) write their own encodings into, one per name (``"q"``,
    ``"k"``) and dtype: a streamed tile is attended and let go before the next is made, so its buffers are free
    again, and a tile writes into pages already mapped and warm in the cache instead of fresh ones (a page
    fault per 4 KiB). A half-precision small tile's backward (:func:`_small_backward`) keeps its temporaries
    there too (names ``"b…"``; the arena is idle during a backward). One arena per thread is kept from call to
    call (:func:`arena`), holding at most :data:`ARENA_BYTES`; a larger request gets a fresh tensor that is not
    kept."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = ARENA_BYTES if cap is None else cap
        self.busy = False
        self._bufs: dict[tuple, torch.Tensor] = {}

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())

    def slot(self, name: str, device: torch.device) -> Callable[[tuple[int, ...], torch.dtype], torch.Tensor]:
        """A provider of a contiguous tensor of a given shape and dtype from buffer ``name`` (the ``into`` of
        :meth:`liepos.Encoding._span`), grown to the largest asked for within the cap."""

        def take(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            n = math.prod(shape)
            key = (name, dtype, device)
            buf = self._bufs.get(key)
            # a buffer made under torch.inference_mode is an inference tensor, which nothing may write outside it
            if buf is None or buf.numel() < n or (buf.is_inference() and not torch.is_inference_mode_enabled()):
                self._bufs.pop(key, None)
                size = n * torch.empty((), dtype=dtype).element_size()
                if size > self.cap:
                    return torch.empty(shape, dtype=dtype, device=device)  # too big to keep
                while self._bufs and self.nbytes() + size > self.cap:
                    self._bufs.pop(next(iter(self._bufs)))
                buf = self._bufs[key] = torch.empty(n, dtype=dtype, device=device)
            return buf[:n].view(shape)

        return take


# the bytes of encodings one thread's arena keeps between calls (two buffers the size of the largest tile's q and
# k, the diagonal blocks' T rows: 4 MiB each for 8 heads of 64 float32 dims at T = 2048)
ARENA_BYTES = 64 << 20
_ARENAS = threading.local()


@contextlib.contextmanager
def arena():
    """This thread's :class:`Arena` while the block runs (a fresh one when it is already in use: a nested call)."""
    a = getattr(_ARENAS, "arena", None)
    if a is None:
        a = _ARENAS.arena = Arena()
    if a.busy:
        yield Arena()
        return
    a.busy = True
    try:
        yield a
    finally:
        a.busy = False


def slot(arena: Arena | None, name: str, device: torch.device) -> Callable | None:
    """``arena.slot(name, device)``, or None without an arena (a tile made for autograd, or the first)."""
    return None if arena is None else arena.slot(name, device)


def fresh(x: torch.Tensor, *sources: torch.Tensor) -> bool:
    """Whether ``x`` shares no memory with ``sources`` (an encoding's output, not its input or a view of it)."""
    p = x.untyped_storage().data_ptr()
    return all(s.untyped_storage().data_ptr() != p for s in sources)


class _Gather(torch.autograd.Function):
    """The rows of several tiles of one tensor as one node: its backward writes every tile's gradient into one
    buffer of the tensor's shape (one fill, an in-place add per tile), where a gather per tile would give each
    its own zero-filled tensor of the whole shape for autograd to sum."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: tuple[Rows, ...]) -> tuple[torch.Tensor, ...]:
        ctx.shape, ctx.rows = x.shape, rows
        return tuple(r.gather(x) for r in rows)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:
        live = [(r, g) for r, g in zip(ctx.rows, grads) if g is not None]
        if not live:
            return None, None
        out = torch.zeros(ctx.shape, dtype=live[0][1].dtype, device=live[0][1].device)
        for r, g in live:
            r.view(out).add_(r.scatter(g))  # (B, H, count, w, ·) += the tile's (B·count, H, w, ·)
        return out, None


# the dtypes whose tiles' gradients one node gathers: in bfloat16 its in-place adds into strided views of the
# buffer cost more than autograd's own sums (decay, T = 2048, two threads, forward + backward: 1.40 → 1.47× SDPA)
_GATHERED = (torch.float32, torch.float64)


def row_source(x: torch.Tensor, rows: Iterable[Rows]) -> Callable[[Rows], torch.Tensor]:
    """A function giving ``r.gather(x)`` for each of the ``rows`` a tiling will ask for: gathered when asked
    (so a streamed tile's rows are made with it), or, when ``x`` needs a gradient (float32 or float64), every
    one at once as one autograd node (:class:`_Gather`), whose backward fills one buffer for all of them."""
    wanted = list(dict.fromkeys(rows))
    if not (torch.is_grad_enabled() and x.requires_grad) or len(wanted) < 2 or x.dtype not in _GATHERED:
        return lambda r: r.gather(x)
    got = dict(zip(wanted, _Gather.apply(x, tuple(wanted))))
    return lambda r: got[r] if r in got else r.gather(x)


def _sink_rows(sinks: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """Sink logits broadcastable to ``(B, H, T)``: one per head ``(H,)``, or one per row ``(B, H, T)``."""
    s = sinks.to(work)
    return s.view(1, -1, 1) if s.dim() == 1 else s


class _Tiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shape, rows, causal, biases, c, sinks, *qkv):
        B, H, T, Dv = shape
        outs, lses = [], []
        with _kernels.flushed(qkv[0].device):  # the kernels' own subnormal probabilities, flushed
            for i, is_causal in enumerate(causal):
                o, L = _flash(qkv[3 * i], qkv[3 * i + 1], qkv[3 * i + 2], 0.0, is_causal, attn_mask=biases[i],
                              scale=c)
                outs.append(o)
                lses.append(L)  # (B·count, H, w) float32 (bfloat16 inputs) or q's dtype
        if len(rows) == 1 and rows[0] == Rows(0, 1, T, 0, T) and sinks is None:
            O, L = outs[0], lses[0]  # one piece over every row: the flash kernel's own output
        else:
            O, L = _merge(shape, rows, outs, lses, sinks)
        O = O.to(qkv[0].dtype)
        ctx.rows, ctx.c, ctx.causal, ctx.biases, ctx.has_sinks = rows, c, causal, biases, sinks is not None
        ctx.save_for_backward(O, L, *(() if sinks is None else (sinks,)), *qkv)
        return O

    @staticmethod
    def backward(ctx, dO):
        if torch.is_grad_enabled():  # create_graph=True: the flash kernel's backward has no derivative of its own
            raise DoubleBackwardError(DOUBLE_BACKWARD)
        O, L, *rest = ctx.saved_tensors
        sinks = rest.pop(0) if ctx.has_sinks else None
        dO = dO.contiguous()
        grads = []
        with _kernels.flushed(dO.device):  # the kernels' own subnormal probabilities, flushed
            for i, (r, is_causal) in enumerate(zip(ctx.rows, ctx.causal)):
                q, k, v = rest[3 * i : 3 * i + 3]
                small = q.dtype in (torch.bfloat16, torch.float16) and max(q.shape[2], k.shape[2]) <= SMALL_TILE
                g = (_small_backward if small else _flash_backward)(
                    r.gather(dO), q, k, v, r.gather(O), r.gather(L), 0.0, is_causal, attn_mask=ctx.biases[i],
                    scale=ctx.c)
                grads += list(g)
        ds = None
        if sinks is not None:
            rowsum = (dO.to(L.dtype) * O.to(L.dtype)).sum(-1)  # (B, H, T)
            ds = -(torch.exp(_sink_rows(sinks, L.dtype) - L) * rowsum)  # (B, H, T)
            ds = (ds.sum((0, 2)) if sinks.dim() == 1 else ds.sum_to_size(sinks.shape)).to(sinks.dtype)
        return (None, None, None, None, None, ds, *grads)


# the widest half-precision tile (queries and keys) whose backward is formed by its definition (_small_backward) rather
# than the flash kernel's backward, which in bfloat16 costs several times more per pair on tiles this small (8
# heads, dim 64, one thread, on a Xeon with AMX: 32 causal blocks of 64 rows 44 against 30 ms, 16 tiles of 64 x 64
# 20 against 6 ms, 8 of 128 x 128 22 against 17 ms; 4 of 256 x 256 15 against 20 ms). In float32 the flash
# backward is as fast or faster at every width and always runs
SMALL_TILE = 128


def _small_backward(dO, q, k, v, O, L, dropout, causal, attn_mask=None, scale=1.0):
    """The flash backward of one tile by its definition, in the working type (float32 for half precision):
    ``P = e^{c q kᵀ + β − L}`` with the merged row log-sum-exps ``L`` (causal: key ``j`` visible from query
    ``i ≥ j``), ``dV = Pᵀ dO``, ``dS = P ∘ (dO vᵀ − rowsum(dO ∘ O))``, ``dQ = c dS k``, ``dK = c dSᵀ q``; in
    bfloat16 the last three products are bfloat16 ones of P and c·dS rounded once (a third of the time of
    float32 products on an AVX512-BF16 EPYC; decay's forward + backward at T = 2048 0.92× and 0.88–0.97× on one
    and two threads)."""
    work = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
    with arena() as scratch:  # the temporaries in this thread's arena (idle during a backward): pages already mapped

        def into(name: str, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return scratch.slot(name, q.device)(tuple(shape), dtype)

        def widened(name: str, x: torch.Tensor) -> torch.Tensor:
            return x if x.dtype == work else into(name, x.shape, work).copy_(x)

        qf, kf, vf, dOf, Of = (widened(n, x) for n, x in zip(("bq", "bk", "bv", "bdO", "bO"), (q, k, v, dO, O)))
        N, H, w, n = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        S = torch.matmul(qf, kf.transpose(-1, -2), out=into("bS", (N, H, w, n), work)).mul_(scale)  # (N, H, w, S)
        if attn_mask is not None:
            S.add_(attn_mask.to(work))
        if causal:
            S.masked_fill_(torch.ones(w, n, dtype=torch.bool, device=S.device).triu_(1), -math.inf)
        P = S.sub_(L.to(work).unsqueeze(-1)).exp_()  # (N, H, w, S): the merged row's probabilities
        dS = torch.matmul(dOf, vf.transpose(-1, -2), out=into("bdS", (N, H, w, n), work))  # (N, H, w, S)
        dS.sub_((dOf * Of).sum(-1, keepdim=True)).mul_(P)
        if q.dtype == torch.bfloat16:
            # the three products that are the gradients in bfloat16 (float32's range; the CPU's matrix kernels
            # accumulate in float32 and round once, as the flash kernel does with its probabilities): P and c·dS
            # rounded to it once. float16 keeps float32 products: its range would flush small terms of dS
            Ph = into("bPh", P.shape, q.dtype).copy_(P)
            dSh = into("bdSh", dS.shape, q.dtype).copy_(dS.mul_(scale))
            dV = torch.matmul(Ph.transpose(-1, -2), dO.to(q.dtype))  # (N, H, S, Dv)
            return torch.matmul(dSh, k.to(q.dtype)), torch.matmul(dSh.transpose(-1, -2), q), dV.to(v.dtype)
        dV = torch.matmul(P.transpose(-1, -2), dOf)  # (N, H, S, Dv)
        dQ = torch.matmul(dS, kf).mul_(scale)  # (N, H, w, D)
        dK = torch.matmul(dS.transpose(-1, -2), qf).mul_(scale)  # (N, H, S, D)
        return dQ.to(q.dtype), dK.to(k.dtype), dV.to(v.dtype)


def _merge(shape, rows, outs, lses, sinks):
    """``(O, L)`` of tiles' outputs and log-sum-exps over their rows (sinks join every row's ``L``)."""
    B, H, T, Dv = shape
    work = lses[0].dtype
    L = torch.full((B, H, T), -torch.inf, dtype=work, device=lses[0].device)
    for r, Li in zip(rows, lses):
        lv = r.view(L)  # (B, H, count, w)
        lv.copy_(torch.logaddexp(lv, r.scatter(Li)))
    if sinks is not None:
        L = torch.logaddexp(L, _sink_rows(sinks, work))
    O = torch.zeros(B, H, T, Dv, dtype=work, device=L.device)
    for r, Li, oi in zip(rows, lses, outs):
        w = torch.exp(r.scatter(Li) - r.view(L))  # (B, H, count, w): the tile's share of each row
        r.view(O).addcmul_(w.unsqueeze(-1), r.scatter(oi))
    return O, L


def _rows_unit(x: torch.Tensor) -> torch.Tensor:
    """``x`` with unit-stride rows: the CPU flash kernel reads each row of q, k and v as ``stride(-1) = 1``
    whatever the tensor says (a channels-last or a stepped view gives a wrong answer without a word), so
    any other layout is copied once (``.contiguous()``); other strides, a storage offset and stride 0
    (expanded batch, heads or keys) it reads right."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


# the largest change of a logit that clearing q's and k's smallest entries may make (:func:`_cleared`):
# 2^-7 of the working type's unit roundoff (float32 and bfloat16: 2^-30), far below any output rounding
CLEAR_LOGIT = {torch.float32: 2.0**-30, torch.bfloat16: 2.0**-30, torch.float64: 2.0**-59}


def clear_thresholds(dtype: torch.dtype, D: int, c: float, bound: tuple[float, float]) -> tuple[float, float] | None:
    """``(τ_q, τ_k) = (δ / (2 D c K), δ / (2 D c Q))`` of :func:`_cleared` for q and k of ``dtype`` and width
    ``D`` (as the flash kernel reads them) whose entries are at most ``bound = (Q, K)`` in magnitude; None where
    nothing is cleared (float16, a bound that is 0, inf or NaN)."""
    delta = CLEAR_LOGIT.get(dtype)
    qm, km = bound
    if delta is None or not (math.isfinite(qm) and math.isfinite(km)) or qm == 0 or km == 0:
        return None
    return delta / (2 * D * c * km), delta / (2 * D * c * qm)


def raw_clearing(q: torch.Tensor, k: torch.Tensor, c: float, D: int) -> tuple[tuple[float, float], bool] | None:
    """For tiles that read rows of ``q`` and ``k`` as they are (no encoding of their own): ``(bound, clean)``,
    the bound ``(max |q|, max |k|)`` every tile's clearing may take (:attr:`Tile.bound`), and whether that clearing
    would change nothing (every nonzero entry of q at least ``τ_q``, of k at least ``τ_k``, :func:`clear_thresholds`
    for width ``D``; :attr:`Tile.clean`): one pass over each (the native absrange op), where the clearing took two
    per tile. None where the op does not run (the tiles find their own)."""
    if q.dtype != k.dtype:  # the tiles read k in q's dtype: its rounding is not k's
        return None
    rq, rk = _kernels.absrange(q.detach()), _kernels.absrange(k.detach())
    if rq is None or rk is None:
        return None
    bound = (rq[0], rk[0])
    taus = clear_thresholds(q.dtype, D, c, bound)  # None: the clearing leaves every entry as it is
    return bound, taus is None or (rq[1] >= taus[0] and rk[1] >= taus[1])


def _cleared(q: torch.Tensor, k: torch.Tensor, c: float, scratch: dict | None = None,
             owned: bool = False, bound: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` with every entry too small for any score to see set to exactly 0.

    A score is ``c Σ_d q_d k_d``; an entry ``|q_d| < τ_q = δ / (2 D c ‖k‖_∞)`` moves every score by
    less than ``δ / (2D)``, and likewise for ``k`` with ``τ_k = δ / (2 D c ‖q‖_∞)``, so clearing all of
    them moves no logit by more than ``δ`` (:data:`CLEAR_LOGIT`, 2^-30 in float32 and bfloat16): a
    relative change ``≤ δ`` of every weight. What stays is at least ``τ``, and every product the kernel
    forms is 0 or at least ``τ_q τ_k = δ² / (4 D² c² ‖q‖_∞ ‖k‖_∞)``: the fades of re-centred tiles
    (``e^{−λ(t − p)}`` on q, ``e^{−λ(p − s)}`` on k) underflow to exact zeros, never to subnormal
    numbers, which cost x86 cores a microcode assist per operation. float16 (range 2^-14) is left as is.
    ``scratch`` (a dict the caller keeps for the tiles of one call, whose cleared q and k die with each
    flash call): the cleared values are written into two buffers kept there, so that a tile after the
    first writes into pages already mapped instead of fresh ones. ``owned`` (with a scratch): q and k are
    this tile's own (:attr:`Tile.owned`) and cleared in place, no copy written at all. ``bound = (Q, K)``:
    upper bounds of ``‖q‖_∞`` and ``‖k‖_∞`` (:attr:`Tile.bound`) taken for them, with no pass over q and k to
    find them: the thresholds are smaller, so fewer entries clear and no logit moves further, while what
    stays is still at least ``τ`` (the bound a caller gives must keep ``τ_q τ_k`` a normal number).
    """
    if q.dtype not in CLEAR_LOGIT or q.numel() == 0 or k.numel() == 0:
        return q, k
    taus = clear_thresholds(q.dtype, q.shape[-1], c, (absmax(q), absmax(k)) if bound is None else bound)
    if taus is None:
        return q, k
    tq, tk = taus
    if owned and scratch is not None and not (q.requires_grad or k.requires_grad):
        if _kernels.clear_below(q, tq, into=q) is not None and _kernels.clear_below(k, tk, into=k) is not None:
            return q, k
    return _below(q, tq, _buffer(scratch, "q", q)), _below(k, tk, _buffer(scratch, "k", k))


def _buffer(scratch: dict | None, side: str, x: torch.Tensor) -> torch.Tensor | None:
    """A contiguous tensor of ``x``'s shape and dtype from ``scratch``'s buffer for ``side`` (grown to the
    largest tile asked for), or None without a scratch or under autograd (whose saved tensors must stay)."""
    if scratch is None or x.requires_grad:
        return None
    buf = scratch.get((side, x.dtype, x.device))
    if buf is None or buf.numel() < x.numel():
        buf = scratch[(side, x.dtype, x.device)] = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    return buf[: x.numel()].view(x.shape)


def absmax(x: torch.Tensor) -> float:
    """``max |x|``: one pass of the native absmax op where it runs, else ``abs().amax()``; NaN if x holds one."""
    m = _kernels.absmax(x.detach())
    if m is None:
        with torch.no_grad():
            m = float(x.detach().abs().amax())
    return m


def _below(x: torch.Tensor, tau: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` with its entries below ``tau`` in magnitude set to 0: one pass of the native clear op
    (:func:`liepos._kernels.clear_below`) where it runs, else ``masked_fill``. Under autograd the gradient
    passes as if nothing were cleared: the flash backward forms every entry's gradient from the other side's
    entries, and a raw entry that is merely small keeps its gradient. ``out``: a contiguous tensor of x's
    shape and dtype to write into (without autograd), else a fresh one."""
    if x.requires_grad:
        return _Cleared.apply(x, tau)
    return clear_small(x, tau, into=out)



class _Cleared(torch.autograd.Function):
    """:func:`~liepos._fast.clear_small` forward, the identity backward (the gradient of the uncleared ``x``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tau: float) -> torch.Tensor:
        return clear_small(x, tau)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


def _fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, D: int, Dv: int, c: float, scratch: dict | None = None,
         owned: bool = False, bound: tuple[float, float] | None = None, clean: bool = False):
    """One head count and one head size for the flash kernel: grouped keys repeated, the narrower of
    q/k and v padded with zero columns (zeros change no score and no output column), the entries of q
    and k no score can see cleared to exact zeros (:func:`_cleared`; ``bound``, ``clean``: :class:`Tile`'s),
    every row of unit stride (:func:`_rows_unit`)."""
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        # the flash kernel reads every head of k and v by q's strides: a mismatch would read past them
        raise ValueError(f"pieces need keys and values of one head count dividing the queries', got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[0] != v.shape[0] or k.shape[2] != v.shape[2]:
        # the flash kernel takes the key count from k and reads v's rows by it: fewer value rows would read past them
        raise ValueError(f"pieces need keys and values of one batch and as many values as keys, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    g = q.shape[1] // k.shape[1]
    if g > 1:  # grouped queries: (G, Hk, S, ·) -> (G, H, S, ·)
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    if Dv < D:
        v = Fn.pad(v, (0, D - Dv))  # (G, H, S, D)
    elif D < Dv:
        q, k = Fn.pad(q, (0, Dv - D)), Fn.pad(k, (0, Dv - D))  # (G, H, ·, Dv)
    k = k.to(q.dtype)
    if not clean:
        q, k = _cleared(q, k, c, scratch, owned, bound)
    return _rows_unit(q), _rows_unit(k), _rows_unit(v.to(q.dtype))


def tiles(shape: tuple[int, int, int], parts: list[Tile], c: float, sinks: torch.Tensor | None = None,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(B, H, T, Dv)`` output of the tiles ``parts`` merged per row by their log-sum-exps.

    ``shape = (B, H, T)``; every output row must be held by at least one tile, and row ``t`` gets
    ``softmax`` over the union of the keys of the tiles holding it (sinks in its denominator) — each
    key of a row in exactly one tile, the caller's contract. In ``dtype`` (default: the first query's).
    """
    D, Dv = parts[0].q.shape[-1], parts[0].v.shape[-1]
    parts = [p for p in parts if p.k.shape[2] and p.q.shape[2] and p.q.shape[0]]
    flat = [t for p in parts for t in _fit(p.q.to(dtype or p.q.dtype), p.k, p.v, D, Dv, c, bound=p.bound, clean=p.clean)]
    out = _Tiles.apply((*shape, max(D, Dv)), tuple(p.rows for p in parts), tuple(p.causal for p in parts),
                       tuple(p.bias for p in parts), c, sinks, *flat)
    return out[..., :Dv] if Dv < D else out


def _grad(p: Tile, sinks: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and (p.q.requires_grad or p.k.requires_grad or p.v.requires_grad
                                        or (sinks is not None and sinks.requires_grad))


def made(shape: tuple[int, int, int], makers: Iterable[Callable[[Arena | None], Tile]], c: float,
         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`tiles` over tiles made one at a time by ``makers``.

    When nothing needs a gradient the tiles are streamed: each is made, attended and merged into a
    running ``(O, L)`` (``L' = log(e^L + e^{L_i})``, ``O' = e^{L − L'} O + e^{L_i − L'} o_i``, one
    ``lerp`` with weight ``σ(L_i − L)``) before the
    next is made, so one tile's encodings are alive at a time (memory ``O(T)``, not ``O(T log T)``), and
    every maker after the first is given the call's :class:`Arena` to write its tile's own encodings into;
    otherwise every tile is made (given None) and merged by the autograd Function, which saves them for the backward.
    Every row must first be written by a tile marked ``first`` (the diagonal blocks: a partition of
    the rows) before another tile holding it is merged.
    """
    makers = iter(makers)
    if not torch.is_grad_enabled():  # streamed for certain: the first tile writes into the arena too
        return _streamed(shape, next(makers), makers, c, sinks)
    first = next(makers)(None)
    if _grad(first, sinks):
        return tiles(shape, [first, *(m(None) for m in makers)], c, sinks)
    held = [first]  # handed over once: the stream lets it go after its merge
    del first
    return _streamed(shape, lambda buffers: held.pop(), makers, c, sinks)


def _streamed(shape: tuple[int, int, int], first: Callable[[Arena | None], Tile],
              makers: Iterator[Callable[[Arena | None], Tile]], c: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """:func:`made`'s stream: each tile made (its own encodings written into this thread's arena), attended and
    merged before the next is made."""
    state: list[torch.Tensor] = []  # [O (B, H, T, max(D, Dv)), L (B, H, T)] once the first tile ran
    scratch: dict = {}  # the buffers of the tiles' cleared q and k, dead after each flash call
    with arena() as buffers:
        head = first(buffers)
        D, Dv, dtype = head.q.shape[-1], head.v.shape[-1], head.q.dtype
        p: Tile | None = head
        del head
        nxt = next(makers, None)
        while p is not None:
            # the only tile (no sinks to fold in after): its output, in its own dtype, is the call's
            _merge_into(state, shape, p, c, D, Dv, scratch, only=nxt is None and sinks is None and not state)
            p = None  # this tile is let go before the next is made
            p = None if nxt is None else nxt(buffers)
            nxt = None if p is None else next(makers, None)
    O, L = state
    if sinks is not None:
        O.mul_(torch.exp(L - torch.logaddexp(L, _sink_rows(sinks, L.dtype))).unsqueeze(-1))
    O = O.to(dtype)
    return O[..., :Dv] if Dv < D else O


def _merge_into(state: list, shape: tuple[int, int, int], p: Tile, c: float, D: int, Dv: int,
                scratch: dict | None = None, only: bool = False) -> None:
    """Attend one tile and merge it into the running ``state = [O, L]`` (allocated by the first); its
    cleared q and k are written into ``scratch``'s buffers (:func:`_cleared`). ``only``: no other tile follows
    and nothing is folded into the output after, so a tile holding every row in order is the output in the
    kernel's dtype (half precision too: no float32 state written and cast back)."""
    if not (p.k.shape[2] and p.q.shape[2] and p.q.shape[0]):
        return
    fitted = _fit(p.q, p.k, p.v, D, Dv, c, scratch, p.owned, p.bound, p.clean)
    # the kernel's own subnormal probabilities flushed, for the flash call alone: no Python runs flushed (with
    # denormals-are-zero a subnormal float hashes as 0, and a table-cache key holding one would be lost)
    with _kernels.flushed(p.q.device):
        o, Li = _flash(*fitted, 0.0, p.causal, attn_mask=p.bias, scale=c)
    r = p.rows
    B, H, T = shape
    every = r.start == 0 and r.a == 0 and r.b == r.period and r.count * r.period == T  # every row, in order
    if p.heads is not None and (not state or p.first):
        raise ValueError(f"a tile of heads {p.heads} merges into a running state of every head, written first")
    if not state and p.first and every and (o.dtype == Li.dtype or only):
        if r.count == 1:  # one block over every row: its output, in whatever order, is the running state
            state += [o, Li]
            return
        if B == 1 and o.transpose(0, 1).is_contiguous():
            # blocks whose output (count, H, w, ·) lies in memory as (H, count, w, ·) (the kernel writes in q's
            # order, and a tile's rows of one batch row keep the heads' order, :meth:`liepos.Encoding._span`): it
            # is the running (1, H, T, ·) state, not copied into a fresh one
            state += [o.transpose(0, 1).view(B, H, T, o.shape[-1]), Li.transpose(0, 1).reshape(B, H, T)]
            return
    if not state:
        state += [torch.empty(B, H, T, o.shape[-1], dtype=Li.dtype, device=o.device),
                  torch.empty((B, H, T), dtype=Li.dtype, device=o.device)]
    O, L = state
    if p.heads is not None:  # (B, h1 − h0, T, ·): the tile's own heads of the state
        O, L = O[:, p.heads[0] : p.heads[1]], L[:, p.heads[0] : p.heads[1]]
    lv, Ls = r.view(L), r.scatter(Li)  # (B, H, count, w)
    if _kernels.merge(r.view(O), lv, r.scatter(o), Ls, p.first):  # one pass over the rows, o read as it is
        return
    if p.first:
        r.view(O).copy_(r.scatter(o))
        lv.copy_(Ls)
        return
    # O' = e^{L − L'} O + e^{L_i − L'} o_i with weights summing to one: O + w (o_i − O), w = σ(L_i − L),
    # one pass over the rows (torch.lerp)
    w = torch.sigmoid(Ls - lv).unsqueeze(-1)  # (B, H, count, w, 1)
    r.view(O).lerp_(r.scatter(o).to(O.dtype), w)
    lv.copy_(torch.logaddexp(lv, Ls))


def pieces(q: torch.Tensor, parts: list[tuple], c: float, sinks: torch.Tensor | None = None,
           bound: tuple[float, float] | None = None, clean: bool = False) -> torch.Tensor:
    """``softmax(c · q [k_1; k_2; …]ᵀ [+ β]) [v_1; v_2; …]`` over pieces ``(k_i, v_i, is_causal[, β_i])``,
    in ``q``'s dtype.

    ``q (B, H, Sq, D)``; ``k_i (B, Hk, S_i, D)``, ``v_i (B, Hk, S_i, Dv)``, ``Hk`` dividing ``H``;
    an ``is_causal`` piece is the square diagonal block (``S_i = Sq``); ``β_i (B, H, 1, S_i)``, a
    per-key bias of the logits (float32). Empty pieces are skipped. ``sinks``: ``(H,)`` or per row
    ``(B, H, Sq)``. ``bound``, ``clean``: every piece's :class:`Tile` fields (bounds of max |q| and max |k|;
    nothing the clearing would change).
    """
    B, H, Sq, _ = q.shape
    every = Rows(0, 1, Sq, 0, Sq)
    ts = [_piece_tile(every, q, p, bound, clean) for p in parts if p[0].shape[2]]
    if not ts:
        raise ValueError("pieces needs at least one piece with keys")
    ts[0] = dataclasses.replace(ts[0], first=True)  # it holds every row: the streamed merge starts from it
    return made((B, H, Sq), [_maker(t) for t in ts], c, sinks)


def pieces_by_heads(q: torch.Tensor, shared: tuple, groups: list[tuple[int, int, tuple]], c: float,
                    sinks: torch.Tensor | None = None, bound: tuple[float, float] | None = None,
                    clean: bool = False) -> torch.Tensor:
    """:func:`pieces` with one piece ``shared`` by every head (attended in one call over all of them) and per group of
    heads ``(h0, h1, piece)`` a piece of those heads alone (``piece``: ``(k_i, v_i, is_causal[, β_i])`` of ``h1 − h0``
    heads), merged into those heads' rows: a per-head window of keys (a linear bias) whose own keys every head shares.
    Streamed only (nothing may need a gradient): every head's softmax is over the shared piece's keys and its group's."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (q, *shared, *(x for g in groups for x in g[2]), sinks)):
        raise ValueError("pieces_by_heads streams its tiles: nothing may need a gradient (use pieces per group)")
    B, H, Sq, _ = q.shape
    if not shared[0].shape[2]:
        raise ValueError("pieces_by_heads needs keys in its shared piece")
    every = Rows(0, 1, Sq, 0, Sq)
    first = _piece_tile(every, q, shared, bound, clean, first=True)
    rest = [_piece_tile(every, q[:, h0:h1], p, bound, clean, heads=(h0, h1)) for h0, h1, p in groups if p[0].shape[2]]
    with torch.no_grad():
        return made((B, H, Sq), [_maker(t) for t in (first, *rest)], c, sinks)


def pieces_per_group(q: torch.Tensor, shared: tuple, groups: list[tuple[int, int, tuple]], c: float,
                     sinks: torch.Tensor | None = None, bound: tuple[float, float] | None = None,
                     clean: bool = False) -> torch.Tensor:
    """:func:`pieces_by_heads`'s result as :func:`pieces` per group of heads: each group's piece and its heads' share
    of ``shared``, in calls of their own (under a gradient too: each group's tiles one autograd node)."""
    y = torch.empty(*q.shape[:-1], shared[1].shape[-1], dtype=q.dtype, device=q.device)  # (B, H, Sq, Dv)
    for h0, h1, piece in groups:
        own = tuple(t[:, h0:h1] if isinstance(t, torch.Tensor) else t for t in shared)  # (B, h1 − h0, ·, ·)
        hs = None if sinks is None else sinks[h0:h1] if sinks.dim() == 1 else sinks[:, h0:h1]
        y[:, h0:h1] = pieces(q[:, h0:h1], [piece, own], c, hs, bound, clean)
    return y


def _piece_tile(rows: Rows, q: torch.Tensor, piece: tuple, bound: tuple[float, float] | None, clean: bool,
                **fields: Any) -> Tile:
    """The tile of a piece ``(k, v, is_causal[, β])`` over ``rows`` of ``q``."""
    return Tile(rows, q, piece[0], piece[1], piece[2], bias=piece[3] if len(piece) > 3 else None, bound=bound,
                clean=clean, **fields)


def _maker(t: Tile) -> Callable[[Arena | None], Tile]:
    """A maker of :func:`made` that hands out a tile already made."""
    return lambda arena: t
