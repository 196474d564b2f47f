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
  with transformers' temperature on the rotated dims); anywhere else (an indexer's) upstream's. This
  is the one module-level change on every route: transformers has no registry for the rope function
  (:mod:`liepos.interop.hf_modeling_hooks`);
* the attention implementation: the patched layers' configs name a twin of theirs registered with
  transformers (``liepos_sdpa``: ``AttentionInterface`` and ``AttentionMaskInterface``), so that the
  model's own code builds upstream's mask and calls upstream's attention, with liepos' dispatch in
  front of it per layer (:mod:`liepos.interop.hf_attention`). Where transformers or the modeling file
  reads the implementation's name (``eager``, the flash and flex backends, the sparse-indexer families,
  Falcon: the exact list is in :mod:`liepos.interop.hf_attention`) the configs keep their name and the
  modeling file's ``ALL_ATTENTION_FUNCTIONS`` is wrapped instead;
* for encodings that are not fixed rotations (xPos, RetNet, ALiBi's slots, dynamic NTK,
  LongRoPE, Jordan blocks) the rope functions return the raw q and k, the cache keeps raw keys,
  their times beside it, and the layer runs the raw-key attention (:mod:`liepos.interop.hf_raw`),
  causal by token order: a decode step through keys kept encoded at a cache origin
  (:mod:`liepos.interop.hf_decode`), anything else through :func:`liepos.attention`.

:func:`unpatch_model` undoes all of it: the forwards, the configs' implementation names, and the
modeling file's functions once no patched model needs them.

The ALiBi families (Bloom, MPT, Falcon ``alibi=True``) compute attention themselves, not through
``ALL_ATTENTION_FUNCTIONS``, so no attention implementation reaches them: their attention module gets a
forward on :func:`liepos.attention` (the configs keep their implementation name).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import torch

from liepos.encoding import Encoding
from liepos.interop.families import FAMILIES, Family, family_of
from liepos.interop.hf_attention import ACTIVE, restore, route
from liepos.interop.hf_config import HFRope, read_hf
from liepos.interop.hf_modeling_hooks import install, release
from liepos.interop.hf_packed import documents
from liepos.interop.hf_raw import raw_attention
from liepos.interop.hf_state import Layer, Length, Positions
from liepos.interop.hf_verify import patch_family, unnumber_layers
from liepos.interop.hf_vision import patch_vision, vision_rope
from liepos.interop.hf_vision import release as release_vision
from liepos.interop.rope_types import times_logit

__all__ = ["patch_model", "unpatch_model", "SUPPORTED_FAMILIES"]

# whether the decoder block running now returns its attention's weights (MPT's block does not tell its attention)
_BLOCK_WEIGHTS: contextvars.ContextVar[bool] = contextvars.ContextVar("liepos_block_weights", default=False)



# ---------------------------------------------------------------------- ALiBi families: their own attention
def _alibi_attention(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, cache: Any,
                     scale: float, weights: bool) -> tuple[torch.Tensor, Any]:
    """q, k, v ``(B, H, S, D)`` of an ALiBi family's attention through the raw-key path at times 0, 1, …"""
    state: Layer = module._liepos
    seen = int(cache.get_seq_length(module.layer_idx)) if cache is not None else 0
    S = q.shape[2]
    state.call = {"cache": cache, "seen": seen, "weights": weights,
                  "pos": torch.arange(seen, seen + S, device=q.device, dtype=torch.float64)[None]}  # (1, S)
    if cache is not None:
        state.call["raw"] = _raw_keys(cache, module.layer_idx)
        k, v = cache.update(k, v, module.layer_idx)
    return raw_attention(module, q, k, v, mask, scaling=scale)


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
    token = ACTIVE.set(None)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        ACTIVE.reset(token)


def _own_forward(family: Family, config: Any) -> Any:
    """The ALiBi family's own forward, or None for the families of the shared mechanism."""
    if family.model_type == "falcon" and getattr(config, "alibi", False):
        return _falcon_forward
    return _OWN_FORWARDS.get(family.model_type)


