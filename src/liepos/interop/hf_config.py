"""Hugging Face transformers configs → liepos encodings, read as that model means them.

:func:`from_hf` reads the position settings of a transformers config (a ``PretrainedConfig`` or
the plain dict of a ``config.json``) and returns the :class:`~liepos.Encoding` the model applies
to its queries and keys, in the layout the family stores::

    enc.query(q, positions) == q·cos + rotate_half(q)·sin      (cos, sin without attention_scaling)

with partial rotary as rotation planes followed by NoPE dims, and the rope's temperature in
``enc.logit_scale`` (``attention_factor²``, since the model multiplies cos and sin by it).
Every ``rope_type`` of ``transformers.modeling_rope_utils`` is a row of :data:`ROPE_TYPES`
(required keys, optional keys, builder); the formulas are :mod:`liepos.scaling`. What depends on
the family (its layout, whether its default rope reads ``partial_rotary_factor``, DeepSeek's
softmax multiplier, ALiBi) comes from :mod:`liepos.interop.families`. Transformers itself is
not imported.

Two precisions: ``"precise"`` (the default) evaluates every formula in float64;
``"compat"`` reproduces the float32 ``inv_freq`` that transformers computes on the CPU, bit for
bit (:mod:`liepos.interop._f32`), and stores those values.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos import scaling
from liepos._checks import check_real
from liepos.catalogue import alibi
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum
from liepos.interop import _f32
from liepos.interop.families import Family, family_of

__all__ = ["from_hf", "read_hf", "HFRope", "ROPE_TYPES", "RopeType", "PRECISIONS", "times_logit"]

PRECISIONS = ("precise", "compat")
_COMMON = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
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
    if rope and all(isinstance(v, Mapping) or v is None for v in rope.values()) and not (set(rope) & _ALL_KEYS):
        nested_keys = list(rope)  # per layer type, also for a type no layer of this config has
    elif labels:
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


def times_logit(enc: Encoding, m: float) -> Encoding:
    """``enc`` with its logit scale multiplied by ``m`` (scores ``m · qᵀA(t − s)k``), also at every length of
    a length-dependent encoding (through :func:`liepos.scaling.map_spectrum`, so the result pickles)."""
    return scaling.map_spectrum(enc, functools.partial(_logit_times, m=m))


def _logit_times(e: Encoding, length: int | None, m: float) -> Encoding:
    """``e`` with its logit scale multiplied by ``m`` (module level, so scaled encodings pickle)."""
    return e.replace(logit_scale=e.logit_scale * m)


@dataclass
class _Ctx:
    """What a rope type's builder reads: the parameters and the derived sizes of one layer type."""

    kind: str
    params: dict[str, Any]
    where: str
    base: Any
    p: Any
    head_dim: int
    dim: int  # rotated dims
    compat: bool
    nested: bool
    max_pos: Any
    enc: Encoding = field(repr=False)  # plain RoPE at ``base`` over ``dim`` dims, then NoPE dims

    @property
    def factor(self) -> Any:
        return self.params.get("factor")

    @property
    def L0(self) -> Any:
        return self.params.get("original_max_position_embeddings")

    def need_max_pos(self, why: str) -> Any:
        if self.max_pos is None:
            raise ValueError(
                f"max_position_embeddings is missing from the config; rope_type {self.kind!r} needs it {why}"
            )
        return self.max_pos

    def store(self, e: Encoding, w32: torch.Tensor) -> Encoding:
        """``e`` with transformers' float32 frequencies in place of the float64 ones."""
        return scaling.with_freqs(e, w32.to(torch.float64), 1.0, "compat")


def _default(c: _Ctx) -> Encoding:
    return c.store(c.enc, _f32.default(c.base, c.dim)) if c.compat else c.enc


def _linear(c: _Ctx) -> Encoding:
    enc = scaling.linear(c.enc, factor=c.factor)
    return c.store(enc, _f32.default(c.base, c.dim) / c.factor) if c.compat else enc


