"""Context extension as maps on the spectrum: PI, NTK, dynamic NTK, YaRN, LongRoPE, Llama 3, proportional,
clipped RoPE and arbitrary per-eigenvalue (and per-head) factors.

Every context-extension trick for RoPE changes the frequencies ω of the rotation blocks of the
generator and, separately, a temperature on the logits. Here each one is a function

    f(enc, **params) -> Encoding

that maps the frequencies of the *rotation* (complex) blocks of ``enc`` and multiplies
``enc.logit_scale`` by the trick's logit factor (Hugging Face's ``attention_factor`` multiplies
both cos and sin, so it multiplies ``qᵀk`` by ``attention_factor²``). Rates, sizes, real blocks,
slots and the layout are kept, so the maps apply to xPos, RetNet or a learned generator as well
as to RoPE. Formulas that depend on the plane index use ``i`` = the index of the block among the
complex blocks (canonical order) and ``d`` = 2 × the number of complex blocks (the rotary dim),
unless ``rotary_dim`` is given.

The formulas follow ``transformers.modeling_rope_utils`` (``ROPE_INIT_FUNCTIONS``) and are
checked against it in ``tests/test_scaling.py``; here they are evaluated in float64.
Length-dependent maps (``dynamic``, ``longrope``) return an encoding with a ``length_rule`` (a
picklable :class:`LengthRule`): :meth:`Encoding.at_length` (called by :func:`liepos.attention` with
``L = max position + 1``) returns the encoding for that length. Until its length is known such an
encoding refuses ``query``/``key`` with a message that says to call ``enc.at_length(L)``: it never
silently uses the unscaled frequencies.

With several position axes (axial RoPE, M-RoPE) plane k has a frequency *vector* ``(ω_k,1 … ω_k,m)``;
a map rescales its length ``|ω_k|`` and keeps its direction, so M-RoPE (one axis per plane) is scaled
exactly as Hugging Face scales its ``inv_freq``, and ``linear`` still divides every position by ``s``.

>>> import torch, liepos as lp
>>> q, t = torch.randn(1, 1, 3, 8, dtype=torch.float64), torch.tensor([0.0, 10.0, 4000.0], dtype=torch.float64)
>>> bool(torch.allclose(linear(lp.rope(8), factor=4.0).query(q, t), lp.rope(8).query(q, t / 4)))  # PI: positions / 4
True
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from liepos._checks import check_bool, check_int, check_real, check_real_tensor, describe
from liepos.encoding import Encoding

__all__ = [
    "SCALINGS",
    "LengthRule",
    "scale",
    "linear",
    "ntk",
    "dynamic",
    "yarn",
    "longrope",
    "llama3",
    "proportional",
    "clipped",
    "factors",
    "clip_taper",
    "rotation_freqs",
    "with_freqs",
    "map_spectrum",
    "yarn_mscale",
    "yarn_attention_factor",
    "yarn_correction_range",
    "longrope_attention_factor",
]


def _positive(value: Any, name: str) -> float:
    """A positive, finite real number (bools refused), named in the error."""
    return check_real(name, value, positive=True)


def _factors(values: Any, name: str, planes: int) -> torch.Tensor:
    t = check_real_tensor(name, values, ndim=1, positive=True)
    if t.shape[0] != planes:
        raise ValueError(f"`{name}` must have one entry per rotation plane ({planes}), got shape {tuple(t.shape)}")
    return t


# ---------------------------------------------------------------------- the spectrum
def _planes(enc: Encoding) -> list[int]:
    if not isinstance(enc, Encoding):
        raise TypeError(f"`enc` must be a liepos.Encoding, got {describe(enc)}")
    idx = [i for i, c in enumerate(enc.generator.complex) if c]
    if not idx:
        raise ValueError(
            f"{enc!r} has no rotation (complex) blocks: a context-extension map has no frequency to change"
        )
    return idx


def rotation_freqs(enc: Encoding) -> torch.Tensor:
    """The frequencies of the rotation (complex) blocks of ``enc``, shape ``(*heads, planes)``.

    For a Hugging Face encoding in the half layout this is ``inv_freq`` (with NoPE planes of
    frequency 0 for ``proportional``). With several position axes, the length ``|ω_k|`` of each
    plane's frequency vector (for M-RoPE, RoPE's ``inv_freq`` again).

    >>> import torch, liepos as lp
    >>> bool(torch.equal(rotation_freqs(lp.rope(8, base=100.0)), lp.rope_freqs(8, base=100.0)))
    True
    >>> bool(torch.equal(rotation_freqs(lp.mrope(8, (2, 1, 1))), lp.rope_freqs(8)))
    True
    """
    idx = _planes(enc)
    w = enc.generator.freqs[..., idx].to(torch.float64)
    return w if enc.num_axes is None else w.norm(dim=-2)  # (*heads, axes, planes) -> (*heads, planes)


def _rotary_dim(planes: int, rotary_dim: Any) -> int:
    if rotary_dim is None:
        return 2 * planes
    rotary_dim = check_int("rotary_dim", rotary_dim, min=1)
    if (rotary_dim + 1) // 2 != planes:
        raise ValueError(
            f"rotary_dim={rotary_dim} does not match the encoding's {planes} rotation planes "
            f"(expected {2 * planes - 1} or {2 * planes})"
        )
    return rotary_dim


def with_freqs(enc: Encoding, w: torch.Tensor, logit: float, tag: str) -> Encoding:
    """``enc`` with the rotation frequencies replaced by ``w`` and the logit scale multiplied."""
    idx = _planes(enc)
    g = enc.generator
    freqs = g.freqs.to(torch.float64).clone()
    if enc.num_axes is None:
        freqs[..., idx] = w.to(freqs.dtype)
    else:  # keep each plane's direction, set its length: ω_k ↦ (ω_k / |ω_k|) · w_k (exact when one axis owns it)
        old = freqs[..., idx]  # (*heads, axes, planes)
        mag = old.norm(dim=-2, keepdim=True)
        direction = torch.where(mag > 0, old / mag.clamp_min(torch.finfo(old.dtype).tiny), torch.zeros_like(old))
        freqs[..., idx] = direction * w.to(freqs.dtype).unsqueeze(-2)  # (*heads, 1, planes) against the axes
    name = f"{enc.name}+{tag}" if enc.name else tag
    return enc.replace(
        generator=g.with_params(freqs=freqs), logit_scale=enc.logit_scale * logit, name=name
    )


@dataclass(frozen=True)
class LengthRule:
    """``enc.at_length(L)`` of a scaled encoding: the map ``at`` applied to ``source.at_length(L)`` at ``L``.

    A plain dataclass of an encoding and a :func:`functools.partial` of a module-level function, so a
    scaled encoding pickles and survives ``torch.save``. The rule stays attached to every result, so
    ``enc.at_length(L1).at_length(L2) == enc.at_length(L2)`` and a static map composed on a
    length-dependent one re-applies at each length.
    """

    source: Encoding
    at: Callable[[Encoding, int | None], Encoding]

    def __call__(self, length: int) -> Encoding:
        return self.at(self.source.at_length(length), length).replace(length_rule=self)


def map_spectrum(enc: Encoding, at: Callable[[Encoding, int | None], Encoding], length_dependent: bool = False) -> Encoding:
    """Apply ``at(e, L)`` to ``enc`` (``L=None``: no length known) and carry length rules through.

    An input that already has a ``length_rule`` keeps it, composed: at length L the result is
    ``at(enc.at_length(L), L)``. A length-dependent map installs a rule of its own.
    """
    _planes(enc)  # an Encoding with rotation blocks, or a named error
    if enc.length_rule is None and not length_dependent:
        return at(enc, None)
    return at(enc, None).replace(length_rule=LengthRule(enc, at), length=None)


def _index_power(P: int, d: int, kappa: float) -> torch.Tensor:
    """``κ^{−2i/(d−2)}`` for i = 0 … P−1 (the exponent is 0 at i = 0, also when d = 2)."""
    i = torch.arange(P, dtype=torch.float64)
    if d > 2:
        expo = -2.0 * i / (d - 2)
    else:
        expo = torch.zeros(P, dtype=torch.float64)
    return torch.as_tensor(kappa, dtype=torch.float64) ** expo


# ---------------------------------------------------------------------- the maps
def linear(enc: Encoding, *, factor: float) -> Encoding:
    """Position interpolation (Chen et al., 2023; kaiokendev): ``ω ↦ ω / s``.

    Equivalent to dividing every position by ``s = factor`` for rotations (a damped block keeps its rate,
    as every map here does). Logit scale unchanged.
    Hugging Face ``rope_type="linear"``.

    >>> import torch, liepos as lp
    >>> q, p = torch.randn(1, 1, 4, 16, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64) * 100
    >>> enc = lp.axial_rope(16)  # several axes too: every coordinate is divided
    >>> bool(torch.allclose(linear(enc, factor=2.0).query(q, p), enc.query(q, p / 2)))
    True
    """
    s = _positive(factor, "factor")
    return map_spectrum(enc, partial(_linear_at, s))


def _linear_at(s: float, e: Encoding, L: int | None) -> Encoding:
    return with_freqs(e, rotation_freqs(e) / s, 1.0, f"linear({s:g})")


def ntk(enc: Encoding, *, factor: float, rotary_dim: int | None = None) -> Encoding:
    """Static NTK-aware scaling (bloc97): the base grows to ``b·s^{d/(d−2)}``.

    On the spectrum, for plane i of d/2 (``s = factor``)::

        ω_i ↦ ω_i · s^{−2i/(d−2)}

    which, for ``ω_i = b^{−2i/d}``, is ``(b·s^{d/(d−2)})^{−2i/d}``: the fastest plane is kept and
    the slowest is divided by exactly ``s``. Hugging Face has only the dynamic form (:func:`dynamic`).

    >>> import torch, liepos as lp
    >>> w, w0 = ntk(lp.rope(16), factor=8.0).generator.freqs, lp.rope(16).generator.freqs
    >>> bool(w[0] == w0[0]), bool(torch.allclose(w[-1], w0[-1] / 8))  # fastest kept, slowest divided by s
    (True, True)
    >>> bool(torch.allclose(w, lp.rope(16, base=10000.0 * 8.0 ** (16 / 14)).generator.freqs))  # base b·s^(d/(d−2))
    True
    """
    s = _positive(factor, "factor")
    return map_spectrum(enc, partial(_ntk_at, s, rotary_dim))


def _ntk_at(s: float, rotary_dim: int | None, e: Encoding, L: int | None) -> Encoding:
    w = rotation_freqs(e)
    d = _rotary_dim(w.shape[-1], rotary_dim)
    return with_freqs(e, w * _index_power(w.shape[-1], d, s), 1.0, f"ntk({s:g})")


def dynamic(
    enc: Encoding, *, factor: float, original_max_position_embeddings: int, rotary_dim: int | None = None
) -> Encoding:
    """Dynamic NTK scaling (emozilla; Hugging Face ``rope_type="dynamic"``), length dependent.

    For a sequence of ``L`` positions (``L0 = original_max_position_embeddings``, ``s = factor``)::

        κ(L) = s·L/L0 − (s − 1)                 for L > L0, else κ = 1
        ω_i ↦ ω_i · κ(L)^{−2i/(d−2)}

    i.e. Hugging Face's base ``b' = b·κ^{d/(d−2)}`` with ``ω_i = b'^{−2i/d}``. The returned
    encoding has the unscaled frequencies and a ``length_rule``; ``enc.at_length(L)`` gives the
    encoding for L. Hugging Face takes ``L0`` from ``config.max_position_embeddings``.

    Hugging Face recomputes only when the length grows past the cached one and resets once it
    falls below ``L0``; the rule here depends on L alone, so it agrees for one growing sequence
    (prefill then decode) and after every reset, and it never depends on history. Keys cached
    under an older κ are not re-rotated by either (the documented bug of transformers #25104).

    >>> import torch, liepos as lp
    >>> enc = dynamic(lp.rope(8), factor=2.0, original_max_position_embeddings=10)
    >>> bool(torch.equal(enc.at_length(10).generator.freqs, lp.rope(8).generator.freqs))  # L ≤ L0: unscaled
    True
    >>> kappa = 2.0 * 20 / 10 - (2.0 - 1)  # at L = 20: static NTK with κ(20) = 3
    >>> bool(torch.allclose(enc.at_length(20).generator.freqs, ntk(lp.rope(8), factor=kappa).generator.freqs))
    True
    """
    s = _positive(factor, "factor")
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    _rotary_dim(len(_planes(enc)), rotary_dim)  # validate now, not at the first long sequence
    return map_spectrum(enc, partial(_dynamic_at, s, L0, rotary_dim), length_dependent=True)


def _dynamic_at(s: float, L0: float, rotary_dim: int | None, e: Encoding, L: int | None) -> Encoding:
    if L is None or L <= L0:
        return e
    w = rotation_freqs(e)
    d = _rotary_dim(w.shape[-1], rotary_dim)
    kappa = (s * L / L0) - (s - 1)
    return with_freqs(e, w * _index_power(w.shape[-1], d, kappa), 1.0, f"dynamic({s:g}, L={L})")


# YaRN's magnitude correction: 0.1·ln s per unit of mscale (Peng et al. 2023, eq. 4's √(1/t) = 0.1 ln s + 1)
_YARN_MSCALE_SLOPE = 0.1
# a ramp whose ends meet is widened by this much, as upstream does, to avoid dividing by zero
_YARN_RAMP_EPS = 0.001
# the spectrum counts as geometric when every log-ratio agrees with the mean to this relative tolerance
_GEOMETRIC_RTOL = 1e-6


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude factor ``m(s, μ) = 0.1·μ·ln s + 1`` for ``s > 1``, else 1.

    DeepSeek's attention multiplies its softmax scale by ``m(s, mscale_all_dim)²``:
    DeepSeek-V2-Lite (``s = 40``, ``μ = 0.707``) gives ≈ 1.59, DeepSeek-V3 (``μ = 1``) ≈ 1.87.

    >>> round(yarn_mscale(40.0, 0.707) ** 2, 4), round(yarn_mscale(40.0, 1.0) ** 2, 4)
    (1.5896, 1.8739)
    """
    s = check_real("scale", scale)
    if s <= 1:
        return 1.0
    return _YARN_MSCALE_SLOPE * check_real("mscale", mscale) * math.log(s) + 1.0


def yarn_attention_factor(
    factor: float,
    *,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
) -> float:
    """YaRN's ``attention_factor`` as Hugging Face picks it (it multiplies cos and sin).

    An explicit ``attention_factor`` wins; else, when both ``mscale`` and ``mscale_all_dim`` are
    given and non-zero, ``m(s, mscale)/m(s, mscale_all_dim)``; else ``m(s, 1) = 0.1·ln s + 1``.
    The logit scale is its square.

    >>> yarn_attention_factor(40.0, mscale=0.707, mscale_all_dim=0.707)
    1.0
    >>> round(yarn_attention_factor(4.0), 6)
    1.138629
    """
    s = _positive(factor, "factor")
    if attention_factor is not None:
        return _positive(attention_factor, "attention_factor")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim))
    return yarn_mscale(s)


