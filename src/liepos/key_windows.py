"""The key windows of a linear bias: per head, the first key a query block can weigh at all.

Under a bias ``b_h − m_h (t − s)`` with orthogonal content, a key far enough before a block scores below
every row's largest by more than the dtype's smallest normal times its rounding, for any data: such keys
are left out, exactly (:func:`window_starts`).
"""

from __future__ import annotations

import math

import torch

from liepos.attention_call import Call, row_norms

__all__ = ["window_starts"]


# the weight a left-out key may have, relative to its row's largest, is below e^-(_DROP + log Sk): past
# the dtype's smallest normal times its unit roundoff, so leaving it out changes no output by a rounding
def _drop(dtype: torch.dtype, n_keys: int) -> float:
    info = torch.finfo(dtype)
    return -math.log(info.tiny) - math.log(info.eps) + math.log(max(n_keys, 1))


def window_starts(call: Call, qe: torch.Tensor, lo: int, slopes: torch.Tensor, knorm: torch.Tensor) -> list[int]:
    """Per head, the first key the block ``lo:hi`` (``hi = lo + qe.shape[2]``) can weigh at all under a linear bias.

    Scores are ``c q̃ᵀk̃ + b − m d`` at lag ``d``, and ``|c q̃ᵀk̃| ≤ c |q̃||k|`` (orthogonal content: encoded
    norms are the raw ones). Every query ``t`` of the block sees its own key (equal times) and the
    nearest earlier key ``lo − 1``, so its row's largest score is at least ``b − low`` with
    ``low = min(C_own, C_near + m (t_last − s_{lo−1}))``: ``C_own`` from the block's own keys' norms,
    ``C_near`` from key ``lo − 1``'s, ``t_last`` the block's last query time. A key ``s`` before the block
    scores at most ``C_before + b − m (t₀ − s)`` (``t₀`` the block's first query time, ``C_before`` from
    the norms of the keys before it). Keys with ``m (t₀ − s) > C_before + low + _drop`` weigh less than
    the dtype's smallest normal times its rounding, relative to their row's largest, for any data: they
    are left out, exactly. Per batch row, the earliest start over the batch. ``knorm (B, Hk, Sk)``:
    every key's norm (float32), computed once per call.
    """
    D = call.enc.content_dim
    hi = lo + qe.shape[2]
    with torch.no_grad():
        H = qe.shape[1]
        qn = row_norms(qe[..., :D]).amax(2).double()  # (B, H): the block's largest query

        def per_head(kn: torch.Tensor) -> torch.Tensor:  # (B, Hk) -> (B, H), with room for the rounding
            return qn * kn.double().repeat_interleave(H // kn.shape[1], dim=1) * call.c * (1 + 1e-4)

        before = per_head(knorm[:, :, :lo].amax(2))  # (B, H)
        own = per_head(knorm[:, :, lo:hi].amax(2))  # (B, H)
        near = per_head(knorm[:, :, lo - 1])  # (B, H)
        m = slopes.clamp_min(0).view(1, -1)  # (1, H)
        gap = call.qpos[:, hi - 1 : hi] - call.kpos[:, lo - 1 : lo]  # (B, 1): the nearest earlier key's lag
        low = torch.minimum(own, near + m * gap)  # (B, H): the row's largest score is at least b − low
        # the kernel's work dtype: half precision accumulates in float32
        work = torch.float32 if qe.dtype in (torch.bfloat16, torch.float16) else qe.dtype
        reach = (before + low + _drop(work, call.kpos.shape[1])) / m  # (B, H): lags that may weigh
        t0 = call.qpos[:, lo : lo + 1]  # (B, 1): the block's earliest query time
        cut = (t0 - reach).nan_to_num(-math.inf)  # (B, H)
        kp = call.kpos[:, :lo].contiguous()
        first = torch.searchsorted(kp, cut.contiguous(), side="left").amin(0)  # (H,): earliest over the batch
    return [int(x) for x in first]
