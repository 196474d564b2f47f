"""Positions through a user coordinate map before the group: ``p ↦ u = φ(p)``, then ``A(u)``.

Circle-RoPE (arXiv 2505.16416) puts image tokens on a ring, VRoPE (arXiv 2502.11664) re-indexes video
positions; both are a map φ on the positions followed by a member of the family. The scores are then
relative *in the mapped coordinates*: ``F(φ(t))ᵀ G(φ(s)) = A(φ(t) − φ(s))``, a function of t − s only
when φ is affine. :class:`Mapped` is the composite (its ``query``/``key`` take raw positions, so
:func:`liepos.diagnose` probes it as the user meets it); :func:`liepos.attention` takes the mapped
positions directly: ``lp.attention(q, k, v, m.encoding, m.positions(t), m.positions(s))``.

>>> import torch, liepos as lp
>>> m = Mapped(lp.rope_directions(8), ring(12))
>>> q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
>>> a = (m.query(q, [3.0]) * m.key(k, [1.0])).sum()            # raw positions 3 and 1 ...
>>> b = (m.encoding.query(q, m.positions([3.0])) * m.encoding.key(k, m.positions([1.0]))).sum()
>>> bool(torch.allclose(a, b))                                  # ... are A(φ(3) − φ(1))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from liepos._checks import check_int, check_real, describe
from liepos.encoding import Encoding

__all__ = ["Mapped", "ring"]


def ring(period: int, radius: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """``p ↦ r (cos 2πp/N, sin 2πp/N)``: N positions on a circle of radius r (the shape of Circle-RoPE's map of
    image tokens; its text axis and its alternation across layers are the caller's). Positions ``(seq,)`` ->
    ``(seq, 2)``.

    >>> ring(4)(torch.tensor([0.0, 1.0])).round(decimals=12).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    period = check_int("period", period, min=1)
    radius = check_real("radius", radius, positive=True)

    def phi(p: torch.Tensor) -> torch.Tensor:
        a = p.to(torch.float64) * (2 * math.pi / period)
        return radius * torch.stack((torch.cos(a), torch.sin(a)), dim=-1)  # (…, seq) -> (…, seq, 2)

    phi.__qualname__ = f"ring({period}, {radius:g})"
    return phi


class Mapped:
    """``encoding`` met through the coordinate map ``fn``: ``query(q, p) = encoding.query(q, fn(p))``.

    ``fn`` takes float64 positions ``(seq,)`` or ``(batch, seq)`` (or with an axes dim) and returns the
    encoding's positions.
    """

    def __init__(self, encoding: Encoding, fn: Callable[[torch.Tensor], torch.Tensor], name: str | None = None) -> None:
        if not isinstance(encoding, Encoding):
            raise TypeError(f"`encoding` must be a liepos.Encoding, got {describe(encoding)}")
        if not callable(fn):
            raise TypeError(f"`fn` must be callable (positions -> coordinates), got {describe(fn)}")
        self.encoding, self.fn = encoding, fn
        self.name = name or f"{encoding.name}∘{getattr(fn, '__qualname__', 'map')}"
        self.dim = encoding.content_dim

    def positions(self, p: Any) -> torch.Tensor:
        """``φ(p)``: the coordinates the encoding sees."""
        return self.fn(torch.as_tensor(p, dtype=torch.float64))

    def query(self, q: torch.Tensor, positions: Any, **kw: Any) -> torch.Tensor:
        return self.encoding.query(q, self.positions(positions), **kw)

    def key(self, k: torch.Tensor, positions: Any, **kw: Any) -> torch.Tensor:
        return self.encoding.key(k, self.positions(positions), **kw)

    def __repr__(self) -> str:
        return f"Mapped({self.name})"
