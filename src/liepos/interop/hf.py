"""Hugging Face transformers configs → liepos encodings.

:func:`from_hf` reads the RoPE settings of a transformers config (a ``PretrainedConfig`` or the
plain dict of a ``config.json``) and returns the :class:`~liepos.Encoding` the model applies to
its queries and keys, in the ``"half"`` layout Hugging Face uses::

    enc.query(q, positions) == q·cos + rotate_half(q)·sin      (cos, sin without attention_scaling)

with partial rotary as rotation planes followed by NoPE dims, and the logit temperature in
``enc.logit_scale`` (``attention_factor²``, since the model multiplies cos and sin by it).
Every ``rope_type`` of ``transformers.modeling_rope_utils`` is supported; the formulas are
:mod:`liepos.scaling`. Transformers itself is not imported.

Two precisions: ``"precise"`` (the default) evaluates every formula in float64;
``"compat"`` reproduces the float32 ``inv_freq`` that transformers computes on the CPU, bit for
bit, and stores those values (the angles are still formed in float64 from them).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from liepos import scaling
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum

__all__ = ["from_hf", "patch_model", "unpatch_model", "SUPPORTED_ATTENTION", "ROPE_TYPES", "PRECISIONS"]

PRECISIONS = ("precise", "compat")

# rope_type -> (required keys, optional keys), besides rope_type/type, rope_theta, partial_rotary_factor;
# the same sets as transformers' RotaryEmbeddingConfigMixin validators
_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor"}), frozenset()),
    "yarn": (
        frozenset({"factor", "original_max_position_embeddings"}),
        frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    ),
    "longrope": (
        frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
        frozenset({"attention_factor", "factor"}),
    ),
    "llama3": (
        frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
        frozenset(),
    ),
    "proportional": (frozenset(), frozenset({"factor"})),
}
ROPE_TYPES = tuple(_KEYS)
_COMMON = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
_ALL_KEYS = _COMMON.union(*(r | o for r, o in _KEYS.values()))
_DEFAULT_THETA = 10000.0


# ---------------------------------------------------------------------- reading a config
class _Source:
    """Uniform read access to a transformers config object or a config.json dict."""

    def __init__(self, config: Any) -> None:
        self.is_dict = isinstance(config, Mapping)
        if not self.is_dict and hasattr(config, "get_text_config"):
            try:
                config = config.get_text_config()
            except Exception:  # noqa: BLE001 - a config without a text part is itself the text part
                pass
        if self.is_dict and not any(k in config for k in ("rope_parameters", "rope_scaling", "rope_theta")):
            text = config.get("text_config")
            if isinstance(text, Mapping):
                config = text
        self.obj = config

    def get(self, name: str, default: Any = None, obj: Any = None) -> Any:
        obj = self.obj if obj is None else obj
        if isinstance(obj, Mapping):
            value = obj.get(name, default)
        else:
            try:
                value = getattr(obj, name, default)
            except RuntimeError:  # a per-layer attribute read globally on a heterogeneous config
                value = default
        return default if value is None else value

    def layer_view(self, layer_type: str | None) -> Any:
        """The per-layer config transformers' rope functions read (``config.per_layer_config[lt]``)."""
        if layer_type is None or self.is_dict:
            return self.obj
        try:
            return self.obj.per_layer_config[layer_type]
        except (AttributeError, ValueError, KeyError, TypeError, IndexError):
            return self.obj


def _labels(src: _Source) -> tuple[str, ...]:
    labels = src.get("_rope_type_labels") or src.get("layer_types") or ()
    return tuple(labels)


