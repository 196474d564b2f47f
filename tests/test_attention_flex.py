"""FlexAttention with the slots' lag bias as a score_mod (liepos.attention_flex) against lp.attention, on the CPU (eager)."""

from __future__ import annotations

import warnings

import pytest
import torch

import liepos as lp
from liepos.attention_flex import flex_attention, lag_bias

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
