"""Attention over keys split into pieces, each a fused kernel, merged exactly by their log-sum-exps.

A query block of a re-centred encoding sees the keys before it (every one of them: no mask) and the
keys of its own block (causally: ``is_causal``). Each piece runs the CPU flash kernel, which returns
its output ``o_i`` and log-sum-exp ``L_i``; the merge is exact::

    L = log(Σ_i e^{L_i} [+ e^{s_h}])          O = Σ_i e^{L_i − L} o_i

(a learned sink ``s_h`` joins the denominator only). The backward is the flash backward of each
piece with the *merged* ``O`` and ``L`` (the softmax probabilities and ``rowsum(dO ∘ O)`` of the whole
row), summed over pieces; the sink's gradient is ``−Σ_t e^{s_h − L_t} rowsum(dO ∘ O)_t``. No mask is
ever materialised.

>>> import torch
>>> q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
>>> seen = torch.ones(3, 6).tril(3).bool()          # queries at times 3, 4, 5 see keys up to theirs
>>> whole = torch.nn.functional.scaled_dot_product_attention(q[:, :, 3:], k, v, attn_mask=seen)
>>> split = pieces(q[:, :, 3:], [(k[:, :, :3], v[:, :, :3], False), (k[:, :, 3:], v[:, :, 3:], True)], 8 ** -0.5)
>>> bool(torch.allclose(whole, split))
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn

__all__ = ["pieces", "available"]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def available(q: torch.Tensor) -> bool:
    """The merged-pieces kernel runs here: a CPU tensor, eager (the flash op's log-sum-exp is CPU-only)."""
    return q.device.type == "cpu" and not torch.compiler.is_compiling()


class _Pieces(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, sinks, c, causal, *kv):  # type: ignore[override]
        outs, lses = [], []
        for i, is_causal in enumerate(causal):
            o, L = _flash(q, kv[2 * i], kv[2 * i + 1], 0.0, is_causal, scale=c)
            outs.append(o)
            lses.append(L)  # (B, H, Sq) float32 (bfloat16 inputs) or q's dtype
        L = torch.stack(lses).logsumexp(0)  # (B, H, Sq)
        if sinks is not None:
            L = torch.logaddexp(L, sinks.to(L.dtype).view(1, -1, 1))
        O = sum((torch.exp(Li - L).unsqueeze(-1) * oi.to(L.dtype) for Li, oi in zip(lses, outs)))
        O = O.to(q.dtype)
        ctx.c, ctx.causal, ctx.has_sinks = c, causal, sinks is not None
        ctx.save_for_backward(q, O, L, *(() if sinks is None else (sinks,)), *kv)
        return O

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO):  # type: ignore[override]
        q, O, L, *rest = ctx.saved_tensors
        sinks = rest.pop(0) if ctx.has_sinks else None
        dO = dO.contiguous()
        dq = torch.zeros_like(q)
        grads = []
        for i, is_causal in enumerate(ctx.causal):
            gq, gk, gv = _flash_backward(dO, q, rest[2 * i], rest[2 * i + 1], O, L, 0.0, is_causal, scale=ctx.c)
            dq = dq + gq
            grads += [gk, gv]
        ds = None
        if sinks is not None:
            rowsum = (dO.to(L.dtype) * O.to(L.dtype)).sum(-1)  # (B, H, Sq)
            ds = -(torch.exp(sinks.to(L.dtype).view(1, -1, 1) - L) * rowsum).sum((0, 2)).to(sinks.dtype)
        return (dq, ds, None, None, *grads)


def pieces(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor, bool]], c: float,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(c · q [k_1; k_2; …]ᵀ) [v_1; v_2; …]`` over pieces ``(k_i, v_i, is_causal)``, in ``q``'s dtype.

    ``q (B, H, Sq, D)``; ``k_i (B, Hk, S_i, D)``, ``v_i (B, Hk, S_i, Dv)``, ``Hk`` dividing ``H``;
    an ``is_causal`` piece is the square diagonal block (``S_i = Sq``). Empty pieces are skipped.
    The flash kernel wants one head size: the narrower of q/k and v is padded with zero columns
    (zeros change no score and no output column).
    """
    D, Dv = q.shape[-1], parts[0][1].shape[-1]
    parts = [(k, v, cz) for k, v, cz in parts if k.shape[2]]
    g = q.shape[1] // parts[0][0].shape[1]
    if g > 1:  # grouped queries: (B, Hk, S_i, ·) -> (B, H, S_i, ·)
        parts = [(k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), cz) for k, v, cz in parts]
    if Dv < D:
        parts = [(k, Fn.pad(v, (0, D - Dv)), cz) for k, v, cz in parts]  # (B, H, S_i, D)
    elif D < Dv:
        q = Fn.pad(q, (0, Dv - D))  # (B, H, Sq, Dv)
        parts = [(Fn.pad(k, (0, Dv - D)), v, cz) for k, v, cz in parts]
    kv = [t.to(q.dtype) for k, v, _ in parts for t in (k, v)]
    out = _Pieces.apply(q, sinks, c, tuple(cz for *_, cz in parts), *kv)
    return out[..., :Dv] if Dv < D else out