def _rope_dicts(src: _Source) -> tuple[dict[str, Any], bool]:
    """The rope parameters as ``({name: dict | None}, nested)``; a flat config uses the name ``None``."""
    rp = src.get("rope_parameters")
    rs = src.get("rope_scaling")
    if src.is_dict and rp is not None and rs is not None and rp != rs:
        raise ValueError(
            f"config has both rope_parameters={rp!r} and rope_scaling={rs!r} and they differ; "
            "keep one of them"
        )
    rope = rp if rp is not None else rs
    if rope is not None and not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters must be a dict, got {type(rope).__name__}")
    rope = copy.deepcopy(dict(rope)) if rope is not None else {}

    labels = _labels(src)
    if labels:
        nested_keys = [k for k in rope if k in labels]
    elif rope and all(isinstance(v, Mapping) or v is None for v in rope.values()) and not (set(rope) & _ALL_KEYS):
        nested_keys = list(rope)
    else:
        nested_keys = []
    if nested_keys:
        stray = sorted(set(rope) - set(nested_keys))
        if stray:
            raise ValueError(
                f"rope_parameters mixes per-layer-type entries {nested_keys} with other keys {stray}"
            )
        return {k: (None if rope[k] is None else dict(rope[k])) for k in nested_keys}, True

    local = src.get("rope_local_base_freq")
    if local is not None:
        # the Gemma-3 v4 shape: rope_scaling and rope_theta are the global layers', the local
        # layers are plain RoPE at rope_local_base_freq (what Gemma3TextConfig converts it to)
        full = rope or {"rope_type": "default"}
        return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}, True
    return {None: rope}, False


def _rope_type(params: Mapping[str, Any], where: str) -> str:
    a, b = params.get("rope_type"), params.get("type")
    if a is not None and b is not None and a != b:
        raise ValueError(f"contradictory rope type{where}: type={b!r} but rope_type={a!r}")
    kind = a if a is not None else (b if b is not None else "default")
    if kind not in _KEYS:
        raise ValueError(f"unknown rope_type {kind!r}{where}; known: {list(ROPE_TYPES)}")
    return kind


def _merge_top(
    params: dict[str, Any], key: str, top: Any, is_dict: bool, nested: bool, where: str
) -> None:
    """Fill ``params[key]`` from the top level of the config; a dict that says both differently is an error."""
    if top is None:
        return
    if key in params and params[key] is not None:
        if is_dict and not nested and params[key] != top:
            raise ValueError(
                f"contradictory {key}{where}: {params[key]!r} in the rope parameters but {top!r} at the top level"
            )
        return
    params[key] = top


# ---------------------------------------------------------------------- building
def _half(w: torch.Tensor, head_dim: int, name: str) -> Encoding:
    """Rotation planes with frequencies ``w`` then NoPE dims, in the half layout (HF partial rotary)."""
    P = int(w.shape[0])
    rest = head_dim - 2 * P
    if rest < 0:
        raise ValueError(f"{P} rotation planes do not fit in head_dim={head_dim}")
    z = torch.zeros(P, dtype=torch.float64)
    gens = [Generator(z, w.to(torch.float64), [1] * P, complex=[True] * P)]
    if rest:
        zr = torch.zeros(rest, dtype=torch.float64)
        gens.append(Generator(zr, zr, [1] * rest))
    return Encoding(direct_sum(*gens), layout="half", name=name)


def _nope(head_dim: int, name: str) -> Encoding:
    z = torch.zeros(head_dim, dtype=torch.float64)
    return Encoding(Generator(z, z, [1] * head_dim), layout="half", name=name)


def _times_logit(enc: Encoding, m: float) -> Encoding:
    """Multiply the logit scale, also at every length of a length-dependent encoding."""
    return scaling._build(enc, lambda e, L: e.replace(logit_scale=e.logit_scale * m))


def _f32_exponents(dim: int, denom: int | None = None) -> torch.Tensor:
    # transformers: torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / (dim if denom is None else denom)


def _f32_default(base: Any, dim: int) -> torch.Tensor:
    return 1.0 / (base ** _f32_exponents(dim))