def _dynamic(c: _Ctx) -> Encoding:
    L0 = c.need_max_pos("as the original length of dynamic NTK")
    check_real("factor", c.factor, positive=True)
    if not c.compat:
        return scaling.dynamic(c.enc, factor=c.factor, original_max_position_embeddings=L0, rotary_dim=c.dim)
    init = c.store(c.enc, _f32.dynamic(c.base, c.dim, c.factor, L0, None))

    def rule(length: int) -> Encoding:
        if length <= L0:
            return init.replace(length_rule=rule)
        return c.store(init, _f32.dynamic(c.base, c.dim, c.factor, L0, length)).replace(length_rule=rule)

    return init.replace(length_rule=rule)


def _yarn(c: _Ctx) -> Encoding:
    params, L0 = c.params, c.L0
    factor = c.factor if c.factor is not None else c.need_max_pos("to derive factor") / L0
    truncate = params.get("truncate", True)
    if c.nested and truncate is not True:
        # transformers reads config.rope_parameters.get("truncate", True): for per-layer-type
        # parameters that is the outer dict, so a layer's truncate is never seen
        warnings.warn(
            f"truncate={truncate!r}{c.where} is ignored by transformers for per-layer-type rope "
            "parameters; using truncate=True as the model does",
            stacklevel=4,
        )
        truncate = True
    yp = dict(
        factor=factor, original_max_position_embeddings=L0,
        beta_fast=params.get("beta_fast") or 32, beta_slow=params.get("beta_slow") or 1,
        mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"), truncate=bool(truncate),
    )
    enc = scaling.yarn(c.enc, base=float(c.base), rotary_dim=c.dim, **yp)
    if not c.compat:
        return enc
    low, high = scaling.yarn_correction_range(
        rotary_dim=c.dim, base=c.base, original_max_position_embeddings=L0,
        beta_fast=yp["beta_fast"], beta_slow=yp["beta_slow"], truncate=yp["truncate"],
    )
    return c.store(enc, _f32.yarn(c.base, c.dim, factor, low, high))


