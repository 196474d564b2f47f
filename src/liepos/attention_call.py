"""The validated inputs of one :func:`liepos.attention` call.

Every argument is checked here, before the cache is touched: a refused call leaves a
:class:`~liepos.KVCache` exactly as it was (no key of a refused call is ever appended, a mixed-dtype
call cannot poison it). :func:`prepare` returns the new keys' times and masks; :func:`bind` appends
them to the cache and fixes what depends on the whole key set (the generator for this length, the
scale, grouped heads, whether every key is finite, whether the fused causal kernel applies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from liepos import _kernels
from liepos._checks import all_finite, check_bool, check_int, check_real, check_real_tensor, check_tensor
from liepos.cache import KVCache
from liepos.encoding import Encoding, as_positions
from liepos.masks import strictly_increasing

__all__ = ["LOW", "LAZY_DTYPES", "Call", "Inputs", "prepare", "bind", "widened", "expand_batch", "key_times", "half_holds",
           "in_float32", "row_norms"]

# the dtypes whose call with slots that couple nothing but themselves (ALiBi) stays as the caller gave it until the
# path is chosen (Call.lazy): the fused linear-bias path reads q, k, v as they are, its scale c; every other path
# widens them to float32 and multiplies q by c (float32: that product is a fresh pass over q the fused path saves)
LAZY_DTYPES = (torch.bfloat16, torch.float32)
# the half-precision dtypes of an attention call, whose working dtype is float32
LOW = (torch.float16, torch.bfloat16)
# the largest factor an origin's budget lets a float16 encoding apply, e^{log(max)/3} (origin_budget's limit)
HALF_GROWTH = math.exp(math.log(torch.finfo(torch.float16).max) / 3)


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """``‖x[…, i, :]‖`` of every row, without a gradient: in float32 for float32 and half precision (read as
    stored, no float32 copy of x: one native pass where it runs), in float32 for float64 as well (the bounds built
    on it leave room for that)."""
    x = x.detach()
    if x.dtype != torch.float64 and (n := _kernels.norms(x)) is not None:
        return n
    if x.dtype in (torch.bfloat16, torch.float16):
        return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32)
    return x.float().norm(dim=-1)


def half_holds(enc: Encoding, venc: Encoding | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               tau: float = 1.0) -> bool:
    """Whether float16 holds every encoded value of a call: ``|q|·τ·max(query_scale)``, ``|k|`` (and ``|v|``
    under a value encoding) times the largest factor the encodings apply (e^budget around an origin, √2
    within a rotation plane) stay below float16's largest value. Read only where a factor exceeds 2."""
    grows = enc.needs_recentring or (venc is not None and venc.needs_recentring)
    qs = 1.0 if enc.query_scale is None else max(1.0, float(enc.query_scale.detach().abs().max()))
    factor = (HALF_GROWTH if grows else 1.0) * math.sqrt(2.0)
    if factor * qs * tau <= 2.0 or q.is_meta:
        return True
    with torch.no_grad():
        big = max(float(q.detach().abs().amax()) * qs * tau if q.numel() else 0.0,
                  float(k.detach().abs().amax()) if k.numel() else 0.0,
                  float(v.detach().abs().amax()) if venc is not None and v.numel() else 0.0)
    return big * factor < torch.finfo(torch.float16).max


def in_float32(call: Call) -> Call:
    """The call computed in float32 (its output is cast back once by :func:`liepos.attention`)."""
    return replace(call, q=call.q.float(), k=call.k.float(), v=call.v.float())


