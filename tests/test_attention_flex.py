"""FlexAttention with the slots' lag bias as a score_mod (liepos.attention_flex) against lp.attention, on the CPU (eager)."""

from __future__ import annotations

import warnings

import pytest
import torch

import liepos as lp
from liepos.attention_flex import alibi_score_mod, flex_attention, lag_bias

pytest.importorskip("torch.nn.attention.flex_attention")


def _rope_alibi(H: int, D: int) -> lp.Encoding:
    """RoPE content with ALiBi's slot block: scores ``qᵀ R(t − s) k − m_h (t − s)``."""
    m = lp.alibi_slopes(H)
    g = lp.direct_sum(lp.rope(D).generator, lp.Generator([0.0], [0.0], [2]))
    qs = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(H, 2).clone()  # (2,) -> (H, 2)
    ks = torch.stack([torch.zeros_like(m), -m], dim=-1)  # (H,) -> (H, 2)
    return lp.Encoding(g, query_slots=qs, key_slots=ks, name="rope_alibi")


def test_lag_bias_is_alibi_slopes():
    beta, mu = lag_bias(lp.alibi(8, num_heads=4))
    assert torch.equal(beta, torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(mu, -lp.alibi_slopes(4), rtol=0, atol=1e-15)


@pytest.mark.parametrize("make", [lambda: lp.alibi(8, num_heads=2), lambda: _rope_alibi(2, 8)], ids=["alibi", "rope_alibi"])
@pytest.mark.parametrize("Sq", [6, 3])
def test_flex_equals_lp_attention(make, Sq):
    enc = make()
    torch.manual_seed(0)
    q = torch.randn(1, 2, Sq, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 6, 8, dtype=torch.float64), torch.randn(1, 2, 6, 8, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention says it is not compiled
        out = flex_attention(q, k, v, enc)
    ref = lp.attention(q, k, v, enc)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-10)


def test_refuses_what_is_not_a_lag_bias():
    with pytest.raises(ValueError, match="slots"):
        lag_bias(lp.rope(8))
    with pytest.raises(ValueError, match="orthogonal content"):
        lag_bias(lp.Encoding(lp.direct_sum(lp.decay([0.1] * 4).generator, lp.Generator([0.0], [0.0], [2])),
                             query_slots=[1.0, 0.0], key_slots=[0.0, -1.0]))
    with pytest.raises(ValueError, match="causal=False"):
        q = torch.randn(1, 2, 4, 8)
        flex_attention(q, q, q, lp.alibi(8, num_heads=2), causal=False)


def _slot_bias(query_slots, key_slots, D: int = 8, block: int = 2) -> lp.Encoding:
    """RoPE content with a nilpotent slot block of size ``block``: the bias ``qsᵀ exp(u N) ks``."""
    g = lp.direct_sum(lp.rope(D).generator, lp.Generator([0.0], [0.0], [block]))
    return lp.Encoding(g, query_slots=query_slots, key_slots=key_slots, name=f"slots{block}")


def _both(q, k, v, enc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention says it is not compiled
        return flex_attention(q, k, v, enc), lp.attention(q, k, v, enc)


def test_a_bias_with_a_constant_term_per_head_equals_lp_attention():
    """Slots ``(1, a_h)`` and ``(b_h, −m_h)`` give ``β_h + μ_h u`` with ``β_h = b_h − a_h m_h ≠ 0``: the
    score_mod adds β (a constant per head shifts no softmax, so the test reads β from lag_bias too)."""
    H = 4
    m = lp.alibi_slopes(H)
    a, b = torch.linspace(-1, 1, H, dtype=torch.float64), torch.linspace(0.5, -0.5, H, dtype=torch.float64)
    enc = _slot_bias(torch.stack([torch.ones(H, dtype=torch.float64), a], -1), torch.stack([b, -m], -1))
    beta, mu = lag_bias(enc)
    assert torch.allclose(beta, b - a * m, rtol=0, atol=1e-15) and torch.allclose(mu, -m, rtol=0, atol=1e-15)
    torch.manual_seed(1)
    q, k, v = torch.randn(1, H, 5, 8, dtype=torch.float64), *torch.randn(2, 1, H, 7, 8, dtype=torch.float64)
    out, ref = _both(q, k, v, enc)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-10)
    # a score_mod that left β out would change nothing above (softmax is shift-invariant per row): check it
    mod = alibi_score_mod(beta, mu, 2, True)
    z = torch.zeros((), dtype=torch.float64)
    for h in range(H):
        got = mod(z, 0, h, torch.tensor(1), torch.tensor(0))
        assert torch.allclose(got, beta[h] + mu[h] * 3, rtol=0, atol=1e-15)


@pytest.mark.parametrize("Sk", [4, 7])
@pytest.mark.parametrize("Hk", [4, 2, 1])
def test_slots_shared_by_every_head_with_grouped_keys_equal_lp_attention(Hk, Sk):
    """Slots of shape ``(slots,)`` (no heads) give one ``(β, μ)`` that every head of q reads, with as many key
    heads as query heads or fewer (grouped-query attention)."""
    enc = _slot_bias([1.0, 0.5], [0.3, -0.25])
    torch.manual_seed(2)
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    k, v = torch.randn(2, 1, Hk, Sk, 8, dtype=torch.float64)
    out, ref = _both(q, k, v, enc)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-10)


def test_a_bias_that_is_not_linear_in_the_lag_is_refused():
    """A nilpotent slot block of size 3 gives ``u²/2``: no score_mod of the form β + μ u, refused (not rounded)."""
    with pytest.raises(ValueError, match="not linear in the lag"):
        lag_bias(_slot_bias([1.0, 0.0, 0.0], [0.0, 0.0, 1.0], block=3))
    near = _slot_bias([1.0, 0.0, 0.0], [0.0, 1.0, 1e-9], block=3)  # u + 1e-9 u²/2: still not linear
    with pytest.raises(ValueError, match="not linear in the lag"):
        lag_bias(near)