# ---------------------------------------------------------------------- patching
def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The patched attention forward: upstream's, with the liepos dispatchers active."""
    state: Layer = self._liepos
    if state.implementation is not None and self.config._attn_implementation != state.implementation:
        raise RuntimeError(
            f"{type(self).__name__} (layer {self.layer_idx}) was patched to run as attn_implementation="
            f"{state.implementation!r}, but its config now names {self.config._attn_implementation!r}: unpatch_model, "
            "set the implementation, then patch_model again"
        )
    # the decoder layers pass the cache by keyword (its name changed over transformers releases)
    cache = next((kwargs[k] for k in ("cache", "past_key_values", "layer_past") if kwargs.get(k) is not None), None)
    state.call = {
        "cache": cache,
        "seen": int(cache.get_seq_length(self.layer_idx)) if cache is not None else 0,
        "weights": bool(kwargs.get("output_attentions", False)) or _recording_attentions(),
        "raw": None if cache is None or state.encoded else _raw_keys(cache, self.layer_idx),
        "cu": documents(kwargs),
    }
    token = ACTIVE.set(self)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        ACTIVE.reset(token)


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
    positions: Positions = self._liepos_positions
    inner = "_liepos_inner" in self.__dict__
    if not inner:  # the model's positions of this forward
        positions.record(position_ids, self)
    if positions.tagged:  # each rope call rotates at the positions of the rotary call that made its cos
        positions.tag(out, position_ids, kwargs.get("layer_type", args[0] if args else None), inner)
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


def _rope_label(module: Any, family: Family, config: Any) -> Any:
    """The key of the module's rope parameters: the family's ``rope_key`` attribute, else the layer type."""
    return getattr(module, family.rope_key) if family.rope_key else _layer_type(module, config)


def _layer_read(read: Any, module: Any, family: Family, config: Any) -> Any:
    if not isinstance(read, Mapping):
        return read
    lt = _rope_label(module, family, config)
    if lt not in read:
        what = f"its {family.rope_key} is" if family.rope_key else "has layer type"
        raise ValueError(f"layer {module.layer_idx} {what} {lt!r} but the encodings are given for {sorted(read)}")
    return read[lt]


def _state(item: Any, module: Any, family: Family, config: Any, positions: Positions) -> Layer:
    """The layer state for an :class:`HFRope` (encoding=None) or a user's Encoding."""
    rotated = _rotated_dims(module, family, config)
    if isinstance(item, HFRope):
        enc = item.encoding
        pad = enc.content_dim - rotated
        gain: torch.Tensor | float = math.sqrt(enc.logit_scale)
        if not item.exact_encoding:  # the temperature on the rotated dims only, as upstream
            g = torch.ones(enc.content_dim, dtype=torch.float64)
            g[item.rotated] = math.sqrt(item.rotary_scale)
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
        length, encoded = Length(enc, attributes), True
        if family.inner_rotary:
            raise NotImplementedError(
                f"{family.model_type}: a {item.rope_type} rope from the config, but the rotary modules inside its "
                "attention (compressors, indexer) each recompute their frequencies at lengths of their own, which "
                "liepos does not follow; fixed ropes (default, linear, yarn, llama3, ...) patch this family exactly"
            )
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
    return Layer(enc, family, gain, encoded, pad, positions, length=length)


def _lengths(states: Any, model: Any, config: Any, family: Family) -> dict[int, Length]:
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
    if family.rope_last:  # the whole [nope | rope] head reaches the rope
        return int(module.head_dim)
    return int(getattr(config, "qk_rope_head_dim", None) or getattr(module, "head_dim", None) or module.head_size)