@dataclass
class Inputs:
    """Checked arguments and the new keys' times / padding / documents, before any cache write."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    enc: Encoding
    venc: Encoding | None
    axes: int | None
    kpos: torch.Tensor  # (B, Sk_new) or (B, Sk_new, axes) float64
    keep: torch.Tensor  # (B, Sk_new) bool
    kdocs: torch.Tensor | None
    qpos: torch.Tensor | None  # (B, Sq[, axes]) or None: the last Sq key times
    qdocs: torch.Tensor | None
    attn_mask: torch.Tensor | None
    causal: bool
    scale: float | None
    sinks: torch.Tensor | None
    block_size: int
    cache: KVCache | None


@dataclass
class Call:
    """Everything one attention evaluation needs, over all keys (the cache's included)."""

    q: torch.Tensor  # (B, H, Sq, D), already multiplied by c when the encoding has slots
    k: torch.Tensor  # (B, Hk, Sk, D) raw keys
    v: torch.Tensor  # (B, Hk, Sk, Dv) raw values
    enc: Encoding  # at this length
    venc: Encoding | None
    qpos: torch.Tensor  # (B, Sq[, axes]) float64
    kpos: torch.Tensor  # (B, Sk[, axes]) float64
    qord: torch.Tensor  # (B, Sq) the order the causal mask follows (times, or token order with axes)
    kord: torch.Tensor  # (B, Sk)
    keep: torch.Tensor  # (B, Sk) bool
    qdocs: torch.Tensor | None
    kdocs: torch.Tensor | None
    attn_mask: torch.Tensor | None
    causal: bool
    c: float
    sinks: torch.Tensor | None
    block_size: int
    cache: KVCache | None
    n_new: int
    finite: bool  # every key and value is finite
    simple: bool  # the fused causal kernel applies: equal, strictly increasing times, nothing else masked
    unmasked: bool  # not causal and nothing masked: every key is seen by every query
    # the dtype the flash kernel reads the encoded content in where a path keeps the slots out of q and k
    # (ALiBi's bias as the kernel's per-key mask): the caller's bfloat16 when only the slots needed float32
    content_dtype: torch.dtype | None = None
    # q, k, v are still the caller's (bfloat16 or float32: LAZY_DTYPES) and q is not yet multiplied by c
    # (``content_dtype`` set): the fused linear-bias path reads them so; every other path takes :func:`widened` first
    lazy: bool = False

    def cached(self) -> KVCache:
        """The call's cache, for a path that needs one (raise when the call has none)."""
        if self.cache is None:
            raise ValueError("this attention path needs a KVCache, but the call has none")
        return self.cache

    def mask_args(self, rows: slice, n_keys: int | None = None) -> tuple:
        """The arguments of :func:`liepos.masks.visible` for ``rows`` and the first ``n_keys`` keys."""
        n = slice(None, n_keys)
        am = None if self.attn_mask is None else self.attn_mask[..., n]
        kd = None if self.kdocs is None else self.kdocs[:, n]
        return self.qord, self.kord[:, n], self.keep[:, n], self.qdocs, kd, am, self.causal, rows


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ndim=4)
        if not x.dtype.is_floating_point:
            raise TypeError(f"`{name}` must have a floating dtype, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError(
            f"`q`, `k` and `v` must share one dtype and device, got {q.dtype}/{k.dtype}/{v.dtype} "
            f"on {q.device}/{k.device}/{v.device}"
        )
    B, H, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must share heads and sequence length")
    if k.shape[-1] != D:
        raise ValueError(f"q has head dim {D} but k has {k.shape[-1]}")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"key/value heads ({k.shape[1]}) must divide query heads ({H}) for grouped-query attention")


