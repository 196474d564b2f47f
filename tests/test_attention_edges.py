"""lp.attention at its edges: no keys at all, a step whose keys are all in the cache, and a value encoding
on the path without re-centring (an orthogonal encoding)."""

from __future__ import annotations

import pytest
import torch

import liepos as lp
from liepos.generator import direct_sum

F64 = torch.float64


def _qkv(seed: int, S: int = 4, D: int = 8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, S, D, dtype=F64, generator=g) for _ in range(3))


def test_no_keys_and_no_cache_attend_to_nothing():
    """Zero keys and no cache: every query's output is zero (an empty softmax contributes nothing)."""
    q, k, v = _qkv(0)
    out = lp.attention(q[:, :, :3], k[:, :, :0], v[:, :, :0], lp.rope(8), torch.arange(3.0), torch.arange(0.0))
    assert out.shape == (1, 2, 3, 8) and torch.equal(out, torch.zeros_like(out))


def test_a_step_without_new_keys_attends_to_the_cached_ones():
    """Keys only in the cache: the queries attend to them, as the reference over the same keys does."""
    q, k, v = _qkv(1)
    enc, cache = lp.rope(8), lp.KVCache()
    lp.attention(q[:, :, :0], k, v, enc, torch.arange(0.0), torch.arange(4.0), cache=cache)
    assert len(cache) == 4
    t = torch.arange(4.0, 7.0, dtype=F64)
    got = lp.attention(q[:, :, :3], k[:, :, :0], v[:, :, :0], enc, t, torch.arange(0.0), cache=cache)
    want = lp.attention_reference(q[:, :, :3], k, v, enc, t, torch.arange(4.0, dtype=F64))
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_value_encoding_without_recentring_matches_the_reference():
    """An orthogonal encoding and value encoding (no re-centring): ``Σ_s p_ts A_v(t − s) v_s``."""
    q, k, v = _qkv(2, S=6)
    enc, venc = lp.rope(8), lp.rope(8, base=100.0)
    p = 3.0 * torch.arange(6, dtype=F64) + 11.0
    got = lp.attention(q, k, v, enc, p, p, value_encoding=venc)
    want = lp.attention_reference(q, k, v, enc, p, p, value_encoding=venc)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_block_size_one_is_accepted_and_changes_no_output():
    """``block_size`` is any positive integer: query blocks of one row give the attention of the default
    blocks (decay: re-centred per block), and 0 is refused by name."""
    q, k, v = _qkv(3, S=6)
    enc = lp.decay([0.5, 0.2, 0.1, 0.05, 0.5, 0.2, 0.1, 0.05])
    p = 2.0 * torch.arange(6, dtype=F64)
    one = lp.attention(q, k, v, enc, p, p - 0.5, block_size=1)
    assert torch.allclose(one, lp.attention(q, k, v, enc, p, p - 0.5), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="block_size"):
        lp.attention(q, k, v, enc, p, p - 0.5, block_size=0)


def test_more_queries_than_keys_without_positions_is_refused():
    """Without positions the queries are the last ``Sq`` of the keys' times: more queries than keys has no
    such reading, and is refused by name rather than guessed."""
    q, k, v = _qkv(4, S=5)
    with pytest.raises(ValueError, match="5 queries but only 3 keys: pass positions explicitly"):
        lp.attention(q, k[:, :, :3], v[:, :, :3], lp.rope(8))


def test_bfloat16_with_a_jordan_block_attends_as_its_float32_values():
    """Polynomial (Jordan) parts cancel between F(t − o) and G(s − o), which bfloat16 cannot hold: such
    calls encode and attend in float32 and cast the output once, bit for bit the float32 call's output cast."""
    q, k, v = _qkv(5, S=6, D=6)
    enc = lp.Encoding(direct_sum(lp.jordan(3, -0.2).generator, lp.rope(2).generator, lp.decay([0.1]).generator))
    p = 5.0 * torch.arange(6, dtype=F64)
    bf = torch.bfloat16
    q, k, v = q.to(bf), k.to(bf), v.to(bf)
    got = lp.attention(q, k, v, enc, p, p)
    assert got.dtype == bf
    assert torch.equal(got, lp.attention(q.float(), k.float(), v.float(), enc, p, p).to(bf))


