"""Every catalogue encoding × every path × every memory layout of q, k and v equals the float64 reference.

Paths: causal attention over a unit ramp (plain SDPA for rotations, the tiled fused pieces for re-centred
encodings, ALiBi's per-key bias), real times (the block-wise fused path), a padding mask (masked SDPA,
the general re-centred path), sinks (the merged pieces), non-causal attention, a cache's prefill and
decode steps, and ``query`` / ``key`` out of place and in place. Layouts: contiguous, transposed
(BSHD memory), channels-last (heads innermost), expanded (stride 0), stepped (every other row and
column of a larger tensor) and a non-zero storage offset. A self-overlapping tensor written in place
is refused by name; everything else gives the reference's values.
"""

from __future__ import annotations

import pytest
import torch

import liepos as lp

F64 = torch.float64
B, H, S, D = 2, 2, 6, 8


def layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views holding values of x's shape in six memory layouts (each's values: ``view.contiguous()``)."""
    big = torch.zeros(*x.shape[:2], 2 * x.shape[2], 2 * x.shape[3], dtype=x.dtype)
    big[:, :, ::2, ::2] = x
    flat = torch.zeros(x.numel() + 5, dtype=x.dtype)
    offset = flat[5:].view(x.shape)
    offset.copy_(x)
    return {
        "contiguous": x,
        "transposed": x.transpose(1, 2).contiguous().transpose(1, 2),
        "channels_last": x.contiguous(memory_format=torch.channels_last),
        "expanded": x[:1, :1].expand(x.shape),
        "stepped": big[:, :, ::2, ::2],
        "offset": offset,
    }


def encodings() -> dict[str, lp.Encoding]:
    return {name: lp.build(name, D, H) for name in sorted(lp.CATALOGUE)}


def times(enc: lp.Encoding, real: bool, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if enc.num_axes is not None:  # several axes: any coordinates (causal follows the token order)
        p = torch.randint(0, 7, (S, enc.num_axes), generator=g).to(F64)
        return p + torch.rand(S, enc.num_axes, dtype=F64, generator=g) if real else p
    if real:
        return 3.0 + torch.cumsum(0.2 + 2 * torch.rand(S, dtype=F64, generator=g), 0)
    return 1000.0 + torch.arange(S, dtype=F64)


PATHS = ["causal", "real times", "padded", "sinks", "bidirectional", "decode"]


def run(path: str, enc: lp.Encoding, q, k, v, p, reference: bool = False) -> torch.Tensor:
    """The path's output (``reference``: ``attention_reference`` of the same call, float64)."""
    kw: dict = {}
    causal = path != "bidirectional"
    if path == "sinks":
        kw["sinks"] = torch.tensor([0.4, -0.9], dtype=F64)
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[0, 2] = keep[1, -1] = False
    if reference:
        mask = keep[:, None, None, :] if path == "padded" else None
        return lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p, causal, mask=mask, **kw)
    if path == "padded":
        kw["key_padding_mask"] = keep
    if path == "bidirectional":
        kw["allow_bidirectional"] = True
    if path != "decode":
        return lp.attention(q, k, v, enc, p, p, causal, **kw)
    cache, rows = lp.KVCache(), []
    for lo, hi in ((0, S - 2), (S - 2, S - 1), (S - 1, S)):  # a prefill, then two decode steps
        rows.append(lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, p[lo:hi], p[lo:hi],
                                 cache=cache))
    return torch.cat(rows, 2)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(lp.CATALOGUE))
def test_attention_in_every_layout(name, path):
    enc = encodings()[name]
    g = torch.Generator().manual_seed(1)
    base = [torch.randn(B, H, S, D, dtype=F64, generator=g) for _ in range(3)]
    p = times(enc, real=path == "real times")
    views = [layouts(x) for x in base]
    for how in views[0]:
        for which in ("qkv", "k", "v"):  # every tensor in the layout, or the keys or values alone
            args = [views[i][how] if "qkv"[i] in which else base[i] for i in range(3)]
            want = run(path, enc, *(a.contiguous() for a in args), p, reference=True)
            got = run(path, enc, *args, p)
            err = float((got - want).abs().max())
            assert err < 1e-9, (name, path, how, which, err)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("name", sorted(lp.CATALOGUE))
def test_query_and_key_in_every_layout(name, inplace):
    enc = encodings()[name]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, H, S, D, dtype=F64, generator=g)
    p = times(enc, real=False)
    origin = None if not enc.needs_recentring else p[-1]
    for side in ("query", "key"):
        for how in layouts(x):
            view = layouts(x)[how]  # fresh: in place writes it
            want = getattr(enc, f"{side}_reference")(view.contiguous(), p, origin=origin)
            if inplace and enc.num_slots:  # slots widen the output: refused in every layout
                with pytest.raises(ValueError, match="as wide as the input"):
                    getattr(enc, side)(view, p, origin=origin, inplace=True)
                continue
            if inplace and enc.generator.basis is not None:  # a change of basis mixes dims: no in-place kernel
                with pytest.raises(ValueError, match="needs the fast path"):
                    getattr(enc, side)(view, p, origin=origin, inplace=True)
                continue
            if inplace and how == "expanded":
                with pytest.raises(ValueError, match="memory of their own"):
                    getattr(enc, side)(view, p, origin=origin, inplace=True)
                continue
            got = getattr(enc, side)(view, p, origin=origin, inplace=inplace)
            assert float((got - want).abs().max()) < 1e-9 * max(1.0, float(want.abs().max())), (name, side, how)
            if inplace:
                assert got.data_ptr() == view.data_ptr()
