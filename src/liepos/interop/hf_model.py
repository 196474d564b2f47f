"""Run a transformers model on liepos: one patch mechanism for every family of the table.

Most modeling files of transformers share one shape (:mod:`liepos.interop.families`): a rotary
module turns ``position_ids`` into ``cos, sin``; the attention calls a module-level
``apply_rotary_pos_emb(q, k, cos, sin)``, updates the cache and calls
``ALL_ATTENTION_FUNCTIONS.get_interface(...)``. :func:`patch_model` keeps all of upstream's
attention (projections, q/k norms, softmax scaling and its multipliers, sliding or chunked
windows, sinks, soft-capping, the backend) and replaces only what the encoding decides:

* the rotary module's ``forward`` also records its ``position_ids`` (one axis, or M-RoPE's three);
* the module-level rope functions of the family's modeling file become dispatchers: inside a
  patched attention they apply the layer's :class:`~liepos.Encoding` (``enc.query``/``enc.key``,
  with transformers' temperature on the rotated dims); anywhere else (an indexer's) upstream's;
* for encodings that are not fixed rotations (xPos, RetNet, ALiBi's slots, dynamic NTK,
  LongRoPE, Jordan blocks) the rope functions return the raw q and k, the cache keeps raw keys,
  their times beside it, and ``ALL_ATTENTION_FUNCTIONS`` returns the raw-key attention, causal by token
  order: a decode step through keys kept encoded at a cache origin (:mod:`liepos.interop.hf_decode`),
  anything else through :func:`liepos.attention`.

The ALiBi families (Bloom, MPT, Falcon ``alibi=True``) get an attention forward on :func:`liepos.attention`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos._fast import FastTables, apply_fast
from liepos.encoding import Encoding
from liepos.tables import check_range
from liepos.interop.families import FAMILIES, Family, family_of
from liepos.interop.hf_decode import attend, checked_step_matrix, hf_visible, remember
from liepos.interop.hf_config import HFRope, read_hf
from liepos.interop.rope_types import times_logit
from liepos.interop.hf_packed import check_row, documents, per_document, restarted
from liepos.interop.hf_verify import one_tensor, patch_family, rotate_one

__all__ = ["patch_model", "unpatch_model", "SUPPORTED_FAMILIES"]

_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("liepos_attention", default=None)
# whether the decoder block running now returns its attention's weights (MPT's block does not tell its attention)
_BLOCK_WEIGHTS: contextvars.ContextVar[bool] = contextvars.ContextVar("liepos_block_weights", default=False)
_TIMES = "_liepos_times"
_LOW = (torch.float16, torch.bfloat16)  # computed in float32, as liepos' apply does


@dataclass
class _Positions:
    """The ``position_ids`` the model's rotary module saw last, shared by all layers of one model,
    and what every layer with the same encoding reads at them (built once per forward, not once
    per layer): fast tables, sliced from the cached windows of :data:`liepos._fast.CACHE` for
    consecutive positions, so a decode step builds nothing; one step's transforms as matrices."""

    ids: torch.Tensor | None = None
    tables: dict[Any, Any] = field(default_factory=dict)
    lengths: list[_Length] = field(default_factory=list)  # the length-dependent ropes, one per layer type

    def record(self, ids: torch.Tensor | None, rotary: Any = None) -> None:
        self.ids = ids
        self.tables.clear()
        if ids is not None and ids.numel():
            for length in self.lengths:
                length.update(ids, rotary)

    def fast(self, enc: Encoding, pos: torch.Tensor, side: str, key: Any, x: torch.Tensor) -> FastTables | None:
        """Fast tables of ``enc`` at ``pos`` ``(1|B, S)`` for inputs like ``x``; None: no fast form."""
        if key in self.tables:
            return self.tables[key]
        ft = None
        if enc._fast_usable(x, pos):
            check_range(enc.generator, pos, side, x.dtype)
            ft = enc._fast_tables(pos, side, torch.float32 if x.dtype in _LOW else x.dtype, False)
        self.tables[key] = ft
        return ft

    def matrix(self, key: Any, enc: Encoding, pos: torch.Tensor, side: str, x: torch.Tensor) -> torch.Tensor | None:
        """``Mᵀ`` ``(1, H|1, d, d)`` at the one position ``pos``, once per forward (None: no fast form):
        row i is the transform of e_i, so ``x @ Mᵀ`` is the transform of every row of ``x`` in one matmul —
        the same one or two products per output dim as the pass per block kind, the rest exact zeros (a
        non-finite entry spreads over its token's row, a token whose scores are not finite either way).
        Rows of a cached window of them (:func:`liepos.interop.hf_decode.step_matrix`) where it can."""
        m = self.tables.get(("matrix",) + key)
        if m is None:
            m = checked_step_matrix(enc, x, pos, side, lambda: self.fast(enc, pos, side, key, x))
            if m is None:
                return None
            self.tables[("matrix",) + key] = m
        return m


