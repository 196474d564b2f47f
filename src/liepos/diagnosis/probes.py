"""Asking a black-box encoder: basis vectors in, the bridge matrix ``M(t, s) = F(t)ᵀ G(s)`` out.

An encoder is a callable ``(x: (batch, heads, seq, dim), positions: (seq,) or (seq, axes)) -> tensor``
(or a tuple whose first item is that tensor). :class:`Probe` calls it with vectors placed at the
positions and reads one head back in float64; whatever it returns is checked, so a wrong shape or a
NaN/inf is a :class:`ProbeError` that says which probe asked and what came back. :class:`Bridge` holds
every ``M(t, s)`` for the positions of one call.

>>> import torch, liepos as lp
>>> enc = lp.rope(4)
>>> p = torch.tensor([0.0, 1.5, 4.0], dtype=torch.float64)
>>> br = Bridge(Probe(enc.query, 4, "query"), Probe(enc.key, 4, "key"), 4, p, "bridge")
>>> A = enc.generator.matrix().to(torch.float64)  # X, dense
>>> bool(torch.allclose(torch.as_tensor(br.M(4.0, 1.5)), torch.linalg.matrix_exp(2.5 * A)))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["TINY", "Bridge", "Encoder", "Linearized", "Probe", "ProbeError", "Side", "rel"]

Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# a norm below this is "zero" when it divides a residual (float64's smallest normal is ~2.2e-308)
TINY = 1e-300
# how many positions a message lists before "..."
_SHOWN = 8


class ProbeError(ValueError):
    """The encoder answered a probe with something that is not a finite ``(batch, heads, seq, dim_out)`` tensor."""


def _positions_text(positions: torch.Tensor) -> str:
    vals = positions.tolist()
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vals[:_SHOWN])
    return f"[{shown}{', ...' if len(vals) > _SHOWN else ''}] ({len(vals)} positions)"


class Probe:
    """One side (query or key) of an encoder, called on vectors placed at every position of one tensor.

    ``dim``: the probe vectors' dim; ``side``: ``"query"`` or ``"key"`` (for messages); ``heads``: the
    heads of the input; ``head``: the head read back; ``dtype``: the dtype the vectors are given in.
    """

    def __init__(self, fn: Encoder, dim: int, side: str, *, dtype: torch.dtype = torch.float64,
                 heads: int = 1, head: int = 0) -> None:
        self.fn, self.dim, self.side, self.dtype, self.heads, self.head = fn, dim, side, dtype, heads, head

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, what: str) -> torch.Tensor:
        """``x``: (n, P, d) vectors (or (n, d): the same vector at every position) -> (n, P, d_out) float64.

        ``what`` names the probe in a :class:`ProbeError`."""
        P = positions.shape[0]
        if x.dim() == 2:
            x = x[:, None, :].expand(-1, P, -1)  # (n, d) -> (n, P, d)
        xx = x.to(self.dtype)[:, None].expand(-1, self.heads, -1, -1).contiguous()  # (n, P, d) -> (n, heads, P, d)
        y = self.fn(xx, positions)
        if isinstance(y, tuple | list) and y:
            y = y[0]
        where = f"the {self.side} encoder, asked by the {what} probe at positions {_positions_text(positions)},"
        if not isinstance(y, torch.Tensor) or y.dim() != 4 or y.shape[:3] != xx.shape[:3]:
            got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else f"a {type(y).__name__}"
            raise ProbeError(f"{where} must return a tensor (batch, heads, seq, dim_out) for an input of shape "
                             f"{tuple(xx.shape)}; got {got}")
        if not y.dtype.is_floating_point:
            raise ProbeError(f"{where} must return a real floating tensor; got dtype {y.dtype}")
        out = y[:, self.head].detach().to(torch.float64)  # (n, heads, P, d_out) -> (n, P, d_out)
        bad = ~torch.isfinite(out)
        if bad.any():
            nan, inf = int(out.isnan().sum()), int(out.isinf().sum())
            first = positions[bad.any(-1).any(0)].tolist()[:_SHOWN]
            raise ProbeError(f"{where} returned non-finite values ({nan} NaN and {inf} inf of {out.numel()} "
                             f"outputs; first at positions {first}): the diagnosis needs finite outputs")
        return out


class Linearized:
    """The encoder with a detected additive part removed (``"affine"``) or a per-vector norm undone
    (``"normalized"``): ``f(x) − f(0)`` or ``f(x) · rms(x)``."""

    def __init__(self, probe: Probe, mode: str) -> None:
        self.probe, self.mode, self.side = probe, mode, probe.side

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, what: str) -> torch.Tensor:
        y = self.probe(x, positions, what)
        if self.mode == "affine":
            zero = torch.zeros(1, self.probe.dim, dtype=torch.float64)
            return y - self.probe(zero, positions, what)
        xx = x if x.dim() == 3 else x[:, None, :]  # (n, d) -> (n, 1, d)
        rms = xx.to(torch.float64).pow(2).mean(-1, keepdim=True).sqrt()  # (n, P or 1, 1)
        return y * rms


# one side (query or key) of the encoding under probe, as the diagnosis reads it
Side = Probe | Linearized


def rel(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """``|a − b| / max(|a|, |b|)`` (Frobenius), or inf when either is not finite."""
    a = np.asarray(a.detach() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b = np.asarray(b.detach() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.inf
    den = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), TINY)
    return float(np.linalg.norm(a - b)) / den


class Bridge:
    """All ``M(t, s) = F(t)ᵀ G(s)`` for t, s in one positions tensor: one query call and one key call."""

    def __init__(self, fq: Side, fk: Side, dim: int, positions: torch.Tensor, what: str) -> None:
        eye = torch.eye(dim, dtype=torch.float64)
        self.pos = positions
        # (d, P, d_out) -> (P, d, d_out): row i of Q[p] is F(p) e_i (numpy: small matmuls are fast there)
        self.Q = np.ascontiguousarray(fq(eye, positions, what).permute(1, 0, 2).numpy())
        self.K = np.ascontiguousarray(fk(eye, positions, what).permute(1, 0, 2).numpy())
        self.index = {float(p): i for i, p in enumerate(positions.tolist())}

    def M(self, t: float, s: float) -> np.ndarray:
        i, j = self.index[float(t)], self.index[float(s)]
        return self.Q[i] @ self.K[j].T  # (d, d): M_ij = <F(t) e_i, G(s) e_j>
