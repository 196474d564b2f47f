"""The plain causal self-attention encodes q and k into the thread's reused buffers (``attend._in_buffers``): the
same bits as encodings into fresh tensors, an output that the next call's encodings cannot touch, and never
under a gradient (autograd would keep encodings the next call overwrites)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import attend, attention_pieces

ENCODINGS = {
    "rope": lambda: lp.rope(64),
    "rope_half": lambda: lp.rope(64, layout="half"),
    "llama3": lambda: lp.scaling.llama3(lp.rope(64, base=500000.0), factor=8.0, original_max_position_embeddings=64),
    "ntk": lambda: lp.scaling.ntk(lp.rope(64, layout="half"), factor=4.0),
}


def _buffered(monkeypatch) -> list:
    """The calls that took the buffers (the arena's providers handed out)."""
    taken: list = []
    real = attention_pieces.slot

    def spy(arena, name, device):
        taken.append(name)
        return real(arena, name, device)

    monkeypatch.setattr(attend, "slot", spy)
    return taken


def _inputs(B: int, H: int, Hk: int, T: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, 64, generator=g).to(dtype)
    k, v = (torch.randn(B, Hk, T, 64, generator=g).to(dtype) for _ in range(2))
    return q, k, v


@given(name=st.sampled_from(sorted(ENCODINGS)), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       B=st.integers(1, 2), groups=st.sampled_from([1, 2]), T=st.integers(1, 300), start=st.integers(0, 5000),
       bshd=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_encodings_in_buffers_give_the_bits_of_fresh_ones(name, dtype, B, groups, T, start, bshd, seed):
    """Any batch, grouped keys, length, first time and memory order (heads inside positions, as a model's
    projections lay them out): the buffered call equals the call encoding into fresh tensors to the bit, and took
    the buffers."""
    enc = ENCODINGS[name]()
    q, k, v = _inputs(B, 4, 4 // groups, T, dtype, seed)
    if bshd:  # (B, H, T, D) views of (B, T, H, D) memory
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    pos = torch.arange(start, start + T)
    taken: list = []
    real = attention_pieces.slot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attend, "slot", lambda a, n, d: taken.append(n) or real(a, n, d))
        got = lp.attention(q, k, v, enc, positions=pos)
        mp.setattr(attend, "IN_BUFFERS", False)
        want = lp.attention(q, k, v, enc, positions=pos)
    assert taken == ["q", "k"]
    assert torch.equal(got, want)


def test_the_next_call_leaves_an_output_as_it_was(monkeypatch):
    """The output is the flash kernel's own tensor, not a buffer: a second call on other inputs (which writes its
    encodings into the same buffers) changes nothing in the first call's output."""
    taken = _buffered(monkeypatch)
    enc = lp.rope(64)
    q, k, v = _inputs(1, 4, 4, 257, torch.float32, 0)
    first = lp.attention(q, k, v, enc)
    kept = first.clone()
    q2, k2, v2 = _inputs(1, 4, 4, 257, torch.float32, 1)
    second = lp.attention(q2, k2, v2, enc)
    assert taken == ["q", "k", "q", "k"]
    assert torch.equal(first, kept) and not torch.equal(first, second)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()


@pytest.mark.parametrize("needs", ["q", "k", "v", "frequencies"])
def test_no_buffers_under_a_gradient(needs, monkeypatch):
    """When anything needs a gradient (q, k, v or the encoding's learned frequencies) the encodings are fresh
    tensors autograd keeps: the gradient through two calls, the second before the first's backward, equals the
    gradient of the first call alone."""
    taken = _buffered(monkeypatch)
    enc = lp.rope(64)
    if needs == "frequencies":
        enc.generator.freqs.requires_grad_(True)
    q, k, v = _inputs(1, 4, 4, 200, torch.float32, 2)
    leaf = {"q": q, "k": k, "v": v}.get(needs)
    if leaf is not None:
        leaf.requires_grad_(True)
    wrt = leaf if leaf is not None else enc.generator.freqs
    (alone,) = torch.autograd.grad(lp.attention(q, k, v, enc).square().sum(), wrt)
    y = lp.attention(q, k, v, enc)
    lp.attention(*_inputs(1, 4, 4, 200, torch.float32, 3), enc)  # another call before y's backward
    (got,) = torch.autograd.grad(y.square().sum(), wrt)
    assert taken == ([] if needs == "frequencies" else ["q", "k"])  # the other call alone, needing nothing
    assert torch.equal(got, alone)


@pytest.mark.parametrize("name", ["rope", "xpos", "retnet", "decay", "alibi", "jordan"])
def test_buffers_made_under_inference_mode_serve_every_later_call(name):
    """A buffer made under ``torch.inference_mode`` is an inference tensor, which nothing may write outside that
    mode: the calls after it (no_grad, a gradient, inference mode again) each get a buffer they may write, with the
    same outputs and the gradient of a call that came first."""
    enc = {"rope": lambda: lp.rope(64), "xpos": lambda: lp.xpos(64), "retnet": lambda: lp.retnet(64, num_heads=4),
           "decay": lambda: lp.build("decay", 64, 4), "alibi": lambda: lp.alibi(64, num_heads=4),
           "jordan": lambda: lp.build("jordan", 64)}[name]()
    q, k, v = _inputs(1, 4, 4, 300, torch.float32, 4)
    leaf = q.clone().requires_grad_(True)
    (first,) = torch.autograd.grad(lp.attention(leaf, k, v, enc).square().sum(), leaf)
    with torch.inference_mode():
        a = lp.attention(q, k, v, enc)
    with torch.no_grad():
        b = lp.attention(q, k, v, enc)
    (again,) = torch.autograd.grad(lp.attention(leaf, k, v, enc).square().sum(), leaf)
    with torch.inference_mode():
        c = lp.attention(q, k, v, enc)
    assert torch.equal(a, b) and torch.equal(b, c) and torch.equal(first, again)