@dataclass
class _Length:
    """The length a length-dependent rope of the config is computed at in each forward, as transformers'.

    transformers' rotary module (``dynamic_rope_update``) recomputes its frequencies before each
    forward and rotates that forward's q and k with them; the keys stay cached as they were
    rotated. ``dynamic``: at the module's ``max_seq_len_cached``, the longest
    ``max(position_ids) + 1`` seen so far, back to ``max_position_embeddings`` once a forward is
    shorter than that; it is read off the module after its forward, so every reset and every
    call outside liepos counts. ``longrope``: at this forward's ``max(position_ids) + 1`` (the
    long factors past ``original_max_position_embeddings``). Layers with such a rope run as fixed
    rotations at ``current`` and cache encoded keys, exactly like upstream.
    """

    rule: Encoding  # the encoding with its length_rule
    attributes: tuple[str, ...]  # the rotary module's length attribute, first found (dynamic); (): this forward's
    current: Encoding | None = None

    def update(self, ids: torch.Tensor, rotary: Any) -> None:
        need = int(ids.max()) + 1
        length = need
        if self.attributes:
            name = next((a for a in self.attributes if hasattr(rotary, a)), None)
            if name is None:
                raise RuntimeError(
                    f"dynamic NTK: the rotary module {type(rotary).__name__} has none of {list(self.attributes)}, so "
                    "the length transformers computes this forward's frequencies at is unknown"
                )
            length = int(getattr(rotary, name))
            if length < need:
                raise RuntimeError(
                    f"dynamic NTK: {type(rotary).__name__}.{name} = {length} is below this forward's "
                    f"max(position_ids) + 1 = {need}"
                )
        self.current = self.rule.at_length(length)


@dataclass
class _Layer:
    """A patched attention module's state: its encoding and how the family hands it q and k."""

    encoding: Encoding
    family: Family
    gain: torch.Tensor | float  # multiplier of encoded q and k: transformers' temperature on rotated dims
    encoded: bool  # pure rotation: HF's cache holds encoded keys, the model's backend runs
    pad: int  # NoPE dims appended before encoding (families that pass only the rotated dims)
    positions: _Positions
    call: dict[str, Any] = field(default_factory=dict)
    length: _Length | None = None  # a config's dynamic / longrope rope: the encoding of each forward
    # a rotation's F and G are the same tables (only rates and Jordan couplings tell the sides apart)
    sided: bool = True

    def __post_init__(self) -> None:
        self.sided = not self.encoding.generator.is_orthogonal

    def times(self, like: torch.Tensor) -> torch.Tensor:
        """Positions ``(1|B, S)`` or ``(1|B, S, axes)`` float64 of the current call."""
        pos = self.positions.ids
        S = like.shape[-2]
        cu = self.call.get("cu")
        if cu is not None:  # packed documents: each starts at time 0
            out = self.positions.tables.get(("packed", like.device))
            if out is None:
                base = torch.arange(S, device=like.device)[None] if pos is None else self._converted(pos, like.device)
                if base.dim() != 2 or base.shape[-1] != S:
                    raise NotImplementedError(
                        f"packed sequences take one position axis over the row's {S} tokens, got positions of shape "
                        f"{tuple(base.shape)}"
                    )
                check_row(cu, like.shape[0], S, self.call.get("seen", 0))
                out = self.positions.tables[("packed", like.device)] = restarted(base.to(torch.float64), cu)
            return out
        if pos is None:
            seen = self.call.get("seen", 0)
            pos = torch.arange(seen, seen + S, device=like.device)
        else:  # the forward's positions: converted once for every layer
            out = self.positions.tables.get(("times", like.device))
            if out is None:
                out = self.positions.tables[("times", like.device)] = self._converted(pos, like.device)
            return out
        return self._converted(pos, like.device)

    @staticmethod
    def _converted(pos: torch.Tensor, device: torch.device) -> torch.Tensor:
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        if pos.dim() == 3:  # M-RoPE: (axes, B, S) -> (B, S, axes)
            pos = pos.permute(1, 2, 0)
        return pos.to(device, torch.float64)

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.family.seq_first:
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, S, H, D) -> (B, H, S, D)
        if q.shape[-1] + self.pad != self.encoding.content_dim:
            raise ValueError(
                f"{self.family.model_type}: the attention rotates {q.shape[-1]} dims but the encoding has "
                f"{self.encoding.content_dim - self.pad} content dims"
            )
        pos = self.times(q)
        self.call["pos"] = pos
        if self.encoded:
            q, k = self._encode(q, pos, "query"), self._encode(k, pos, "key")
        elif not isinstance(self.gain, float) or self.gain != 1.0:
            q, k = self._scaled(q), self._scaled(k)  # the gain commutes with the rotation of each plane
        if self.family.seq_first:
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # back to (B, S, H, D)
        return q, k

    def _encode(self, x: torch.Tensor, pos: torch.Tensor, side: str) -> torch.Tensor:
        if self.pad:
            x = torch.cat((x, x.new_zeros(*x.shape[:-1], self.pad)), dim=-1)  # (…, rot) -> (…, rot + pad)
        enc = self.encoding if self.length is None else self.length.current
        if enc is None:
            raise RuntimeError(f"{self.family.model_type}: the rotary module did not run before the attention, so "
                               "the length of this forward's dynamic rope is unknown")
        if self.positions.ids is None or pos.dim() != 2:  # no forward-wide positions: encode directly
            out = getattr(enc, side)(x, pos)
        else:
            side = side if self.sided else "query"  # a rotation: F and G are the same tables
            key = (id(enc), side, x.dtype, x.device, tuple(pos.shape))
            m = None
            if pos.numel() == 1 and x.dtype not in _LOW and x.shape[-1] == enc.dim:  # a decode step: one matmul
                m = self.positions.matrix(key, enc, pos, side, x)
            if m is not None:
                out = x @ m
            elif (ft := self.positions.fast(enc, pos, side, key, x)) is None:
                out = enc._apply(x, pos, side)  # a basis, a gathered partner, learned parameters: the readable path
            else:
                out = apply_fast(x, ft)
        if self.pad:
            out = out[..., : out.shape[-1] - self.pad]
        return self._scaled(out)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.gain, float):
            return x if self.gain == 1.0 else x * self.gain
        return x * self.gain.to(device=x.device, dtype=x.dtype)


