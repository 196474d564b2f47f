"""Hugging Face transformers configs → liepos encodings, read as that model means them.

:func:`from_hf` reads the position settings of a transformers config (a ``PretrainedConfig`` or
the plain dict of a ``config.json``) and returns the :class:`~liepos.Encoding` the model applies
to its queries and keys, in the layout the family stores::

    enc.query(q, positions) == q·cos + rotate_half(q)·sin      (cos, sin without attention_scaling)

with partial rotary as rotation planes followed by NoPE dims (NoPE dims first where the family's heads
are ``[nope | rope]``: DeepSeek-V4), and the rope's temperature in
``enc.logit_scale`` (``attention_factor²``, since the model multiplies cos and sin by it).
Every ``rope_type`` of ``transformers.modeling_rope_utils`` is a row of :data:`ROPE_TYPES`
(required keys, optional keys, builder: :mod:`liepos.interop.rope_types`); the formulas are
:mod:`liepos.scaling`. What depends on
the family (its layout, whether its default rope reads ``partial_rotary_factor``, DeepSeek's
softmax multiplier, ALiBi) comes from :mod:`liepos.interop.families`. Transformers itself is
not imported.

Two precisions: ``"precise"`` (the default) evaluates every formula in float64;
``"compat"`` reproduces the float32 ``inv_freq`` that transformers computes on the CPU, bit for
bit (:mod:`liepos.interop._f32`), and stores those values.

This module reads one layer type and the whole config; the reading of a config object or dict is
:mod:`liepos.interop.config_source`, ALiBi and absolute positions :mod:`liepos.interop.config_alibi`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from liepos import scaling
from liepos._checks import check_real
from liepos.encoding import Encoding
from liepos.generator import Generator
from liepos.interop.config_alibi import config_alibi, position_kind
from liepos.interop.config_source import ConfigSource, config_object, merge_top, rope_dicts, source_labels
from liepos.interop.families import Family, family_of
from liepos.interop.rope_types import (COMMON_KEYS, ROPE_TYPES, RopeContext, RopeType, half_rope, nope_encoding,
                                       times_logit)

__all__ = ["from_hf", "read_hf", "HFRope", "ROPE_TYPES", "RopeType", "PRECISIONS", "times_logit", "spread_axes"]

PRECISIONS = ("precise", "compat")
_DEFAULT_THETA = 10000.0


# ---------------------------------------------------------------------- one layer type
def _rope_type(params: Mapping[str, Any], where: str) -> str:
    a, b = params.get("rope_type"), params.get("type")
    # the legacy type "mrope" (Qwen2-VL's config.json) is rope_type "default", as transformers' Qwen2-VL configs
    # rewrite it (keeping type="mrope" beside it): the M-RoPE itself is the mrope_section
    a, b = ("default" if x == "mrope" else x for x in (a, b))
    if a is not None and b is not None and a != b:
        raise ValueError(f"contradictory rope type{where}: type={b!r} but rope_type={a!r}")
    kind = a if a is not None else (b if b is not None else "default")
    if kind not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {kind!r}{where}; known: {list(ROPE_TYPES)}")
    return kind


def _check_keys(params: Mapping[str, Any], kind: str, where: str, ignore: frozenset[str]) -> None:
    row = ROPE_TYPES[kind]
    unknown = sorted(set(params) - COMMON_KEYS - row.required - row.optional - ignore)
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


def _mla_fraction(src: ConfigSource, layer_type: str | None, head_dim: int, p: Any) -> Any:
    """An MLA config's partial rotary factor: Mistral 4 spells its decoupled slice as ``head_dim ·
    partial_rotary_factor == qk_rope_head_dim`` (its rotary module reads ``head_dim``), so the slice rotates whole."""
    view = src.layer_view(layer_type)
    rope = src.get("qk_rope_head_dim", obj=view)
    if p == 1 or not rope or head_dim != rope:
        return p
    full = src.get("head_dim", obj=view)
    if full and int(full * p) == rope:
        return 1.0
    raise ValueError(f"partial_rotary_factor={p} with qk_rope_head_dim={rope} and head_dim={full}: the rope's "
                     "rotated dims are neither the decoupled slice nor a part of it liepos knows")


def _one(params: dict[str, Any], *, src: ConfigSource, layer_type: str | None, nested: bool, head_dim: int,
         precision: str, ignore_keys: frozenset[str], family: Family | None) -> tuple[Encoding, int]:
    """The encoding of one layer type (rope temperature in ``logit_scale``) and its rotated dims."""
    where = "" if layer_type is None else f" for layer type {layer_type!r}"
    kind = _rope_type(params, where)
    merge_top(params, "rope_theta", src.get("rope_theta"), src.is_dict, nested, where)
    merge_top(params, "partial_rotary_factor", src.get("partial_rotary_factor"), src.is_dict, nested, where)
    rotary_dim = src.get("rotary_dim")  # GPT-J and CodeGen count their rotated dims instead
    if params.get("partial_rotary_factor") is None and isinstance(rotary_dim, int) and family is not None \
            and family.default_partial and 0 < rotary_dim <= head_dim:
        params["partial_rotary_factor"] = rotary_dim / head_dim
    if ROPE_TYPES[kind].original:
        top = src.get("original_max_position_embeddings")
        merge_top(params, "original_max_position_embeddings", top, src.is_dict, nested, where)
        if params.get("original_max_position_embeddings") is None and src.get("max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = src.get("max_position_embeddings")
    _check_keys(params, kind, where, ignore_keys)
    base = params.get("rope_theta", _DEFAULT_THETA)
    check_real("rope_theta", base, positive=True)
    if base == 1:
        raise ValueError("rope_theta must differ from 1")
    p = _mla_fraction(src, layer_type, head_dim, _rotary_fraction(params, kind, family, src.get("model_type")))
    # the rotary dim: the generic partial rotary, except proportional, which covers the full head
    dim = head_dim if kind == "proportional" else int(head_dim * p)
    if dim < 2:
        raise ValueError(
            f"head_dim={head_dim} with partial_rotary_factor={p} leaves {dim} rotary dims: nothing rotates"
        )
    name = f"hf:{kind}" + ("" if layer_type is None else f"[{layer_type}]")
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    ctx = RopeContext(kind, params, where, base, p, head_dim, dim, precision == "compat", nested,
               src.get("max_position_embeddings"), half_rope(1.0 / (float(base) ** exps), head_dim, name))
    enc = ROPE_TYPES[kind].build(ctx).replace(name=name)
    rotated = dim if kind != "proportional" else 2 * int(p * head_dim // 2)
    return enc, rotated


def _dict_layer_head_dim(src: ConfigSource, layer_type: str, default: Any) -> Any:
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


def _head_dim(src: ConfigSource, layer_type: str | None, override: int | None, family: Family | None = None) -> int:
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 1:
            raise ValueError(f"head_dim must be a positive int, got {override!r}")
        return override
    view = src.layer_view(layer_type)
    # an MLA rope rotates the decoupled slice; a [nope | rope] head (rope_last) is passed to the rope whole
    rope_slice = None if family is not None and family.rope_last else src.get("qk_rope_head_dim", obj=view)
    hd = rope_slice or src.get("head_dim", obj=view)
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




# ---------------------------------------------------------------------- the whole config
@dataclass(frozen=True)
class HFRope:
    """Everything :func:`read_hf` reads from a config about one layer type.

    * ``encoding``: the rotation (planes then NoPE dims, or NoPE dims then planes with the family's
      ``rope_last``) in the family's layout; its
      ``logit_scale`` is the rope's ``attention_factor²`` when the whole head rotates, else 1;
    * ``rotary_dim``: the number of rotated dims (the first ones of the head; the last ones in a family
      with ``rope_last``: :attr:`rotated`);
    * ``rotary_scale``: ``attention_factor²``, the factor transformers applies to the rotated
      dims' part of qᵀk only (it multiplies cos and sin);
    * ``softmax_multiplier``: a model-level factor on the softmax scale (DeepSeek's
      ``m(s, mscale_all_dim)²``), 1 for other families; never part of the rope's factor;
    * ``rope_type``: the config's rope type (``"dynamic"`` and ``"longrope"`` tell a patched
      model how transformers picks the length of each forward), None for ALiBi and NoPE;
    * ``query_temperature``: ``("llama_4_scaling_beta", β, L0)``: the attention multiplies the rotated
      query by ``1 + β·log(1 + ⌊t / L0⌋)`` (Mistral 3/4's ``get_llama_4_attn_scale``), a factor of the
      query's time an :class:`~liepos.Encoding` does not carry: a patched model keeps upstream's, and
      :func:`from_hf` refuses it unless it is named in ``ignore_keys``.
    """

    encoding: Encoding
    rotary_dim: int
    rotary_scale: float
    softmax_multiplier: float
    family: Family | None
    rope_type: str | None = None
    query_temperature: tuple[str, float, int] | None = None

    @property
    def rotated(self) -> slice:
        """The rotated dims of the head: the first ``rotary_dim``, or the last with the family's ``rope_last``."""
        if self.family is not None and self.family.rope_last:
            return slice(self.encoding.content_dim - self.rotary_dim, self.encoding.content_dim)
        return slice(0, self.rotary_dim)

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


def _layout(enc: Encoding, src: ConfigSource, family: Family | None) -> Encoding:
    """The family's layout; a config of no known family says it with ``rope_interleave`` (what to_hf writes)."""
    layout = "rope_interleave" if family is None else family.layout
    if family is not None and family.direction < 0:  # the rotation runs the other way: ω ↦ −ω
        enc = scaling.map_spectrum(enc, _reversed)
    if layout == "half" or (layout == "rope_interleave" and not src.get("rope_interleave", False)):
        return enc
    return enc.replace(layout="interleaved")


def _planes_last(e: Encoding, length: int | None) -> Encoding:
    """``e`` with its real (NoPE) blocks before its rotation planes, each group in its order: in the
    interleaved layout the head reads ``[nope | (2k, 2k + 1) pairs]`` (module level, so encodings pickle)."""
    g = e.generator
    if g.basis is not None or g.num_axes is not None:
        raise ValueError(f"{e!r}: only a rope of one position axis in its canonical basis moves its planes last")
    order = [i for i, c in enumerate(g.complex) if not c] + [i for i, c in enumerate(g.complex) if c]
    idx = torch.tensor(order)
    moved = Generator(g.rates[..., idx], g.freqs[..., idx], [g.sizes[i] for i in order],
                      complex=[g.complex[i] for i in order], allow_growth=g.allow_growth)
    return e.replace(generator=moved)


def _reversed(e: Encoding, length: int | None) -> Encoding:
    """``e`` turning the other way: every frequency negated (module level, so encodings pickle)."""
    return e.replace(generator=e.generator.with_params(freqs=-e.generator.freqs))


def _mrope(params: Mapping[str, Any], src: ConfigSource, head_dim: int, where: str) -> Encoding:
    """M-RoPE (Qwen2-VL, Qwen2.5-VL): planes in ``mrope_section`` sections, one position axis each."""
    from liepos.catalogue import mrope

    kind = _rope_type(params, where)
    if kind != "default":
        raise ValueError(f"mrope_section with rope_type {kind!r}{where}: transformers' M-RoPE scales no frequency")
    base = params.get("rope_theta", src.get("rope_theta", _DEFAULT_THETA))
    enc = mrope(head_dim, [int(s) for s in params["mrope_section"]], float(base))
    return enc.replace(name="hf:mrope")


# Mistral 3/4's position-dependent query temperature in the rope parameters (applied by the attention)
_L4_BETA = "llama_4_scaling_beta"


def _l4_length(params: Mapping[str, Any], src: ConfigSource) -> int:
    length = params.get("original_max_position_embeddings") or src.get("max_position_embeddings")
    if not length:
        raise ValueError(f"{_L4_BETA} needs original_max_position_embeddings, the length its temperature steps at")
    return int(length)


def _not_rope_keys(src: ConfigSource) -> frozenset[str]:
    """The rope-parameter keys the config's class says transformers' rope validation does not read."""
    return frozenset(getattr(src.obj, "ignore_keys_at_rope_validation", None) or ())


# the M-RoPE keys of a rope dict: read by a verified family's probed axes, not by its 1-D rope
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def spread_axes(enc: Encoding, owners: Sequence[int], axes: int, sections: Any = None) -> Encoding:
    """``enc``'s rotation planes on ``axes`` position axes: plane k turns with axis ``owners[k]`` (M-RoPE).

    Named after the pattern ``owners`` follow for the config's ``sections``: ``hf:mrope`` (consecutive
    sections, section i on axis i mod 3: :func:`liepos.catalogue.mrope`), ``hf:mrope_interleaved``
    (:func:`liepos.catalogue.mrope_interleaved`), else ``hf:mrope[probed]``.
    """
    g = enc.generator
    if enc.length_rule is not None or g.num_axes is not None or g.freqs.dim() != 1 or max(g.sizes) > 1 \
            or bool((g.rates != 0).any()):
        raise ValueError(f"M-RoPE axes spread over fixed rotation planes only, got {enc!r}")
    complex_ = [bool(c) for c in g.complex]
    if sum(complex_) != len(owners):
        raise ValueError(f"the rotary module's {len(owners)} planes are not the {sum(complex_)} rotation planes of {enc!r}")
    freqs = torch.zeros(axes, len(complex_), dtype=g.freqs.dtype)
    plane = iter(owners)
    for b, c in enumerate(complex_):
        if c:
            freqs[next(plane), b] = g.freqs[b]
    spread = Generator(torch.zeros_like(freqs), freqs, g.sizes, complex=complex_, axes=axes)
    return enc.replace(generator=spread, name=f"hf:{_axes_pattern(list(owners), sections)}")


def _axes_pattern(owners: list[int], sections: Any) -> str:
    if not isinstance(sections, list | tuple) or len(sections) != 3 or sum(sections) != len(owners):
        return "mrope[probed]"
    consecutive = [i % 3 for i, n in enumerate(sections) for _ in range(int(n))]
    interleaved = [0] * len(owners)
    for axis in (1, 2):
        for k in range(axis, min(3 * int(sections[axis]), len(owners)), 3):
            interleaved[k] = axis
    return "mrope" if owners == consecutive else "mrope_interleaved" if owners == interleaved else "mrope[probed]"


def _checked_family(src: ConfigSource, family: Family | None, ignore: frozenset[str]) -> tuple[str, Family | None]:
    """The kind of positions and the family row of a config: the table's, or one verified against the
    modeling code (:mod:`liepos.interop.hf_verify`) for a ``model_type`` the table lacks."""
    model_type = src.get("model_type")
    kind = position_kind(src, family)
    if kind == "absolute":
        raise ValueError(
            f"{model_type!r} models use learned absolute position embeddings (added to the input), which are "
            "not a relative encoding A(t − s): liepos has no encoding for them"
            + (f"; {family.why}" if family is not None and family.why else "")
        )
    if kind == "refused":
        raise ValueError(f"model_type {model_type!r}: {family.why if family is not None else 'refused'}")
    if model_type is not None and family is None and not any(
        src.get(k) is not None for k in ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim")
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

    >>> import math
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
    src = ConfigSource(config)
    row = family_of(src.get("model_type")) if family is None else family
    if row is not None and row.derived_rope and isinstance(config, Mapping):
        src = ConfigSource(_through_class(config, row))
    kind, family = _checked_family(src, row, ignore)
    if kind == "alibi":
        if family is None:  # only a family row says a model uses ALiBi
            raise ValueError("a config read as ALiBi needs its family row (liepos.interop.families)")
        enc = config_alibi(src, family)
        return HFRope(enc, 0, 1.0, 1.0, family)
    out = _read_layers(src, layer_type, precision, head_dim, ignore, family)
    if family is not None and family.verified:
        from liepos.interop.hf_verify import prove

        prove(src.obj, family.model_type, out, layer_type)  # the reading equals upstream's rope, or a ValueError
    return out


def _through_class(config: Mapping[str, Any], family: Family) -> Any:
    """A ``config.json`` dict of a ``derived_rope`` family built into its transformers config class."""
    try:
        return config_object(config, family.model_type)
    except ValueError as err:
        raise ValueError(f"model_type {family.model_type!r}: its config class derives the rope parameters from the "
                         f"config.json's keys at construction, so liepos reads the dict through that class, and "
                         f"{err}: install transformers or pass the config object") from None


def _read_layers(src: ConfigSource, layer_type: str | None, precision: str, head_dim: int | None,
                 ignore: frozenset[str], family: Family | None) -> HFRope | dict[str, HFRope]:
    dicts, nested = rope_dicts(src)

    def read(lt: str | None, params: dict[str, Any] | None, axes: bool = True) -> HFRope:
        hd = _head_dim(src, lt, head_dim, family)
        if params is None:
            return HFRope(nope_encoding(hd, "hf:nope" + ("" if lt is None else f"[{lt}]")), 0, 1.0, 1.0, family)
        where = "" if lt is None else f" for layer type {lt!r}"
        if _L4_BETA in params and _L4_BETA not in ignore:  # the attention's query temperature, not the rope's
            beta = params[_L4_BETA]
            rest = {k: v for k, v in params.items() if k != _L4_BETA}
            return dataclasses.replace(read(lt, rest, axes), query_temperature=(_L4_BETA, beta, _l4_length(rest, src)))
        if "max_position_embeddings" in params and "max_position_embeddings" in _not_rope_keys(src):
            # a copy transformers' rope does not read (it reads the config's own max_position_embeddings)
            params = {k: v for k, v in params.items() if k != "max_position_embeddings"}
        if axes and family is not None and family.verified and family.axis_of:  # M-RoPE, its axes probed
            one = read(lt, {k: v for k, v in params.items() if k not in _MROPE_KEYS}, axes=False)
            spread = spread_axes(one.encoding, family.axis_of, family.axes, params.get("mrope_section"))
            return dataclasses.replace(one, encoding=spread)
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
        if family is not None and family.rope_last and rotated < hd:
            enc = scaling.map_spectrum(enc, _planes_last)  # [nope | rope]: the NoPE dims first
        return HFRope(_layout(enc, src, family), rotated, temperature, _softmax_multiplier(params, family), family,
                      _rope_type(params, where))

    if not nested:
        if layer_type is not None:
            labels = source_labels(src)
            if labels and layer_type not in labels:
                raise ValueError(f"layer_type {layer_type!r} is not one of the config's layer types {sorted(set(labels))}")
        return read(layer_type, dicts[None])
    if layer_type is not None:
        if layer_type not in dicts:
            raise ValueError(f"layer_type {layer_type!r} has no rope parameters; the config has "
                             f"{sorted(k for k in dicts if k is not None)}")
        return read(layer_type, dicts[layer_type])
    return {lt: read(lt, params) for lt, params in dicts.items() if lt is not None}  # nested: every key a name


def _as_encoding(r: HFRope, softmax_mscale: bool | None) -> Encoding:
    enc = r.encoding
    if not r.exact_encoding:
        # transformers multiplies only the rotated dims (the first ones of the head) by
        # attention_factor² (it scales cos and sin): a per-dim temperature on the query, D = diag(query_scale)
        D = torch.ones(enc.content_dim, dtype=torch.float64)
        D[r.rotated] = r.rotary_scale
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
    for r in [read] if isinstance(read, HFRope) else list(read.values()):
        if r.query_temperature is not None:
            key, beta, length = r.query_temperature
            raise ValueError(
                f"the config's {key}={beta!r} is a query temperature 1 + {beta!r}·log(1 + ⌊t / {length}⌋) that the "
                "attention multiplies the rotated query by (get_llama_4_attn_scale), a factor of the query's time "
                f"that an Encoding does not carry; pass ignore_keys={{{key!r}}} for the rope alone (patch_model "
                "keeps the attention's own factor)"
            )
    if isinstance(read, HFRope):
        return _as_encoding(read, softmax_mscale)
    return {lt: _as_encoding(r, softmax_mscale) for lt, r in read.items()}