def _f32_dynamic(base: Any, dim: int, factor: Any, max_pos: Any, length: int | None) -> torch.Tensor:
    if length is None:
        # at initialisation transformers uses seq_len = max_position_embeddings, in Python floats
        b = base * ((factor * max_pos / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    else:
        # in the forward pass seq_len = max(position_ids) + 1 is an int64 tensor: float32 arithmetic
        seq = torch.maximum(torch.tensor(length, dtype=torch.int64), torch.tensor(max_pos, dtype=torch.int64))
        b = base * ((factor * seq / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (b ** _f32_exponents(dim))


def _f32_yarn(base: Any, dim: int, factor: Any, low: float, high: float) -> torch.Tensor:
    pos = base ** (torch.arange(0, dim, 2).to(dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos, 1.0 / (factor * pos)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def _f32_longrope(base: Any, dim: int, factors: Any) -> torch.Tensor:
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _f32_llama3(base: Any, dim: int, factor: Any, low_ff: Any, high_ff: Any, L0: Any) -> torch.Tensor:
    w = _f32_default(base, dim)
    low_wl, high_wl = L0 / low_ff, L0 / high_ff
    wavelen = 2 * math.pi / w
    scaled = torch.where(wavelen > low_wl, w / factor, w)
    smooth = (L0 / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, scaled)


def _f32_proportional(base: Any, head_dim: int, p: Any, factor: Any) -> torch.Tensor:
    r = int(p * head_dim // 2)
    w = 1.0 / (base ** (torch.arange(0, 2 * r, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    nope = head_dim // 2 - r
    if nope > 0:
        w = torch.cat((w, torch.zeros(nope, dtype=torch.float32)))
    return w / factor


def _one(
    params: dict[str, Any],
    *,
    src: _Source,
    layer_type: str | None,
    nested: bool,
    head_dim: int,
    precision: str,
    ignore_keys: frozenset[str],
    softmax_mscale: bool,
) -> Encoding:
    where = "" if layer_type is None else f" for layer type {layer_type!r}"
    kind = _rope_type(params, where)
    required, optional = _KEYS[kind]

    _merge_top(params, "rope_theta", src.get("rope_theta"), src.is_dict, nested, where)
    _merge_top(params, "partial_rotary_factor", src.get("partial_rotary_factor"), src.is_dict, nested, where)
    if kind in ("yarn", "longrope", "llama3"):
        top = src.get("original_max_position_embeddings")
        _merge_top(params, "original_max_position_embeddings", top, src.is_dict, nested, where)
        if params.get("original_max_position_embeddings") is None and src.get("max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = src.get("max_position_embeddings")

    unknown = sorted(set(params) - _COMMON - required - optional - ignore_keys)
    if unknown:
        raise ValueError(
            f"unknown or unused rope parameters {unknown}{where} for rope_type {kind!r} "
            f"(it reads {sorted(required | optional | {'rope_theta', 'partial_rotary_factor'})}); "
            "pass ignore_keys= to drop them knowingly"
        )
    missing = sorted(k for k in required if k not in params)
    if missing:
        raise ValueError(f"rope_type {kind!r}{where} is missing required parameters {missing}")

    base = params.get("rope_theta", _DEFAULT_THETA)
    scaling._positive(base, "rope_theta")
    if base == 1:
        raise ValueError("rope_theta must differ from 1")
    p = params.get("partial_rotary_factor", 1.0)
    if p is None:
        p = 1.0
    scaling._real(p, "partial_rotary_factor")
    if not 0 < p <= 1:
        raise ValueError(f"partial_rotary_factor must lie in (0, 1], got {p!r}")
    max_pos = src.get("max_position_embeddings")

    def need_max_pos(why: str) -> Any:
        if max_pos is None:
            raise ValueError(f"max_position_embeddings is missing from the config; rope_type {kind!r} needs it {why}")
        return max_pos

    # the rotary dim: the generic partial rotary, except proportional, which covers the full head
    dim = head_dim if kind == "proportional" else int(head_dim * p)
    if dim < 2:
        raise ValueError(
            f"head_dim={head_dim} with partial_rotary_factor={p} leaves {dim} rotary dims: nothing rotates"
        )
    name = f"hf:{kind}" + ("" if layer_type is None else f"[{layer_type}]")
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    enc = _half(1.0 / (float(base) ** exps), head_dim, name)
    compat = precision == "compat"
    factor = params.get("factor")
    L0 = params.get("original_max_position_embeddings")

    def store(e: Encoding, w32: torch.Tensor, logit: float = 1.0) -> Encoding:
        return scaling._with_freqs(e, w32.to(torch.float64), logit, "compat")

    if kind == "default":
        if compat:
            enc = store(enc, _f32_default(base, dim))
    elif kind == "linear":
        enc = scaling.linear(enc, factor=factor)
        if compat:
            w = _f32_default(base, dim)
            w /= factor
            enc = store(enc, w)
    elif kind == "dynamic":
        L0d = need_max_pos("as the original length of dynamic NTK")
        scaling._positive(factor, "factor")
        if not compat:
            enc = scaling.dynamic(enc, factor=factor, original_max_position_embeddings=L0d, rotary_dim=dim)
        else:
            init = store(enc, _f32_dynamic(base, dim, factor, L0d, None))

            def rule(length: int) -> Encoding:
                if length <= L0d:
                    return init.replace(length_rule=rule)
                return store(init, _f32_dynamic(base, dim, factor, L0d, length)).replace(length_rule=rule)

            enc = init.replace(length_rule=rule)
    elif kind == "yarn":
        if factor is None:
            factor = need_max_pos("to derive factor") / L0
        truncate = params.get("truncate", True)
        if nested and truncate is not True:
            # transformers reads config.rope_parameters.get("truncate", True): for per-layer-type
            # parameters that is the outer dict, so a layer's truncate is never seen
            warnings.warn(
                f"truncate={truncate!r}{where} is ignored by transformers for per-layer-type rope "
                "parameters; using truncate=True as the model does",
                stacklevel=3,
            )
            truncate = True
        yp = dict(
            factor=factor,
            original_max_position_embeddings=L0,
            beta_fast=params.get("beta_fast") or 32,
            beta_slow=params.get("beta_slow") or 1,
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor=params.get("attention_factor"),
            truncate=bool(truncate),
        )
        enc = scaling.yarn(enc, base=float(base), rotary_dim=dim, **yp)
        if compat:
            low, high = scaling.yarn_correction_range(
                rotary_dim=dim, base=base, original_max_position_embeddings=L0,
                beta_fast=yp["beta_fast"], beta_slow=yp["beta_slow"], truncate=yp["truncate"],
            )
            enc = store(enc, _f32_yarn(base, dim, factor, low, high))
        mall = params.get("mscale_all_dim")
        if softmax_mscale and mall:
            # DeepSeek-V2/V3 and the other MLA models: softmax scale ·= m(s, mscale_all_dim)²
            m = scaling.yarn_mscale(params["factor"] if params["factor"] is not None else factor, mall)
            enc = _times_logit(enc, m * m)
    elif kind == "longrope":
        lp_factor = factor
        if lp_factor is None:
            lp_factor = need_max_pos("to derive factor") / L0
        enc = scaling.longrope(
            enc, short_factor=params["short_factor"], long_factor=params["long_factor"],
            original_max_position_embeddings=L0, factor=lp_factor,
            attention_factor=params.get("attention_factor"),
        )
        if compat:
            short = store(enc, _f32_longrope(base, dim, params["short_factor"]))
            w_long = _f32_longrope(base, dim, params["long_factor"])

            def rule(length: int) -> Encoding:
                if length > L0:
                    return store(short, w_long).replace(length_rule=rule)
                return short.replace(length_rule=rule)

            enc = short.replace(length_rule=rule)
    elif kind == "llama3":
        enc = scaling.llama3(
            enc, factor=factor, original_max_position_embeddings=L0,
            low_freq_factor=params["low_freq_factor"], high_freq_factor=params["high_freq_factor"],
        )
        if compat:
            enc = store(enc, _f32_llama3(base, dim, factor, params["low_freq_factor"],
                                         params["high_freq_factor"], L0))
    elif kind == "proportional":
        pf = 1.0 if factor is None else factor
        enc = scaling.proportional(enc, partial_rotary_factor=p, factor=pf)
        if compat:
            enc = store(enc, _f32_proportional(base, head_dim, p, pf))
    return enc.replace(name=name)


def _dict_layer_head_dim(src: _Source, layer_type: str, default: Any) -> Any:
    """Per-layer head dims of a config.json: ``per_layer_config`` (transformers' heterogeneous
    configs, keyed by layer index) or Gemma 4's ``global_head_dim`` for its full-attention layers."""
    per = src.get("per_layer_config")
    types = list(src.get("layer_types") or ())
    if isinstance(per, Mapping) and types:
        overrides = {int(k): v for k, v in per.items()}
        found = {
            (overrides.get(i) or {}).get("head_dim", default) for i, t in enumerate(types) if t == layer_type
        }
        if len(found) > 1:
            raise ValueError(
                f"layers of type {layer_type!r} have different head dims {sorted(found, key=str)}; pass head_dim="
            )
        return found.pop() if found else default
    glob = src.get("global_head_dim")
    if glob is not None and layer_type == "full_attention":
        return glob
    return default


def _head_dim(src: _Source, layer_type: str | None, override: int | None) -> int:
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 1:
            raise ValueError(f"head_dim must be a positive int, got {override!r}")
        return override
    view = src.layer_view(layer_type)
    hd = src.get("qk_rope_head_dim", obj=view) or src.get("head_dim", obj=view)
    if src.is_dict and layer_type is not None:
        hd = _dict_layer_head_dim(src, layer_type, hd)
    if hd is None:
        hidden = src.get("hidden_size", obj=view)
        heads = src.get("num_attention_heads", obj=view)
        if hidden is None or heads is None:
            raise ValueError(
                "the config has no head_dim and no hidden_size/num_attention_heads to derive it; pass head_dim="
            )
        hd = hidden // heads
    return int(hd)


def from_hf(
    config: Any,
    *,
    layer_type: str | None = None,
    precision: str = "precise",
    head_dim: int | None = None,
    ignore_keys: Iterable[str] = (),
    softmax_mscale: bool = True,
) -> Encoding | dict[str, Encoding]:
    """The encoding a Hugging Face transformers model applies, from its config.

    Args:
        config: a transformers ``PretrainedConfig`` (multimodal configs use their text config)
            or a ``config.json`` dict. Both shapes are read: transformers ≥ 5 ``rope_parameters``
            and the older ``rope_scaling`` + ``rope_theta`` (+ ``partial_rotary_factor``,
            ``original_max_position_embeddings``, and Gemma-3's ``rope_local_base_freq``); ``type``
            is an alias of ``rope_type``.
        layer_type: for per-layer-type parameters (Gemma 3/4, ModernBERT, …) the layer type to
            return; without it such a config gives a dict ``{layer_type: Encoding}``. A layer
            type whose parameters are ``None`` is NoPE.
        precision: ``"precise"`` (float64 formulas) or ``"compat"`` (transformers' float32
            ``inv_freq``, bit for bit).
        head_dim: override the head dim (default ``qk_rope_head_dim`` for MLA models, else
            ``head_dim``, else ``hidden_size // num_attention_heads``; per layer type for
            heterogeneous configs such as Gemma 4: ``per_layer_config`` of the object or dict,
            or a config.json's ``global_head_dim`` for its ``full_attention`` layers).
        ignore_keys: rope parameters to drop knowingly (e.g. ``{"mrope_section"}`` for the 1-D
            text positions of an M-RoPE model). Any other key the rope type does not read is an error.
        softmax_mscale: apply the softmax correction of the DeepSeek/MLA family: when the YaRN
            parameters carry ``mscale_all_dim``, those models multiply their softmax scale by
            ``m(factor, mscale_all_dim)²`` (:func:`liepos.scaling.yarn_mscale`), which is
            folded into ``logit_scale``. ``False`` keeps only the rope utilities' part.

    Returns:
        An :class:`~liepos.Encoding` in the ``"half"`` layout over the full head dim: the
        rotation planes (``inv_freq``) then ``head_dim − rotary_dim`` NoPE dims, with
        ``logit_scale = attention_factor²`` (times the MLA softmax correction), and a
        ``length_rule`` for ``dynamic`` and ``longrope``. DeepSeek checkpoints with
        ``rope_interleave`` pair dims (2k, 2k+1) instead: ``enc.replace(layout="interleaved")``.

    Raises:
        ValueError: unknown ``rope_type``, unknown or unused keys, missing required keys,
            contradictory keys (``type`` vs ``rope_type``, a value given twice differently).

    >>> enc = from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0})
    >>> enc.layout, enc.dim, enc.generator.freqs.tolist()[:2]
    ('half', 16, [1.0, 0.31622776601683794])
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if isinstance(ignore_keys, str):
        ignore_keys = (ignore_keys,)
    ignore = frozenset(ignore_keys)
    src = _Source(config)
    dicts, nested = _rope_dicts(src)

    def build(lt: str | None, params: dict[str, Any] | None) -> Encoding:
        hd = _head_dim(src, lt, head_dim)
        if params is None:
            return _nope(hd, "hf:nope" + ("" if lt is None else f"[{lt}]"))
        return _one(
            dict(params), src=src, layer_type=lt, nested=nested, head_dim=hd, precision=precision,
            ignore_keys=ignore, softmax_mscale=bool(softmax_mscale),
        )

    if not nested:
        if layer_type is not None:
            labels = _labels(src)
            if labels and layer_type not in labels:
                raise ValueError(f"layer_type {layer_type!r} is not one of the config's layer types {sorted(set(labels))}")
        return build(layer_type, dicts[None])
    if layer_type is not None:
        if layer_type not in dicts:
            raise ValueError(f"layer_type {layer_type!r} has no rope parameters; the config has {sorted(dicts)}")
        return build(layer_type, dicts[layer_type])
    return {lt: build(lt, params) for lt, params in dicts.items()}


# ---------------------------------------------------------------------- patching a model
# attention classes whose forward _forward reproduces (projections, optional per-head q/k norm,
# rotary, cache update, attention interface, o_proj); others are refused rather than guessed
SUPPORTED_ATTENTION = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention")
_TIMES = "_liepos_times"


def _layer_encoding(encoding: Any, module: Any, config: Any) -> Encoding:
    if isinstance(encoding, Encoding):
        return encoding
    types = list(getattr(config, "layer_types", None) or ())
    lt = getattr(module, "layer_type", None) or (types[module.layer_idx] if module.layer_idx < len(types) else None)
    if lt not in encoding:
        raise ValueError(
            f"layer {module.layer_idx} has layer type {lt!r} but the encodings are given for {sorted(encoding)}"
        )
    return encoding[lt]


def _check_layer(enc: Encoding, module: Any, config: Any) -> None:
    if not isinstance(enc, Encoding):
        raise TypeError(f"encoding must be a liepos.Encoding (or a dict of them by layer type), got {type(enc).__name__}")
    if enc.content_dim != module.head_dim:
        raise ValueError(
            f"the encoding has {enc.content_dim} content dims but {type(module).__name__} (layer "
            f"{module.layer_idx}) has head_dim={module.head_dim}"
        )
    heads = getattr(config, "num_attention_heads", None)
    if enc.num_heads is not None and heads is not None and enc.num_heads != heads:
        raise ValueError(
            f"the encoding has per-head parameters for {enc.num_heads} heads but the model has "
            f"num_attention_heads={heads}"
        )


def _stores_encoded_keys(enc: Encoding) -> bool:
    """Pure rotations at a fixed generator: encoded keys are exact at absolute times, cache them."""
    return not enc.needs_recentring and enc.length_rule is None


def _key_times(cache: Any, layer_idx: int, new: torch.Tensor, n_keys: int, seen: int) -> torch.Tensor:
    """Times (B, n_keys) of the keys ``cache.update`` returned: kept beside the cache, per layer.

    ``seen`` is the layer's token count before the update: a smaller count than recorded means
    the cache was cropped, and the latest times are dropped with it.
    """
    store = cache.__dict__.setdefault(_TIMES, {})
    old, total = store.get(layer_idx, (None, 0))
    if old is not None and seen < total:
        old = old[:, : old.shape[-1] - (total - seen)] if total - seen < old.shape[-1] else None
    n_old = n_keys - new.shape[-1]
    if n_old > 0:
        if old is None or old.shape[-1] < n_old:
            raise RuntimeError(
                f"layer {layer_idx}: the cache holds {n_old} keys whose times liepos did not record "
                "(a cache filled by the unpatched model, or reordered/cropped); start from an empty cache"
            )
        old = old[:, -n_old:]
        B = max(old.shape[0], new.shape[0])
        times = torch.cat((old.expand(B, -1), new.expand(B, -1)), dim=-1)
    else:
        times = new[:, new.shape[-1] - n_keys:]
    store[layer_idx] = (times, seen + new.shape[-1])
    return times


def _bool_mask(mask: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """HF's attention mask -> (attn_mask (B|1, 1|H, Sq, Sk) bool, key_padding_mask (B, Sk) bool)."""
    if mask is None:
        return None, None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"an attention mask of type {type(mask).__name__} (flex attention's BlockMask?) is not supported "
            "for encodings that need re-centring; use attn_implementation='sdpa' or 'eager'"
        )
    if mask.dim() == 2:  # flash-attention style padding mask (B, Sk), 1 = token
        return None, mask.bool()
    if mask.dtype != torch.bool:  # additive: 0 = attend, dtype min = masked
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask, None


def _forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any = None,
             attention_mask: Any = None, cache: Any = None, past_key_values: Any = None,
             **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The patched attention forward: HF's, with liepos in place of ``apply_rotary_pos_emb``."""
    import sys

    from liepos.attention import attention

    if cache is None:
        cache = past_key_values
    enc: Encoding = self._liepos_encoding
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape)  # (B, S, H, D)
    k = self.k_proj(hidden_states).view(hidden_shape)  # (B, S, Hk, D)
    if getattr(self, "q_norm", None) is not None:  # Qwen3: per-head RMSNorm before the rotation
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H|Hk, S, D)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, Hk, S, D)
    S = q.shape[2]

    seen = int(cache.get_seq_length(self.layer_idx)) if cache is not None else 0
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = kwargs.get("cache_position")
    if pos is None:
        pos = torch.arange(seen, seen + S, device=q.device)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    if pos.dim() != 2:
        raise ValueError(
            f"position_ids of shape {tuple(pos.shape)}: patch_model handles one position axis (batch, seq)"
        )
    pos = pos.to(torch.float64)  # (1|B, S)

    if self._liepos_encoded_cache:
        # pure rotation: the encoded keys are exact at absolute times, so HF's cache of rotated keys
        # and every attention backend work unchanged; the temperature goes into the scaling
        q, k = enc.query(q, pos), enc.key(k, pos)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = getattr(sys.modules[type(self).__module__], "eager_attention_forward", None)
        if eager is None:
            from transformers.models.llama.modeling_llama import eager_attention_forward as eager
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
        window = getattr(self, "sliding_window", getattr(self.config, "sliding_window", None))
        out, weights = interface(
            self, q, k, v, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling * enc.logit_scale, sliding_window=window, **kwargs,
        )
    else:
        # re-centred (decay, xPos, slots) or length-dependent: the cache holds raw keys, their
        # times are kept beside it, and liepos.attention encodes them relative to each query block
        if self.training and self.attention_dropout:
            raise NotImplementedError(
                f"attention_dropout={self.attention_dropout} is not applied by the liepos attention path; "
                "set config.attention_dropout = 0.0"
            )
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
            kpos = _key_times(cache, self.layer_idx, pos, k.shape[2], seen)
        else:
            kpos = pos
        attn_mask, padding = _bool_mask(attention_mask)
        B = q.shape[0]
        out = attention(
            q, k, v, enc, positions=pos.expand(B, -1), key_positions=kpos.expand(B, -1), causal=True,
            attn_mask=attn_mask, key_padding_mask=padding, scale=self.scaling,
        ).transpose(1, 2)  # (B, S, H, D)
        weights = None
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _attention_modules(model: Any) -> list[Any]:
    found, other = [], set()
    for m in model.modules():
        name = type(m).__name__
        if name in SUPPORTED_ATTENTION:
            found.append(m)
        elif name.endswith("Attention") and hasattr(m, "q_proj") and hasattr(m, "k_proj"):
            other.add(name)
    if other:
        raise ValueError(
            f"{type(model).__name__} has attention layers of classes {sorted(other)} that patch_model does not "
            f"reproduce; supported: {list(SUPPORTED_ATTENTION)}"
        )
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention layer of a supported class {list(SUPPORTED_ATTENTION)}"
        )
    return found


def patch_model(model: Any, encoding: Encoding | Mapping[str, Encoding] | None = None, *,
                precision: str = "precise") -> Any:
    """Run every attention layer of a transformers Llama-family model on liepos; returns ``model``.

    Each attention module of a supported class (:data:`SUPPORTED_ATTENTION`: Llama, Mistral,
    Qwen2, Qwen3) gets a forward that computes the projections as upstream and applies
    ``encoding`` instead of ``apply_rotary_pos_emb``; positions are the model's ``position_ids``.

    * ``encoding=None``: :func:`from_hf` of the model's config (``precision`` passed on), so the
      patched model computes what the unpatched one does (same weights, ``"half"`` layout, the
      YaRN/LongRoPE temperature in ``logit_scale``).
    * Pure rotations with a fixed generator (RoPE and its static scalings) cache the *encoded*
      keys in HF's cache, exactly like upstream, and use the model's attention backend
      (``sdpa``, ``eager``, …) with ``scaling · logit_scale``.
    * Every other encoding (xPos, RetNet, decay, ALiBi's slots, Jordan blocks, and the
      length-dependent ``dynamic``/``longrope``) caches *raw* keys; their times are kept beside
      the cache, and :func:`liepos.attention` encodes them relative to each query block, with
      HF's mask (padding, sliding window) applied on top of the causal order of times. Decoding
      therefore equals the full forward, also when dynamic NTK or LongRoPE change the generator
      with the length (upstream keeps keys rotated under the old one: transformers #25104).

    ``encoding`` may be a dict ``{layer_type: Encoding}`` (what :func:`from_hf` returns for
    per-layer-type configs). Patching a patched model replaces its encoding;
    :func:`unpatch_model` restores the upstream forward.

    Limits: one position axis (no M-RoPE); on the raw-key path no attention dropout, no
    ``output_attentions``, and a cache that is reordered (beam search) or filled by the unpatched
    model is not supported (a cropped one is).
    """
    if encoding is None:
        encoding = from_hf(model.config, precision=precision)
    elif not isinstance(encoding, (Encoding, Mapping)):
        raise TypeError(
            f"encoding must be a liepos.Encoding, a dict of them by layer type, or None, got {type(encoding).__name__}"
        )
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    modules = _attention_modules(model)
    plan = []
    for m in modules:
        enc = _layer_encoding(encoding, m, config)
        _check_layer(enc, m, config)
        plan.append((m, enc))
    for m, enc in plan:  # validate everything before touching any layer
        m._liepos_encoding = enc
        m._liepos_encoded_cache = _stores_encoded_keys(enc)
        m.forward = _forward.__get__(m, type(m))
    return model


def unpatch_model(model: Any) -> Any:
    """Undo :func:`patch_model`: every attention layer runs its upstream forward again."""
    for m in model.modules():
        if "_liepos_encoding" in m.__dict__:
            for attr in ("forward", "_liepos_encoding", "_liepos_encoded_cache"):
                m.__dict__.pop(attr, None)
    return model