# ---------------------------------------------------------------------- the dispatchers in a modeling file
def _rope_dispatcher(upstream: Any) -> Any:
    def rope(q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        module = _ACTIVE.get()
        if module is None:
            return upstream(q, k, *args, **kwargs)
        return rotate_one(module._liepos, q, args, kwargs) if one_tensor(upstream) else module._liepos.rotate(q, k)

    vars(rope)["_liepos_upstream"] = upstream
    return rope


class _Interfaces:
    """``ALL_ATTENTION_FUNCTIONS`` of a modeling file: liepos.attention for raw-key layers, else upstream's."""

    def __init__(self, upstream: Any) -> None:
        self._liepos_upstream = upstream

    def get_interface(self, name: Any, default: Any) -> Any:
        module = _ACTIVE.get()
        if module is not None and not module._liepos.encoded:
            fn = _raw_attention
        else:
            fn = self._liepos_upstream.get_interface(name, default)
        if module is not None and module._liepos.call.get("cu") is not None:
            return functools.partial(_packed_attention, fn)
        return fn

    def __getitem__(self, name: Any) -> Any:
        return self._liepos_upstream[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._liepos_upstream, name)


# modeling file -> the models patched through it: unpatch_model restores the file when none is left
_PATCHED: dict[str, weakref.WeakSet] = {}


def _install(family: Family, model: Any) -> None:
    """Put the dispatchers in the family's modeling file (once; they fall through when unpatched)."""
    _PATCHED.setdefault(family.modeling, weakref.WeakSet()).add(model)
    mod = importlib.import_module(family.modeling)
    for name in family.apply:
        fn = getattr(mod, name)
        if not hasattr(fn, "_liepos_upstream"):
            setattr(mod, name, _rope_dispatcher(fn))
    table = getattr(mod, "ALL_ATTENTION_FUNCTIONS", None)
    if table is not None and not isinstance(table, _Interfaces):
        vars(mod)["ALL_ATTENTION_FUNCTIONS"] = _Interfaces(table)


def _packed_attention(fn: Any, module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
                      **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The layer's attention ``fn`` once per packed document (:mod:`liepos.interop.hf_packed`)."""
    state: _Layer = module._liepos
    cu = state.call["cu"]
    check_row(cu, q.shape[0], q.shape[2], state.call["seen"])
    if state.length is not None:
        raise NotImplementedError(
            f"packed sequences with {state.length.rule!r}: transformers computes a dynamic or longrope rope at the "
            "length of the whole row, so a packed document would not see the frequencies it sees alone"
        )
    pos, cache, raw = state.call.get("pos"), state.call["cache"], state.call.get("raw")
    row = state.positions.tables
    memos = row.setdefault(("documents",), {})  # what every layer reads at one document's times

    def enter(a: int, b: int) -> None:
        # the document alone: its times, its tables, and (raw keys) a cache of its own that the row's
        # never sees, so that it takes the path of a prefill of its own
        state.call["pos"] = None if pos is None else pos[:, a:b]
        state.call["cache"], state.call["raw"] = (None if cache is None else _Scratch()), None
        state.positions.tables = memos.setdefault((a, b), {})

    try:
        return per_document(fn, module, q, k, v, attention_mask, cu, kwargs, enter)
    finally:
        state.call["pos"], state.call["cache"], state.call["raw"] = pos, cache, raw
        state.positions.tables = row


class _Scratch:
    """A packed document's stand-in for HF's cache on the raw-key path: only its ``__dict__`` is read (key times, stores)."""


# ---------------------------------------------------------------------- the raw-key path
def _key_times(cache: Any, layer: int, pos: torch.Tensor, n_keys: int, seen: int) -> tuple[torch.Tensor, int]:
    """Times ``(B, n_keys)`` of the keys ``cache.update`` returned, and the absolute index of key 0.

    Kept beside the cache per layer. A dynamic cache returns the keys so far (a sliding one, the
    latest); a static one returns its whole buffer, the new keys written at ``seen …``.
    """
    store = cache.__dict__.setdefault(_TIMES, {})
    S = pos.shape[-1]
    buf, total = store.get(layer, (None, 0))  # buf (B, capacity): the first `total` are the times so far
    if seen == 0 or buf is None:
        buf, total = None, 0
    if seen < total:  # cropped: drop the latest times with it
        total = seen
    if seen != total:
        raise RuntimeError(
            f"layer {layer}: the cache holds {seen} tokens but liepos recorded the times of {total} "
            "(a cache filled by the unpatched model, or reordered); start from an empty cache"
        )
    B = pos.shape[0] if buf is None else max(buf.shape[0], pos.shape[0])
    if buf is None or buf.shape[0] != B or total + S > buf.shape[1]:  # grow by doubling: O(1) per step
        grown = pos.new_zeros(B, max(2 * (0 if buf is None else buf.shape[1]), total + S, 64))
        if total:
            grown[:, :total] = buf[:, :total]  # (1|B, total) broadcast to (B, total)
        buf = grown
    buf[:, total:total + S] = pos  # (1|B, S)
    times = buf[:, : total + S]  # (B, seen + S)
    store[layer] = (buf, total + S)
    if n_keys == seen + S:  # everything so far (dynamic): a view of the buffer, nothing copied
        return times, 0
    if n_keys > seen + S:  # a static buffer with unfilled slots
        pad = times.new_zeros(B, n_keys - seen - S)
        return torch.cat((times, pad), dim=-1), 0
    return times[:, times.shape[-1] - n_keys:], seen + S - n_keys  # a sliding window's latest keys


def _raw_attention(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: Any,
                   scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The attention interface of raw-key layers: :func:`liepos.attention` at the recorded times."""
    from liepos.attend import attention

    state: _Layer = module._liepos
    if dropout:
        raise NotImplementedError(
            f"attention_dropout={dropout} is not applied by the liepos attention path; set config.attention_dropout = 0.0"
        )
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{state.family.model_type}: {state.family.why}")
    pos = state.call["pos"]  # (1|B, S)
    if pos.dim() != 2:
        raise NotImplementedError("the raw-key path takes one position axis; M-RoPE runs as a pure rotation")
    B, S, Sk = q.shape[0], q.shape[2], k.shape[2]
    seen, cache, want = state.call["seen"], state.call["cache"], state.call.get("weights")
    if cache is not None:
        kpos, first = _key_times(cache, module.layer_idx, pos, Sk, seen)
        if not want:  # a decode step: keys encoded at the cache's origin, only the new one encoded now
            out = attend(state, module.layer_idx, q, k, v, attention_mask, scaling, pos, kpos, cache, seen,
                         state.call.get("raw"))
            if out is not None:
                return out.transpose(1, 2).contiguous(), None  # (B, H, S, D) -> (B, S, H, D)
    else:
        kpos, first = pos, 0
    kpos = kpos.expand(B, -1)
    # causal by token order: query i (token seen + i) sees key j (token first + j) when first + j <= seen + i
    order = (torch.arange(Sk, device=q.device) + first)[None, :] <= (torch.arange(S, device=q.device) + seen)[:, None]
    filled = (torch.arange(Sk, device=q.device) < seen + S - first).expand(B, -1)  # (B, Sk): unfilled static slots
    mask = order[None, None]  # (1, 1, S, Sk)
    hf = hf_visible(attention_mask, Sk)
    if hf is not None:
        mask = mask & hf
    out = attention(q, k, v, state.encoding, positions=pos.expand(B, -1), key_positions=kpos, causal=True,
                    attn_mask=mask, key_padding_mask=filled, scale=scaling)
    weights = None
    if state.call.get("weights"):
        # the softmax weights themselves: the same attention applied to one-hot values
        eye = torch.eye(Sk, dtype=v.dtype, device=v.device).expand(B, k.shape[1], Sk, Sk)  # (B, Hk, Sk, Sk)
        weights = attention(q, k, eye, state.encoding, positions=pos.expand(B, -1), key_positions=kpos,
                            causal=True, attn_mask=mask, key_padding_mask=filled, scale=scaling)
    if cache is not None and first == 0 and Sk == seen + S and not want:  # a prefill: keep its keys encoded
        remember(state, module.layer_idx, k, v, kpos, cache, q.shape[1], pos)
    return out.transpose(1, 2).contiguous(), weights  # (B, S, H, D)


# ---------------------------------------------------------------------- ALiBi families: their own attention
def _alibi_attention(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, cache: Any,
                     scale: float, weights: bool) -> tuple[torch.Tensor, Any]:
    """q, k, v ``(B, H, S, D)`` of an ALiBi family's attention through the raw-key path at times 0, 1, …"""
    state: _Layer = module._liepos
    seen = int(cache.get_seq_length(module.layer_idx)) if cache is not None else 0
    S = q.shape[2]
    state.call = {"cache": cache, "seen": seen, "weights": weights,
                  "pos": torch.arange(seen, seen + S, device=q.device, dtype=torch.float64)[None]}  # (1, S)
    if cache is not None:
        state.call["raw"] = _raw_keys(cache, module.layer_idx)
        k, v = cache.update(k, v, module.layer_idx)
    return _raw_attention(module, q, k, v, mask, scaling=scale)


def _bloom_forward(self: Any, hidden_states: torch.Tensor, residual: torch.Tensor, alibi: Any = None,
                   attention_mask: Any = None, layer_past: Any = None, use_cache: bool = False,
                   output_attentions: bool = False, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Bloom's attention with liepos in place of the ``alibi`` bias tensor."""
    from transformers.models.bloom.modeling_bloom import dropout_add

    if self.pretraining_tp > 1 and self.slow_but_exact:
        raise NotImplementedError("Bloom's slow_but_exact tensor-parallel sum is not reproduced; set slow_but_exact=False")
    B, S, _ = hidden_states.shape
    q, k, v = self._reshape(self.query_key_value(hidden_states))  # 3 × (B, H, S, D)
    out, weights = _alibi_attention(self, q, k, v, attention_mask, layer_past, self.inv_norm_factor,
                                    output_attentions or _recording_attentions())
    out = self.dense(out.reshape(B, S, -1))  # (B, S, H, D) -> (B, S, H·D)
    return dropout_add(out, residual, self.hidden_dropout, self.training), weights


def _mpt_forward(self: Any, hidden_states: torch.Tensor, position_bias: Any = None, cache: Any = None,
                 attention_mask: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """MPT's attention with liepos in place of ``position_bias``; MPT's mask is True where masked."""
    if self.training and self.attn_dropout_p:
        raise NotImplementedError(f"attn_pdrop={self.attn_dropout_p} is not applied by the liepos attention path")
    B, S = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (x.reshape(B, S, self.n_heads, self.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2))  # (B, H, S, D)
    mask = None if attention_mask is None else ~attention_mask
    want = _recording_attentions() or _BLOCK_WEIGHTS.get()
    out, weights = _alibi_attention(self, q, k, v, mask, cache, self.softmax_scale, want)
    return self.out_proj(out.reshape(B, S, -1)), weights  # (B, S, H, D) -> (B, S, H·D)


def _falcon_forward(self: Any, hidden_states: torch.Tensor, alibi: Any = None, attention_mask: Any = None,
                    position_ids: Any = None, layer_past: Any = None, use_cache: bool = False,
                    output_attentions: bool = False, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Falcon's attention with ``alibi=True``, liepos in place of the alibi bias, as upstream's branch of this call.

    transformers adds ``alibi/√d`` to the mask in the model; its sdpa branch uses that mask as the
    bias (once), its eager branch (any other backend, or ``output_attentions=True``) adds the alibi
    to the scores as well, so the bias counts twice there: ``2·m_h/√d`` per position. The patched
    layer takes the same branch per call, with the key slots doubled on the eager one.
    """
    if self.training and self.attention_dropout.p:
        raise NotImplementedError(f"attention_dropout={self.attention_dropout.p} is not applied by the liepos attention path")
    q, k, v = self._split_heads(self.query_key_value(hidden_states))  # 3 × (B, S, H|Hk, D)
    B, S = q.shape[:2]
    kv = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    q = q.transpose(1, 2).reshape(B, self.num_heads, S, self.head_dim)  # (B, H, S, D)
    k, v = (x.transpose(1, 2).reshape(B, kv, S, self.head_dim) for x in (k, v))  # (B, Hk, S, D)
    once = self.config._attn_implementation == "sdpa" and not output_attentions
    state = self._liepos
    if not once:  # upstream's eager branch: the bias of the scores and again that of the mask
        twice = self.__dict__.get("_liepos_twice")
        if twice is None or twice[0] is not state:
            enc = state.encoding
            twice = (state, dataclasses.replace(state, encoding=enc.replace(key_slots=2 * enc.key_slots)))
            self.__dict__["_liepos_twice"] = twice
        self._liepos = twice[1]
    try:
        out, weights = _alibi_attention(self, q, k, v, attention_mask, layer_past, self.inv_norm_factor,
                                        output_attentions or _recording_attentions())
    finally:
        self._liepos = state
    return self.dense(out.reshape(B, S, -1)), weights  # (B, S, H, D) -> (B, S, H·D)


_OWN_FORWARDS = {"bloom": _bloom_forward, "mpt": _mpt_forward}
# decoder blocks that return their attention's weights without passing output_attentions to it
_WEIGHT_BLOCKS = {"mpt": "MptBlock"}


def _block_forward(self: Any, *args: Any, output_attentions: bool = False, **kwargs: Any) -> Any:
    """A decoder block's upstream forward, with whether it returns the weights visible to its attention."""
    token = _BLOCK_WEIGHTS.set(bool(output_attentions))
    try:
        return type(self).forward(self, *args, output_attentions=output_attentions, **kwargs)
    finally:
        _BLOCK_WEIGHTS.reset(token)


def _upstream_rope(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A sub-module inside a patched attention (an indexer) that rotates with upstream's rope."""
    token = _ACTIVE.set(None)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _own_forward(family: Family, config: Any) -> Any:
    """The ALiBi family's own forward, or None for the families of the shared mechanism."""
    if family.model_type == "falcon" and getattr(config, "alibi", False):
        return _falcon_forward
    return _OWN_FORWARDS.get(family.model_type)


# ---------------------------------------------------------------------- patching
def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The patched attention forward: upstream's, with the liepos dispatchers active."""
    state: _Layer = self._liepos
    # the decoder layers pass the cache by keyword (its name changed over transformers releases)
    cache = next((kwargs[k] for k in ("cache", "past_key_values", "layer_past") if kwargs.get(k) is not None), None)
    state.call = {
        "cache": cache,
        "seen": int(cache.get_seq_length(self.layer_idx)) if cache is not None else 0,
        "weights": bool(kwargs.get("output_attentions", False)) or _recording_attentions(),
        "raw": None if cache is None or state.encoded else _raw_keys(cache, self.layer_idx),
        "cu": documents(kwargs),
    }
    token = _ACTIVE.set(self)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _raw_keys(cache: Any, layer: int) -> Any:
    """HF's key tensor of ``layer`` before this step writes to it (None when the cache has no such layer)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or layer >= len(layers):
        return None
    return getattr(layers[layer], "keys", None)


def _recording_attentions() -> bool:
    """Whether transformers' output recorder collects attention weights in this forward."""
    collector = _collector()
    collected = None if collector is None else collector.get()
    return type(collected) is dict and "attentions" in collected  # a plain dict (no ABC check per call)


@functools.cache
def _collector() -> Any:
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # an older transformers: output_attentions reaches the attention as a kwarg
        return None
    return _active_collector


def _text_rotary(module: Any, config: Any) -> bool:
    """A rotary module of the text decoder (a vision tower's has its own config and positions)."""
    if not type(module).__name__.endswith("RotaryEmbedding"):
        return False
    own = getattr(module, "config", None)
    return own is None or getattr(own, "model_type", None) == getattr(config, "model_type", None)


def _rotary_forward(self: Any, x: Any, position_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
    out = type(self).forward(self, x, position_ids, *args, **kwargs)  # upstream's length update first
    self._liepos_positions.record(position_ids, self)
    return out


def _family(model: Any, config: Any) -> Family:
    model_type = getattr(config, "model_type", None)
    family = family_of(model_type)
    if family is None and isinstance(model_type, str):
        return patch_family(model, config)  # probed from the modeling code and proven, or refused with why
    if family is None or not family.attention:
        known = sorted(SUPPORTED_FAMILIES)
        why = "" if family is None or not family.why else f" ({family.why})"
        what = "ALiBi model" if family is not None and family.positions == "alibi" else "family"
        raise ValueError(
            f"patch_model does not patch {type(model).__name__} (model_type {model_type!r}){why}: no {what} row "
            f"with its attention class in liepos.interop.families; patched: {known}"
        )
    return family


def _layer_type(module: Any, config: Any) -> Any:
    lt = getattr(module, "layer_type", None)
    types = list(getattr(config, "layer_types", None) or ())
    if lt is None and module.layer_idx < len(types):
        lt = types[module.layer_idx]
    return lt


def _layer_read(read: Any, module: Any, config: Any) -> Any:
    if not isinstance(read, Mapping):
        return read
    lt = _layer_type(module, config)
    if lt not in read:
        raise ValueError(f"layer {module.layer_idx} has layer type {lt!r} but the encodings are given for {sorted(read)}")
    return read[lt]


def _state(item: Any, module: Any, family: Family, config: Any, positions: _Positions) -> _Layer:
    """The layer state for an :class:`HFRope` (encoding=None) or a user's Encoding."""
    rotated = _rotated_dims(module, family, config)
    if isinstance(item, HFRope):
        enc = item.encoding
        pad = enc.content_dim - rotated
        gain: torch.Tensor | float = math.sqrt(enc.logit_scale)
        if not item.exact_encoding:  # the temperature on the rotated dims only, as upstream
            g = torch.ones(enc.content_dim, dtype=torch.float64)
            g[: item.rotary_dim] = math.sqrt(item.rotary_scale)
            gain = g[:rotated]
        if enc.logit_scale != 1.0:  # the gain carries it, on the dims upstream scales
            enc = times_logit(enc, 1.0 / enc.logit_scale)
    else:
        if not isinstance(item, Encoding):
            raise TypeError(f"encoding must be a liepos.Encoding (or a dict of them by layer type), got {type(item).__name__}")
        if item.query_scale is not None:
            raise ValueError(
                f"{item!r} carries a per-dim temperature (query_scale): pass encoding=None, and patch_model "
                "reads the config's rotated-dims temperature and applies it on those dims itself"
            )
        enc, pad = item, 0
        # a fixed rotation runs in the model's backend: its logit scale in q and k; liepos.attention applies it itself
        gain = math.sqrt(item.logit_scale) if _fixed(item) else 1.0
    if enc.content_dim - pad != rotated:
        raise ValueError(
            f"the encoding has {enc.content_dim} content dims but {type(module).__name__} (layer "
            f"{module.layer_idx}) rotates {rotated} dims"
        )
    heads = getattr(config, "num_attention_heads", None)
    if enc.num_heads is not None and heads is not None and enc.num_heads != heads:
        raise ValueError(
            f"the encoding has per-head parameters for {enc.num_heads} heads but the model has num_attention_heads={heads}"
        )
    encoded, length = _fixed(enc), None
    if isinstance(item, HFRope) and enc.length_rule is not None and item.rope_type in ("dynamic", "longrope"):
        # upstream's frequencies of each forward, keys cached as rotated: a fixed rotation per forward
        nested = isinstance(getattr(config, "rope_parameters", None), Mapping) and isinstance(
            config.rope_parameters.get(_layer_type(module, config)), Mapping)
        attributes: tuple[str, ...] = () if item.rope_type == "longrope" else ("max_seq_len_cached",)
        if attributes and nested:  # upstream reads the layer type's own, else the shared one
            attributes = (f"{_layer_type(module, config)}_max_seq_len_cached",) + attributes
        length, encoded = _Length(enc, attributes), True
    own = _own_forward(family, config) is not None
    if own:  # an ALiBi family's attention: liepos.attention, raw keys
        encoded, gain = False, 1.0
    if not encoded and not family.raw_keys and not own:
        raise NotImplementedError(
            f"{family.model_type}: {enc!r} is not a fixed rotation, so it needs the raw-key path, and {family.why}; "
            "fixed rotations (RoPE and its static scalings) patch this family exactly"
        )
    if not encoded and family.splits_rotary:
        raise NotImplementedError(f"{family.model_type}: the raw-key path needs the whole head; this family rotates part")
    return _Layer(enc, family, gain, encoded, pad, positions, length=length)


def _lengths(states: Any, model: Any, config: Any, family: Family) -> dict[int, _Length]:
    """The layers' length-dependent ropes of the config, each once; refused when the model keeps no dynamic length."""
    lengths = {id(st.length): st.length for st in states if st.length is not None}
    rotaries = [m for m in model.modules() if _text_rotary(m, config)]
    for length in lengths.values():
        if length.attributes and not any(hasattr(r, a) for r in rotaries for a in length.attributes):
            raise NotImplementedError(
                f"{family.model_type}: dynamic NTK from the config, but no rotary module of the model has "
                f"{list(length.attributes)}, the length transformers computes each forward's frequencies at"
            )
    return lengths


def _fixed(enc: Encoding) -> bool:
    """Pure rotations at a fixed generator: encoded keys are exact at absolute times, cache them."""
    return not enc.needs_recentring and enc.length_rule is None


def _rotated_dims(module: Any, family: Family, config: Any) -> int:
    if family.rotary_dims:  # a verified row: the dims its probe passed to the rope
        return family.rotary_dims
    if family.splits_rotary:
        return int(module.rotary_ndims)
    return int(getattr(config, "qk_rope_head_dim", None) or getattr(module, "head_dim", None) or module.head_size)


def patch_model(model: Any, encoding: Encoding | Mapping[str, Encoding] | None = None, *,
                precision: str = "precise") -> Any:
    """Run every attention layer of a transformers model of a supported family on liepos; returns ``model``.

    The families are the rows of :data:`liepos.interop.families.FAMILIES` with an attention class (the
    Llama-shaped families, the MLA families, Llama 4 text, Qwen2-VL M-RoPE; ALiBi: Bloom, MPT, Falcon).
    A family outside the table is probed in its modeling code and proven on the spot
    (:mod:`liepos.interop.hf_verify`); any other model is refused with the reason.

    * ``encoding=None``: what the config means (:func:`liepos.interop.read_hf`, ``precision``
      passed on), so the patched model computes what the unpatched one does; the temperature is
      applied to the rotated dims as upstream does, model-level multipliers stay upstream's.
    * Pure rotations with a fixed generator cache the *encoded* keys in HF's cache, as upstream, and
      run the model's own attention backend.
    * A config's dynamic NTK or longrope: each forward rotates at the length transformers'
      rotary module computes that forward's frequencies at, keys cached as rotated (upstream's
      model exactly); an explicit length-dependent Encoding means its rule (below).
    * Packed documents (``cu_seq_lens_q/k``): times restart per document and the attention runs
      per document, so a packed row equals its documents run alone (:mod:`liepos.interop.hf_packed`).
    * Every other encoding caches *raw* keys; their times are kept beside the cache, and beside
      them the keys encoded at a cache origin, so a decode step encodes its query and new key only
      (:mod:`liepos.interop.hf_decode`); otherwise :func:`liepos.attention` encodes them relative to
      each query block, causal by token order and under HF's mask (padding, packed sequences,
      sliding windows, static caches); ``output_attentions`` returns the softmax weights.

    ``encoding`` may be a dict ``{layer_type: Encoding}``. Layers the family runs without rope
    (SmolLM3's and Llama 4's NoPE layers) stay NoPE and upstream's, Llama 4's ``attn_temperature_tuning``
    included (:class:`liepos.temperature.Llama4Temperature` is the same factor for liepos' own attention).
    Patching a patched model replaces its
    encoding; :func:`unpatch_model` restores the upstream forward.

    Limits: on the raw-key path no attention dropout; a cache filled by the unpatched model is refused,
    and the key times follow the cache's rows as filled (beam search reordering rows with different
    positions, i.e. a left-padded batch, is not supported there); families whose attention adds terms
    liepos' attention lacks (Gemma 2/3 soft-capping, GPT-OSS sinks, Falcon's own) take fixed rotations only.
    """
    if encoding is not None and not isinstance(encoding, (Encoding, Mapping)):
        raise TypeError(
            f"encoding must be a liepos.Encoding, a dict of them by layer type, or None, got {type(encoding).__name__}"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    family = _family(model, config)
    read = read_hf(config, precision=precision, family=family) if encoding is None else encoding
    modules = [m for m in model.modules() if type(m).__name__ in family.attention and getattr(m, "use_rope", True)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention layer of class {list(family.attention)}")
    positions = getattr(model, "_liepos_positions", None) or _Positions()
    states: dict[Any, _Layer] = {}  # one state per (encoding, rotated dims): layers share its tables

    def state(m: Any) -> _Layer:
        item = _layer_read(read, m, config)
        key = (id(item), _rotated_dims(m, family, config))
        if key not in states:
            states[key] = _state(item, m, family, config, positions)
        return dataclasses.replace(states[key], call={})

    plan = [(m, state(m)) for m in modules]
    lengths = _lengths(states.values(), model, config, family)
    if _own_forward(family, config) is None:
        _install(family, model)  # validate everything before touching any layer
    for m in model.modules():
        if _text_rotary(m, config) and "_liepos_positions" not in m.__dict__:
            m._liepos_positions = positions
            m.forward = _rotary_forward.__get__(m, type(m))
    model.__dict__["_liepos_positions"] = positions
    positions.lengths[:] = lengths.values()  # a repatched model follows only its new encodings
    forward = _own_forward(family, config) or _forward
    for m in model.modules():  # decoder blocks that say whether they return weights; indexers on upstream's rope
        name = type(m).__name__
        wrap = _block_forward if name == _WEIGHT_BLOCKS.get(family.model_type) else _upstream_rope
        if (wrap is _block_forward or name in family.upstream_inside) and "_liepos_block" not in m.__dict__:
            m._liepos_block = True
            m.forward = wrap.__get__(m, type(m))
    for m, st in plan:
        m._liepos = st
        m.forward = forward.__get__(m, type(m))
    return model


def unpatch_model(model: Any) -> Any:
    """Undo :func:`patch_model`: every attention layer runs its upstream forward again."""
    for m in model.modules():
        m.__dict__.pop("_liepos_twice", None)
        for attr in ("_liepos", "_liepos_positions", "_liepos_block"):
            if attr in m.__dict__:
                m.__dict__.pop("forward", None)
                m.__dict__.pop(attr)
    model.__dict__.pop("_liepos_positions", None)
    for name, models in list(_PATCHED.items()):
        models.discard(model)
        if not models:  # no patched model reads this modeling file any more: upstream's functions back
            _uninstall(importlib.import_module(name))
            del _PATCHED[name]
    return model


def _uninstall(mod: Any) -> None:
    """The modeling file as transformers wrote it: every dispatcher and the attention table unwrapped."""
    for name, value in list(vars(mod).items()):
        if callable(value) and hasattr(value, "_liepos_upstream"):
            setattr(mod, name, value._liepos_upstream)
    table = getattr(mod, "ALL_ATTENTION_FUNCTIONS", None)
    if isinstance(table, _Interfaces):
        mod.ALL_ATTENTION_FUNCTIONS = table._liepos_upstream


# the model types patch_model patches
SUPPORTED_FAMILIES = tuple(t for t, f in FAMILIES.items() if f.attention)