def _check_encodings(enc: Any, venc: Any, q: torch.Tensor, v: torch.Tensor, causal: bool, allow: bool) -> None:
    if not isinstance(enc, Encoding):
        raise TypeError(f"`enc` must be a liepos.Encoding, got {type(enc).__name__}")
    H = q.shape[1]
    if enc.num_heads is not None and enc.num_heads != H:
        raise ValueError(f"the encoding has per-head parameters for {enc.num_heads} heads but q has {H}")
    if q.shape[-1] != enc.content_dim:
        raise ValueError(f"q has head dim {q.shape[-1]} but the encoding expects {enc.content_dim}")
    if venc is not None:
        if not isinstance(venc, Encoding):
            raise TypeError(f"`value_encoding` must be a liepos.Encoding, got {type(venc).__name__}")
        if venc.num_slots:
            raise ValueError(f"`value_encoding` must have no slots (values carry no constants), got {venc!r}")
        if getattr(venc, "num_axes", None) is not None or getattr(enc, "num_axes", None) is not None:
            raise ValueError("`value_encoding` needs one position axis: encodings with several axes are not supported")
        if venc.dim != v.shape[-1]:
            raise ValueError(f"`value_encoding` acts on {venc.dim} dims but v has {v.shape[-1]}")
        if venc.num_heads is not None and venc.num_heads != H:
            raise ValueError(f"`value_encoding` has per-head parameters for {venc.num_heads} heads but q has {H}")
    grows = enc.needs_recentring or (venc is not None and venc.needs_recentring)
    if not causal and grows and not allow:
        raise ValueError(
            f"bidirectional attention (causal=False) with {enc!r}: its generator is not orthogonal "
            f"(decay, growth, a Jordan block or slots), so A(t - s) for t < s grows instead of fading and "
            f"the encoding leaves the family; pass allow_bidirectional=True to run it anyway"
        )


def _check_sinks(sinks: Any, H: int, device: torch.device) -> torch.Tensor | None:
    if sinks is None:
        return None
    s = check_real_tensor("sinks", sinks, ndim=1, dtype=None)
    if s.shape[0] != H:
        raise ValueError(f"`sinks` must have shape ({H},) (one logit per query head), got {tuple(s.shape)}")
    if not s.dtype.is_floating_point:
        s = s.double()
    return s.to(device)


def expand_batch(p: torch.Tensor, B: int, axes: int | None = None) -> torch.Tensor:
    """Positions broadcast to every batch row, as a view: (S,) or (1|B, S) -> (B, S); with several axes
    (S, A) or (1|B, S, A) -> (B, S, A)."""
    if p.dim() == (1 if axes is None else 2):
        p = p.unsqueeze(0)  # (S[, A]) -> (1, S[, A])
    return p.expand(B, *p.shape[1:])  # (1|B, S[, A]) -> (B, S[, A])


def _positions(p: Any, n: int, B: int, axes: int | None, name: str, dev: torch.device) -> torch.Tensor:
    t = expand_batch(as_positions(p, n, B, name, axes), B, axes)
    if t.is_meta and dev.type != "meta":
        raise ValueError(f"{name} are on the meta device (no values) but the tensors are on {dev}")
    return t.to(dev)


def key_times(k, positions, key_positions, B, Sq, axes, cache) -> torch.Tensor:
    """The times ``(B, n[, axes])`` of the ``n = k.shape[2]`` new keys of an attention call: ``key_positions``
    when given; the query times when as many keys as queries come with ``positions`` only (self-attention);
    else ``0 … n − 1``, continuing after each row's last time in ``cache`` (several axes: after its largest
    coordinate, on every axis). The rule :func:`liepos.attention` applies, for callers that keep their
    own cache of the same times."""
    n, dev = k.shape[2], k.device
    if key_positions is not None:
        return _positions(key_positions, n, B, axes, "key_positions", dev)
    if positions is not None and n == Sq:
        return _positions(positions, n, B, axes, "positions", dev)
    kpos = torch.arange(n, dtype=torch.float64)
    if cache is not None and len(cache):
        # continue each row after its own last cached time (several axes: after the largest
        # coordinate, on every axis, as M-RoPE's text after an image)
        kpos = cache.last_times().cpu() + 1 + kpos  # (B, n)
    if axes is not None:
        kpos = kpos.unsqueeze(-1).expand(*kpos.shape, axes)  # (…, n) -> (…, n, axes)
    return expand_batch(kpos, B, axes).to(dev)


