"""FlexAttention as the GPU path where the slots reduce to a per-head bias linear in the lag (ALiBi).

``softmax(c · qᵀ A(t − s) k + b_h(t − s)) v`` with an orthogonal content part (rotation, NoPE: ``qᵀ A(t − s) k``
is the product of the encoded q and k, nothing to re-centre) and slots whose bias is
``b_h(u) = β_h + μ_h u`` (ALiBi: ``β = 0``, ``μ = −m_h``): the content is encoded once by the fast
apply, and the bias is a ``score_mod`` of :func:`torch.nn.attention.flex_attention.flex_attention`, so no
slot columns and no (seq × seq) bias are ever formed. ``β`` and ``μ`` are read off the encoding itself
(its slot scores at lags 0, 1, 2, the last a check that the bias is linear), never assumed.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from liepos.encoding import Encoding

__all__ = ["lag_bias", "alibi_score_mod", "flex_attention"]


def lag_bias(enc: Encoding) -> tuple[torch.Tensor, torch.Tensor]:
    """``(β, μ)`` per head, float64 ``(heads,)``: the slots' bias ``slots_qᵀ A(u) slots_k = β + μ u``.

    Raises ValueError when the encoding has no slots, a content part that is not orthogonal (its scores
    need re-centring, which a score_mod of the encoded q, k cannot give), or a bias that is not linear in u.
    """
    if enc.num_slots == 0:
        raise ValueError(f"`enc` must carry slots (a bias of the lag), got {enc.name!r} with none")
    g = enc.generator
    content = enc.content_dim
    if bool((g.rates[..., :content] != 0).any()):
        raise ValueError(f"`enc` must have an orthogonal content part (rotation or NoPE), got {enc.name!r} "
                         "whose content decays or grows: use lp.attention")
    H = enc.num_heads or 1
    zeros = torch.zeros(1, H, 1, content, dtype=torch.float64)
    key = enc.key(zeros, [0.0])
    b = torch.stack([(enc.query(zeros, [u]) * key).sum(-1).flatten() for u in (0.0, 1.0, 2.0)])  # (3, H)
    beta, mu = b[0], b[1] - b[0]
    if not torch.allclose(b[2], beta + 2 * mu, rtol=1e-12, atol=1e-12):
        raise ValueError(f"the slots of {enc.name!r} give a bias that is not linear in the lag: {b.T.tolist()}")
    return beta, mu


def alibi_score_mod(beta: torch.Tensor, mu: torch.Tensor, q_offset: int, causal: bool) -> Callable:
    """``score + β_h + μ_h (t − s)`` with ``t = q_offset + q_idx``, ``s = kv_idx`` (−∞ where ``s > t`` when causal)."""

    def score_mod(score, b, h, q_idx, kv_idx):
        lag = (q_idx + q_offset - kv_idx).to(score.dtype)
        out = score + beta[h] + mu[h] * lag
        return torch.where(lag >= 0, out, -float("inf")) if causal else out

    return score_mod


@functools.lru_cache(maxsize=1)
def _compiled(flex: Callable) -> Callable:
    return torch.compile(flex)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enc: Encoding, causal: bool = True,
                   scale: float | None = None) -> torch.Tensor:
    """``softmax(c · qᵀ A(t − s) k + β_h + μ_h (t − s)) v`` through FlexAttention (``c = logit_scale · scale``).

    Self-attention at times ``0 … k_seq − 1`` with the queries the last ``q_seq`` of them, as
    :func:`liepos.attention` takes them by default; ``scale`` defaults to ``1/√(content dim)``.
    Equal to ``lp.attention(q, k, v, enc, causal=causal, scale=scale)`` (tests/test_attention_flex.py).
    """
    from torch.nn.attention.flex_attention import flex_attention as flex

    if q.is_cuda:
        flex = _compiled(flex)  # one fused kernel on a GPU; eager (scores materialised) elsewhere
    beta, mu = lag_bias(enc)
    Sq, Sk = q.shape[-2], k.shape[-2]
    if not causal:  # a bias of the lag is not symmetric in it
        raise ValueError(f"causal=False leaves the family for {enc.name!r} (its bias changes sign with the lag): "
                         "use lp.attention(..., allow_bidirectional=True)")
    content = enc.content_dim
    qe = enc.query(q, torch.arange(Sk - Sq, Sk, dtype=torch.float64))[..., :content]
    ke = enc.key(k, torch.arange(Sk, dtype=torch.float64))[..., :content]
    c = enc.logit_scale * (1.0 / math.sqrt(content) if scale is None else scale)
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    if enc.num_heads is None:  # slots shared by every head: one (β, μ), read by each of q's heads
        beta, mu = beta.expand(q.shape[1]), mu.expand(q.shape[1])  # (1,) -> (H,)
    mod = alibi_score_mod(beta.to(q.device, dt), mu.to(q.device, dt), Sk - Sq, causal)
    return flex(qe, ke, v, score_mod=mod, scale=c, enable_gqa=q.shape[1] != k.shape[1])
