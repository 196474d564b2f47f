"""Attention by re-centred query blocks (liepos.recentre): a block whose queries span too much time for one
origin is split, and several-axis positions keep one origin per batch element."""

from __future__ import annotations

import torch

import liepos as lp

F64 = torch.float64


def test_queries_far_apart_in_one_block_are_split_and_match_the_reference():
    """Decay at rate 0.5 with queries 3000 apart inside one block of two (keys at their own times, half a
    step before each query: the block-by-block path): one origin for both would put e^{0.5·3000} into the
    tables; the block is halved instead, and attention equals the reference."""
    enc = lp.decay([0.5, 0.1, 0.05, 0.01])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 4, dtype=F64, generator=g) for _ in range(3))
    p = torch.tensor([0.0, 3000.0, 3001.0, 9000.0], dtype=F64)
    got = lp.attention(q, k, v, enc, p, p - 0.5, block_size=2)
    want = lp.attention_reference(q, k, v, enc, p, p - 0.5)
    assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_several_axis_positions_per_batch_element_equal_each_element_alone():
    """Positions (batch, seq, axes): every batch element re-centred at its own block origin, as if alone."""
    enc = lp.decay_axial_rope(8, axes=2, rates=[0.3, 0.2, 0.1, 0.05])  # decays: re-centred per block
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=F64, generator=g) for _ in range(3))
    p = torch.stack([torch.stack([torch.arange(5.0), torch.zeros(5)], -1),
                     torch.stack([torch.arange(5.0) * 3 + 100, torch.arange(5.0)], -1)]).to(F64)  # (2, 5, 2)
    got = lp.attention(q, k, v, enc, p, p, block_size=2)
    alone = torch.cat([lp.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], enc, p[i], p[i], block_size=2)
                       for i in range(2)])
    assert torch.allclose(got, alone, rtol=1e-12, atol=1e-12)
