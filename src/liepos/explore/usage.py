"""How much each block of the spectrum is used: every block's share of the query–key magnitude, per head.

For a head with blocks ``b`` (the canonical blocks of its encoding: a plane, a real dim, a Jordan
block), the share of block ``b`` is ``E_t[|q_b(t)|·|k_b(t)|] / Σ_b' E_t[|q_b'(t)|·|k_b'(t)|]``
over the tokens of a batch, ``q_b``, ``k_b`` the query's and key's coordinates in that block
(learned couplings applied, ``q·p``, ``k/p``). A block whose share is near 0 contributes nothing to
the score whatever its rate and frequency; the map (:func:`liepos.explore.report.plot_map`)
colours every block with it, so the colour is measured per block.
"""

from __future__ import annotations

import torch

__all__ = ["block_usage"]


@torch.no_grad()
def block_usage(model, x: torch.Tensor) -> list[dict]:
    """Per layer and head group: ``blocks`` ``[(λ, ω, n)]`` per head and ``share`` (heads, blocks), rows summing to 1.

    ALiBi's slot block (no query or key coordinates) is left out."""
    inputs: list[torch.Tensor] = []
    hooks = [blk.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for blk in model.blocks]
    was = model.training
    model.eval()
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    out = []
    for li, (blk, h) in enumerate(zip(model.blocks, inputs)):
        B, S, _ = h.shape
        qkv = blk.qkv(blk.ln1(h)).view(B, S, 3, blk.heads, blk.head_dim)  # (B, S, 3, H, hd)
        q, k = qkv[:, :, 0], qkv[:, :, 1]  # (B, S, H, hd)
        for gi, ((a, b), m) in enumerate(zip(blk.spans, blk.encoders)):
            enc, p = m.canonical()
            qg, kg = q[:, :, a:b].double(), k[:, :, a:b].double()  # (B, S, h, hd)
            if p is not None:
                qg, kg = qg * p.to(qg), kg / p.to(kg)
            g, perm = enc.generator, enc.plan.perm.tolist()
            rates = g.rates.detach().reshape(-1, g.num_blocks).expand(b - a, -1)  # (h, blocks)
            freqs = g.freqs.detach().reshape(-1, g.num_blocks).expand(b - a, -1)  # (h, blocks)
            energy, blocks, c = [], [], 0
            for i, (n, cplx) in enumerate(zip(g.sizes, g.complex)):
                width = n * (2 if cplx else 1)
                dims = [perm[j] for j in range(c, c + width) if perm[j] < blk.head_dim]
                c += width
                if not dims:  # the slot block
                    continue
                e = qg[..., dims].norm(dim=-1) * kg[..., dims].norm(dim=-1)  # (B, S, h)
                energy.append(e.mean((0, 1)))  # (h,)
                blocks.append(i)
            E = torch.stack(energy, -1)  # (h, kept blocks)
            share = E / E.sum(-1, keepdim=True).clamp_min(1e-300)
            out.append({"layer": li, "group": gi, "spec": getattr(m, "name", ""), "share": share.tolist(),
                        "blocks": [[(float(rates[hh, i]), float(freqs[hh, i]), int(g.sizes[i])) for i in blocks]
                                   for hh in range(b - a)]})
    return out