def _longrope(c: _Ctx) -> Encoding:
    params, L0 = c.params, c.L0
    for key in ("short_factor", "long_factor"):
        # transformers multiplies a tensor of the list into inv_freq: one entry broadcasts to every plane
        if len(params[key]) == 1:
            params[key] = list(params[key]) * (c.dim // 2)
    factor = c.factor if c.factor is not None else c.need_max_pos("to derive factor") / L0
    enc = scaling.longrope(
        c.enc, short_factor=params["short_factor"], long_factor=params["long_factor"],
        original_max_position_embeddings=L0, factor=factor, attention_factor=params.get("attention_factor"),
    )
    if list(params["short_factor"]) == list(params["long_factor"]):
        # one factor list: the switch at L0 changes nothing, so the rotation is fixed (what to_hf writes)
        enc = enc.at_length(int(L0)).replace(length_rule=None)  # int: at_length takes a token count
        return c.store(enc, _f32.longrope(c.base, c.dim, params["short_factor"])) if c.compat else enc
    if not c.compat:
        return enc
    short = c.store(enc, _f32.longrope(c.base, c.dim, params["short_factor"]))
    w_long = _f32.longrope(c.base, c.dim, params["long_factor"])

    def rule(length: int) -> Encoding:
        if length > L0:
            return c.store(short, w_long).replace(length_rule=rule)
        return short.replace(length_rule=rule)

    return short.replace(length_rule=rule)


def _llama3(c: _Ctx) -> Encoding:
    low, high = c.params["low_freq_factor"], c.params["high_freq_factor"]
    if low == high:
        return _llama3_step(c, low)
    enc = scaling.llama3(c.enc, factor=c.factor, original_max_position_embeddings=c.L0,
                         low_freq_factor=low, high_freq_factor=high)
    return c.store(enc, _f32.llama3(c.base, c.dim, c.factor, low, high, c.L0)) if c.compat else enc


def _llama3_step(c: _Ctx, band: Any) -> Encoding:
    """llama3 with ``low_freq_factor == high_freq_factor``: the smooth band is empty, as upstream computes it.

    Transformers accepts the config: wavelengths above ``L0 / band`` are divided by ``factor``,
    the others kept; only a wavelength exactly at the edge would divide 0 by 0 (NaN upstream).
    """
    w = scaling.rotation_freqs(c.enc)
    edge = c.L0 / band
    wavelen = 2 * math.pi / w
    if bool((wavelen == edge).any()):
        raise ValueError(
            f"llama3 rope{c.where} with low_freq_factor == high_freq_factor == {band!r} and a wavelength exactly "
            f"at L0/{band!r} = {edge!r}: transformers computes 0/0 (NaN) there; liepos refuses rather than guess"
        )
    stepped = torch.where(wavelen > edge, w / c.factor, w)
    if c.compat:
        w32 = _f32.default(c.base, c.dim)
        stepped = torch.where(2 * math.pi / w32 > edge, w32 / c.factor, w32)
    return scaling.with_freqs(c.enc, stepped, 1.0, "llama3")


def _proportional(c: _Ctx) -> Encoding:
    pf = 1.0 if c.factor is None else c.factor
    enc = scaling.proportional(c.enc, partial_rotary_factor=c.p, factor=pf)
    return c.store(enc, _f32.proportional(c.base, c.head_dim, c.p, pf)) if c.compat else enc


@dataclass(frozen=True)
class RopeType:
    """One ``rope_type`` of transformers: the keys its validator accepts and the builder of its encoding.

    ``original`` says the type reads ``original_max_position_embeddings`` (falling back on the
    config's top-level value, then ``max_position_embeddings``, as transformers does).
    """

    required: frozenset[str]
    optional: frozenset[str]
    build: Callable[[_Ctx], Encoding]
    original: bool = False


def _keys(*names: str) -> frozenset[str]:
    return frozenset(names)


# the same key sets as transformers' RotaryEmbeddingConfigMixin validators
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType(_keys(), _keys(), _default),
    "linear": RopeType(_keys("factor"), _keys(), _linear),
    "dynamic": RopeType(_keys("factor"), _keys(), _dynamic),
    "yarn": RopeType(
        _keys("factor", "original_max_position_embeddings"),
        _keys("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
        _yarn, original=True,
    ),
    "longrope": RopeType(
        _keys("short_factor", "long_factor", "original_max_position_embeddings"),
        _keys("attention_factor", "factor"), _longrope, original=True,
    ),
    "llama3": RopeType(
        _keys("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), _keys(),
        _llama3, original=True,
    ),
    "proportional": RopeType(_keys(), _keys("factor"), _proportional),
}
_ALL_KEYS = _COMMON.union(*(r.required | r.optional for r in ROPE_TYPES.values()))


# ---------------------------------------------------------------------- one layer type
def _rope_type(params: Mapping[str, Any], where: str) -> str:
    a, b = params.get("rope_type"), params.get("type")
    if a is not None and b is not None and a != b:
        raise ValueError(f"contradictory rope type{where}: type={b!r} but rope_type={a!r}")
    kind = a if a is not None else (b if b is not None else "default")
    if kind not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {kind!r}{where}; known: {list(ROPE_TYPES)}")
    return kind


def _check_keys(params: Mapping[str, Any], kind: str, where: str, ignore: frozenset[str]) -> None:
    row = ROPE_TYPES[kind]
    unknown = sorted(set(params) - _COMMON - row.required - row.optional - ignore)
    if unknown:
        raise ValueError(
            f"unknown or unused rope parameters {unknown}{where} for rope_type {kind!r} "
            f"(it reads {sorted(row.required | row.optional | {'rope_theta', 'partial_rotary_factor'})}); "
            "transformers only warns about an unused key, liepos refuses so that nothing is silently "
            "dropped: pass ignore_keys= to drop them knowingly"
        )
    missing = sorted(k for k in row.required if k not in params)
    if missing:
        raise ValueError(f"rope_type {kind!r}{where} is missing required parameters {missing}")


def _rotary_fraction(params: Mapping[str, Any], kind: str, family: Family | None, model_type: Any) -> Any:
    """``partial_rotary_factor`` as the family's rope reads it (1.0 where its default rope ignores it)."""
    p = params.get("partial_rotary_factor", 1.0)
    p = 1.0 if p is None else p
    check_real("partial_rotary_factor", p)
    if not 0 < p <= 1:
        raise ValueError(f"partial_rotary_factor must lie in (0, 1], got {p!r}")
    if kind != "default" or p == 1 or model_type is None:
        return p
    if family is None:
        raise ValueError(
            f"partial_rotary_factor={p} with the default rope of model_type {model_type!r}: some families' "
            "default rope reads it (Phi, GPT-NeoX), others ignore it (Llama, Qwen2), and liepos does not know "
            f"{model_type!r}; pass head_dim= (the rotated dims) to say which"
        )
    return p if family.default_partial else 1.0


def _one(params: dict[str, Any], *, src: _Source, layer_type: str | None, nested: bool, head_dim: int,
         precision: str, ignore_keys: frozenset[str], family: Family | None) -> tuple[Encoding, int]:
    """The encoding of one layer type (rope temperature in ``logit_scale``) and its rotated dims."""
    where = "" if layer_type is None else f" for layer type {layer_type!r}"
    kind = _rope_type(params, where)
    _merge_top(params, "rope_theta", src.get("rope_theta"), src.is_dict, nested, where)
    _merge_top(params, "partial_rotary_factor", src.get("partial_rotary_factor"), src.is_dict, nested, where)
    if ROPE_TYPES[kind].original:
        top = src.get("original_max_position_embeddings")
        _merge_top(params, "original_max_position_embeddings", top, src.is_dict, nested, where)
        if params.get("original_max_position_embeddings") is None and src.get("max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = src.get("max_position_embeddings")
    _check_keys(params, kind, where, ignore_keys)
    base = params.get("rope_theta", _DEFAULT_THETA)
    check_real("rope_theta", base, positive=True)
    if base == 1:
        raise ValueError("rope_theta must differ from 1")
    p = _rotary_fraction(params, kind, family, src.get("model_type"))
    # the rotary dim: the generic partial rotary, except proportional, which covers the full head
    dim = head_dim if kind == "proportional" else int(head_dim * p)
    if dim < 2:
        raise ValueError(
            f"head_dim={head_dim} with partial_rotary_factor={p} leaves {dim} rotary dims: nothing rotates"
        )
    name = f"hf:{kind}" + ("" if layer_type is None else f"[{layer_type}]")
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    ctx = _Ctx(kind, params, where, base, p, head_dim, dim, precision == "compat", nested,
               src.get("max_position_embeddings"), _half(1.0 / (float(base) ** exps), head_dim, name))
    enc = ROPE_TYPES[kind].build(ctx).replace(name=name)
    rotated = dim if kind != "proportional" else 2 * int(p * head_dim // 2)
    return enc, rotated


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




# ---------------------------------------------------------------------- ALiBi and absolute positions
def _f32_bloom_slopes(num_heads: int) -> torch.Tensor:
    """Bloom's (and Falcon's) ``_get_alibi_slopes``, in float32 as upstream."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n = min(closest, num_heads - closest)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * n, 2, dtype=torch.int32))])
    return slopes


def _f32_mpt_slopes(num_heads: int, bias_max: Any) -> torch.Tensor:
    """MPT's ``build_mpt_alibi_tensor`` slopes (another order than Bloom's for other head counts)."""
    n2 = 2 ** math.ceil(math.log2(num_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n2 + 1, dtype=torch.int64).float() * (bias_max / n2))
    if n2 != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def _alibi(src: _Source, family: Family) -> Encoding:
    """Bloom, MPT, Falcon(alibi=True): ``qᵀk/√d − m_h (t − s)`` with the model's own slopes.

    Bloom and MPT add ``m_h·s`` after the ``1/√d`` scaling; Falcon adds it before, so its
    slopes in that identity are ``m_h/√d``.
    """
    if family.model_type == "mpt":
        attn = src.get("attn_config") or {}
        bias_max = attn.get("alibi_bias_max", 8) if isinstance(attn, Mapping) else getattr(attn, "alibi_bias_max", 8)
        heads, hidden = src.get("n_heads"), src.get("d_model")
        slopes = _f32_mpt_slopes(int(heads), bias_max)
    else:
        heads = src.get("num_attention_heads") or src.get("n_head")
        hidden = src.get("hidden_size") or src.get("n_embed")
        slopes = _f32_bloom_slopes(int(heads)) if heads is not None else None
    if heads is None or hidden is None:
        raise ValueError(f"the {family.model_type} config has no head count or hidden size to read its ALiBi from")
    head_dim = int(hidden) // int(heads)
    slopes = slopes.to(torch.float64)
    if family.model_type == "falcon":
        # Falcon adds its alibi tensor before the 1/√d softmax scaling (eager) or as alibi/√d (sdpa)
        slopes = slopes / math.sqrt(head_dim)
    enc = alibi(head_dim, num_heads=int(heads), slopes=slopes)
    return enc.replace(name=f"hf:alibi[{family.model_type}]")


def _position_kind(src: _Source, family: Family | None) -> str:
    if family is not None and family.model_type == "falcon":
        return "alibi" if src.get("alibi", False) else "rope"
    if family is not None and family.model_type == "mpt":
        attn = src.get("attn_config") or {}
        on = attn.get("alibi", True) if isinstance(attn, Mapping) else getattr(attn, "alibi", True)
        if not on:
            raise ValueError("an MPT config with attn_config.alibi=False has no position encoding liepos can read")
    return "rope" if family is None else family.positions


# ---------------------------------------------------------------------- the whole config
@dataclass(frozen=True)
class HFRope:
    """Everything :func:`read_hf` reads from a config about one layer type.

    * ``encoding``: the rotation (planes then NoPE dims) in the family's layout; its
      ``logit_scale`` is the rope's ``attention_factor²`` when the whole head rotates, else 1;
    * ``rotary_dim``: the rotated dims (the first ones of the head);
    * ``rotary_scale``: ``attention_factor²``, the factor transformers applies to the rotated
      dims' part of qᵀk only (it multiplies cos and sin);
    * ``softmax_multiplier``: a model-level factor on the softmax scale (DeepSeek's
      ``m(s, mscale_all_dim)²``), 1 for other families; never part of the rope's factor;
    * ``rope_type``: the config's rope type (``"dynamic"`` and ``"longrope"`` tell a patched
      model how transformers picks the length of each forward), None for ALiBi and NoPE.
    """

    encoding: Encoding
    rotary_dim: int
    rotary_scale: float
    softmax_multiplier: float
    family: Family | None
    rope_type: str | None = None

    @property
    def exact_encoding(self) -> bool:
        """Whether one ``logit_scale`` states the temperature exactly (it covers the whole head)."""
        return self.rotary_scale == 1.0 or self.rotary_dim == self.encoding.content_dim


def _softmax_multiplier(params: Mapping[str, Any] | None, family: Family | None) -> float:
    if family is None or not family.softmax_mscale or not params:
        return 1.0
    kind = params.get("rope_type", params.get("type"))
    mall = params.get("mscale_all_dim")
    if kind != "yarn" or not mall:
        return 1.0
    m = scaling.yarn_mscale(params["factor"], mall)
    return m * m


def _layout(enc: Encoding, src: _Source, family: Family | None) -> Encoding:
    """The family's layout; a config of no known family says it with ``rope_interleave`` (what to_hf writes)."""
    layout = "rope_interleave" if family is None else family.layout
    if family is not None and family.direction < 0:  # the rotation runs the other way: ω ↦ −ω
        enc = scaling.map_spectrum(enc, _reversed)
    if layout == "half" or (layout == "rope_interleave" and not src.get("rope_interleave", False)):
        return enc
    return enc.replace(layout="interleaved")


def _reversed(e: Encoding, length: int | None) -> Encoding:
    """``e`` turning the other way: every frequency negated (module level, so encodings pickle)."""
    return e.replace(generator=e.generator.with_params(freqs=-e.generator.freqs))


def _mrope(params: Mapping[str, Any], src: _Source, head_dim: int, where: str) -> Encoding:
    """M-RoPE (Qwen2-VL, Qwen2.5-VL): planes in ``mrope_section`` sections, one position axis each."""
    from liepos.catalogue import mrope

    kind = _rope_type(params, where)
    if kind != "default":
        raise ValueError(f"mrope_section with rope_type {kind!r}{where}: transformers' M-RoPE scales no frequency")
    base = params.get("rope_theta", src.get("rope_theta", _DEFAULT_THETA))
    enc = mrope(head_dim, [int(s) for s in params["mrope_section"]], float(base))
    return enc.replace(name="hf:mrope")


def _checked_family(src: _Source, family: Family | None, ignore: frozenset[str]) -> tuple[str, Family | None]:
    """The kind of positions and the family row of a config: the table's, or one verified against the
    modeling code (:mod:`liepos.interop.hf_verify`) for a ``model_type`` the table lacks."""
    model_type = src.get("model_type")
    kind = _position_kind(src, family)
    if kind == "absolute":
        raise ValueError(
            f"{model_type!r} models use learned absolute position embeddings (added to the input), which are "
            "not a relative encoding A(t − s): liepos has no encoding for them"
            + (f"; {family.why}" if family is not None and family.why else "")
        )
    if kind == "refused":
        raise ValueError(f"model_type {model_type!r}: {family.why}")
    if model_type is not None and family is None and not any(
        src.get(k) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta")
    ):
        raise ValueError(
            f"model_type {model_type!r} carries no rope parameters and liepos does not know the family: it may "
            "use absolute positions or its own scheme; liepos refuses rather than assume RoPE"
        )
    if family is None and model_type is not None:
        from liepos.interop.hf_verify import verified_family

        family = verified_family(src.obj, str(model_type), ignore_axes="mrope_section" in ignore)  # or refuses
    return kind, family


def read_hf(config: Any, *, layer_type: str | None = None, precision: str = "precise", head_dim: int | None = None,
            ignore_keys: Iterable[str] = (), family: Family | None = None) -> HFRope | dict[str, HFRope]:
    """Every position fact of a transformers config, per layer type: see :class:`HFRope`.

    :func:`from_hf` is this, reduced to an :class:`~liepos.Encoding`. Arguments as there; ``family``:
    the row to read the config with (default: the table's row of its ``model_type``, or one verified
    against the modeling code; :func:`~liepos.interop.patch_model` passes the row it verified with the model).

    >>> r = read_hf({"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4,
    ...              "partial_rotary_factor": 0.5, "max_position_embeddings": 128,
    ...              "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    ...                               "original_max_position_embeddings": 32}})
    >>> r.rotary_dim, math.isclose(r.rotary_scale, scaling.yarn_mscale(4.0) ** 2), r.exact_encoding
    (8, True, False)
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    ignore = frozenset((ignore_keys,) if isinstance(ignore_keys, str) else ignore_keys)
    src = _Source(config)
    kind, family = _checked_family(src, family_of(src.get("model_type")) if family is None else family, ignore)
    if kind == "alibi":
        enc = _alibi(src, family)
        return HFRope(enc, 0, 1.0, 1.0, family)
    out = _read_layers(src, layer_type, precision, head_dim, ignore, family)
    if family is not None and family.verified:
        from liepos.interop.hf_verify import prove

        prove(src.obj, family.model_type, out, layer_type)  # the reading equals upstream's rope, or a ValueError
    return out


def _read_layers(src: _Source, layer_type: str | None, precision: str, head_dim: int | None,
                 ignore: frozenset[str], family: Family | None) -> HFRope | dict[str, HFRope]:
    dicts, nested = _rope_dicts(src)

    def read(lt: str | None, params: dict[str, Any] | None) -> HFRope:
        hd = _head_dim(src, lt, head_dim)
        if params is None:
            return HFRope(_nope(hd, "hf:nope" + ("" if lt is None else f"[{lt}]")), 0, 1.0, 1.0, family)
        where = "" if lt is None else f" for layer type {lt!r}"
        if "mrope_section" in params and "mrope_section" not in ignore:
            if family is not None and family.verified:
                raise ValueError(
                    f"model_type {family.model_type!r} is not in liepos' table and has M-RoPE sections{where}: "
                    "the sections are wired by its model, not its rope, so liepos cannot verify them; pass "
                    "ignore_keys={'mrope_section'} for its 1-D text positions"
                )
            return HFRope(_mrope(params, src, hd, where), hd, 1.0, 1.0, family)
        enc, rotated = _one(dict(params), src=src, layer_type=lt, nested=nested, head_dim=hd,
                            precision=precision, ignore_keys=ignore, family=family)
        temperature = enc.logit_scale
        if rotated < hd and temperature != 1.0:
            enc = times_logit(enc, 1.0 / temperature)  # the factor belongs to the rotated dims only
        return HFRope(_layout(enc, src, family), rotated, temperature, _softmax_multiplier(params, family), family,
                      _rope_type(params, where))

    if not nested:
        if layer_type is not None:
            labels = _labels(src)
            if labels and layer_type not in labels:
                raise ValueError(f"layer_type {layer_type!r} is not one of the config's layer types {sorted(set(labels))}")
        return read(layer_type, dicts[None])
    if layer_type is not None:
        if layer_type not in dicts:
            raise ValueError(f"layer_type {layer_type!r} has no rope parameters; the config has {sorted(dicts)}")
        return read(layer_type, dicts[layer_type])
    return {lt: read(lt, params) for lt, params in dicts.items()}


def _as_encoding(r: HFRope, softmax_mscale: bool | None) -> Encoding:
    enc = r.encoding
    if not r.exact_encoding:
        # transformers multiplies only the rotated dims (the first ones of the head) by
        # attention_factor² (it scales cos and sin): a per-dim temperature on the query, D = diag(query_scale)
        D = torch.ones(enc.content_dim, dtype=torch.float64)
        D[: r.rotary_dim] = r.rotary_scale
        enc = enc.replace(query_scale=D)
    use = (r.family is not None and r.family.softmax_mscale) if softmax_mscale is None else bool(softmax_mscale)
    if use and r.softmax_multiplier != 1.0:
        enc = times_logit(enc, r.softmax_multiplier)
    return enc


def from_hf(
    config: Any,
    *,
    layer_type: str | None = None,
    precision: str = "precise",
    head_dim: int | None = None,
    ignore_keys: Iterable[str] = (),
    softmax_mscale: bool | None = None,
) -> Encoding | dict[str, Encoding]:
    """The encoding a Hugging Face transformers model applies, from its config, as that model means it.

    Args:
        config: a transformers ``PretrainedConfig`` (multimodal configs use their text config)
            or a ``config.json`` dict. Both shapes are read: transformers ≥ 5 ``rope_parameters``
            and the older ``rope_scaling`` + ``rope_theta`` (+ ``partial_rotary_factor``,
            ``original_max_position_embeddings``, and Gemma-3's ``rope_local_base_freq``); ``type``
            is an alias of ``rope_type``. The ``model_type`` selects the family's facts
            (:mod:`liepos.interop.families`): layout (Cohere, GLM, Llama 4 and DeepSeek-V3 with
            ``rope_interleave`` pair dims (2k, 2k+1)), whether the default rope reads
            ``partial_rotary_factor`` (Llama and Qwen2 ignore it, Phi and GPT-NeoX read it),
            DeepSeek's softmax multiplier; Bloom, MPT and Falcon(``alibi=True``) are ALiBi with
            their own slopes; GPT-2 and OPT are refused by name. A ``model_type`` outside the table
            is probed in its transformers modeling code and the reading proven against it
            (:mod:`liepos.interop.hf_verify`), or refused with the reason: never read with
            another family's conventions. A config without a ``model_type`` is liepos' own
            (what :func:`~liepos.interop.to_hf` writes).
        layer_type: for per-layer-type parameters (Gemma 3/4, ModernBERT, …) the layer type to
            return; without it such a config gives a dict ``{layer_type: Encoding}``. A layer
            type whose parameters are ``None`` is NoPE.
        precision: ``"precise"`` (float64 formulas) or ``"compat"`` (transformers' float32
            ``inv_freq``, bit for bit).
        head_dim: override the head dim (default ``qk_rope_head_dim`` for MLA models, else
            ``head_dim``, else ``hidden_size // num_attention_heads``; per layer type for
            heterogeneous configs such as Gemma 4).
        ignore_keys: rope parameters to drop knowingly (e.g. ``{"mrope_section"}`` for the 1-D
            text positions of an M-RoPE model). Any other key the rope type does not read is an error.
        softmax_mscale: fold a model-level softmax multiplier into ``logit_scale``: DeepSeek and
            the other MLA models multiply their softmax scale by ``m(factor, mscale_all_dim)²``
            (:func:`liepos.scaling.yarn_mscale`). ``None`` (default): when the family's attention
            does (an MLA ``model_type``); other families with ``mscale_all_dim`` only change the
            rope's ``attention_factor``, as transformers does.

    Returns:
        An :class:`~liepos.Encoding` over the full head dim: the rotation planes (``inv_freq``)
        then ``head_dim − rotary_dim`` NoPE dims, with ``logit_scale = attention_factor²``
        (times the MLA softmax multiplier) when the whole head rotates, and a ``length_rule`` for
        ``dynamic`` and ``longrope``. When only part of the head rotates and the rope has a
        temperature (Phi-3 longrope, GPT-NeoX + yarn), transformers multiplies only the rotated dims
        by ``attention_factor²``: the encoding carries it as ``query_scale`` on those dims (1 on the
        others), so its scores are ``qᵀ D A(t − s) k`` exactly as upstream's.

    Raises:
        ValueError: unknown ``rope_type``, unknown or unused keys, missing required keys,
            contradictory keys, absolute-position families, edge configs liepos refuses (each
            message says why).

    >>> enc = from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0})
    >>> import liepos as lp
    >>> q = torch.randn(1, 1, 3, 16, dtype=torch.float64)
    >>> bool(torch.allclose(enc.query(q, [0, 1, 2]), lp.rope(16).replace(layout="half").query(q, [0, 1, 2])))
    True
    """
    read = read_hf(config, layer_type=layer_type, precision=precision, head_dim=head_dim, ignore_keys=ignore_keys)
    if isinstance(read, HFRope):
        return _as_encoding(read, softmax_mscale)
    return {lt: _as_encoding(r, softmax_mscale) for lt, r in read.items()}