def yarn_correction_range(
    *,
    rotary_dim: int,
    base: float,
    original_max_position_embeddings: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[float, float]:
    """The plane-index range ``(low, high)`` over which YaRN ramps from extrapolation to interpolation.

    The plane that turns ``β`` times over the original context ``L0`` has index
    ``r(β) = d·ln(L0/(2πβ)) / (2 ln b)``; ``low = max(r(beta_fast), 0)``,
    ``high = min(r(beta_slow), d − 1)``, rounded outwards (floor/ceil) when ``truncate``.
    GPT-OSS (``truncate=False``, d = 64, b = 150000, L0 = 4096) has ``(8.0928…, 17.398…)``.

    >>> lo, hi = yarn_correction_range(rotary_dim=64, base=150000, original_max_position_embeddings=4096,
    ...                                truncate=False)
    >>> round(lo, 4), round(hi, 3)
    (8.0928, 17.398)
    """
    d = check_int("rotary_dim", rotary_dim, min=1)
    b = _positive(base, "base")
    if b == 1.0:
        raise ValueError("base must differ from 1 (a constant spectrum has no correction range)")
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    return _correction_range(d, math.log(b), 1.0, L0, _positive(beta_fast, "beta_fast"),
                             _positive(beta_slow, "beta_slow"), check_bool("truncate", truncate))


def _correction_range(
    d: int, log_base: float, w0: float, L0: float, beta_fast: float, beta_slow: float, truncate: bool
) -> tuple[float, float]:
    # the same order of float64 operations as transformers, so floor/ceil agree at the boundaries
    def r(beta: float) -> float:
        return (d * math.log(w0 * L0 / (beta * 2 * math.pi))) / (2 * log_base)

    low, high = r(beta_fast), r(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return float(max(low, 0)), float(min(high, d - 1))


def _spectrum_log_base(w: torch.Tensor, d: int) -> tuple[float, float]:
    """``(ln b, ω_0)`` of a geometric spectrum ``ω_i = ω_0·b^{−2i/d}`` (one row), or ValueError."""
    P = int(w.shape[-1])
    vals = w.tolist()
    if P < 2 or any(v <= 0 for v in vals):
        raise ValueError(
            "yarn needs base= here: the rotation spectrum has fewer than two planes or a "
            f"non-positive frequency ({vals[:4]}...), so its base cannot be inferred"
        )
    ratios = [vals[i + 1] / vals[i] for i in range(P - 1)]
    log_rho = math.log(vals[-1] / vals[0]) / (P - 1)
    if any(abs(math.log(q) - log_rho) > _GEOMETRIC_RTOL * max(1.0, abs(log_rho)) for q in ratios):
        raise ValueError(
            "yarn needs base= here: the rotation spectrum is not geometric (ω_i = ω_0·b^(−2i/d)), "
            "so the plane index of a wavelength is not defined by a base"
        )
    return -(d / 2) * log_rho, vals[0]


def yarn(
    enc: Encoding,
    *,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
    base: float | None = None,
    rotary_dim: int | None = None,
) -> Encoding:
    """YaRN (Peng et al., 2023; Hugging Face ``rope_type="yarn"``): ramped interpolation plus a temperature.

    With ``(low, high)`` from :func:`yarn_correction_range` (``high += 0.001`` when equal)::

        γ_i = clamp((i − low) / (high − low), 0, 1)
        ω_i ↦ ω_i · [(1 − γ_i) + γ_i / s]          (s = factor)

    so fast planes (i ≤ low) are kept, slow planes (i ≥ high) are divided by ``s``. The logit
    scale is multiplied by ``attention_factor²`` (:func:`yarn_attention_factor`). ``base`` is the
    RoPE base b of the spectrum; by default it is read off the spectrum, which must then be
    geometric, ``ω_i = ω_0·b^{−2i/d}`` (with ``ω_0 = 1`` the index formula is Hugging Face's).
    ``beta_fast < beta_slow`` is allowed (the ramp then runs the other way, as upstream).

    >>> import torch, liepos as lp
    >>> enc = yarn(lp.rope(64, base=150000.0), factor=32.0, original_max_position_embeddings=4096)
    >>> w, w0 = enc.generator.freqs, lp.rope(64, base=150000.0).generator.freqs
    >>> low, high = yarn_correction_range(rotary_dim=64, base=150000.0, original_max_position_embeddings=4096)
    >>> bool(torch.equal(w[: int(low) + 1], w0[: int(low) + 1])), bool(torch.allclose(w[int(high):], w0[int(high):] / 32))
    (True, True)
    >>> enc.logit_scale == yarn_attention_factor(32.0) ** 2
    True
    """
    s = _positive(factor, "factor")
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    bf = _positive(beta_fast, "beta_fast")
    bs = _positive(beta_slow, "beta_slow")
    truncate = check_bool("truncate", truncate)
    b = None if base is None else _positive(base, "base")
    if b == 1.0:
        raise ValueError("`base` must differ from 1, got 1.0")
    af = yarn_attention_factor(s, mscale=mscale, mscale_all_dim=mscale_all_dim, attention_factor=attention_factor)
    return map_spectrum(enc, partial(_yarn_at, s, L0, bf, bs, truncate, b, rotary_dim, af))


def _yarn_at(
    s: float, L0: float, bf: float, bs: float, truncate: bool, b: float | None, rotary_dim: int | None, af: float,
    e: Encoding, L: int | None,
) -> Encoding:
    w = rotation_freqs(e)
    P = int(w.shape[-1])
    d = _rotary_dim(P, rotary_dim)
    i = torch.arange(P, dtype=torch.float64)
    out = []
    for row in w.reshape(-1, P):  # (*heads, planes) -> (rows, planes)
        if b is None:
            log_b, w0 = _spectrum_log_base(row, d)
        else:
            log_b, w0 = math.log(b), float(row[0])
            if w0 <= 0:
                raise ValueError(f"yarn needs a positive first frequency, got {w0}")
        low, high = _correction_range(d, log_b, w0, L0, bf, bs, truncate)
        if low == high:
            high += _YARN_RAMP_EPS
        gamma = ((i - low) / (high - low)).clamp(0.0, 1.0)
        out.append(row * (1.0 - gamma) + (row / s) * gamma)
    new = torch.stack(out).reshape(w.shape)  # (rows, planes) -> (*heads, planes)
    return with_freqs(e, new, af * af, f"yarn({s:g})")


def longrope_attention_factor(
    factor: float, original_max_position_embeddings: float, attention_factor: float | None = None
) -> float:
    """LongRoPE's ``attention_factor``: explicit, else ``sqrt(1 + ln s / ln L0)`` for ``s > 1``, else 1.

    >>> round(longrope_attention_factor(32.0, 4096), 6)
    1.190238
    """
    if attention_factor is not None:
        return _positive(attention_factor, "attention_factor")
    s = _positive(factor, "factor")
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    if s <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(s) / math.log(L0))


def longrope(
    enc: Encoding,
    *,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_position_embeddings: int,
    factor: float | None = None,
    attention_factor: float | None = None,
    max_position_embeddings: int | None = None,
) -> Encoding:
    """LongRoPE (Ding et al., 2024; Phi-3; Hugging Face ``rope_type="longrope"``), length dependent.

    Per-plane rescale factors λ, one list for short and one for long sequences::

        ω_i ↦ ω_i / λ_i,   λ = long_factor if L > L0 else short_factor

    (``L0 = original_max_position_embeddings``, L the number of positions). The returned encoding
    has the short factors and a ``length_rule`` switching to the long ones. The logit scale is
    multiplied by ``attention_factor²`` (:func:`longrope_attention_factor`; the same for both),
    with ``s = factor``, or ``max_position_embeddings / L0`` when ``factor`` is not given.

    >>> import torch, liepos as lp
    >>> enc = longrope(lp.rope(4), short_factor=[1, 2], long_factor=[4, 8], original_max_position_embeddings=16,
    ...                factor=1.0)
    >>> w0 = lp.rope(4).generator.freqs
    >>> bool(torch.equal(enc.at_length(16).generator.freqs, w0 / torch.tensor([1.0, 2.0], dtype=torch.float64)))
    True
    >>> bool(torch.equal(enc.at_length(17).generator.freqs, w0 / torch.tensor([4.0, 8.0], dtype=torch.float64)))
    True
    """
    P = len(_planes(enc))
    short = _factors(short_factor, "short_factor", P)
    long = _factors(long_factor, "long_factor", P)
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(
                "longrope needs factor, or max_position_embeddings to derive it as "
                "max_position_embeddings / original_max_position_embeddings"
            )
        s = _positive(max_position_embeddings, "max_position_embeddings") / L0
    else:
        s = _positive(factor, "factor")
    af = longrope_attention_factor(s, L0, attention_factor)
    return map_spectrum(enc, partial(_longrope_at, short, long, L0, af), length_dependent=True)


def _longrope_at(short: torch.Tensor, long: torch.Tensor, L0: float, af: float, e: Encoding, L: int | None) -> Encoding:
    use_long = L is not None and L > L0
    tag = f"longrope({'long' if use_long else 'short'})"
    return with_freqs(e, rotation_freqs(e) / (long if use_long else short), af * af, tag)


def llama3(
    enc: Encoding,
    *,
    factor: float,
    original_max_position_embeddings: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> Encoding:
    """Llama 3.1 frequency-dependent interpolation (Hugging Face ``rope_type="llama3"``).

    With wavelength ``λ = 2π/|ω|``, ``L0 = original_max_position_embeddings``, ``s = factor``,
    ``l = low_freq_factor`` and ``h = high_freq_factor``::

        ω ↦ ω                          if λ < L0/h    (fast planes kept)
        ω ↦ ω/s                        if λ > L0/l    (slow planes interpolated)
        ω ↦ (1 − α)·ω/s + α·ω,  α = (L0/λ − l)/(h − l)   otherwise

    Logit scale unchanged. Meta's values are s = 8, l = 1, h = 4, L0 = 8192.

    >>> import math, torch, liepos as lp
    >>> w0 = lp.rope(128, base=500000.0).generator.freqs
    >>> w = llama3(lp.rope(128, base=500000.0), factor=8.0, original_max_position_embeddings=8192).generator.freqs
    >>> wavelen = 2 * math.pi / w0
    >>> fast, slow = wavelen < 8192 / 4, wavelen > 8192 / 1
    >>> bool(torch.equal(w[fast], w0[fast])), bool(torch.allclose(w[slow], w0[slow] / 8))
    (True, True)
    """
    s = _positive(factor, "factor")
    L0 = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    lo = _positive(low_freq_factor, "low_freq_factor")
    hi = _positive(high_freq_factor, "high_freq_factor")
    if not hi > lo:
        raise ValueError(
            f"`high_freq_factor` must be greater than low_freq_factor ({low_freq_factor}), got {high_freq_factor}"
        )
    return map_spectrum(enc, partial(_llama3_at, s, L0, lo, hi))


def _llama3_at(s: float, L0: float, lo: float, hi: float, e: Encoding, L: int | None) -> Encoding:
    w = rotation_freqs(e)
    wavelen = math.tau / w.abs()  # inf for a zero frequency: interpolated (stays 0)
    alpha = (L0 / wavelen - lo) / (hi - lo)
    ramp = (1 - alpha) * w / s + alpha * w
    new = torch.where(wavelen > L0 / lo, w / s, w)
    medium = ~(wavelen < L0 / hi) & ~(wavelen > L0 / lo)
    return with_freqs(e, torch.where(medium, ramp, new), 1.0, f"llama3({s:g})")


def proportional(enc: Encoding, *, partial_rotary_factor: float, factor: float = 1.0) -> Encoding:
    """Proportional RoPE (Gemma 4 global layers; Hugging Face ``rope_type="proportional"``).

    Of the d/2 planes only the first ``r = int(p·d // 2)`` keep rotating; the others become
    explicit NoPE planes (frequency 0, still paired in place, so the storage layout is the full
    head's); everything is divided by ``s = factor``::

        ω_i ↦ ω_i / s   for i < r,        ω_i ↦ 0   for i ≥ r      (p = partial_rotary_factor)

    Unlike the usual partial rotary (a shorter rope over ``rotary_dim = p·head_dim`` with its own
    exponent ``2i/rotary_dim``, then NoPE dims), the kept planes keep the full head's frequencies
    ``b^{−2i/head_dim}``: the slowest ones are removed rather than the spectrum compressed.

    >>> import torch, liepos as lp
    >>> w, w0 = proportional(lp.rope(8), partial_rotary_factor=0.5).generator.freqs, lp.rope(8).generator.freqs
    >>> bool(torch.equal(w[:2], w0[:2])), bool(torch.equal(w[2:], torch.zeros(2, dtype=torch.float64)))
    (True, True)
    """
    p = check_real("partial_rotary_factor", partial_rotary_factor, min=0.0, max=1.0)
    s = _positive(factor, "factor")
    return map_spectrum(enc, partial(_proportional_at, p, s))


def _proportional_at(p: float, s: float, e: Encoding, L: int | None) -> Encoding:
    w = rotation_freqs(e)
    P = int(w.shape[-1])
    keep = (torch.arange(P) < int(p * (2 * P) // 2)).to(w.dtype)
    return with_freqs(e, w * keep / s, 1.0, f"proportional({p:g})")


def clip_taper(n: int) -> torch.Tensor:
    """The Hann taper of clipped RoPE: ``m_j = ½(1 + cos(π j/(n − 1)))``, j = 0 … n − 1 (``n = 1``: ``[1]``).

    It falls from 1 to exactly 0 (``numpy.linspace(0, π, n)``'s end points, as CoPE's reference code).

    >>> [round(float(m), 6) for m in clip_taper(3)]
    [1.0, 0.5, 0.0]
    """
    n = check_int("n", n, min=1)
    j = torch.arange(n, dtype=torch.float64)
    theta = j * (math.pi / (n - 1)) if n > 1 else torch.zeros(1, dtype=torch.float64)
    return 0.5 * (1.0 + torch.cos(theta))


def clipped(enc: Encoding, *, clip: int | None = None, original_max_position_embeddings: int | None = None) -> Encoding:
    """Clipped RoPE (CoPE, arXiv 2602.05258): a Hann taper of the ``n`` lowest frequencies down to zero.

    With the planes in canonical order (for RoPE: fastest first, so the last ``n`` are the slowest)::

        ω_{P−n+j} ↦ ω_{P−n+j} · ½(1 + cos(π j/(n − 1))),   j = 0 … n − 1

    the last plane becomes a zero (NoPE) plane. ``n = clip``, or, given
    ``original_max_position_embeddings = L0`` only, the number of planes whose period ``2π/|ω|``
    exceeds ``L0`` (mlx-lm's sizing), measured on the spectrum it is given. Length independent; logit
    scale unchanged. It composes with :func:`yarn` in either order, and sized by ``L0`` the orders
    differ (after yarn more planes are slower than ``L0``); yarn after the clip needs ``base=``, the
    tapered spectrum being no longer geometric. A fixed ``clip`` and yarn at a given base are both
    per-plane multipliers, so they commute.

    >>> import torch, liepos as lp
    >>> w0 = lp.rope(16).generator.freqs
    >>> w = clipped(lp.rope(16), clip=3).generator.freqs
    >>> bool(torch.equal(w[:5], w0[:5])), bool(torch.allclose(w[5:], w0[5:] * clip_taper(3))), float(w[-1])
    (True, True, 0.0)
    """
    if (clip is None) == (original_max_position_embeddings is None):
        raise ValueError(
            f"clipped needs exactly one of `clip` (a number of planes) or `original_max_position_embeddings` "
            f"(clip the planes slower than it), got clip={clip!r}, "
            f"original_max_position_embeddings={original_max_position_embeddings!r}"
        )
    P = len(_planes(enc))
    if clip is not None:
        clip = check_int("clip", clip, min=1, max=P)
    L0 = None if original_max_position_embeddings is None else _positive(
        original_max_position_embeddings, "original_max_position_embeddings")
    return map_spectrum(enc, partial(_clipped_at, clip, L0))


def _clipped_at(clip: int | None, L0: float | None, e: Encoding, L: int | None) -> Encoding:
    w = rotation_freqs(e)
    P = int(w.shape[-1])
    n = clip
    if n is None:
        if L0 is None:
            raise ValueError("a clip count or an original length L0 is needed to clip the rotation frequencies")
        counts = {int(c) for c in (math.tau / w.abs() > L0).sum(-1).reshape(-1).tolist()}  # per head row
        if len(counts) != 1:
            raise ValueError(f"clipped: the heads have different numbers of planes slower than L0={L0:g} "
                             f"({sorted(counts)}); pass clip= explicitly")
        n = counts.pop()
        if n == 0:
            return with_freqs(e, w, 1.0, "clipped(0)")
    m = torch.ones(P, dtype=torch.float64)
    m[P - n :] = clip_taper(n)
    return with_freqs(e, w * m, 1.0, f"clipped({n})")


def factors(enc: Encoding, *, factors: Any) -> Encoding:
    """Arbitrary rescale factors per eigenvalue and per head: ``ω_{h,i} ↦ ω_{h,i} / λ_{h,i}``.

    ``factors`` ``(planes,)`` (LongRoPE2's searched per-dimension factors), ``(heads, planes)`` or
    ``(heads, 1)`` (AdaRoPE's head-specific scaling): every ``λ > 0``. A per-head factor on an
    encoding without heads gives it a heads axis. Length independent (the two-window switch of
    LongRoPE/LongRoPE2 is :func:`longrope`, which takes arbitrary factor vectors too); logit scale
    unchanged.

    >>> import torch, liepos as lp
    >>> lam = torch.tensor([[1.0, 2.0], [4.0, 8.0]], dtype=torch.float64)  # (heads, planes)
    >>> w = factors(lp.rope(4), factors=lam).generator.freqs
    >>> bool(torch.equal(w, lp.rope_freqs(4) / lam))
    True
    """
    P = len(_planes(enc))
    lam = check_real_tensor("factors", factors, ndim=(1, 2), positive=True)
    if lam.shape[-1] not in (1, P) or (lam.dim() == 1 and lam.shape[0] != P):
        raise ValueError(f"`factors` must have shape ({P},), (heads, {P}) or (heads, 1), got {tuple(lam.shape)}")
    if lam.dim() == 2 and enc.num_heads not in (None, lam.shape[0]):
        raise ValueError(f"`factors` has {lam.shape[0]} heads but the encoding has {enc.num_heads}")
    return map_spectrum(enc, partial(_factors_at, lam))


def _with_heads(e: Encoding, H: int) -> Encoding:
    """``e`` with its generator's parameters given a heads axis of ``H`` (one copy per head)."""
    g = e.generator
    if g.num_heads is not None:
        return e
    rates = g.rates.expand(H, *g.rates.shape).clone()  # (blocks,) -> (H, blocks); with axes (H, axes, blocks)
    freqs = g.freqs.expand(H, *g.freqs.shape).clone()
    return e.replace(generator=g.with_params(rates=rates, freqs=freqs))


def _factors_at(lam: torch.Tensor, e: Encoding, L: int | None) -> Encoding:
    if lam.dim() == 2:
        e = _with_heads(e, int(lam.shape[0]))
    return with_freqs(e, rotation_freqs(e) / lam, 1.0, "factors")


# ---------------------------------------------------------------------- the registry
SCALINGS: dict[str, Callable[..., Encoding]] = {
    "linear": linear,
    "ntk": ntk,
    "dynamic": dynamic,
    "yarn": yarn,
    "longrope": longrope,
    "llama3": llama3,
    "proportional": proportional,
    "clipped": clipped,
    "factors": factors,
}
"""Every map, one signature: ``SCALINGS[name](enc, **params) -> Encoding``."""


def scale(enc: Encoding, kind: str, **params: Any) -> Encoding:
    """``SCALINGS[kind](enc, **params)``, with errors that name an unknown kind or parameter.

    >>> import liepos as lp
    >>> scale(lp.rope(4), "linear", factor=2.0).version == linear(lp.rope(4), factor=2.0).version
    True
    """
    try:
        fn = SCALINGS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scaling {kind!r}; known: {sorted(SCALINGS)}") from None
    sig = inspect.signature(fn)
    accepted = [n for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise TypeError(f"scaling {kind!r} got unknown parameters {unknown}; it accepts {accepted}")
    missing = sorted(
        n for n in accepted if sig.parameters[n].default is inspect.Parameter.empty and n not in params
    )
    if missing:
        raise TypeError(f"scaling {kind!r} is missing required parameters {missing}")
    return fn(enc, **params)
