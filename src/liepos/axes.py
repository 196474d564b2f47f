"""Moved: several position axes are an axis of :class:`liepos.Generator` (``axes=m``) and of the one
:class:`liepos.Encoding`; the constructors live in :mod:`liepos.catalogue`. Re-exports for old imports."""

from __future__ import annotations

from typing import Any

import torch

from liepos.catalogue import axial_rope, decay_axial_rope, mrope, rope_mixed
from liepos.encoding import as_positions

__all__ = ["as_axes_positions", "axial_rope", "decay_axial_rope", "mrope", "rope_mixed"]


def as_axes_positions(positions: Any, seq: int, batch: int | None, axes: int, name: str = "positions") -> torch.Tensor:
    """``liepos.encoding.as_positions(positions, seq, batch, name, axes)`` (the old argument order)."""
    return as_positions(positions, seq, batch, name, axes)
