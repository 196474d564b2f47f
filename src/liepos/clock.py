"""Learned time: a :class:`Clock` turns hidden states into non-decreasing real times.

The encodings only ever see times, and times may be any real numbers (irregular time series,
event streams, timestamps per batch element). A clock learns them::

    t_i = start + Σ_{j ≤ i} (min_step + softplus(gate(h_j)))

so ``t`` never decreases (``Δt_i ≥ min_step ≥ 0``): gates control Δt. It is differentiable in the
hidden states and in the gate, works with every encoding (``lp.attention(q, k, v, enc,
positions=t, key_positions=t)``; the causal mask follows the times) and with :class:`liepos.KVCache`,
which stores times: feeding the chunks of a sequence with ``start`` = the last time so far gives
the times of the whole sequence.

>>> import torch
>>> clock = Clock(4)
>>> t = clock(torch.zeros(1, 3, 4, dtype=torch.float32))
>>> [round(x, 6) for x in t[0].tolist()]  # at initialisation one unit per token
[1.0, 2.0, 3.0]
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as Fn

__all__ = ["Clock"]


def _inverse_softplus(y: float) -> float:
    # softplus(x) = y  <=>  x = log(expm1(y)), written stably for large y
    return y + math.log(-math.expm1(-y))


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
        if isinstance(hidden_dim, bool) or not isinstance(hidden_dim, int) or hidden_dim < 1:
            raise ValueError(f"hidden_dim must be a positive int, got {hidden_dim!r}")
        min_step, init_step = float(min_step), float(init_step)
        if not (min_step >= 0 and math.isfinite(min_step)):
            raise ValueError(f"min_step must be finite and >= 0, got {min_step}")
        if not (init_step > min_step and math.isfinite(init_step)):
            raise ValueError(f"init_step must be finite and > min_step ({min_step}), got {init_step}")
        if not out_dtype.is_floating_point:
            raise TypeError(f"out_dtype must be a floating dtype, got {out_dtype}")
        self.hidden_dim = hidden_dim
        self.min_step = min_step
        self.out_dtype = out_dtype
        self.gate = nn.Linear(hidden_dim, 1, dtype=dtype, device=device)
        with torch.no_grad():
            self.gate.weight.zero_()
            self.gate.bias.fill_(_inverse_softplus(init_step - min_step))

    def steps(self, hidden: torch.Tensor) -> torch.Tensor:
        """The steps ``Δt_i = min_step + softplus(gate(h_i))``, shape ``hidden.shape[:-1]``."""
        if not isinstance(hidden, torch.Tensor) or hidden.dim() not in (2, 3):
            raise ValueError(
                f"hidden must be a tensor of shape (batch, seq, hidden) or (seq, hidden), got "
                f"{tuple(getattr(hidden, 'shape', ()))}"
            )
        if hidden.shape[-1] != self.hidden_dim:
            raise ValueError(f"hidden has width {hidden.shape[-1]} but the clock expects {self.hidden_dim}")
        g = self.gate(hidden.to(self.gate.weight.dtype)).squeeze(-1)  # (…, seq)
        return self.min_step + Fn.softplus(g.to(self.out_dtype))

    def forward(self, hidden: torch.Tensor, start: Any = None) -> torch.Tensor:
        """Times ``t_i = start + Σ_{j≤i} Δt_j``; ``start``: the last time before this chunk (scalar or ``(batch,)``)."""
        t = torch.cumsum(self.steps(hidden), dim=-1)  # (…, seq)
        if start is not None:
            s = torch.as_tensor(start, dtype=self.out_dtype, device=t.device)
            if s.dim() == 1 and t.dim() == 2:
                s = s.unsqueeze(-1)  # (batch, 1)
            elif s.dim() > 1:
                raise ValueError(f"start must be a scalar or (batch,), got shape {tuple(s.shape)}")
            t = t + s
        return t

    def extra_repr(self) -> str:
        return f"hidden_dim={self.hidden_dim}, min_step={self.min_step}, out_dtype={self.out_dtype}"