def _bool_tensor(m: Any, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        raise TypeError(f"`{name}` must be a boolean tensor (True = attend), got {type(m).__name__} "
                        f"{getattr(m, 'dtype', '')}")
    if tuple(m.shape) != shape:
        raise ValueError(f"`{name}` must have shape {shape}, got {tuple(m.shape)}")
    return m


def _documents(document_ids, key_document_ids, B, Sq, Sk_new, dev):
    kd = key_document_ids if key_document_ids is not None else document_ids
    if kd is None:
        return None, None
    if key_document_ids is None and Sk_new != Sq:
        raise ValueError("document_ids without key_document_ids needs as many keys as queries")
    if not isinstance(kd, torch.Tensor) or tuple(kd.shape) != (B, Sk_new):
        raise ValueError(f"key_document_ids must be a tensor of shape {(B, Sk_new)}, got "
                         f"{tuple(getattr(kd, 'shape', ()))}")
    qd = None
    if document_ids is not None:
        if not isinstance(document_ids, torch.Tensor) or tuple(document_ids.shape) != (B, Sq):
            raise ValueError(f"document_ids must be a tensor of shape {(B, Sq)}, got "
                             f"{tuple(getattr(document_ids, 'shape', ()))}")
        qd = document_ids.to(dev)
    return qd, kd.to(dev)


def _check_cache(cache: Any, k: torch.Tensor, axes: int | None) -> None:
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(f"`cache` must be a liepos.KVCache, got {type(cache).__name__}")
    if cache.batch is not None and cache.batch != k.shape[0]:
        raise ValueError(
            f"the batch size changed mid-cache: the KVCache holds {cache.batch} rows but k has {k.shape[0]}; "
            f"use a new KVCache (or cache.reset()) for another batch"
        )


def prepare(q, k, v, enc, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids,
            key_document_ids, cache, scale, allow_bidirectional, block_size, sinks, value_encoding) -> Inputs:
    """Check every argument; nothing is written anywhere."""
    _check_qkv(q, k, v)
    check_bool("causal", causal)
    check_bool("allow_bidirectional", allow_bidirectional)
    block_size = check_int("block_size", block_size, min=1)
    scale = None if scale is None else check_real("scale", scale, positive=True)
    _check_encodings(enc, value_encoding, q, v, causal, allow_bidirectional)
    B, H, Sq, _ = q.shape
    Sk_new, dev = k.shape[2], q.device
    axes = getattr(enc, "num_axes", None)  # several position axes: positions (…, seq, axes)
    _check_cache(cache, k, axes)
    s = _check_sinks(sinks, H, dev)
    kpos = key_times(k, positions, key_positions, B, Sq, axes, cache)
    keep = torch.ones(B, Sk_new, dtype=torch.bool, device=dev)
    if key_padding_mask is not None:
        keep = _bool_tensor(key_padding_mask, "key_padding_mask", (B, Sk_new)).to(dev)
    qdocs, kdocs = _documents(document_ids, key_document_ids, B, Sq, Sk_new, dev)
    if qdocs is not None and kdocs is None:
        raise ValueError("document_ids for the queries need document ids for the keys")
    Sk = (len(cache) if cache is not None else 0) + Sk_new
    if positions is None and Sq > Sk:
        raise ValueError(f"{Sq} queries but only {Sk} keys: pass positions explicitly")
    qpos = None if positions is None else _positions(positions, Sq, B, axes, "positions", dev)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
            raise TypeError("`attn_mask` must be a boolean tensor (True = attend)")
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, Sq, Sk))
        except RuntimeError as err:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(B, H, Sq, Sk)}"
            ) from err
    if cache is not None:
        cache.check(k, v, kpos, keep, kdocs)
    return Inputs(q, k, v, enc, value_encoding, axes, kpos, keep, kdocs, qpos, qdocs, attn_mask,
                  causal, scale, s, block_size, cache)


