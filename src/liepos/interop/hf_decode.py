"""The decode step of a patched raw-key layer: keys kept encoded at a cache origin beside HF's cache.

A layer whose encoding is not a fixed rotation (xPos, RetNet, decays, ALiBi's slots, Jordan blocks)
caches *raw* keys in Hugging Face's cache (:mod:`liepos.interop.hf_model`). Encoding every cached key
again at each step would cost one pass over the cache per step before attention even starts; instead
each layer keeps beside HF's cache the keys encoded at one *origin* ``o``, ``G(s − o) k``, in the
store :class:`liepos.KVCache` uses (:class:`liepos.cache.EncodedKeys`: growth in place, the origin's
span, re-encoding), and a step encodes only its query and its new key, because the score does not
depend on ``o``::

    (F(t − o) q)ᵀ (G(s − o) k) = qᵀ A(t − s) k

The origin moves only when a query or a new key would leave the precision budget of
:mod:`liepos.recentre` around it: ``|λ|·|t − o|`` within the exponent budget and ``|t − o|`` within
the polynomial span (ALiBi's slots in float32: every 256 tokens; xPos: every ~12 000). Then every key
is encoded afresh from HF's raw keys at the new origin — no transport, so no drift — a cost of one
pass over the cache amortised over that many steps. Keys behind the origin may lie any distance back
(they fade causally), exactly as in :class:`liepos.KVCache` and :func:`liepos.attention`.

The tables of a step are built once per forward and shared by every layer with that encoding (rows
of a cached window of :data:`liepos._fast.CACHE` for consecutive positions). Whatever this path does
not cover (a static or sliding cache that returns other keys than "all so far", attention weights, a
length-dependent generator, a cache reordered or cropped since the last step, a query block wider
than the budget) returns ``None`` and the caller runs :func:`liepos.attention` over the raw keys.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as Fn

from liepos._checks import all_finite
from liepos._fast import TableCache, apply_fast, table_window
from liepos.cache import EncodedKeys
from liepos.attention_sdpa import sdpa
from liepos.encoding import Encoding
from liepos.generator import Generator
from liepos.attention_pieces import available, pieces
from liepos.lag_bias import bias_mask, constant_bias, linear_bias
from liepos.origin_budget import origin_span
from liepos.tables import check_range

__all__ = ["attend", "remember", "budget", "checked_step_matrix", "hf_visible", "identity", "step_matrix", "MATRICES",
           "STORES"]

STORES = "_liepos_encoded"  # the cache attribute holding every layer's encoded keys
_LOW = (torch.float16, torch.bfloat16)


@dataclass
class _Store:
    """One layer's keys encoded at an origin (:class:`liepos.cache.EncodedKeys`) and what HF's cache tells of them.

    ``keys`` holds, per key, the parts this layer's encoding needs: ``"k"`` ``(B, Hs, n, content_dim)`` the
    encoded content (absent when ``plain``: HF's raw keys serve), ``"slots"`` ``(1|B, H, n, slots)`` the
    keys' encoded slot values (their bias: qₛᵀ kₛ), ``"v"`` ``(B, Hk, n, Dv)`` values when HF's cannot serve
    (half inputs upcast), ``"scale"`` ``(1|B, H, n, 1)`` with ``factor``: each key's e^{−λ_h (s − o)}.
    Its version is what the encoded values depend on: the encoding, the work dtype, device, batch, heads.
    """

    keys: EncodedKeys
    raw: torch.Tensor  # HF's raw-key tensor after the last write: the cache is untouched while it stays
    finite: bool  # every key and value up to ``checked`` is finite
    own_v: bool  # the store keeps its own values (half inputs upcast)
    plain: bool  # the encoding leaves the content dims as they are: HF's raw keys serve as encoded content
    checked: int = 0  # the keys whose finiteness is known (read only when a mask hides some key)
    factor: Any = None  # (the rotation shared by every head, rates (H,)): heads that differ by one decay only

    def parts(self, enc: Encoding, ke: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """The store's parts of keys encoded by ``enc`` ``(B, Hs, S, content + slots)`` and their values."""
        c, out = enc.content_dim, {}
        if not self.plain:
            out["k"] = ke[..., :c]
        if enc.num_slots:
            out["slots"] = ke[..., c:]
        if self.own_v:
            out["v"] = v.to(ke.dtype)
        return out


def budget(enc: Encoding, dtype: torch.dtype) -> float:
    """The largest ``|t − o|`` of a query or new key around an origin, as :mod:`liepos.recentre` allows."""
    return origin_span(enc, dtype)


@functools.lru_cache(maxsize=64)
def _plain(enc: Encoding, version: tuple) -> bool:
    """Whether ``enc`` leaves its content dims as they are (NoPE content, the positions in the slots: ALiBi)."""
    g = enc.generator
    if g.basis is not None or enc.query_scale is not None:
        return False
    blocks = [i for i, off in enumerate(g.offsets) if off < g.dim - enc.num_slots]  # canonical: slots come last
    with torch.no_grad():
        return all(g.sizes[i] == 1 for i in blocks) and not bool(g.rates[..., blocks].any() or g.freqs[..., blocks].any())


@functools.lru_cache(maxsize=64)
def _factored(enc: Encoding, version: tuple) -> tuple[Encoding, torch.Tensor] | None:
    """For per-head parameters that differ only by one decay rate on every dim of a head (RetNet): the
    rotation shared by every head (an encoding without heads) and the rates ``(H,)``; else None.

    Then ``G_h(s − o) k = e^{−λ_h (s − o)} R(s − o) k``: the store keeps ``R(s − o) k`` at HF's key
    heads and one factor per head and key, and a score is ``c · e^{λ_h (t − o)} e^{−λ_h (s − o)} ·
    (R(t − o) q)ᵀ (R(s − o) k)`` — the same products as with per-head keys, the keys read once per
    group of query heads (:func:`_factored_attention`)."""
    g = enc.generator
    if enc.num_heads is None or g.basis is not None or enc.num_slots or enc.query_scale is not None:
        return None
    if g.num_axes is not None or max(g.sizes) > 1 or g.rates.requires_grad or g.freqs.requires_grad:
        return None
    rates, freqs = g.rates.detach(), g.freqs.detach()  # (H, blocks)
    if not bool((rates == rates[:, :1]).all()) or not bool((freqs == freqs[:1]).all()):
        return None
    rot = Encoding(Generator(torch.zeros_like(rates[0]), freqs[0].clone(), g.sizes, complex=g.complex),
                   layout=enc.layout, name=f"{enc.name}:rotation")
    return rot, rates[:, 0].clone()


def _decay(layer: Any, rates: torch.Tensor, rel: torch.Tensor, side: str, work: torch.dtype) -> torch.Tensor:
    """``e^{λ_h t}`` (query) or ``e^{−λ_h s}`` (key) at relative times ``rel`` ``(1|B, S)``: ``(1|B, H, S, 1)``,
    once per forward for every layer (``rel`` is the forward's)."""
    key = ("decay", id(rates), side, id(rel), work)
    d = layer.positions.tables.get(key) if layer is not None else None
    if d is None:
        e = rates.to(rel.device)[None, :, None] * rel[:, None, :]  # float64 (1|B, H, S)
        d = (e if side == "query" else -e).exp().to(work).unsqueeze(-1)
        if layer is not None and layer.positions.ids is not None:
            layer.positions.tables[key] = d
    return d


def _work(enc: Encoding, dtype: torch.dtype) -> torch.dtype:
    """The dtype keys are encoded and attended in: float32 for half inputs with Jordan parts (as liepos.attention)."""
    return torch.float32 if dtype in _LOW and enc.plan.has_coupling else dtype


def _tables(layer: Any, enc: Encoding, rel: torch.Tensor, side: str, x: torch.Tensor, key: tuple) -> Any:
    """Fast tables of one side at ``rel``, once per forward for every layer sharing the encoding (None: no fast form)."""
    memo = layer.positions.tables
    if key in memo:
        return memo[key]
    ft = None
    if enc._fast_usable(x, rel):
        if enc.plan.has_coupling:  # scales: |λ·rel| <= budget() <= log(max)/3 already; couplings τᵏ/k! may not
            check_range(enc.generator, rel, side, x.dtype)
        ft = enc._fast_tables(rel, side, torch.float32 if x.dtype in _LOW else x.dtype, True)
    if layer.positions.ids is not None:  # positions recorded for this forward: valid for every layer
        memo[key] = ft
    return ft


def _encode(layer: Any, enc: Encoding, x: torch.Tensor, rel: torch.Tensor, side: str, origin: float,
            work: torch.dtype) -> torch.Tensor:
    """``F(t − o) x`` or ``G(s − o) x`` with the encoded slots appended, in ``work`` (slots: float32 at least)."""
    x = x.to(work)
    if side == "query":
        x = enc._scaled(x)
    m = _matrix(layer, enc, x, rel, side, origin, work)
    if m is not None:
        return x @ m  # (B, H, 1, c) @ (1, H|1, c, c)
    ft = _tables(layer, enc, rel, side, x, ("origin", id(enc), side, origin, work, x.device, tuple(rel.shape)))
    if ft is None:
        return (enc.query if side == "query" else enc.key)(x, rel)
    out_dtype = ft.dtype if (enc.num_slots and x.dtype in _LOW) else x.dtype
    return apply_fast(x, ft, out_dtype=out_dtype)


def _matrix(layer: Any, enc: Encoding, x: torch.Tensor, rel: torch.Tensor, side: str, origin: float,
            work: torch.dtype) -> torch.Tensor | None:
    """``Mᵀ`` ``(1, H|1, c, c)`` of one side at one position for the whole batch (a decode step), else None.

    Row i is the transform of e_i, so ``x @ Mᵀ`` encodes every row of ``x`` in one matmul instead of
    a pass per block kind — the same sums (every output dim is the tables' one or two products, the
    rest exact zeros; a non-finite entry spreads over its token's row instead of its plane, a token
    whose scores are not finite either way). Read once per forward for every layer (:func:`step_matrix`);
    float32/64 without slots (slots are not linear in x, half inputs are encoded in float32 and rounded once).
    """
    if x.dtype in _LOW or rel.numel() != 1 or enc.num_slots:
        return None
    key = ("origin", id(enc), side, origin, work, x.device, tuple(rel.shape))
    memo = layer.positions.tables
    m = memo.get(("matrix",) + key)
    if m is None:
        m = checked_step_matrix(enc, x, rel, side, lambda: _tables(layer, enc, rel, side, x, key))
        if m is None:
            return None
        if layer.positions.ids is not None:
            memo[("matrix",) + key] = m
    return m


class _Rows:
    """``Mᵀ`` at every position of a window ``(W, 1, c, c)``: an entry of :data:`MATRICES`."""

    def __init__(self, m: torch.Tensor) -> None:
        self.m = m

    def nbytes(self) -> int:
        return self.m.numel() * self.m.element_size()


# windows of a decode step's Mᵀ, keyed like liepos._fast.CACHE (device, dtype, encoding version, side,
# window): one apply over the identity for 64 consecutive positions instead of one per forward
MATRICES = TableCache(max_entries=16, max_bytes=64 << 20)


def step_matrix(enc: Encoding, pos: torch.Tensor, side: str, dtype: torch.dtype, tables: Any) -> torch.Tensor:
    """``Mᵀ`` ``(1, H|1, c, c)`` of ``side`` at the one position ``pos`` (fast-usable, range checked).

    For an encoding shared by every head at an integer position: rows of a cached window, the transform
    of the identity at 64 consecutive positions in one apply (the tables' rows of the window of
    :data:`liepos._fast.CACHE`, so the same values bit for bit as an apply at the one position: every entry
    is a table product with 1 or an exact 0). Otherwise (per-head parameters: a window would cost more
    than it saves) the transform of the identity at ``tables()``, the fast tables at ``pos``.
    """
    c, device = enc.content_dim, pos.device
    p = float(pos.reshape(()))
    if enc.num_heads is None and p == math.floor(p) and abs(p) <= 2**52:
        base, end = table_window(int(p), 1)
        key = (device, dtype, enc.version, side, base, end)
        rows = MATRICES.get(key, lambda: _Rows(_window_matrices(enc, base, end, side, dtype, device)))
        return rows.m[int(p) - base: int(p) - base + 1]  # (1, 1, c, c)
    eye = identity(c, dtype, device).expand(1, enc.num_heads or 1, c, c)  # (1, H|1, c, c)
    return apply_fast(eye, tables())  # a position axis of size 1 broadcasts over the c rows


def checked_step_matrix(enc: Encoding, x: torch.Tensor, pos: torch.Tensor, side: str,
                        tables: Any) -> torch.Tensor | None:
    """:func:`step_matrix` for ``x``'s dtype once the fast path applies to ``x`` at ``pos`` and the range
    check passed (the tables at this position must fit the dtype); None: no fast form."""
    if not enc._fast_usable(x, pos):
        return None
    check_range(enc.generator, pos, side, x.dtype)
    return step_matrix(enc, pos, side, x.dtype, tables)


def _window_matrices(enc: Encoding, base: int, end: int, side: str, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
    """``Mᵀ`` ``(W, 1, c, c)`` at positions ``base … end − 1``: the identity's rows encoded at each."""
    c, W = enc.content_dim, end - base
    ft = enc._fast_tables(torch.arange(base, end, dtype=torch.float64, device=device), side, dtype, False)
    eye = identity(c, dtype, device).reshape(c, 1, 1, c).expand(c, 1, W, c).contiguous()  # (c rows, 1, W, c)
    return apply_fast(eye, ft).permute(2, 1, 0, 3).contiguous()  # (c, 1, W, c) -> (W, 1, c, c)


def _expand(x: torch.Tensor, heads: int, enc: Encoding) -> torch.Tensor:
    """Key/value heads repeated to ``heads`` for a per-head encoding (it acts on each query head's keys)."""
    g = 1 if enc.num_heads is None else heads // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)  # (B, Hk, S, d) -> (B, H, S, d)


def _rebuild(layer: Any, enc: Encoding, k: torch.Tensor, v: torch.Tensor, kpos: torch.Tensor, n: int,
             origin: float, version: tuple, work: torch.dtype, span: float, heads: int) -> _Store | None:
    """A store of the first ``n`` raw keys encoded at ``origin``; None when a key ahead of it is out of budget."""
    times = kpos[:, :n]
    if n and float(times.max()) - origin > span:  # a key later than the origin grows: bound it as recentre does
        return None
    ks, vs = k[:, :, :n], v[:, :, :n]
    plain = work == k.dtype and _plain(enc, enc.version)
    own_v = work != v.dtype  # per-head keys over grouped heads read HF's values (_grouped)
    st = _Store(EncodedKeys(), k, True, own_v, plain)
    st.factor = None if plain or work in _LOW else _factored(enc, enc.version)  # half: one rounding per key
    parts: dict[str, torch.Tensor] = {}
    if n and st.factor is not None:  # rotated at HF's heads, one decay factor per head and key
        rot, rates = st.factor
        parts = {"scale": _decay(None, rates, times - origin, "key", work),
                 **st.parts(rot, rot.key(ks.to(work), times - origin), vs)}
    elif n and (not plain or enc.num_slots or own_v):
        parts = st.parts(enc, enc.key(_expand(ks, heads, enc).to(work), times - origin), vs)
    st.keys.reencode(version, origin, span, n, **parts)  # every key encoded afresh at the origin
    return st


def attend(layer: Any, idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
           scaling: float | None, pos: torch.Tensor, kpos: torch.Tensor, cache: Any, seen: int,
           raw_before: Any) -> torch.Tensor | None:
    """Attention of ``q`` ``(B, H, S, D)`` over HF's keys through the layer's encoded-key store, or None.

    ``k``/``v`` are every key/value so far as HF's cache returned them, raw; ``pos`` ``(1|B, S)`` the
    query times, ``kpos`` ``(B, seen + S)`` the key times; ``raw_before`` HF's key tensor before this
    step's write (the store is valid only while it is the tensor the store last saw).
    """
    enc: Encoding = layer.encoding
    B, H, S, _ = q.shape
    if (enc.length_rule is not None or pos.dim() != 2 or k.shape[2] != seen + S or kpos.shape[-1] != seen + S
            or not hasattr(cache, "__dict__") or _training(q, k, v)):
        return None
    stores = cache.__dict__.setdefault(STORES, {})
    work = _work(enc, q.dtype)
    version = (_version(layer, enc), work, q.device, B, k.shape[1])
    st = stores.get(idx)
    if st is not None and (st.keys.version != version or st.raw is not raw_before or len(st.keys) != seen):
        st = None  # another encoding, or the cache was reordered, cropped or reset: encode afresh
    span = st.keys.span if st is not None else budget(enc, work)
    lo, hi = _bounds(layer, pos)
    if st is None or not st.keys.within_range(lo, hi):
        stores.pop(idx, None)
        if hi - lo > span:  # the queries need several origins: one per block of them, or liepos.attention
            blocked = _blocks(layer, enc, q, k, v, attention_mask, scaling, pos, kpos, seen, version, work, span)
            if blocked is not None:
                stores[idx] = blocked[1]
            return None if blocked is None else blocked[0]
        st = _rebuild(layer, enc, k, v, kpos, seen, _origin(lo, hi, span), version, work, span, H)
        if st is None:
            return None
    out = _step(layer, enc, st, q, k, v, attention_mask, scaling, pos, seen, work, kpos)
    st.raw = k
    stores[idx] = st
    return out


def _blocks(layer: Any, enc: Encoding, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
            scaling: float | None, pos: torch.Tensor, kpos: torch.Tensor, seen: int, version: tuple,
            work: torch.dtype, span: float) -> tuple[torch.Tensor, _Store] | None:
    """A prefill wider than the budget: blocks of queries, each within ``span`` of its own origin (as
    :mod:`liepos.recentre` cuts them), every key up to the block's end encoded at that origin; the last
    block's store is the layer's for decoding. None (liepos.attention then) unless the times are one
    increasing row and nothing was cached before."""
    t = pos[0]  # (S,)
    S = t.shape[0]
    if seen or pos.shape[0] != 1 or (S > 1 and not bool((t[1:] > t[:-1]).all())):
        return None
    outs, a, st = [], 0, None
    while a < S:
        b = max(a + 1, int(torch.searchsorted(t, t[a] + span, right=True)))  # queries a … b-1
        st = _rebuild(layer, enc, k, v, kpos, a, _origin(float(t[a]), float(t[b - 1]), span), version, work,
                      span, q.shape[1])
        if st is None:
            return None
        mask = attention_mask
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            mask = mask[..., a:b, :b]  # (B|1, 1, S, Sk) -> the block's rows and keys
        elif isinstance(mask, torch.Tensor):
            mask = mask[..., :b]  # (B, Sk) padding
        outs.append(_step(layer, enc, st, q[:, :, a:b], k[:, :, :b], v[:, :, :b], mask, scaling, pos[:, a:b], a,
                          work, kpos[:, :b]))
        a = b
    if st is None:  # no query
        return None
    st.raw = k
    return torch.cat(outs, dim=2), st


@functools.lru_cache(maxsize=16)
def identity(d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ``d × d`` identity (read only: the transform of its rows is a step's ``Mᵀ``), made once."""
    return torch.eye(d, dtype=dtype, device=device)


def _training(*xs: torch.Tensor) -> bool:
    """A forward that autograd records: liepos.attention's path (the store serves inference)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _origin(lo: float, hi: float, span: float) -> float:
    """The origin for queries from ``lo`` to ``hi`` (``hi − lo ≤ span``): ``⌊span⌋`` past the first, so
    the queries that follow stay within the budget for about ``2·span − (hi − lo)`` more positions
    (every key so far lies behind it: causally they fade). A whole number of positions, so that integer
    times stay integers relative to it and a step reads its tables from a cached window."""
    return lo + math.floor(span) if math.isfinite(span) else hi


def _version(layer: Any, enc: Encoding) -> tuple:
    """``enc.version``, read once per forward for every layer (it stamps every parameter tensor)."""
    memo = layer.positions.tables
    v = memo.get(("version", id(enc)))
    if v is None:
        v = enc.version
        if layer.positions.ids is not None:
            memo[("version", id(enc))] = v
    return v


def _bounds(layer: Any, pos: torch.Tensor) -> tuple[float, float]:
    """``(min, max)`` of the query times, read once per forward."""
    memo = layer.positions.tables
    b = memo.get("bounds")
    if b is None:
        b = (float(pos.min()), float(pos.max()))
        if layer.positions.ids is not None:
            memo["bounds"] = b
    return b


def _step(layer: Any, enc: Encoding, st: _Store, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          attention_mask: Any, scaling: float | None, pos: torch.Tensor, seen: int, work: torch.dtype,
          kpos: torch.Tensor) -> torch.Tensor:
    """Encode the new keys and the queries at the store's origin, append, attend.

    Slots (ALiBi) do not widen the attention: their part of the score, ``F(t − o) sₚᵀ G(s − o) sₖ``,
    depends on the times only and joins as an additive bias, unscaled, so the content dims keep the
    head dim the fused kernel wants (a 66-wide head falls back to the slow math kernel on the CPU).
    """
    B, H, S, _ = q.shape
    store, origin = st.keys, st.keys.origin
    rel = layer.positions.tables.get(("rel", origin))
    if rel is None:
        rel = pos - origin  # (1|B, S), the same in every layer
        if layer.positions.ids is not None:
            layer.positions.tables[("rel", origin)] = rel
    kn, vn = k[:, :, seen:], v[:, :, seen:]
    c = (1.0 / math.sqrt(enc.content_dim) if scaling is None else scaling) * enc.logit_scale
    _encode_keys(layer, enc, kn, rel, st, vn, work, H)
    n = len(store)
    if st.plain:  # the content is HF's own q and k: only the slots' values are encoded (once per forward)
        qc, ke, qs = q, k, _slot_values(layer, enc, q, rel, "query", origin, work, H) if enc.num_slots else None
    else:
        qe, ke = _encode(layer, st.factor[0] if st.factor else enc, q, rel, "query", origin, work), store.part("k")
        qc, qs = (qe[..., : enc.content_dim], qe[..., enc.content_dim:]) if enc.num_slots else (qe, None)
    ve = (store.part("v") if st.own_v else v).to(qc.dtype)
    mask = _mask(attention_mask, S, n, seen, q.device)
    if mask is not None and st.checked < n:
        # a key hidden from some query must not reach it even when it is not finite: know whether
        # every key is (unmasked, a non-finite key reaches every query in either kernel alike)
        st.finite = st.finite and all_finite(k[:, :, st.checked:n], v[:, :, st.checked:n])
        st.checked = n
    if st.factor is not None and (S > 1 or not st.finite):  # the per-head form: scaled keys and queries
        ke = _expand(ke, H, enc) * store.part("scale")  # (B, Hk, n, c) -> (B, H, n, c)
        qc = qc * _decay(layer, st.factor[1], rel, "query", work)
    if not st.finite:  # the select-masked form: slots ride as columns again (c applied to the content)
        if enc.num_slots and qs is not None:  # qs: the queries' slot values, there exactly when slots are
            ks = store.part("slots").expand(B, -1, -1, -1)  # (B, H, n, slots)
            ke = torch.cat((_expand(ke, H, enc).expand(-1, ks.shape[1], -1, -1).to(ks.dtype), ks), -1)
            qc, c = torch.cat((qc * c, qs.expand(B, -1, -1, -1)), -1), 1.0
        if ve.shape[1] != ke.shape[1]:  # per-head keys over HF's grouped values
            ve = ve.repeat_interleave(ke.shape[1] // ve.shape[1], dim=1)  # (B, Hk, n, Dv) -> (B, H, n, Dv)
        return sdpa(qc, ke, ve, mask, c, finite=False).to(v.dtype)
    if enc.num_slots and S > 1 and st.factor is None and hf_visible(attention_mask, n) is None:
        # a causal multi-token step (every earlier key, its own causally: no padding, no other mask)
        out = _linear_prefill(enc, qc, ke[:, :, :n], ve, kpos[:, :n] - origin, c)
        if out is not None:
            return out.to(v.dtype)
    bias = None
    if enc.num_slots and qs is not None:  # qs: there exactly when slots are
        key = ("bias", id(enc), origin, n, work)
        bias = layer.positions.tables.get(key)
        if bias is None:
            bias = qs @ store.part("slots").transpose(-1, -2)  # (1|B, H, S, n): the same in every layer
            if layer.positions.ids is not None:
                layer.positions.tables[key] = bias
    if mask is not None:  # an additive float mask (a boolean one is slow on the CPU)
        base = bias if bias is not None else torch.zeros(mask.shape, dtype=qc.dtype, device=qc.device)
        bias = base.masked_fill(~mask, -math.inf)
    causal = mask is None and S > 1
    if causal and bias is not None:  # a prefill-sized step with slots: the causal order goes into the bias
        order = torch.ones(S, n, dtype=torch.bool, device=q.device).tril(n - S)
        bias, causal = bias.masked_fill(~order, -math.inf), False
    if st.factor is not None and S == 1:  # rotated keys at HF's heads, the heads' decays as factors
        a = _decay(layer, st.factor[1], rel, "query", work)  # (1|B, H, 1, 1)
        return _factored_attention(qc, ke, store.part("scale")[..., 0], a[..., 0], ve, bias, c).to(v.dtype)
    if ve.shape[1] != ke.shape[1] and S == 1:  # per-head keys over HF's grouped values: read once per group
        return _grouped(qc, ke, ve, bias, c).to(v.dtype)
    if ve.shape[1] != ke.shape[1]:  # a multi-token step: the values repeated to the keys' heads
        ve = ve.repeat_interleave(ke.shape[1] // ve.shape[1], dim=1)  # (B, Hk, n, Dv) -> (B, H, n, Dv)
    out = Fn.scaled_dot_product_attention(qc, ke, ve, attn_mask=bias, is_causal=causal, scale=c,
                                          enable_gqa=ke.shape[1] != H)
    return out.to(v.dtype)


def _linear_prefill(enc: Encoding, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel: torch.Tensor,
                    c: float) -> torch.Tensor | None:
    """A causal multi-token step (its S queries are the last S of the n keys, ``rel (1|B, n)`` the keys'
    times from the origin) under a linear bias (ALiBi): the fused kernels with the per-key part
    ``m_h (s − o)`` as their broadcast mask ``(1|B, H, 1, n)`` — the earlier keys unmasked, the step's own
    causally — instead of the ``(S × n)`` bias; the row's part ``b_h − m_h (t − o)`` changes no softmax.
    None when it does not apply (not the CPU kernel, not a linear bias, the slots asking for a gradient)."""
    if not available(q) or not constant_bias(enc, rel):
        return None
    lb = linear_bias(enc, q.shape[1])
    if lb is None:
        return None
    beta = bias_mask(lb[0], rel, q.dtype)  # (1|B, H, 1, n)
    if v.shape[1] != k.shape[1]:  # per-head keys over HF's grouped values
        v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)  # (B, Hk, n, Dv) -> (B, H, n, Dv)
    beta = beta.expand(q.shape[0], -1, -1, -1)  # (B, H, 1, n)
    a = k.shape[2] - q.shape[2]  # keys before the step's own
    parts = [(k[:, :, :a], v[:, :, :a], False, beta[..., :a]), (k[:, :, a:], v[:, :, a:], True, beta[..., a:])]
    return pieces(q, parts, c)


def _factored_attention(q: torch.Tensor, k: torch.Tensor, kf: torch.Tensor, qf: torch.Tensor, v: torch.Tensor,
                        bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """One query per head ``(B, H, 1, D)`` (rotated) over keys rotated at HF's heads ``(B, Hk, n, D)``
    with the heads' factors ``kf`` ``(B|1, H, n)`` and ``qf`` ``(1|B, H, 1)`` (:func:`_factored`), values
    ``(B, Hk, n, Dv)``: logits ``scale · qf · kf · (q·k)``, the keys and values read once per group."""
    B, H, S, D = q.shape
    Hk = k.shape[1]
    s = torch.matmul(q.reshape(B, Hk, H // Hk * S, D), k.transpose(-1, -2)).reshape(B, H, S, -1)  # (B, H, 1, n)
    s = s * (kf.unsqueeze(-2) * (qf.unsqueeze(-1) * scale))
    if bias is not None:
        s = s + bias
    w = torch.softmax(s, dim=-1)
    return torch.matmul(w.reshape(B, Hk, H // Hk * S, -1), v).reshape(B, H, S, -1)  # (B, Hk, g, Dv) -> (B, H, 1, Dv)


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Softmax attention of queries ``(B, H, S, D)`` over per-head keys ``(B, H, n, D)`` and HF's grouped
    values ``(B, Hk, n, Dv)`` (query heads ``j·g … j·g + g − 1`` share value head j, as ``enable_gqa``),
    ``bias`` additive ``(…, S, n)``. A decode step reads its values once per group instead of repeated to
    every query head for SDPA (RetNet's per-head decays on 8 query heads over 4 value heads: a quarter
    fewer bytes per step, the step's cost on a CPU)."""
    B, H, S, _ = q.shape
    Hk = v.shape[1]
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (B, H, S, n)
    if bias is not None:
        s = s + bias
    w = torch.softmax(s, dim=-1)
    return torch.matmul(w.reshape(B, Hk, H // Hk * S, -1), v).reshape(B, H, S, -1)  # (B, Hk, g·S, Dv) -> (B, H, S, Dv)


def _encode_keys(layer: Any, enc: Encoding, kn: torch.Tensor, rel: torch.Tensor, st: _Store, vn: torch.Tensor,
                 work: torch.dtype, heads: int) -> None:
    """Encode a step's new raw keys ``kn`` ``(B, Hk, S, D)`` at the store's origin and append them (and
    their values where the store keeps its own): the only key encoding of a decode step."""
    S, origin = kn.shape[-2], st.keys.origin
    if st.plain:  # HF's raw keys are the content: only their slots' values
        parts: dict[str, torch.Tensor] = (
            {"slots": _slot_values(layer, enc, kn, rel, "key", origin, work, heads)} if enc.num_slots else {})
        if st.own_v:
            parts["v"] = vn.to(work)
        st.keys.append(S, **parts)
        return
    parts = {}
    if st.factor is not None:  # rotated at HF's heads; the per-head decay kept as one factor per key
        parts["scale"] = _decay(layer, st.factor[1], rel, "key", work)
        enc = st.factor[0]
    kn = _expand(kn, heads, enc).to(work)
    m = _matrix(layer, enc, kn, rel, "key", origin, work)
    if m is not None:  # one matmul (no slots: a step matrix is linear), copied into the store's next rows
        ke = kn @ m
        parts["k"] = ke
        if st.own_v:
            parts["v"] = vn.to(ke.dtype)
    else:
        parts.update(st.parts(enc, _encode(layer, enc, kn, rel, "key", origin, work), vn))
    st.keys.append(S, **parts)


def _slot_values(layer: Any, enc: Encoding, x: torch.Tensor, rel: torch.Tensor, side: str, origin: float,
                 work: torch.dtype, heads: int) -> torch.Tensor:
    """The encoded slot values ``(1|B, H, S, slots)`` at ``rel`` (they depend on the times only)."""
    ft = _tables(layer, enc, rel, side, x, ("origin", id(enc), side, origin, work, x.device, tuple(rel.shape)))
    if ft is not None:
        sv = ft.slot_vals  # (…, S, slots), (H|1, S, slots) or (B, H|1, S, slots)
        while sv.dim() < 4:
            sv = sv.unsqueeze(0)
        return sv.to(work).expand(-1, heads, -1, -1)
    zeros = x.new_zeros(x.shape[0], heads, x.shape[2], enc.content_dim).to(work)
    return (enc.query if side == "query" else enc.key)(zeros, rel)[..., enc.content_dim:]


def hf_visible(attention_mask: Any, Sk: int) -> torch.Tensor | None:
    """HF's attention mask (boolean, additive float, or ``(B, Sk)`` padding) as booleans over the last ``Sk`` keys."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"an attention mask of type {type(attention_mask).__name__} (flex attention's BlockMask?) is not "
            "supported on the raw-key path; use attn_implementation='sdpa' or 'eager'"
        )
    m = attention_mask
    hf = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    if hf.dim() == 2:  # (B, Sk) padding, 1 = token
        return hf.bool()[:, None, None, -Sk:]  # (B, 1, 1, Sk)
    return hf[..., -Sk:]


def _mask(attention_mask: Any, S: int, Sk: int, seen: int, device: torch.device) -> torch.Tensor | None:
    """HF's mask as booleans ``(…, S, Sk)``, with the causal order of a multi-token step; None: all visible."""
    hf = hf_visible(attention_mask, Sk)
    if S == 1:
        return hf
    order = torch.arange(Sk, device=device)[None, :] <= (torch.arange(S, device=device) + seen)[:, None]  # (S, Sk)
    if hf is None:
        return None if seen == 0 else order[None, None]  # None: the causal kernel (S == Sk)
    return hf & order


def remember(layer: Any, idx: int, k: torch.Tensor, v: torch.Tensor, kpos: torch.Tensor, cache: Any, heads: int,
             pos: torch.Tensor) -> None:
    """After a call :func:`attend` declined for its query span (a prefill): encode its keys at its last time."""
    enc: Encoding = layer.encoding
    if (enc.length_rule is not None or pos.dim() != 2 or kpos.shape[-1] != k.shape[2] or not hasattr(cache, "__dict__")
            or _training(k, v)):
        return
    work = _work(enc, k.dtype)
    origin = _bounds(layer, pos)[1]
    version = (enc.version, work, k.device, k.shape[0], k.shape[1])
    st = _rebuild(layer, enc, k, v, kpos, k.shape[2], origin, version, work, budget(enc, work), heads)
    if st is not None:
        cache.__dict__.setdefault(STORES, {})[idx] = st
