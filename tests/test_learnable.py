"""Learnable generators stay in the family: parametrised rates ≤ 0, frequencies > 0, per-axis frequency
vectors and an orthogonal basis; a few optimiser steps later lp.diagnose still finds the encoding
exactly relative, with the generator that was learned."""

import numpy as np
import pytest
import torch

import liepos as lp
from liepos import axial_rope
from liepos.nn import LearnableEncoding, LearnableGenerator

F64 = torch.float64


def test_initial_values_are_the_catalogue():
    assert torch.allclose(LearnableEncoding(8)().generator.freqs, lp.rope(8).generator.freqs)
    ax = LearnableEncoding(8, axes=2)()
    assert ax.num_axes == 2
    assert torch.allclose(ax.generator.freqs, axial_rope(8, 2).generator.freqs)
    mixed = LearnableGenerator(8, axes=2, num_heads=3, init="mixed", base=10.0)()
    w = mixed.freqs  # (H, 2, planes): frequency vectors with RoPE-Mixed's magnitudes
    assert w.shape == (3, 2, 4)
    assert torch.allclose(w.norm(dim=-2)[0], torch.tensor([1.0, 10 ** -0.5, 1.0, 10 ** -0.5], dtype=F64))


def test_any_parameter_values_stay_in_the_family():
    g = LearnableGenerator(8, axes=2, num_heads=2, decay=True, basis="orthogonal", init="mixed")
    with torch.no_grad():
        for p in g.parameters():
            p.copy_(torch.randn_like(p) * 30)  # wild values, as a diverging optimiser might leave them
    with torch.no_grad():
        ag = g()
    assert bool((ag.rates <= 0).all())
    assert bool((g.magnitudes() > 0).all())
    P = g.basis().detach()
    assert torch.allclose(P @ P.T, torch.eye(8, dtype=F64), atol=1e-10)
    X = ag.matrix()
    assert float(torch.linalg.norm(X[0] @ X[1] - X[1] @ X[0])) < 1e-8 * float(X.norm()) ** 2
    lp.Encoding(LearnableGenerator(8, decay=True)(), layout="half")  # construction validates rates ≤ 0


def _train(pe, target, positions, steps=5, lr=0.05, seed=0):
    """A few Adam steps fitting the scores of ``target`` (a toy loss); returns the losses."""
    g = torch.Generator().manual_seed(seed)
    H = 2 if pe.generator.num_heads is None else pe.generator.num_heads
    S = positions.shape[0]
    q = torch.randn(2, H, S, pe.dim, generator=g, dtype=F64)
    k = torch.randn(2, H, S, pe.dim, generator=g, dtype=F64)
    with torch.no_grad():
        want = target.query(q, positions) @ target.key(k, positions).transpose(-1, -2)
    opt = torch.optim.Adam(pe.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        enc = pe()
        got = enc.query(q, positions) @ enc.key(k, positions).transpose(-1, -2)
        loss = (got - want).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for name, p in pe.named_parameters():
            assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_few_training_steps_keep_a_one_axis_generator_relative():
    pe = LearnableEncoding(8, decay=True, basis="orthogonal")
    before = pe().generator.matrix().detach().clone()
    target = lp.xpos(8, base=100.0, scale_base=32.0)
    losses = _train(pe, target, torch.arange(16, dtype=F64))
    assert losses[-1] < losses[0]
    enc = pe()
    with torch.no_grad():
        X = enc.generator.matrix()
        assert not torch.allclose(X, before)
        d = lp.diagnose(lambda x, t: enc.query(x, t), lambda x, t: enc.key(x, t), 8, lengths=(8, 16))
    assert d.relative, str(d)
    # the recovered generator is the learned one (interleaved layout: storage = canonical order)
    np.testing.assert_allclose(d.matrix, X.numpy(), atol=1e-6)


def test_a_few_training_steps_keep_several_axes_relative():
    pe = LearnableEncoding(8, axes=2, num_heads=2, init="mixed", decay=True, basis="orthogonal", base=10.0)
    pos = torch.stack(torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).reshape(16, 2)
    target = axial_rope(8, 2, base=10.0)
    losses = _train(pe, target, pos.to(F64))
    assert losses[-1] < losses[0]
    enc = pe()
    with torch.no_grad():
        # shifts along every axis leave the scores unchanged
        g = torch.Generator().manual_seed(1)
        q, k = torch.randn(1, 2, 16, 8, generator=g, dtype=F64), torch.randn(1, 2, 16, 8, generator=g, dtype=F64)
        s0 = enc.query(q, pos) @ enc.key(k, pos).transpose(-1, -2)
        for c in ([7.0, 0.0], [0.0, -3.0], [2.5, 11.0]):
            cc = pos.to(F64) + torch.tensor(c, dtype=F64)
            assert torch.allclose(enc.query(q, cc) @ enc.key(k, cc).transpose(-1, -2), s0, atol=1e-9)
        d = lp.diagnose(lambda x, t: enc.query(x, t), lambda x, t: enc.key(x, t), 8, axes=2,
                        heads=2, head=1, lengths=(8, 16))
        assert d.relative, str(d)
        X = enc.generator.matrix()[:, 1]  # head 1, both axes
        for a in range(2):
            np.testing.assert_allclose(d.axes[a].matrix, X[a].numpy(), atol=1e-6)


def test_learned_encodings_train_through_attention():
    pe = LearnableEncoding(8, num_heads=2, decay=True)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=F64) for _ in range(3))
    out = lp.attention(q, k, v, pe(), positions=torch.arange(6.0) * 0.5, key_positions=torch.arange(6.0) * 0.5)
    out.sum().backward()
    assert pe.generator.raw_freq.grad is not None and pe.generator.raw_rate.grad is not None


def test_bad_options():
    with pytest.raises(ValueError, match="even"):
        LearnableGenerator(7)
    with pytest.raises(ValueError, match="init"):
        LearnableGenerator(8, axes=2, init="spiral")
    with pytest.raises(ValueError, match="divisible"):
        LearnableGenerator(6, axes=2)


@pytest.mark.parametrize("side", ["query", "key"])
def test_learned_slots_get_the_readable_paths_gradient(side):
    """Slot values that need a gradient leave the fast path (whose cached tables hold them as numbers):
    ``query`` / ``key`` give the same values and slot gradients as the dense reference."""
    enc = lp.alibi(8, num_heads=3, slopes=[0.5, 0.1, 0.01])
    slots = enc.query_slots if side == "query" else enc.key_slots
    slots.requires_grad_(True)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    p = torch.arange(7, dtype=torch.float64) + 10**6
    with torch.no_grad():
        getattr(enc, side)(x, p)  # tables of these positions now cached
    fast = getattr(enc, side)(x, p)
    ref = getattr(enc, f"{side}_reference")(x, p)
    assert fast.requires_grad
    w = torch.randn_like(ref)
    (g_fast,) = torch.autograd.grad((fast * w).sum(), slots)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), slots)
    assert torch.allclose(fast, ref, rtol=1e-12, atol=1e-9)
    assert torch.allclose(g_fast, g_ref, rtol=1e-10, atol=1e-8)
