"""Learnable generators that stay in the family, whatever the optimiser does.

Every parameter is mapped onto the family by construction, so no step of any optimiser can leave
it and the encoding stays *exactly* relative after training (``lp.diagnose`` agrees):

* frequencies positive: ``ω = softplus(raw)`` (or ``exp(raw)``); with several axes each plane has a
  frequency *vector* ``ω_k = |ω_k| · d_k`` with ``|ω_k| = softplus(raw)`` and a free direction
  ``d_k = raw_dir / ‖raw_dir‖`` (RoPE-Mixed), or one owning axis (axial);
* rates ``λ = −softplus(raw) ≤ 0``: decay, never growth;
* a learned orthogonal basis ``P = exp(S − Sᵀ)`` (STRING, Schenck et al. 2025): ``X = P J Pᵀ``; the
  generators of different axes share ``P`` and stay commuting.

A module's ``forward()`` returns a fresh :class:`~liepos.Encoding` (or
:class:`~liepos.axes.AxesEncoding`) whose tensors are functions of the parameters, so gradients
flow from the attention loss into them::

    pe = LearnableEncoding(64, axes=2, decay=True, basis="orthogonal")
    opt = torch.optim.Adam(pe.parameters())
    out = lp.attention(q, k, v, pe(), positions=t, key_positions=t)

>>> import torch
>>> pe = LearnableEncoding(8)
>>> bool(torch.allclose(pe().generator.freqs, __import__("liepos").rope(8).generator.freqs))
True
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as Fn

from liepos.axes import AxesEncoding, AxesGenerator
from liepos.encoding import Encoding
from liepos.generator import Generator

__all__ = ["LearnableGenerator", "LearnableEncoding"]

F64 = torch.float64


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


class LearnableGenerator(nn.Module):
    """Rotation planes (optionally damped) with learnable frequencies, rates and basis.

    Args:
        dim: head dim (even): ``dim/2`` rotation planes.
        axes: ``None`` for one position axis (returns a :class:`~liepos.Generator`), else the number
            of axes (returns an :class:`~liepos.axes.AxesGenerator`).
        num_heads: per-head parameters when given.
        base: RoPE base of the initial frequencies (``base^(−2k/dim)``; with axes, as
            :func:`~liepos.axes.axial_rope` for ``init="axial"`` or RoPE-Mixed for ``"mixed"``).
        init: ``"axial"`` (each plane owns one axis, its frequency positive) or ``"mixed"`` (each
            plane has a learned direction in position space; RoPE-Mixed). Only with ``axes``.
        decay: learn rates ``λ = −softplus(raw) ≤ 0`` (per axis and plane); ``decay_init`` is their
            initial magnitude.
        basis: ``None`` or ``"orthogonal"`` (``P = matrix_exp(S − Sᵀ)``, starting at the identity).
        freq_param: ``"softplus"`` or ``"exp"``.
        dtype: of the parameters (float64 by default: the tables are float64 anyway).
    """

    def __init__(
        self,
        dim: int,
        *,
        axes: int | None = None,
        num_heads: int | None = None,
        base: float = 10000.0,
        init: str = "axial",
        decay: bool = False,
        decay_init: float = 0.01,
        basis: str | None = None,
        freq_param: str = "softplus",
        seed: int = 0,
        dtype: torch.dtype = F64,
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"dim must be a positive even int, got {dim!r}")
        if axes is not None and (not isinstance(axes, int) or axes < 1):
            raise ValueError(f"axes must be None or a positive int, got {axes!r}")
        if init not in ("axial", "mixed"):
            raise ValueError(f"init must be 'axial' or 'mixed', got {init!r}")
        if basis not in (None, "orthogonal"):
            raise ValueError(f"basis must be None or 'orthogonal', got {basis!r}")
        if freq_param not in ("softplus", "exp"):
            raise ValueError(f"freq_param must be 'softplus' or 'exp', got {freq_param!r}")
        if not decay_init > 0:
            raise ValueError(f"decay_init must be positive, got {decay_init}")
        self.dim, self.axes, self.num_heads = dim, axes, num_heads
        self.init, self.freq_param = init, freq_param
        P = dim // 2
        A = 1 if axes is None else axes
        heads = () if num_heads is None else (num_heads,)
        # initial magnitudes and owning axes / directions
        if axes is None or init == "axial":
            if axes is not None and P % A:
                raise ValueError(f"init='axial' needs dim/2 = {P} planes divisible by axes = {A}")
            per = P // A
            mag = base ** (-2.0 * torch.arange(per, dtype=F64) / (2 * per))  # axial_rope's schedule
            mag = mag.repeat(A)  # (P,)
            owner = torch.arange(P) // per  # (P,)
            mask = torch.zeros(A, P, dtype=F64)
            mask[owner, torch.arange(P)] = 1.0
            self.register_buffer("mask", mask)
            direction = None
        else:
            if P % 2:
                raise ValueError(f"init='mixed' needs an even number of planes, got {P}")
            q = P // 2
            mag = (base ** (-torch.arange(q, dtype=F64) / q)).repeat(2)  # RoPE-Mixed: base^(-4i/dim)
            g = torch.Generator().manual_seed(seed)
            phi = torch.rand(*heads, 1, generator=g, dtype=F64) * 2 * math.pi
            phi = torch.cat([phi.expand(*heads, q), (phi + math.pi / 2).expand(*heads, q)], dim=-1)  # (*H, P)
            direction = torch.stack([torch.cos(phi), torch.sin(phi)], dim=-2)  # (*H, 2, P)
            if A != 2:
                direction = torch.randn(*heads, A, P, generator=g, dtype=F64)
            self.mask = None
        mag = mag.expand(*heads, P).clone()
        raw = _inv_softplus(mag) if freq_param == "softplus" else torch.log(mag)
        self.raw_freq = nn.Parameter(raw.to(dtype))  # (*H, P)
        self.raw_direction = None if direction is None else nn.Parameter(direction.to(dtype))
        self.raw_rate = None
        if decay:
            r = torch.full((*heads, A, P), float(decay_init), dtype=F64)
            self.raw_rate = nn.Parameter(_inv_softplus(r).to(dtype))
        self.skew = nn.Parameter(torch.zeros(dim, dim, dtype=dtype)) if basis == "orthogonal" else None

    # ------------------------------------------------------------------ the parametrisation
    def magnitudes(self) -> torch.Tensor:
        """``|ω_k| > 0``, shape ``(*heads, planes)``."""
        return Fn.softplus(self.raw_freq) if self.freq_param == "softplus" else torch.exp(self.raw_freq)

    def frequencies(self) -> torch.Tensor:
        """``ω``: ``(*heads, planes)`` for one axis, else ``(*heads, axes, planes)``."""
        mag = self.magnitudes()
        if self.axes is None:
            return mag
        if self.raw_direction is None:
            return mag.unsqueeze(-2) * self.mask.to(mag.dtype)  # (*H, A, P)
        d = self.raw_direction
        return mag.unsqueeze(-2) * d / d.norm(dim=-2, keepdim=True).clamp_min(1e-30)

    def rates(self) -> torch.Tensor | None:
        """``λ = −softplus(raw) ≤ 0`` or ``None``; shape like :meth:`frequencies`."""
        if self.raw_rate is None:
            return None
        r = -Fn.softplus(self.raw_rate)
        return r.squeeze(-2) if self.axes is None else r

    def basis(self) -> torch.Tensor | None:
        """The orthogonal basis ``P = exp(S − Sᵀ)`` or ``None``."""
        if self.skew is None:
            return None
        return torch.linalg.matrix_exp(self.skew - self.skew.transpose(-1, -2))

    def forward(self) -> Generator | AxesGenerator:
        w = self.frequencies()
        r = self.rates()
        if r is None:
            r = torch.zeros_like(w)
        P = self.dim // 2
        cplx = [True] * P
        if self.axes is None:
            return Generator(r, w, [1] * P, complex=cplx, basis=self.basis())
        return AxesGenerator(r, w, [1] * P, complex=cplx, basis=self.basis())


class LearnableEncoding(nn.Module):
    """A :class:`LearnableGenerator` with a layout: ``forward()`` returns the current encoding.

    Keyword arguments are those of :class:`LearnableGenerator`, plus ``layout``. ``query`` and
    ``key`` are shortcuts for ``self().query`` / ``self().key`` (one encoding is built per call).
    """

    def __init__(self, dim: int, *, layout: str = "interleaved", **kwargs: Any) -> None:
        super().__init__()
        self.generator = LearnableGenerator(dim, **kwargs)
        self.layout = layout
        self.dim = dim

    def forward(self) -> Encoding:
        g = self.generator()
        if isinstance(g, AxesGenerator):
            return AxesEncoding(g, layout=self.layout, name="learnable")
        return Encoding(g, layout=self.layout, name="learnable")

    def query(self, q: torch.Tensor, positions: Any = None) -> torch.Tensor:
        return self().query(q, positions)

    def key(self, k: torch.Tensor, positions: Any = None) -> torch.Tensor:
        return self().key(k, positions)
