"""Encoded attention that stays exact at any length, with learned sinks and values carried by a generator.

:func:`attention` computes ``softmax(logit_scale · qᵀ A(t − s) k / √d) v`` on top of
``torch.nn.functional.scaled_dot_product_attention``:

* the causal mask follows the *times* (a key is visible when ``s ≤ t``), not the indices; equal,
  strictly increasing query and key times run the fused causal kernel (``is_causal``) with no mask;
* encodings whose F and G grow with absolute time (decay, damped rotation, Jordan blocks, ALiBi's
  slots) are evaluated relative to an origin per query block (:mod:`liepos.recentre`), which
  leaves every score unchanged and keeps every factor finite, at positions of 10⁹ as at 0;
* ALiBi runs through its slots (on the fused path its per-key part is the flash kernel's broadcast
  mask ``(B, H, 1, S)``): no (seq × seq) bias is ever allocated;
* ``sinks`` (one logit per head) join the softmax denominator only (:mod:`liepos.attention_sdpa`);
* ``value_encoding`` carries the values by a second generator: ``o_t = Σ_s w_ts A_v(t − s) v_s``,
  as one encode of v and one of the output, never a per-pair matrix;
* a :class:`~liepos.KVCache` stores keys with their times (:mod:`liepos.cache`), so prefill +
  decode equals the full forward.

Arguments are checked in :mod:`liepos.attention_call` before the cache is touched.
:func:`attention_reference` is the readable float64 reference: scores from the lags
``u = t − s`` and the closed-form blocks of ``A(u)``, one block at a time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import liepos.attention_graph as attention_graph
from liepos._checks import all_finite
from liepos.attention_call import Call, bind, expand_batch, prepare, widened
from liepos._fast import arange_start
from liepos.attention_pieces import arena, available, pieces, slot
from liepos.attention_sdpa import sdpa
from liepos.cache import KVCache
from liepos.encoding import Encoding, as_positions
from liepos.generator import Generator
from liepos.masks import finish, visible
from liepos.recentre import recentred, takes_fused_bias
from liepos.temperature import check_temperature, scaled_queries

__all__ = ["attention", "attention_reference", "KVCache"]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enc: Encoding,
    positions: Any = None, key_positions: Any = None, causal: bool = True, *,
    attn_mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None, key_document_ids: torch.Tensor | None = None,
    cache: KVCache | None = None, scale: float | None = None, allow_bidirectional: bool = False,
    block_size: int = 256, sinks: torch.Tensor | None = None, value_encoding: Encoding | None = None,
    temperature: Any = None,
) -> torch.Tensor:
    """Attention with a positional encoding: ``softmax(c · qᵀ A(t − s) k + b) v``, ``c = logit_scale/√d``.

    ``b`` is the bias the slots carry (``slots_qᵀ A(t − s) slots_k``, ALiBi's ``−m (t − s)``): it
    is added unscaled, as in Press et al.

    Args:
        q: queries ``(batch, heads, q_seq, dim)``; ``dim`` is the encoding's content dim.
        k, v: keys and values ``(batch, kv_heads, k_seq, dim)`` / ``(…, v_dim)``; ``kv_heads``
            divides ``heads`` (grouped-query attention). ``q``, ``k``, ``v`` share one floating dtype.
        enc: the :class:`~liepos.Encoding`.
        positions: query times ``(q_seq,)`` or ``(batch, q_seq)``, integer or real. Default: the
            last ``q_seq`` key times (bottom-right aligned).
        key_positions: key times ``(k_seq,)`` or ``(batch, k_seq)``. Default: ``positions`` when the
            call brings as many keys as queries (self-attention), else ``0 … k_seq − 1``, continuing
            after the cached keys when ``cache`` is given.
        causal: a key is visible to a query when ``s ≤ t`` (by time, not by index). With several
            position axes (an encoding with ``num_axes``; positions ``(…, seq, axes)``) times have no
            total order and causal masks by token order instead (query i of q_seq sees keys
            j ≤ k_seq_total − q_seq + i, cached keys first), as Qwen2-VL does; pass ``attn_mask`` for
            any other visibility.
        attn_mask: optional boolean ``(q_seq, k_seq_total)`` or broadcastable 4-D mask, True = attend.
        key_padding_mask: ``(batch, k_seq)``, True for real tokens, False for padding.
        document_ids / key_document_ids: ``(batch, seq)`` ids for packed sequences; a query sees
            only keys of its own document.
        cache: a :class:`KVCache`; ``k`` and ``v`` are appended to it (after every check has passed)
            and attention runs over all cached keys.
        scale: the SDPA scale before ``logit_scale``, a positive finite number (default
            ``1/√(content dim)``, also with slots).
        allow_bidirectional: with ``causal=False``, encodings that are not orthogonal (decay,
            growth, Jordan blocks, ALiBi slots) leave the family because the lag changes sign;
            they are refused unless this is True.
        block_size: queries per block for re-centred encodings and materialised masks.
        sinks: ``(heads,)`` learned sink logits ``s_h``: ``o = Σ_j e^{z_j} v_j / (Σ_j e^{z_j} + e^{s_h})``,
            softmax over the scores with a sink column appended and then dropped (differentiable).
        value_encoding: an :class:`~liepos.Encoding` of ``v_dim`` dims without slots: the output is
            ``o_t = Σ_s w_ts A_v(t − s) v_s``, exact and re-centred like the scores.
        temperature: a :class:`liepos.temperature.Temperature`: row i's logits times ``τ(t_i, n_i)``
            (``n_i`` its visible keys; Scalable-Softmax, Llama 4's temperature tuning), exact through a cache.

    Queries with no visible key return zeros. A NaN or infinite key or value reaches only the queries that
    see it; a query row holding one returns NaN in its row alone, whatever kernel runs.

    The identity it implements, checked against :func:`attention_reference`::

        attention(q, k, v, enc, t, s)[i] = Σ_j softmax_j(c · q_iᵀ exp((t_i − s_j) X) k_j) A_v(t_i − s_j) v_j

    >>> import torch, liepos as lp
    >>> q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    >>> far = torch.arange(5) + 10**6                      # xPos far from 0, re-centred ...
    >>> out = attention(q, k, v, lp.xpos(8), far, far)
    >>> ref = attention_reference(q, k, v, lp.xpos(8), torch.arange(5), torch.arange(5))
    >>> bool(torch.allclose(out, ref))                      # ... equals the lag reference at 0
    True
    >>> out = attention(q, k, v, lp.rope(8), far, far, value_encoding=lp.xpos(8))  # values carried by xPos
    >>> bool(torch.allclose(out, attention_reference(q, k, v, lp.rope(8), far, far, value_encoding=lp.xpos(8))))
    True
    """
    masks, flags = (attn_mask, key_padding_mask, document_ids, key_document_ids), (causal, allow_bidirectional, block_size)
    # one opaque op under torch.compile / export and on meta tensors; a temperature stays on the eager path
    if _graph_may_run(q, enc, temperature) and attention_graph.routable(q, k, v, enc, positions, key_positions, masks,
                                                                        cache, scale, sinks, value_encoding, flags):
        return attention_graph.run(q, k, v, enc, positions, key_positions, masks, scale, flags, sinks, value_encoding)
    x = prepare(q, k, v, enc, positions, key_positions, causal, attn_mask, key_padding_mask, document_ids,
                key_document_ids, cache, scale, allow_bidirectional, block_size, sinks, value_encoding)
    temperature = check_temperature(temperature, enc, q.shape[1])
    if (empty := _nothing_to_attend(q, k, v, x, cache)) is not None:
        return _not_numbers(q, empty)
    call = _bound(x, temperature)
    needs = call.enc.needs_recentring or (call.venc is not None and call.venc.needs_recentring)
    out = recentred(call) if needs else _plain(call)
    return _not_numbers(q, out.to(v.dtype))


def _not_numbers(q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` with NaN in every row whose query holds a NaN or an infinity. The kernels disagree there: the
    flash kernels of SDPA give such a row 0 on some CPUs and dtypes and NaN on others, and a tile's merge
    may drop it; one summing pass over ``q`` (:func:`~liepos._checks.all_finite`) finds none in the common
    case."""
    if not out.numel() or all_finite(q):
        return out
    bad = ~torch.isfinite(q).all(-1, keepdim=True)  # (B, H, Sq, 1): a query row not all finite
    return out.masked_fill(bad, math.nan)


def _bound(x: Any, temperature: Any) -> Call:
    """The call bound to its keys, widened to float32 unless the fused linear-bias path reads its bfloat16 q, k, v
    as they are (:attr:`~liepos.attention_call.Call.lazy`), its queries scaled by the temperature."""
    call = bind(x)
    if call.lazy and (temperature is not None or not takes_fused_bias(call)):
        call = widened(call)  # every path but the fused linear-bias one reads float32 q, k, v (q times c)
    return scaled_queries(call, temperature)


def _graph_may_run(q: torch.Tensor, enc: Encoding, temperature: Any) -> bool:
    """Whether the opaque op may serve the call: no temperature, or meta tensors (a temperature, once checked,
    changes no shape)."""
    return temperature is None or (q.device.type == "meta" and check_temperature(temperature, enc, q.shape[1]) is not None)


def _nothing_to_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: Any, cache: KVCache | None):
    """Zeros when there is nothing to attend to or no one asking (the keys still join a cache), else None."""
    B, H, Sq, _ = q.shape
    if B == 0 or Sq == 0 or (cache is None or not len(cache)) and k.shape[2] == 0:
        if cache is not None and B and k.shape[2]:
            cache.append(x.k, x.v, x.kpos, x.keep, x.kdocs)
        return v.new_zeros(B, H, Sq, v.shape[-1])
    return None


def _encoded(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (values encoded under a ``value_encoding``) at absolute times. A cache keeps them
    in its store (origin 0, per version), so a decode step encodes only its new keys."""
    cache, venc = call.cache, call.venc
    if cache is None or call.k.shape[1] != cache.held()[0].shape[1]:
        return call.enc.key(call.k, call.kpos), call.v if venc is None else venc.key(call.v, call.kpos)
    store = cache.encoded
    version = ("abs", call.enc.version, None if venc is None else venc.version, call.q.dtype)  # the work dtype too
    if store.version != version:
        store.reencode(version)  # an empty store of this version: every key is new below
    n_old = len(store)
    if n_old < call.k.shape[-2]:
        kpos = call.kpos[:, n_old:]
        ke = call.enc.key(call.k[..., n_old:, :], kpos)
        if venc is None:
            store.append(k=ke)
        else:
            store.append(k=ke, v=venc.key(call.v[..., n_old:, :], kpos))
    return store.part("k"), call.v if venc is None else store.part("v")


# the plain causal self-attention encodes q and k into this thread's buffers (attention_pieces.arena), whose pages stay
# mapped from call to call, not into fresh tensors (a page fault per 4 KiB); False: fresh tensors (benchmarks/ab.py)
IN_BUFFERS = True


def _in_buffers(call: Call) -> torch.Tensor | None:
    """The causal self-attention over times ``p0 … p0 + T − 1`` (one range for every batch row; no cache, sinks or
    value encoding) with q and k encoded into this thread's :class:`~liepos.attention_pieces.Arena`, free again once
    the flash call has read them: its output is the kernel's own. None (the caller encodes into fresh tensors) when
    anything needs a gradient — autograd would keep the encodings, which the next call overwrites — or the call is of
    another kind."""
    enc, q, k, v = call.enc, call.q, call.k, call.v
    if (not IN_BUFFERS or not call.simple or call.cache is not None or call.sinks is not None or call.venc is not None
            or enc.num_slots or not available(q)):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None  # learned frequencies are refused below: their tables take no span (Encoding._fast_usable)
    pos = call.kpos  # (B, T), or (B, T, axes) for an encoding of several axes (no range)
    one = pos.dim() == 2 and (pos.shape[0] == 1 or pos.stride(0) == 0)
    p0 = arange_start(pos[:1]) if one else None  # (1, T): one range for every batch row
    if p0 is None or not enc._span_takes_tables(q, p0):
        return None
    with arena() as buffers:
        qe = enc._span(q, p0, "query", into=slot(buffers, "q", q.device))
        ke = enc._span(k, p0, "key", into=slot(buffers, "k", k.device))
        return sdpa(qe, ke, v, None, call.c, is_causal=True, finite=call.finite)


def _plain(call: Call) -> torch.Tensor:
    """Pure rotations (no re-centring): encode at absolute times, one fused call where possible. NoPE (the
    identity, nothing to learn, no slots or query scale) reads q and k as they are, without their copies."""
    enc = call.enc
    if enc.generator.is_identity and not enc.num_slots and enc.query_scale is None and call.cache is None:
        qe, ke, ve = call.q, call.k, call.v if call.venc is None else call.venc.key(call.v, call.kpos)
    elif (y := _in_buffers(call)) is not None:
        return y
    else:
        qe = enc.query(call.q, call.qpos)
        ke, ve = _encoded(call)
    if call.simple and call.sinks is not None and available(qe):
        y = pieces(qe, [(ke, ve, True)], call.c, call.sinks)  # the sink rides in the log-sum-exp
    elif call.simple or call.unmasked:
        y = sdpa(qe, ke, ve, None, call.c, is_causal=call.simple, sinks=call.sinks, finite=call.finite)
    else:
        outs = []
        for i in range(0, qe.shape[2], call.block_size):
            rows = slice(i, min(i + call.block_size, qe.shape[2]))
            m = visible(*call.mask_args(rows))
            outs.append(finish(sdpa(qe[:, :, rows], ke, ve, m, call.c, sinks=call.sinks, finite=call.finite), m))
        y = torch.cat(outs, dim=2)
    if call.venc is not None:
        y = call.venc.key(y, -call.qpos)  # A_v(t) y = G_v(-t) y
    return y


# ---------------------------------------------------------------------- reference
def _weights(scores: torch.Tensor, vis: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """The reference's softmax weights ``(B, H, Sq, Sk)`` over the visible keys: a row with none weighs nothing,
    NaN scores (a NaN query) stay NaN, ``sinks`` ``(H,)`` join each row's denominator."""
    scores = scores.masked_fill(~vis, -math.inf)
    if sinks is not None:
        B, H, Sq, _ = scores.shape
        col = torch.as_tensor(sinks, dtype=torch.float64).reshape(1, H, 1, 1).expand(B, H, Sq, 1)  # (B, H, Sq, 1)
        return torch.softmax(torch.cat((scores, col), -1), dim=-1)[..., :-1]
    return torch.where(vis.any(-1, keepdim=True), torch.softmax(scores, dim=-1), 0.0)  # seen (B, H|1, Sq, 1)


def _block_generators(g: Generator) -> list[tuple[Generator, int, int]]:
    out = []
    for i, (n, cplx, off, w) in enumerate(zip(g.sizes, g.complex, g.offsets, g.widths)):
        sub = Generator(
            g.rates[..., i : i + 1], g.freqs[..., i : i + 1], [n], complex=[cplx], allow_growth=True,
            axes=g.num_axes, nus=None if g.nus is None else g.nus[..., i : i + 1],
        )
        out.append((sub, off, w))
    return out


def _lag_blocks(g: Generator, lags: torch.Tensor):
    """``(off, w, A)`` per canonical block: ``A = exp(u X_block)`` at the lags ``(B, Sq, Sk[, axes])``,
    shape ``(B, H|1, Sq, Sk, w, w)``."""
    parts = [(0, g.dim, g)] if g.basis is not None else [(off, w, sub) for sub, off, w in _block_generators(g)]
    for off, w, sub in parts:
        A = sub.exp(lags)  # (B, Sq, Sk, *heads, w, w)
        if sub.num_heads is None:
            A = A.unsqueeze(3)  # (B, Sq, Sk, 1, w, w)
        yield off, w, A.permute(0, 3, 1, 2, 4, 5)  # (B, H|1, Sq, Sk, w, w)


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
    sinks: torch.Tensor | None = None,
    value_encoding: Encoding | None = None,
) -> torch.Tensor:
    """Float64 reference: ``o_t = Σ_s softmax_s(c · [D q_t; q_slots]ᵀ exp((t − s) X) [k_s; k_slots]) A_v(t − s) v_s``.

    ``c = scale · logit_scale`` (``scale`` default ``1/√content_dim``) multiplies the content part of the
    query only (the slots' bias is added unscaled), ``D = diag(query_scale)`` (a per-dim temperature,
    as YaRN's and LongRoPE's attention factors from :func:`liepos.from_hf`), ``sinks`` ``(heads,)``
    a column of logits that joins the softmax and is dropped, ``A_v`` the ``value_encoding`` (identity
    without one). With several position axes (positions ``(…, seq, axes)``) ``u = t − s`` is a vector,
    ``exp(Σ_a u_a X_a)``, and ``causal`` follows the token order (query i sees keys
    ``j ≤ k_seq − q_seq + i``), as :func:`attention` does.

    Independent of the fast path: no tables, no F/G factorisation, no re-centring; only
    :meth:`Generator.exp` of each block at the lags. Memory ``O(q_seq · k_seq · heads)`` per block;
    meant for tests and small inputs. ``mask``: optional boolean (B|1, H|1, Sq, Sk), True = attend. A row
    with no visible key is 0; a query row holding a NaN or an infinity is NaN.
    """
    B, H, Sq, D = q.shape
    Hk = k.shape[1]
    if Hk != H:
        k = k.repeat_interleave(H // Hk, dim=1)  # (B, Hk, Sk, D) -> (B, H, Sk, D)
        v = v.repeat_interleave(H // Hk, dim=1)  # (B, Hk, Sk, Dv) -> (B, H, Sk, Dv)
    Sk = k.shape[2]
    axes = enc.num_axes
    if value_encoding is not None and value_encoding.num_axes != axes:
        raise ValueError(f"`value_encoding` has {value_encoding.num_axes} position axes but the encoding has {axes}")
    qp = positions if positions is not None else torch.arange(Sk - Sq, Sk, dtype=torch.float64)
    if positions is None and axes is not None:
        qp = qp.unsqueeze(-1).expand(Sq, axes)  # (Sq,) -> (Sq, axes): the same time on every axis
    qp = expand_batch(as_positions(qp, Sq, B, "positions", axes), B, axes)  # (B, Sq[, axes])
    kp = expand_batch(as_positions(key_positions, Sk, B, "key_positions", axes), B, axes)  # (B, Sk[, axes])
    c = (1.0 / math.sqrt(enc.content_dim) if scale is None else scale) * enc.logit_scale
    q64, k64, v64 = q.double() * c, k.double(), v.double()  # the slots below are not scaled
    if enc.query_scale is not None:
        q64 = q64 * enc.query_scale.double()  # D q: the per-dim temperature on the content dims
    n = enc.num_slots
    if n and enc.query_slots is not None and enc.key_slots is not None:  # slots come in pairs (Encoding checks)
        qs = enc.query_slots.double().reshape(1, -1, 1, n).expand(B, H, Sq, n)  # (B, H, Sq, slots)
        ks = enc.key_slots.double().reshape(1, -1, 1, n).expand(B, H, Sk, n)  # (B, H, Sk, slots)
        q64, k64 = torch.cat((q64, qs), -1), torch.cat((k64, ks), -1)
    # canonical coordinates: storage index perm[c] holds canonical c
    perm = enc.plan.perm
    q64, k64 = q64.index_select(-1, perm), k64.index_select(-1, perm)
    lags = qp[:, :, None] - kp[:, None, :]  # (B, Sq, Sk[, axes])
    scores = torch.zeros(B, H, Sq, Sk, dtype=torch.float64)
    for off, w, A in _lag_blocks(enc.generator, lags):
        qb, kb = q64[..., off : off + w], k64[..., off : off + w]
        scores = scores + torch.einsum("bhtd,bhtsde,bhse->bhts", qb, A, kb)
    vis = torch.ones(B, 1, Sq, Sk, dtype=torch.bool)
    if causal and axes is None:
        vis = vis & (lags >= 0).unsqueeze(1)
    elif causal:  # several axes: token order, the queries the last Sq of the keys
        vis = vis & torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq)
    if mask is not None:
        vis = vis & mask
    w = _weights(scores, vis, sinks)
    bad = ~torch.isfinite(q).all(-1, keepdim=True)  # (B, H, Sq, 1): a query not all finite gives NaN
    if value_encoding is None:
        return (w @ v64).masked_fill(bad, math.nan)
    vperm = value_encoding.plan.perm
    vc = v64.index_select(-1, vperm)  # canonical coordinates of the values
    out = torch.zeros(B, H, Sq, v.shape[-1], dtype=torch.float64)
    for off, wd, A in _lag_blocks(value_encoding.generator, lags):
        out[..., off : off + wd] = torch.einsum("bhts,bhtsde,bhse->bhtd", w, A, vc[..., off : off + wd])
    return out.index_select(-1, value_encoding.plan.inv).masked_fill(bad, math.nan)


attention_graph.install(attention)  # the eager call the compiled op runs