@pytest.mark.parametrize("Sq, Sk, B", [(3, 0, 1), (0, 4, 1), (3, 4, 0)])
def test_nothing_to_attend_returns_zeros_without_entering_a_kernel(Sq, Sk, B, monkeypatch):
    """No keys (and no cache), no queries, or an empty batch: zeros of the output's shape at once; neither the
    plain nor the re-centred path runs (an empty softmax would give the same zeros, at the cost of a call)."""
    from liepos import attend

    for name in ("_plain", "recentred"):
        monkeypatch.setattr(attend, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran with nothing to attend"))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 2, Sq, 8, dtype=F64, generator=g)
    k, v = (torch.randn(B, 2, Sk, 8, dtype=F64, generator=g) for _ in range(2))
    for enc in (lp.rope(8), lp.decay([0.1] * 8)):  # the plain path and the re-centred one
        out = lp.attention(q, k, v, enc, torch.arange(float(Sq)), torch.arange(float(Sk)))
        assert out.shape == (B, 2, Sq, 8) and torch.equal(out, torch.zeros_like(out))


def test_a_call_with_no_keys_leaves_an_empty_cache_unbound():
    """No keys into an empty cache: nothing joins it, so it holds no dtype and no batch size yet; the next call
    may bring either (float32, a batch of two) and is the plain forward."""
    q, k, v = _qkv(2)
    enc = lp.rope(8)
    for nxt in (lambda x: x.float(), lambda x: torch.cat((x, x))):
        cache = lp.KVCache()
        out = lp.attention(q[:, :, :3], k[:, :, :0], v[:, :, :0], enc, torch.arange(3.0), torch.arange(0.0), cache=cache)
        assert len(cache) == 0 and torch.equal(out, torch.zeros_like(out))
        got = lp.attention(nxt(q), nxt(k), nxt(v), enc, cache=cache)
        assert len(cache) == 4
        assert torch.allclose(got, lp.attention(nxt(q), nxt(k), nxt(v), enc), atol=1e-6)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_nope_hands_sdpa_the_callers_q_and_k(monkeypatch, dtype):
    """NoPE's encodings are the identity: the call reads q and k as they are (no copy of either) and equals
    the reference; a value encoding still carries the values."""
    from liepos import attend

    seen = []
    real = attend.sdpa
    monkeypatch.setattr(attend, "sdpa", lambda qe, ke, *a, **kw: seen.append((qe, ke)) or real(qe, ke, *a, **kw))
    q, k, v = (x.to(dtype) for x in _qkv(7, S=6))
    out = lp.attention(q, k, v, lp.nope(8))
    (qe, ke), = seen
    assert qe.data_ptr() == q.data_ptr() and ke.data_ptr() == k.data_ptr()
    ref = lp.attention_reference(q.double(), k.double(), v.double(), lp.nope(8))
    assert torch.allclose(out.double(), ref, atol=1e-12 if dtype == F64 else 2e-2)
    out = lp.attention(q, k, v, lp.nope(8), value_encoding=lp.rope(8))
    ref = lp.attention_reference(q.double(), k.double(), v.double(), lp.nope(8), value_encoding=lp.rope(8))
    assert torch.allclose(out.double(), ref, atol=1e-12 if dtype == F64 else 2e-2)


def test_a_learnable_generator_at_zero_frequency_keeps_its_gradient():
    """A learnable frequency at 0 is A(u) = I now, but not its derivative (∂A/∂ω = uJ): the call encodes, and
    the gradient equals the reference's."""
    freqs = torch.zeros(4, dtype=F64, requires_grad=True)
    g = lp.Generator(torch.zeros(4, dtype=F64), freqs, [1] * 4, complex=[True] * 4)  # 4 planes at ω = 0
    assert not g.is_identity and lp.nope(8).generator.is_identity
    q, k, v = _qkv(8, S=6)
    lp.attention(q, k, v, lp.Encoding(g)).sum().backward()
    got = freqs.grad.clone()
    freqs.grad = None
    lp.attention_reference(q, k, v, lp.Encoding(g)).sum().backward()
    assert got.abs().max() > 1e-6 and torch.allclose(got, freqs.grad, atol=1e-10)
