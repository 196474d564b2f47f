"""``attention_pieces.pieces_by_heads``: one piece of keys shared by every head, attended in one call, and per group of
heads a piece of their own merged into their rows, equals the softmax over each head's union of keys (float64, by
its definition) and the per-group ``pieces`` it replaces; ALiBi's per-head windows take it where nothing needs a
gradient."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import recentre
from liepos.attention_pieces import pieces, pieces_by_heads


def _softmax_union(q, shared, groups, c, sinks):
    """Per head, ``softmax(c q kᵀ + β)`` over the shared piece's keys (causal: key i seen from query ≥ i) and its
    group's, a sink column in the denominator: float64, by the definition."""
    B, H, Sq, _ = q.shape
    out = torch.empty(B, H, Sq, shared[1].shape[-1], dtype=torch.float64)
    for h0, h1, piece in groups:
        for h in range(h0, h1):
            logits, values = [], []
            for (k, v, causal, *bias), j in ((shared, h), (piece, h - h0)):
                s = c * q[:, h].double() @ k[:, j].double().transpose(-1, -2)  # (B, Sq, S)
                if bias and bias[0] is not None:
                    s = s + bias[0][:, j].double()  # (B, 1, S)
                if causal:
                    s = s.masked_fill(torch.ones(Sq, k.shape[2], dtype=torch.bool).triu(1), -math.inf)
                logits.append(s)
                values.append(v[:, j].double())
            s = torch.cat(logits, -1)  # (B, Sq, S_shared + S_group)
            if sinks is not None:
                col = sinks[h].double().expand(B, Sq, 1) if sinks.dim() == 1 else sinks[:, h].double().unsqueeze(-1)
                s = torch.cat([s, col], -1)
            p = torch.softmax(s, -1)[..., : sum(x.shape[1] for x in values)]
            out[:, h] = p @ torch.cat(values, 1)
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), H=st.integers(2, 6), Sq=st.integers(1, 40), cuts=st.lists(st.booleans(), min_size=5,
       max_size=5), counts=st.lists(st.integers(0, 30), min_size=7, max_size=7), causal=st.booleans(),
       masked=st.booleans(), sink=st.sampled_from([None, "head", "row"]), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_equals_the_softmax_over_each_heads_keys(seed, H, Sq, cuts, counts, causal, masked, sink, dtype):
    g = torch.Generator().manual_seed(seed)
    B, D, Dv = 2, 8, 8
    bounds = [0] + [h for h in range(1, H) if cuts[h - 1]] + [H]  # a random partition of the heads into groups
    q = torch.randn(B, H, Sq, D, generator=g, dtype=dtype)
    S0 = Sq if causal else max(1, counts[0])

    def piece(heads: int, S: int, is_causal: bool) -> tuple:
        bias = torch.randn(B, heads, 1, S, generator=g, dtype=dtype) if masked else None
        return (torch.randn(B, heads, S, D, generator=g, dtype=dtype), torch.randn(B, heads, S, Dv, generator=g, dtype=dtype),
                is_causal, bias)

    shared = piece(H, S0, causal)
    groups = [(h0, h1, piece(h1 - h0, counts[i + 1], False)) for i, (h0, h1) in enumerate(zip(bounds, bounds[1:]))]
    sinks = None if sink is None else torch.randn(H, generator=g, dtype=dtype) if sink == "head" else torch.randn(
        B, H, Sq, generator=g, dtype=dtype)
    c = 0.3
    got = pieces_by_heads(q, shared, groups, c, sinks)
    assert got.shape == (B, H, Sq, Dv) and got.dtype == dtype
    want = _softmax_union(q, shared, groups, c, sinks)
    vmax = max(float(x[1].abs().max()) for x in (shared, *(p for *_, p in groups)) if x[1].numel())
    tol = (1e-5 if dtype == torch.float32 else 1e-12) * max(1.0, vmax)
    assert float((got.double() - want).abs().max()) <= tol
    # and the per-group pieces it replaces (each group with its heads' share of the shared piece)
    for h0, h1, p in groups:
        own = tuple(t[:, h0:h1] if isinstance(t, torch.Tensor) else t for t in shared)
        hs = None if sinks is None else sinks[h0:h1] if sinks.dim() == 1 else sinks[:, h0:h1]
        alone = pieces(q[:, h0:h1], [p, own] if p[0].shape[2] else [own], c, hs)
        assert float((got[:, h0:h1] - alone).abs().max()) <= 2 * tol


def test_refuses_a_gradient_and_an_empty_shared_piece():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    with pytest.raises(ValueError, match="gradient"):
        pieces_by_heads(q.requires_grad_(), (k, v, True), [(0, 2, (k, v, False))], 0.5)
    with pytest.raises(ValueError, match="shared piece"):
        pieces_by_heads(q.detach(), (k[:, :, :0], v[:, :, :0], False), [(0, 2, (k, v, False))], 0.5)


def test_alibi_takes_it_without_a_gradient_and_the_groups_with_one(monkeypatch):
    """ALiBi at T = 4096: its blocks' heads fall in several windows; without a gradient the block's own keys are one
    call over every head, with one the groups keep their calls (the autograd path); both within float32's
    rounding of the float64 reference."""
    calls = []
    real = recentre.pieces_by_heads
    monkeypatch.setattr(recentre, "pieces_by_heads", lambda *a, **kw: calls.append(len(a[2])) or real(*a, **kw))
    enc = lp.build("alibi", 64, 8)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 8, 4096, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        fast = lp.attention(q, k, v, enc)
    assert calls and max(calls) > 1  # a block of several head groups went through it
    n = len(calls)
    qg = q.clone().requires_grad_()
    slow = lp.attention(qg, k, v, enc)
    assert len(calls) == n  # with a gradient: the per-group pieces
    ref = lp.attention(q.double(), k.double(), v.double(), enc)
    bound = 2.0**-14 * float(v.abs().max())  # the precision contract of a polynomial block (ALiBi's slots) in float32
    assert float((fast.double() - ref).abs().max()) <= bound and float((slow.detach().double() - ref).abs().max()) <= bound


def test_alibi_with_learned_sinks_keeps_the_groups_and_their_gradient():
    """Sinks that need a gradient (q, k and v not): the windows keep their calls per group (the autograd path), and
    the sinks' gradient is the float64 one's."""
    enc = lp.build("alibi", 64, 8)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 8, 4096, 64, generator=g) for _ in range(3))
    sinks = torch.linspace(-1.0, 1.0, 8).requires_grad_()
    out = lp.attention(q, k, v, enc, sinks=sinks)
    (out * v.mean(2, keepdim=True)).sum().backward()
    s64 = sinks.detach().double().requires_grad_()
    ref = lp.attention(q.double(), k.double(), v.double(), enc, sinks=s64)
    (ref * v.double().mean(2, keepdim=True)).sum().backward()
    assert float((out.detach().double() - ref.detach()).abs().max()) <= 2.0**-14 * float(v.abs().max())
    assert torch.allclose(sinks.grad.double(), s64.grad, rtol=1e-4, atol=1e-3)
