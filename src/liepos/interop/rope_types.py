"""The rope types of a transformers config: one row per ``rope_type`` of ``transformers.modeling_rope_utils``.

Each row of :data:`ROPE_TYPES` (a :class:`RopeType`) holds the keys its validator requires and accepts
and the builder of its encoding from a :class:`RopeContext` (the parameters and derived sizes of one
layer type); the formulas are :mod:`liepos.scaling`, and under ``"compat"`` the float32 ``inv_freq``
transformers computes on the CPU (:mod:`liepos.interop._f32`) replaces the float64 frequencies. A new
rope type of a config is a new row here.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos import scaling
from liepos._checks import check_real
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum
from liepos.interop import _f32

__all__ = ["ROPE_TYPES", "RopeType", "RopeContext", "COMMON_KEYS", "ALL_KEYS", "times_logit", "half_rope",
           "nope_encoding"]

# the keys every rope type reads
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def half_rope(w: torch.Tensor, head_dim: int, name: str) -> Encoding:
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


def nope_encoding(head_dim: int, name: str) -> Encoding:
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
class RopeContext:
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


def _default(c: RopeContext) -> Encoding:
    return c.store(c.enc, _f32.default(c.base, c.dim)) if c.compat else c.enc


def _linear(c: RopeContext) -> Encoding:
    enc = scaling.linear(c.enc, factor=c.factor)
    return c.store(enc, _f32.default(c.base, c.dim) / c.factor) if c.compat else enc


def _dynamic(c: RopeContext) -> Encoding:
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


def _yarn(c: RopeContext) -> Encoding:
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


def _longrope(c: RopeContext) -> Encoding:
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


def _llama3(c: RopeContext) -> Encoding:
    low, high = c.params["low_freq_factor"], c.params["high_freq_factor"]
    if low == high:
        return _llama3_step(c, low)
    enc = scaling.llama3(c.enc, factor=c.factor, original_max_position_embeddings=c.L0,
                         low_freq_factor=low, high_freq_factor=high)
    return c.store(enc, _f32.llama3(c.base, c.dim, c.factor, low, high, c.L0)) if c.compat else enc


def _llama3_step(c: RopeContext, band: Any) -> Encoding:
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


def _proportional(c: RopeContext) -> Encoding:
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
    build: Callable[[RopeContext], Encoding]
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
ALL_KEYS = COMMON_KEYS.union(*(r.required | r.optional for r in ROPE_TYPES.values()))
