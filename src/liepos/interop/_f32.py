"""Transformers' float32 ``inv_freq``, bit for bit, as ``modeling_rope_utils`` computes it on the CPU.

Every replica starts from the one exponent vector transformers writes,
``torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim``, so that the default
frequencies ``1 / base**(2i/d)`` are written once and every scaled type derives from them in
the same float32 operations, in the same order, as upstream.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["default", "dynamic", "llama3", "longrope", "proportional", "yarn"]


def exponents(dim: int, denom: int | None = None) -> torch.Tensor:
    """``2i / denom`` for i < dim/2, in float32 (transformers' ``arange(0, dim, 2) / dim``)."""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / (dim if denom is None else denom)


def default(base: Any, dim: int) -> torch.Tensor:
    """``1 / base**(2i/dim)``: every default and scaled type starts here."""
    return 1.0 / (base ** exponents(dim))


def dynamic(base: Any, dim: int, factor: Any, max_pos: Any, length: int | None) -> torch.Tensor:
    """Dynamic NTK at ``length`` (None: at initialisation)."""
    if length is None:
        # at initialisation transformers uses seq_len = max_position_embeddings, in Python floats
        b = base * ((factor * max_pos / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    else:
        # in the forward pass seq_len = max(position_ids) + 1 is an int64 tensor: float32 arithmetic
        seq = torch.maximum(torch.tensor(length, dtype=torch.int64), torch.tensor(max_pos, dtype=torch.int64))
        b = base * ((factor * seq / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return default(b, dim)


def yarn(base: Any, dim: int, factor: Any, low: float, high: float) -> torch.Tensor:
    """YaRN's ramp between interpolation and extrapolation over the correction range."""
    pos = base ** exponents(dim)
    extrapolation, interpolation = 1.0 / pos, 1.0 / (factor * pos)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def longrope(base: Any, dim: int, factors: Any) -> torch.Tensor:
    """LongRoPE's per-plane rescaling ``1 / (f_i · base**(2i/dim))``."""
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * base ** exponents(dim))


def llama3(base: Any, dim: int, factor: Any, low_ff: Any, high_ff: Any, L0: Any) -> torch.Tensor:
    """Llama 3.1's wavelength bands: kept, divided by ``factor``, or smoothly in between."""
    w = default(base, dim)
    low_wl, high_wl = L0 / low_ff, L0 / high_ff
    wavelen = 2 * math.pi / w
    scaled = torch.where(wavelen > low_wl, w / factor, w)
    smooth = (L0 / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, scaled)


def proportional(base: Any, head_dim: int, p: Any, factor: Any) -> torch.Tensor:
    """Gemma 4's proportional rope: exponents over the whole head, zero frequencies after the rotated part."""
    r = int(p * head_dim // 2)
    w = 1.0 / (base ** exponents(2 * r, head_dim))
    nope = head_dim // 2 - r
    if nope > 0:
        w = torch.cat((w, torch.zeros(nope, dtype=torch.float32)))
    return w / factor