def bind(x: Inputs) -> Call:
    """Append the new keys to the cache and fix everything that depends on the whole key set."""
    k, v, kpos, keep, kdocs, cache = x.k, x.v, x.kpos, x.keep, x.kdocs, x.cache
    if cache is not None:
        cache.append(k, v, kpos, keep, kdocs)
        k, v, kpos, keep, kdocs = cache.held()
        finite = cache.finite
    else:
        finite = all_finite(k, v)
    B, H, Sq, _ = x.q.shape
    Sk = kpos.shape[1]
    qpos = kpos[:, Sk - Sq :] if x.qpos is None else x.qpos
    # the generator for this length (dynamic NTK, longrope, ...)
    length = int(math.floor(max(float(qpos.detach().max()), float(kpos.detach().max())))) + 1
    enc = x.enc.at_length(length)
    c = (1.0 / math.sqrt(enc.content_dim) if x.scale is None else x.scale) * enc.logit_scale
    q = x.q
    wide = enc.plan.has_coupling or (x.venc is not None and x.venc.plan.has_coupling)
    content_dtype = None
    if q.dtype in LAZY_DTYPES and wide and x.venc is None and not _content_coupled(enc):
        content_dtype = q.dtype  # only the slots couple (ALiBi): the content may be attended in q's own dtype
    lazy = content_dtype is not None  # widened by the caller unless the fused linear-bias path takes the call
    if q.dtype in LOW and not lazy and (wide or q.dtype == torch.float16 and not half_holds(enc, x.venc, q, k, v)):
        # polynomial (Jordan) parts cancel between F(t - o) and G(s - o): bfloat16 cannot hold the
        # encoded values; float16 overflows on large inputs times an origin's factors. Encode and attend
        # in float32 (the output is cast back once)
        q, k, v = q.float(), k.float(), v.float()
    if enc.num_slots and not lazy:
        # slots carry an additive bias (ALiBi's -m(t - s)), which is not a temperature: scale the
        # content of q instead of the scores, so the score is c·qᵀA k + slotsᵀA slots
        q, c = q * c, 1.0
    per_head = enc.num_heads is not None or (x.venc is not None and x.venc.num_heads is not None)
    if per_head and k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)  # (B, Hk, Sk, D) -> (B, H, Sk, D)
        v = v.repeat_interleave(H // v.shape[1], dim=1)  # (B, Hk, Sk, Dv) -> (B, H, Sk, Dv)
    qord, kord = qpos, kpos
    if x.axes is not None:  # several axes: the mask follows the token order
        kord = torch.arange(Sk, dtype=torch.float64, device=q.device).expand(B, Sk)  # (B, Sk)
        qord = torch.arange(Sk - Sq, Sk, dtype=torch.float64, device=q.device).expand(B, Sq)  # (B, Sq)
    plain_keys = bool(keep.all()) and kdocs is None and x.attn_mask is None
    simple = (x.causal and plain_keys and finite and Sq == Sk and bool(torch.equal(qord, kord))
              and strictly_increasing(kord))
    return Call(q, k, v, enc, x.venc, qpos, kpos, qord, kord, keep, x.qdocs, kdocs, x.attn_mask, x.causal,
                c, x.sinks, x.block_size, cache, x.k.shape[2], finite, simple, not x.causal and plain_keys, content_dtype,
                lazy)


def widened(call: Call) -> Call:
    """A :attr:`Call.lazy` call as every path but the fused linear-bias one reads it: q, k, v in float32 (the
    slots' bias cannot be held in bfloat16) and q multiplied by c (the slots carry the bias, not a
    temperature: the score is c·qᵀA k + slotsᵀA slots); any other call as it is."""
    if not call.lazy:
        return call
    q, c = call.q.float(), call.c
    if call.enc.num_slots:
        q, c = q * c, 1.0
    return replace(call, q=q, k=call.k.float(), v=call.v.float(), c=c, lazy=False)


def _content_coupled(enc: Encoding) -> bool:
    """Whether a coupling pair of the encoding's plan writes a content dim (a Jordan block of the content),
    not only slot dims (ALiBi's bias of degree one in the lag)."""
    dst = enc.plan.dst
    return bool((dst < enc.content_dim).any()) if dst.numel() else False
