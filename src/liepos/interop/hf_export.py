"""liepos encodings → Hugging Face ``rope_parameters``: the way back of :func:`~liepos.from_hf`.

:func:`to_hf` states an encoding in the words an unpatched transformers model reads: a
``rope_parameters`` dict and the head facts (``head_dim``, ``partial_rotary_factor``, the
layout). Transformers' rope is a rotation of the first dims of the head at frequencies that one
of its ``rope_type`` formulas produces, times a temperature, followed by untouched dims; so the
encodings it can express are exactly the fixed RoPE-like ones:

* every block a rotation plane of rate 0 and size 1 (no decay, no xPos growth, no Jordan block),
  then real dims of rate 0 (NoPE, the un-rotated part of a partial head);
* no change of basis, no slots (ALiBi is a model type in transformers, not a rope type),
  parameters shared by the heads, one position axis, no length rule.

Among the ``rope_type`` rows it picks the plainest that states the frequencies exactly:
``default`` (``ω_i = base^(−2i/d)``), ``linear`` (the same divided by a factor), else
``longrope`` with equal short and long factor lists (any frequencies, any temperature).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos.encoding import Encoding

__all__ = ["to_hf"]

# relative agreement at which frequencies count as one formula's (float64 rounding of base**x)
_MATCH = 1e-12
# original_max_position_embeddings of an exported longrope: with equal short and long factor
# lists the switch at this length changes nothing, so any value states the same encoding
_ANY_LENGTH = 4096


def _refuse(enc: Encoding, what: str) -> ValueError:
    return ValueError(f"to_hf({enc!r}): transformers' rope_parameters cannot express {what}")


def _planes(enc: Encoding) -> tuple[torch.Tensor, int]:
    """The rotation frequencies ``(planes,)`` and the number of NoPE dims after them, or a named refusal."""
    g = enc.generator
    if getattr(enc, "num_axes", None) or g.freqs.dim() > 2 or getattr(g, "num_axes", None):
        raise _refuse(enc, "several position axes (M-RoPE's mrope_section is a multimodal model's own)")
    if g.basis is not None:
        raise _refuse(enc, "a custom basis (a generator that is not block-diagonal in the head's dims)")
    if enc.num_slots:
        raise _refuse(enc, "slots (ALiBi's bias is the model type of Bloom/MPT/Falcon, not a rope type)")
    if g.num_heads is not None:
        raise _refuse(enc, "per-head parameters (transformers' rope is shared by the heads)")
    if enc.length_rule is not None:
        raise _refuse(enc, "a length rule given as a function (state the dynamic/longrope parameters directly)")
    rates, freqs = g.rates.detach().to(torch.float64), g.freqs.detach().to(torch.float64)
    for i, (size, _cplx) in enumerate(zip(g.sizes, g.complex)):
        if size != 1:
            raise _refuse(enc, f"block {i}, a Jordan block of size {size}")
        if float(rates[i]) != 0.0:
            kind = "growth" if float(rates[i]) > 0 else "decay (xPos / RetNet)"
            raise _refuse(enc, f"block {i}, a rate {float(rates[i]):g}: {kind}")
    cplx = list(g.complex)
    P = sum(cplx)
    if P == 0:
        raise _refuse(enc, "an encoding with no rotation plane (NoPE: leave the model's rope out instead)")
    if any(cplx[P:]) or not all(cplx[:P]):
        raise _refuse(enc, "rotation planes after real dims (transformers rotates the first dims of the head)")
    w = freqs[:P]
    if bool((w <= 0).any()):
        raise _refuse(enc, "a rotation plane of frequency <= 0")
    return w, g.dim - 2 * P


def _default_freqs(base: float, rot: int) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a - b).abs() <= _MATCH * b.abs()).all())


def _rotated_temperature(encoding: Encoding, rot: int) -> float:
    """The factor on the rotated dims' part of qᵀk, as transformers' ``attention_factor²`` states it.

    transformers multiplies cos and sin, so its factor covers the ``rot`` rotated dims only: a whole-head
    ``logit_scale`` says that only when the whole head rotates; a ``query_scale`` says it when it is one
    constant on the rotated dims and 1 on the others."""
    D = encoding.query_scale
    if D is None:
        if rot < encoding.content_dim and encoding.logit_scale != 1.0:
            raise _refuse(encoding, f"a logit_scale on the whole head, but transformers applies attention_factor² "
                                    f"to the {rot} rotated dims of {encoding.content_dim} only")
        return encoding.logit_scale
    c = float(D[0])
    if not (bool((D[:rot] == c).all()) and bool((D[rot:] == 1).all())) or encoding.logit_scale != 1.0:
        raise _refuse(encoding, "a query_scale that is not one factor on the rotated dims and 1 on the others "
                                "(with logit_scale 1)")
    return c


def to_hf(encoding: Encoding) -> dict[str, Any]:
    """The config entries that make an unpatched transformers model compute ``encoding``.

    Returns a dict a config (object or ``config.json``) can be updated with: ``rope_parameters``
    (``rope_type``, ``rope_theta``, ``partial_rotary_factor`` and the type's keys), ``head_dim``
    and ``rope_interleave`` (``True`` for the interleaved layout: families that pair dims
    (2k, 2k+1), such as Cohere, GLM or DeepSeek-V3 with that flag; the half layout is
    ``rotate_half``). The dict is itself a config :func:`~liepos.from_hf` reads back::

        from_hf(to_hf(enc)) == enc      (the same frequencies to 1e-12, layout, dims, logit scale)

    Raises:
        ValueError: naming the block transformers cannot express: a decay or growth rate (xPos,
            RetNet), a Jordan block, a custom basis, slots (ALiBi), per-head parameters,
            several axes, or a length rule given as a function.

    >>> import liepos as lp
    >>> enc = lp.scaling.linear(lp.rope(16, base=500000.0, layout="half"), factor=4.0)
    >>> cfg = to_hf(enc)
    >>> cfg["rope_parameters"]["rope_type"], cfg["rope_parameters"]["factor"]
    ('linear', 4.0)
    >>> back = lp.from_hf(cfg)
    >>> bool(torch.allclose(back.generator.freqs, enc.generator.freqs, rtol=1e-12, atol=0))
    True
    """
    if not isinstance(encoding, Encoding):
        raise TypeError(f"encoding must be a liepos.Encoding, got {type(encoding).__name__}")
    w, nope = _planes(encoding)
    P = int(w.shape[0])
    rot, head_dim = 2 * P, 2 * P + nope
    base = float((w[0] / w[1]) ** P) if P > 1 else 10000.0  # ω_1/ω_0 = base^(−2/rot)
    p = rot / head_dim
    if int(head_dim * p) != rot:  # transformers' rotary dim is int(head_dim · partial_rotary_factor)
        raise _refuse(encoding, f"{rot} rotated dims of {head_dim}: int({head_dim} · {p!r}) is not {rot}")
    params: dict[str, Any] = {"rope_theta": base, "partial_rotary_factor": p}
    temperature = _rotated_temperature(encoding, rot)
    default = _default_freqs(base, rot)
    factor = float(default[0] / w[0])
    if temperature == 1.0 and _close(w, default):
        params["rope_type"] = "default"
    elif temperature == 1.0 and _close(w, default / factor):
        params.update(rope_type="linear", factor=factor)
    else:
        ext = (default / w).tolist()  # 1/(f_i · base^(2i/rot)) = ω_i
        params.update(
            rope_type="longrope", short_factor=ext, long_factor=list(ext), factor=1.0,
            original_max_position_embeddings=_ANY_LENGTH, attention_factor=math.sqrt(temperature),
        )
    return {
        "head_dim": head_dim,
        "rope_parameters": params,
        "rope_interleave": encoding.layout == "interleaved",
    }
