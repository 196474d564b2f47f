"""The one call into ``scaled_dot_product_attention``: grouped queries, learned sinks, non-finite keys.

Learned attention sinks (GPT-OSS, StreamingLLM) add one logit ``s_h`` per head to the softmax
*denominator* only::

    o_t = Σ_j e^{z_tj} v_j / (Σ_j e^{z_tj} + e^{s_h})

which is softmax over the scores with a sink column ``s_h`` appended, the sink's value being zero. It
rides in the same fused kernel: queries gain one column ``s_h / c`` and a sink key ``[0 … 0, 1]``
(value 0) joins the keys, so its score is ``c · (s_h / c) · 1 = s_h`` and every other score is
unchanged. With ``is_causal`` the sink key comes first and a dummy query row keeps the top-left causal
alignment (query ``i + 1`` sees the sink and keys ``0 … i``); its row is dropped.

A key or value that is NaN or infinite must not reach a query that does not see it; the fused kernel
adds the mask to the scores (``NaN + (−∞) = NaN``) and multiplies hidden weights by values
(``0 · NaN = NaN``), so when the keys are not all finite the scores are masked by selection instead
and a non-finite value reaches exactly the rows that give it a positive weight.

>>> import torch
>>> q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64) for _ in range(3))
>>> s = torch.tensor([0.5, -1.0], dtype=torch.float64)
>>> out = sdpa(q, k, v, None, 8 ** -0.5, is_causal=True, sinks=s)
>>> z = (q @ k.transpose(-1, -2)) * 8 ** -0.5                  # (1, 2, 4, 4)
>>> z = z.masked_fill(~torch.ones(4, 4).tril().bool(), float("-inf"))
>>> z = torch.cat((z, s.view(1, 2, 1, 1).expand(1, 2, 4, 1)), -1)   # the sink column
>>> ref = torch.softmax(z, -1)[..., :4] @ v                          # ... dropped
>>> bool(torch.allclose(out, ref))
True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as Fn

__all__ = ["sdpa"]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, c: float, *,
         is_causal: bool = False, sinks: torch.Tensor | None = None, finite: bool = True) -> torch.Tensor:
    """``softmax(c · q kᵀ + mask) v`` (with a sink column when ``sinks`` is given), in ``v``'s dtype.

    ``q (B, H, Sq, D)``, ``k (B, Hk, Sk, D)``, ``v (B, Hk, Sk, Dv)``; ``Hk`` divides ``H``. ``mask``:
    boolean, broadcastable to ``(B, H, Sq, Sk)``, True = attend. ``finite``: the caller knows every key
    and value is finite (else the select-masked form runs).
    """
    out_dtype = v.dtype
    if v.dtype != q.dtype:
        # half-precision inputs with slots or Jordan blocks: encoded q and k stay float32; values
        # follow and the output is cast back once
        v = v.to(q.dtype)
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, dim=1)  # (B, Hk, Sk, D) -> (B, H, Sk, D)
        v = v.repeat_interleave(g, dim=1)  # (B, Hk, Sk, Dv) -> (B, H, Sk, Dv)
    drop = False
    if sinks is not None:
        q, k, v, mask, drop = _with_sink(q, k, v, mask, c, sinks, is_causal)
    if not finite:
        out = _select_masked(q, k, v, mask, c, is_causal)
    else:
        if mask is not None and mask.dtype == torch.bool:
            # an additive float mask: SDPA on the CPU is ~100x slower with a boolean mask (torch 2.13)
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, -math.inf)
        out = Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=c)
    if drop:
        out = out[:, :, 1:]
    return out.to(out_dtype)


def _with_sink(q, k, v, mask, c, sinks, is_causal):
    """Queries ``[q, s_h / c]``, keys ``[sink; k, 0]``, values ``[0; v]``; a dummy query when causal."""
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    s = (sinks.to(device=q.device, dtype=q.dtype) / c).view(1, H, 1, 1).expand(B, H, Sq, 1)  # (B, H, Sq, 1)
    q = torch.cat((q, s), -1)  # (B, H, Sq, D + 1)
    sink_key = torch.zeros(B, H, 1, k.shape[-1] + 1, dtype=k.dtype, device=k.device)
    sink_key[..., -1] = 1.0
    k = torch.cat((sink_key, torch.cat((k, k.new_zeros(B, H, Sk, 1)), -1)), 2)  # (B, H, 1 + Sk, D + 1)
    v = torch.cat((v.new_zeros(B, H, 1, v.shape[-1]), v), 2)  # (B, H, 1 + Sk, Dv)
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], Sk)
        mask = torch.cat((torch.ones_like(mask[..., :1]), mask), -1)  # (…, Sq, 1 + Sk): the sink is always seen
    if is_causal:
        q = torch.cat((q.new_zeros(B, H, 1, q.shape[-1]), q), 2)  # (B, H, 1 + Sq, D + 1)
    return q, k, v, mask, is_causal


def _select_masked(q, k, v, mask, c, is_causal):
    """Attention with the mask applied by selection, for keys or values that are not all finite."""
    Sq, Sk = q.shape[-2], k.shape[-2]
    z = (q @ k.transpose(-1, -2)) * c  # (B, H, Sq, Sk)
    seen = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if is_causal:
        seen = seen.tril()
    if mask is not None:
        seen = seen & mask
    w = torch.softmax(z.masked_fill(~seen, -math.inf), -1)
    bad = ~torch.isfinite(v)
    out = w @ v.masked_fill(bad, 0.0)
    # a non-finite value reaches the rows that weigh it: they become NaN, the others stay exact
    reach = ((w != 0).to(w.dtype) @ bad.to(w.dtype)) > 0  # (B, H, Sq, Dv)
    return out.masked_fill(reach, math.nan)
