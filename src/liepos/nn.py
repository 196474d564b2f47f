"""Learned time and learned generators that stay in the family, whatever the optimiser does.

:class:`Clock` turns hidden states into non-decreasing real times::

    t_i = start + Σ_{j ≤ i} (min_step + softplus(gate(h_j)))

:class:`LearnableGenerator` / :class:`LearnableEncoding` map every parameter onto the family by
construction, so no optimiser step can leave it and the encoding stays *exactly* relative after
training (``lp.diagnose`` agrees):

* frequencies positive: ``ω = softplus(raw)`` (or ``exp(raw)``); with several axes each plane has a
  frequency *vector* ``ω_k = |ω_k| · d_k`` with ``|ω_k| = softplus(raw)`` and a free direction
  ``d_k = raw_dir / ‖raw_dir‖`` (RoPE-Mixed), or one owning axis (axial);
* rates ``λ = −softplus(raw) ≤ 0``: decay, never growth;
* a learned orthogonal basis ``P = exp(S − Sᵀ)`` (STRING, Schenck et al. 2025): ``X = P J Pᵀ``; the
  generators of different axes share ``P`` and stay commuting.

A module's ``forward()`` returns a fresh :class:`~liepos.Encoding` whose tensors are functions of the
parameters, so gradients flow from the attention loss into them::

    pe = LearnableEncoding(64, axes=2, decay=True, basis="orthogonal")
    opt = torch.optim.Adam(pe.parameters())
    out = lp.attention(q, k, v, pe(), positions=t, key_positions=t)

>>> import torch, liepos as lp
>>> bool(torch.allclose(LearnableEncoding(8)().generator.freqs, lp.rope(8).generator.freqs))
True
>>> t = Clock(4)(torch.zeros(1, 3, 4))
>>> bool(torch.allclose(t.diff(dim=-1), torch.ones(1, 2, dtype=t.dtype)))  # one unit per token at start
True
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as Fn

from liepos._checks import check_bool, check_choice, check_int, check_real, describe
from liepos.catalogue import rope_freqs
from liepos.encoding import Encoding
from liepos.generator import Generator
from liepos.tables import LAYOUTS

__all__ = ["Clock", "LearnableEncoding", "LearnableGenerator", "inverse_softplus"]

# a direction vector shorter than this is treated as this long (its norm divides it)
_MIN_DIRECTION_NORM = 1e-30


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """``x`` with ``softplus(x) = y`` for ``y > 0``: ``log(expm1(y))``, written stably for large y.

    >>> import torch
    >>> y = torch.tensor([1e-3, 1.0, 50.0], dtype=torch.float64)
    >>> bool(torch.allclose(torch.nn.functional.softplus(inverse_softplus(y)), y))
    True
    """
    return y + torch.log(-torch.expm1(-y))


class Clock(nn.Module):
    """Hidden states ``(batch, seq, hidden)`` or ``(seq, hidden)`` -> times ``(batch, seq)`` / ``(seq,)``.

    Args:
        hidden_dim: width of the hidden states.
        init_step: the step Δt every token takes at initialisation (the gate's weight starts at 0,
            its bias at ``softplus⁻¹(init_step − min_step)``): the clock starts as ``1, 2, 3, …``.
        min_step: a floor on every step (> 0 makes times strictly increasing).
        out_dtype: dtype of the times (float64 by default: a cumulative sum over long sequences
            keeps its precision; the encodings compute in float64 anyway).
        dtype, device: of the gate's parameters.

    Works with every encoding (``lp.attention(q, k, v, enc, positions=t, key_positions=t)``; the causal
    mask follows the times) and with :class:`liepos.KVCache`, which stores times: feeding the chunks of
    a sequence with ``start`` = the last time so far gives the times of the whole sequence.
    The defining identity: ``t_i − t_{i−1} = min_step + softplus(gate(h_i)) ≥ min_step``.
    """

    def __init__(
        self,
        hidden_dim: int,
        *,
        init_step: float = 1.0,
        min_step: float = 0.0,
        out_dtype: torch.dtype = torch.float64,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.hidden_dim = check_int("hidden_dim", hidden_dim, min=1)
        self.min_step = check_real("min_step", min_step, nonnegative=True)
        init_step = check_real("init_step", init_step, min=self.min_step)
        if not init_step > self.min_step:
            raise ValueError(f"`init_step` must be > min_step ({self.min_step}), got {init_step}")
        if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
            raise TypeError(f"`out_dtype` must be a floating torch.dtype, got {describe(out_dtype)}")
        self.out_dtype = out_dtype
        self.gate = nn.Linear(self.hidden_dim, 1, dtype=dtype, device=device)
        with torch.no_grad():
            self.gate.weight.zero_()
            self.gate.bias.fill_(float(inverse_softplus(torch.tensor(init_step - self.min_step, dtype=torch.float64))))

    def steps(self, hidden: torch.Tensor) -> torch.Tensor:
        """The steps ``Δt_i = min_step + softplus(gate(h_i))``, shape ``hidden.shape[:-1]``."""
        if not isinstance(hidden, torch.Tensor) or hidden.dim() not in (2, 3):
            raise ValueError(
                f"`hidden` must be a tensor of shape (batch, seq, hidden) or (seq, hidden), got {describe(hidden)}"
            )
        if hidden.shape[-1] != self.hidden_dim:
            raise ValueError(f"`hidden` has width {hidden.shape[-1]} but the clock expects {self.hidden_dim}")
        g = self.gate(hidden.to(self.gate.weight.dtype)).squeeze(-1)  # (…, seq, 1) -> (…, seq)
        return self.min_step + Fn.softplus(g.to(self.out_dtype))

    def forward(self, hidden: torch.Tensor, start: Any = None) -> torch.Tensor:
        """Times ``t_i = start + Σ_{j≤i} Δt_j``; ``start``: the last time before this chunk (scalar or ``(batch,)``)."""
        t = torch.cumsum(self.steps(hidden), dim=-1)  # (…, seq)
        if start is not None:
            s = torch.as_tensor(start, dtype=self.out_dtype, device=t.device)
            if s.dim() == 1 and t.dim() == 2:
                s = s.unsqueeze(-1)  # (batch,) -> (batch, 1)
            elif s.dim() > 1:
                raise ValueError(f"`start` must be a scalar or (batch,), got shape {tuple(s.shape)}")
            t = t + s
        return t

    def extra_repr(self) -> str:
        return f"hidden_dim={self.hidden_dim}, min_step={self.min_step}, out_dtype={self.out_dtype}"


class LearnableGenerator(nn.Module):
    """Rotation planes (optionally damped) with learnable frequencies, rates and basis.

    Args:
        dim: head dim (even): ``dim/2`` rotation planes.
        axes: ``None`` for one position axis, else the number of axes (the Generator has ``axes=``).
        num_heads: per-head parameters when given.
        base: RoPE base of the initial frequencies (``base^(−2k/dim)``; with axes, as
            :func:`~liepos.axial_rope` for ``init="axial"`` or RoPE-Mixed for ``"mixed"``).
        init: with ``axes`` only: ``"axial"`` (the default; each plane owns one axis, its frequency
            positive) or ``"mixed"`` (each plane has a learned direction in position space; RoPE-Mixed).
        decay: learn rates ``λ = −softplus(raw) ≤ 0`` (per axis and plane); ``decay_init`` is their
            initial magnitude.
        basis: ``None`` or ``"orthogonal"`` (``P = matrix_exp(S − Sᵀ)``, starting at the identity).
        freq_param: ``"softplus"`` or ``"exp"``.
        seed: of the random initial directions (``init="mixed"``).
        dtype: of the parameters (float64 by default: the tables are float64 anyway).
    """

    def __init__(
        self,
        dim: int,
        *,
        axes: int | None = None,
        num_heads: int | None = None,
        base: float = 10000.0,
        init: str | None = None,
        decay: bool = False,
        decay_init: float = 0.01,
        basis: str | None = None,
        freq_param: str = "softplus",
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, min=2, even=True)
        self.axes = None if axes is None else check_int("axes", axes, min=1)
        self.num_heads = None if num_heads is None else check_int("num_heads", num_heads, min=1)
        if init is not None and axes is None:
            raise ValueError(f"`init` chooses how several position axes share the planes: it needs `axes`, got init={init!r}")
        self.init = check_choice("init", "axial" if init is None else init, ("axial", "mixed"))
        check_choice("basis", basis, (None, "orthogonal"))
        self.freq_param = check_choice("freq_param", freq_param, ("softplus", "exp"))
        decay_init = check_real("decay_init", decay_init, positive=True)
        base = check_real("base", base, positive=True)
        P, A = self.dim // 2, 1 if self.axes is None else self.axes
        heads: tuple[int, ...] = () if self.num_heads is None else (self.num_heads,)
        if self.init == "axial":
            mag, direction = self._axial(P, A, base), None
        else:
            mag, direction = self._mixed(P, A, base, heads, check_int("seed", seed, min=0))
        mag = mag.expand(*heads, P).clone()  # (P,) -> (*H, P)
        raw = inverse_softplus(mag) if freq_param == "softplus" else torch.log(mag)
        self.raw_freq = nn.Parameter(raw.to(dtype))  # (*H, P)
        self.raw_direction = None if direction is None else nn.Parameter(direction.to(dtype))
        self.raw_rate = None
        if check_bool("decay", decay):
            r = torch.full((*heads, A, P), decay_init, dtype=torch.float64)
            self.raw_rate = nn.Parameter(inverse_softplus(r).to(dtype))
        self.skew = nn.Parameter(torch.zeros(dim, dim, dtype=dtype)) if basis == "orthogonal" else None

    def _axial(self, P: int, A: int, base: float) -> torch.Tensor:
        """Each axis owns P/A consecutive planes with axial RoPE's frequencies; the owner mask is a buffer."""
        if P % A:
            raise ValueError(f"init='axial' needs dim/2 = {P} planes divisible by axes = {A}")
        per = P // A
        owner = torch.arange(P) // per  # (P,)
        mask = torch.zeros(A, P, dtype=torch.float64)
        mask[owner, torch.arange(P)] = 1.0
        self.register_buffer("mask", mask)
        return rope_freqs(2 * per, base).repeat(A)  # (P,)

    def _mixed(self, P: int, A: int, base: float, heads: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE-Mixed: magnitudes base^(−4i/dim) twice; per head a direction φ and φ + π/2 (random on A ≠ 2 axes)."""
        if P % 2:
            raise ValueError(f"init='mixed' needs an even number of planes, got {P}")
        q = P // 2
        self.mask: torch.Tensor | None = None  # axial init's buffer (A, P) of which axis owns a plane
        g = torch.Generator().manual_seed(seed)
        phi = torch.rand(*heads, 1, generator=g, dtype=torch.float64) * 2 * math.pi
        phi = torch.cat([phi.expand(*heads, q), (phi + math.pi / 2).expand(*heads, q)], dim=-1)  # (*H, 1) -> (*H, P)
        direction = torch.stack([torch.cos(phi), torch.sin(phi)], dim=-2)  # (*H, 2, P)
        if A != 2:
            direction = torch.randn(*heads, A, P, generator=g, dtype=torch.float64)
        return rope_freqs(P, base).repeat(2), direction

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
            if self.mask is None:
                raise RuntimeError("liepos: an axial LearnableGenerator without its plane mask; this is a bug")
            return mag.unsqueeze(-2) * self.mask.to(mag.dtype)  # (*H, 1, P) * (A, P) -> (*H, A, P)
        d = self.raw_direction
        return mag.unsqueeze(-2) * d / d.norm(dim=-2, keepdim=True).clamp_min(_MIN_DIRECTION_NORM)

    def rates(self) -> torch.Tensor | None:
        """``λ = −softplus(raw) ≤ 0`` or ``None``; shape like :meth:`frequencies`."""
        if self.raw_rate is None:
            return None
        r = -Fn.softplus(self.raw_rate)
        return r.squeeze(-2) if self.axes is None else r  # (*H, 1, P) -> (*H, P) for one axis

    def basis(self) -> torch.Tensor | None:
        """The orthogonal basis ``P = exp(S − Sᵀ)`` or ``None``."""
        if self.skew is None:
            return None
        return torch.linalg.matrix_exp(self.skew - self.skew.transpose(-1, -2))

    def forward(self) -> Generator:
        w = self.frequencies()
        r = self.rates()
        P = self.dim // 2
        return Generator(torch.zeros_like(w) if r is None else r, w, [1] * P, complex=[True] * P,
                         basis=self.basis(), axes=self.axes)


class LearnableEncoding(nn.Module):
    """A :class:`LearnableGenerator` with a layout: ``forward()`` returns the current encoding.

    Keyword arguments are those of :class:`LearnableGenerator`, plus ``layout``. ``query`` and
    ``key`` are shortcuts for ``self().query`` / ``self().key`` (one encoding is built per call).
    """

    def __init__(self, dim: int, *, layout: str = "interleaved", **kwargs: Any) -> None:
        super().__init__()
        self.generator = LearnableGenerator(dim, **kwargs)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.dim = self.generator.dim

    def forward(self) -> Encoding:
        return Encoding(self.generator(), layout=self.layout, name="learnable")

    def query(self, q: torch.Tensor, positions: Any = None) -> torch.Tensor:
        return self().query(q, positions)

    def key(self, k: torch.Tensor, positions: Any = None) -> torch.Tensor:
        return self().key(k, positions)