def patch_model(model: Any, encoding: Encoding | Mapping[str, Encoding] | None = None, *,
                precision: str = "precise") -> Any:
    """Run every attention layer of a transformers model of a supported family on liepos; returns ``model``.

    The families are the rows of :data:`liepos.interop.families.FAMILIES` with an attention class (the
    Llama-shaped families, the MLA families, Llama 4 text, Qwen2-VL M-RoPE; ALiBi: Bloom, MPT, Falcon).
    A family outside the table is probed in its modeling code and proven on the spot
    (:mod:`liepos.interop.hf_verify`); a vision tower whose rotary module reads (h, w) patch pairs and whose
    attention calls ``apply_rotary_pos_emb_vision`` likewise (:mod:`liepos.interop.hf_vision`); any other
    model is refused with the reason.

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
    encoding; :func:`unpatch_model` restores the upstream forward, the configs' attention implementation
    names and the modeling files (:mod:`liepos.interop.hf_attention` says which implementation runs where).

    Limits: on the raw-key path no attention dropout; a cache filled by the unpatched model is refused,
    and the key times follow the cache's rows as filled (beam search reordering rows with different
    positions, i.e. a left-padded batch, is not supported there); families whose attention adds terms
    liepos' attention lacks (Gemma 2/3 soft-capping, GPT-OSS sinks, Falcon's own) take fixed rotations only;
    a model running on a registered twin (``liepos_sdpa``) whose config is given another implementation
    afterwards refuses its next forward (unpatch, set the implementation, patch again).
    """
    if encoding is not None and not isinstance(encoding, (Encoding, Mapping)):
        raise TypeError(
            f"encoding must be a liepos.Encoding, a dict of them by layer type, or None, got {type(encoding).__name__}"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    tower = vision_rope(model, config) if family_of(getattr(config, "model_type", None)) is None else None
    if tower is not None:  # a vision tower's rope over (h, w) patch pairs: probed, proven, patched
        if encoding is not None:
            raise ValueError(f"{type(model).__name__} is a vision tower whose rope reads (h, w) patch positions: "
                             "patch_model patches it with the encoding its rotary module means only (encoding=None)")
        return patch_vision(model, config, tower)
    try:  # a refusal leaves the model as it was, the layer numbers the family check gave included
        return _patch(model, config, encoding, precision)
    except BaseException:
        if not any("_liepos" in m.__dict__ for m in model.modules()):  # refused before any layer was patched
            unnumber_layers(model)
        raise


def _patch(model: Any, config: Any, encoding: Any, precision: str) -> Any:
    family = _family(model, config)
    read = read_hf(config, precision=precision, family=family) if encoding is None else encoding
    modules = [m for m in model.modules() if type(m).__name__ in family.attention and getattr(m, "use_rope", True)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention layer of class {list(family.attention)}")
    positions = getattr(model, "_liepos_positions", None) or Positions()
    states: dict[Any, Layer] = {}  # one state per (encoding, rotated dims): layers share its tables

    def state(m: Any) -> Layer:
        item = _layer_read(read, m, family, config)
        key = (id(item), _rotated_dims(m, family, config))
        if key not in states:
            states[key] = _state(item, m, family, config, positions)
        label = _rope_label(m, family, config) if family.inner_rotary else None
        return dataclasses.replace(states[key], call={}, label=label)

    plan = [(m, state(m)) for m in modules]
    lengths = _lengths(states.values(), model, config, family)
    if _own_forward(family, config) is None:  # everything validated: now the model changes
        _hook_in(family, model, plan)
    # rotary modules inside an attention (compressors, indexers) rotate at positions of their own
    inner = {id(r) for m, _ in plan for r in m.modules() if family.inner_rotary and _text_rotary(r, config)}
    positions.tagged = family.inner_rotary
    for m in model.modules():
        if _text_rotary(m, config) and "_liepos_positions" not in m.__dict__:
            m._liepos_positions = positions
            if id(m) in inner:
                m._liepos_inner = True
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


def _hook_in(family: Family, model: Any, plan: list[tuple[Any, Layer]]) -> None:
    """The attention implementation the layers run (a registered twin, where exact) and the modeling file's hooks."""
    routed = route(model, [m for m, _ in plan], family.modeling)
    install(family.modeling, family.apply, model, table=not routed)
    for m, st in plan:
        st.implementation = m.config._attn_implementation if routed else None


def unpatch_model(model: Any) -> Any:
    """Undo :func:`patch_model`: every attention layer runs its upstream forward again, every config names
    the attention implementation it named before, and each modeling file holds transformers' own functions
    again once no patched model needs them."""
    for m in model.modules():
        m.__dict__.pop("_liepos_twice", None)
        m.__dict__.pop("_liepos_inner", None)
        for attr in ("_liepos", "_liepos_positions", "_liepos_block"):
            if attr in m.__dict__:
                m.__dict__.pop("forward", None)
                m.__dict__.pop(attr)
    model.__dict__.pop("_liepos_positions", None)
    release_vision(model)
    unnumber_layers(model)
    restore(model)  # the attention implementation each config named before
    release(model)  # the modeling files' own functions back once no patched model needs them
    return model

# the model types patch_model patches
SUPPORTED_FAMILIES = tuple(t for t, f in FAMILIES.items() if f.attention)
