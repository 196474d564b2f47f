"""A bias linear in the lag (ALiBi's slots), split at an origin for the fused kernel.

Scores ``content + b_h − m_h (t − s)`` are read as per-head slopes and offsets (:func:`linear_bias`, from
the slots at lags 0 and 1); around an origin ``o`` the bias splits into ``m_h (s − o)`` per key, the flash
kernel's additive mask (:func:`bias_mask`), and ``b_h − m_h (t − o)`` per row, which the softmax does not
see (only a sink does: :func:`key_bias`). :func:`constant_bias` says whether the bias may be read once as
numbers (nothing asks for its gradient).
"""

from __future__ import annotations

import torch

from liepos.attention_call import LOW, Call
from liepos.encoding import Encoding

__all__ = ["constant_bias", "bias_mask", "key_bias", "linear_bias", "linear_bias_slopes"]


def constant_bias(enc: Encoding, *times: torch.Tensor) -> bool:
    """Whether the slots' bias may be read once as numbers (the kernel's mask has no gradient): nothing
    asks for one, neither the slots and generator nor the ``times`` (learned positions)."""
    g = enc.generator
    params = (enc.query_slots, enc.key_slots, g.rates, g.freqs, g.nus, *times)
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in params))


def bias_mask(slopes: torch.Tensor, rel: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-key part ``m_h (s − o)`` of a linear bias as the flash kernel's additive mask
    ``(B, H, 1, S)`` from the slopes ``(H,)`` and the keys' times from the origin ``rel (B, S)``, in the
    type the kernel reads with queries of ``dtype`` (float32 for half precision, else that dtype)."""
    work = torch.float32 if dtype in LOW else dtype
    return (slopes.view(1, -1, 1, 1) * rel.unsqueeze(1).unsqueeze(1)).to(work)  # (H,) ⊗ (B, S) -> (B, H, 1, S)


def key_bias(call: Call, slopes: tuple[torch.Tensor, torch.Tensor], rel: torch.Tensor, tq: torch.Tensor,
              o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear bias ``b_h − m_h (t − s)`` split at the origin: ``m_h (s − o)`` per key, the flash
    kernel's additive mask ``(B, H, 1, S)`` (float32 for half precision), and ``r = b_h − m_h (t − o)``
    per row, which softmax does not see; only a sink does, so its logit becomes ``s_h − r`` per row
    ``(B, H, Sq)`` (None without sinks)."""
    m, b0 = slopes  # (H,) float64
    beta = bias_mask(m, rel, call.q.dtype)  # (B, H, 1, S)
    if call.sinks is None:
        return beta, None
    r = b0.view(1, -1, 1) - m.view(1, -1, 1) * (tq - o).unsqueeze(1)  # (B, H, Sq) float64
    s = call.sinks.float() if call.sinks.dtype in LOW else call.sinks  # r spans ±m·allowed: not in bfloat16
    return beta, s.view(1, -1, 1) - r.to(s.dtype)



# slopes by (encoding version, heads): read once per parameter state, not per call (a few ms each)
_SLOPES: dict[tuple, tuple[torch.Tensor, torch.Tensor] | None] = {}


def linear_bias_slopes(call: Call) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`linear_bias` of the call's encoding at its query heads (None with values carried by a generator)."""
    if call.venc is not None or call.q.shape[0] == 0:
        return None
    return linear_bias(call.enc, call.q.shape[1])


def linear_bias(enc: Encoding, heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-head slopes ``m_h > 0`` and offsets ``b_h`` ``(heads,)`` float64 when every score is
    ``content + b_h − m_h (t − s)`` with orthogonal content (rotations or identity, which keep norms)
    and slots carrying a bias of degree one in the lag, as ALiBi's do; else None. The bias is read from
    the slots at lags 0 and 1 in float64, once per version of the encoding (its parameters' storages
    and in-place versions)."""
    if not enc.num_slots or enc.generator.basis is not None:
        return None
    key = (enc.version, heads)
    if key not in _SLOPES:
        if len(_SLOPES) >= 64:
            _SLOPES.pop(next(iter(_SLOPES)))
        _SLOPES[key] = _read_slopes(enc, heads)
    return _SLOPES[key]


def _read_slopes(enc: Encoding, H: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    g = enc.generator
    rates, freqs = g.rates.detach().reshape(-1, g.num_blocks), g.freqs.detach().reshape(-1, g.num_blocks)
    for i, (n, off) in enumerate(zip(g.sizes, g.offsets)):
        slot = off >= enc.content_dim
        if bool((rates[:, i] != 0).any()) or n > (2 if slot else 1) or (slot and bool((freqs[:, i] != 0).any())):
            return None
    with torch.no_grad():
        z = torch.zeros(1, H, 2, enc.content_dim, dtype=torch.float64)
        qs = enc.query(z, torch.tensor([0.0, 1.0], dtype=torch.float64))[..., enc.content_dim:]  # (1, H, 2, slots)
        ks = enc.key(z[:, :, :1], torch.tensor([0.0], dtype=torch.float64))[..., enc.content_dim:]  # (1, H, 1, slots)
        b = (qs * ks).sum(-1)[0]  # (H, 2): the bias at lags 0 and 1
    m = b[:, 0] - b[:, 1]  # (H,)
    return (m, b[:, 0]) if bool(torch.isfinite(b).all()) else None
