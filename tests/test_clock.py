"""Continuous and learned time: real timestamps per batch element, a Clock that learns them
(monotone, differentiable: gradcheck), with every encoding and with the cache that stores times."""

import pytest
import torch

import liepos as lp
from liepos.nn import Clock

F64 = torch.float64
H, D = 2, 8


def encodings():
    return {
        "rope": lp.rope(D),
        "xpos": lp.xpos(D),
        "retnet": lp.retnet(D, num_heads=H),
        "decay": lp.decay(torch.linspace(0.05, 0.5, D, dtype=F64)),
        "alibi": lp.alibi(D, num_heads=H),
        "jordan": lp.build("jordan", D),
    }


def _clock(hidden=6, seed=0, **kw):
    torch.manual_seed(seed)
    clock = Clock(hidden, dtype=F64, **kw)
    with torch.no_grad():
        clock.gate.weight.normal_(0, 0.5)
    return clock


def test_clock_is_monotone_and_starts_as_the_integer_clock():
    c0 = Clock(4)
    h = torch.randn(2, 5, 4)
    assert torch.allclose(c0(h), torch.arange(1, 6, dtype=F64).expand(2, 5))
    c = _clock(4, min_step=0.1)
    t = c(torch.randn(3, 50, 4, dtype=F64) * 10)
    assert t.shape == (3, 50) and t.dtype == F64
    assert bool((t.diff(dim=-1) >= 0.1 - 1e-12).all())
    assert c(torch.randn(7, 4, dtype=F64)).shape == (7,)
    with pytest.raises(ValueError, match="width"):
        c(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="init_step"):
        Clock(4, init_step=0.0)


def test_gradcheck_through_the_clock():
    clock = _clock(3)
    h = torch.randn(2, 4, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: clock(x, start=torch.tensor([0.5, -2.0], dtype=F64)), (h,))
    w = clock.gate.weight
    assert torch.autograd.gradcheck(
        lambda W: torch.cumsum(torch.nn.functional.softplus(h.detach() @ W.T + clock.gate.bias), 1), (w,)
    )


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_gradcheck_through_attention_with_learned_times(name):
    enc = encodings()[name]
    clock = _clock(3, seed=1)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, 4, D, generator=g, dtype=F64) for _ in range(3))
    h = torch.randn(1, 4, 3, generator=g, dtype=F64, requires_grad=True)

    def f(x):
        t = clock(x)
        return lp.attention(q, k, v, enc, positions=t, key_positions=t)

    assert torch.autograd.gradcheck(f, (h,), atol=1e-6, fast_mode=True)
    # and the gate's parameters receive gradients
    f(h).sum().backward()
    assert clock.gate.weight.grad is not None and bool(clock.gate.weight.grad.abs().sum() > 0)


@pytest.mark.parametrize("name", list(encodings()))
def test_learned_times_work_with_every_encoding_and_the_cache(name):
    enc = encodings()[name]
    clock = _clock(6, seed=3)
    g = torch.Generator().manual_seed(4)
    B, S = 2, 10
    h = torch.randn(B, S, 6, generator=g, dtype=F64)
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=F64) for _ in range(3))
    with torch.no_grad():
        t = clock(h)
        full = lp.attention(q, k, v, enc, positions=t, key_positions=t)
        want = lp.attention_reference(q, k, v, enc, positions=t, key_positions=t)
        assert torch.allclose(full, want, atol=1e-9)
        # the cache stores times: a prefill then one token at a time, each chunk's clock started at
        # the last time so far, equals the full forward
        cache = lp.KVCache()
        t0 = clock(h[:, :4])
        outs = [lp.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, positions=t0, key_positions=t0,
                             cache=cache)]
        last = t0[:, -1]
        for i in range(4, S):
            ti = clock(h[:, i : i + 1], start=last)
            outs.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc,
                                     positions=ti, key_positions=ti, cache=cache))
            last = ti[:, -1]
        assert torch.allclose(cache.times, t, atol=1e-12)
        assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-9)


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_irregular_timestamps_per_batch_element_are_relative(name):
    """Event streams: real, irregular, different per batch element; shifting one element's times by a
    constant changes nothing (the causal mask follows the times)."""
    enc = encodings()[name]
    g = torch.Generator().manual_seed(5)
    B, S = 3, 12
    t = torch.cumsum(torch.rand(B, S, generator=g, dtype=F64) ** 3 * 5, -1)  # bursts and gaps
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=F64) for _ in range(3))
    out = lp.attention(q, k, v, enc, positions=t, key_positions=t)
    shift = torch.tensor([[1e6], [-3.25], [0.5]], dtype=F64)
    assert torch.allclose(lp.attention(q, k, v, enc, positions=t + shift, key_positions=t + shift), out, atol=1e-8)
    assert torch.allclose(out, lp.attention_reference(q, k, v, enc, positions=t, key_positions=t), atol=1e-9)
