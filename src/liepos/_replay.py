"""Replayed calls: an encoding's repeated call on one shape served from a record of its first.

``enc.query(q, positions)`` / ``enc.key(k, positions)`` at the times ``p0 … p0 + S − 1`` checks the positions, the
range of the tables, whether the fast path applies, looks the table window up in the cache and dispatches to a
kernel: about ten steps of Python, each cheap while the interpreter's data is in the caches, and together a good
part of the kernel's own time right after a pass over a large tensor has evicted them (benchmarks/apply.py,
the rows "half" and "half (full call)" at the attention shape). The first call of a kind
records what those steps decided (:class:`Lane`: the table rows, their 4-D views, the output dtype); a later call
with the same tensor shape, strides and dtype (the :func:`lane_key`), the same times (compared with one
``torch.equal``) and the same parameters (the encoding's stamp: identities, storages and version counters; no
gradient asked of them) runs the kernel at once, with the same values: the recorded steps are the ones the full
call would take again. Anything else takes the full call, which may record it (:meth:`liepos.Encoding.query`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from liepos import _kernels, _triton
from liepos._fast import FastTables, apply_fast

__all__ = ["Lane", "lane_key", "new_lane", "keep", "LANES", "LANE_MIN_ELEMS", "SPAN_TABLE_BYTES"]

# lanes kept per encoding (the oldest let go first): a model's shapes of queries and keys at a few lengths
LANES = 8
# the fewest elements of a call that records a lane: below, the call is a decode step's or alike, whose times move
# every call (a lane would be recorded and declined each time, a cost with no repeat to pay for it)
LANE_MIN_ELEMS = 1 << 16
# the largest tables a lane (or a kept range of :meth:`liepos.Encoding._span`) may keep alive: its rows are views
# of a cached window, or built for one call (a longer range's kernel outweighs the lookups a lane spares)
SPAN_TABLE_BYTES = 8 << 20


@dataclass(frozen=True)
class Lane:
    """What the full call decided for one :func:`lane_key` at the times ``p0 …``: ``stamp`` (the encoding's stamp
    then), ``times`` (a copy of the positions given; None: none given, ``p0 = 0``), the table rows ``ft``, the
    output dtype, and for one half-layout rotation its tables as 4-D views."""

    stamp: tuple
    times: torch.Tensor | None
    ft: FastTables
    out_dtype: torch.dtype
    halves: tuple[torch.Tensor, torch.Tensor] | None

    def admits(self, x: torch.Tensor, positions: Any) -> bool:
        """Whether a call on ``x`` (of this lane's key) at ``positions`` is the recorded one, but for the encoding's
        parameters (the caller compares its stamp): eager, no gradient asked of ``x``, the same times."""
        if torch.compiler.is_compiling() or (x.requires_grad and torch.is_grad_enabled()) or _triton.interpreting():
            return False  # under TRITON_INTERPRET=1 the full call sends CPU tensors to the Triton kernels
        if positions is None:
            return self.times is None
        return (self.times is not None and type(positions) is torch.Tensor and positions.dtype == torch.int64
                and positions.device.type == "cpu" and positions.shape == self.times.shape
                and torch.equal(positions, self.times))

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The recorded call on ``x``: the full call's last step, :func:`~liepos._fast.apply_fast` on the recorded
        rows (or, for one half-layout rotation, the rotation it reaches, :func:`~liepos._kernels.rotate_halves`)."""
        if self.halves is not None:
            y = _kernels.rotate_halves(x, *self.halves)
            if y is not None:
                return y
        return apply_fast(x, self.ft, out_dtype=self.out_dtype)


def lane_key(x: torch.Tensor, side: str) -> tuple | None:
    """The key of ``x``'s lane on ``side``, or None for a tensor no lane serves (another class, another device)."""
    if type(x) is not torch.Tensor or x.device.type != "cpu":
        return None
    return side, x.shape, x.stride(), x.dtype


def new_lane(x: torch.Tensor, p0: int, positions: Any, ft: FastTables, out_dtype: torch.dtype,
             stamp: tuple) -> Lane | None:
    """A lane for the full call on ``x`` (a CPU tensor with a :func:`lane_key`) just decided (``p0``: its first time;
    ``ft``: its table rows), or None where a
    repeat could not be checked as cheaply: a gradient asked, times given otherwise than as None or an int64 CPU
    tensor, fewer than :data:`LANE_MIN_ELEMS` elements, tables above :data:`SPAN_TABLE_BYTES`. The caller records
    only calls whose encoding has no query scale and no length rule, at a ``p0`` from its own range check."""
    if (x.requires_grad and torch.is_grad_enabled()) or x.numel() < LANE_MIN_ELEMS or ft.nbytes() > SPAN_TABLE_BYTES:
        return None
    if positions is None:
        if p0 != 0:
            return None
        times = None
    elif type(positions) is torch.Tensor and positions.dtype == torch.int64 and positions.device.type == "cpu":
        times = positions.detach().clone()
    else:
        return None
    halves: tuple[torch.Tensor, torch.Tensor] | None = None
    if (len(ft.runs) == 1 and ft.runs[0].kind == "halves" and ft.coupling is None and ft.slot_vals is None
            and ft.runs[0].hi == x.shape[-1] and out_dtype == x.dtype):
        c, s = (t[(None,) * (4 - t.dim())] for t in ft.runs[0].tab)  # (…, S, P) -> (B|1, H|1, S, P)
        halves = (c, s)
    return Lane(stamp, times, ft, out_dtype, halves)


def keep(lanes: dict, key: tuple, lane: Any, most: int = LANES) -> None:
    """Put ``lane`` under ``key`` in ``lanes``, letting the oldest go past ``most`` entries."""
    lanes.pop(key, None)
    while len(lanes) >= most:
        try:
            lanes.pop(next(iter(lanes)), None)
        except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
            break
    lanes[key] = lane
