"""torch.compile of the encodings: one graph, no breaks, no recompilation across sequence lengths."""

from __future__ import annotations

import pytest
import torch

import liepos as lp

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402


def _encode(enc):
    def f(q, k):
        return enc.query(q), enc.key(k)

    return f


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_no_recompile_across_lengths(backend):
    enc = lp.xpos(16, layout="half")
    if backend == "inductor":
        pytest.importorskip("torch._inductor")
    torch._dynamo.reset()
    counters.clear()
    # only the sequence axis is dynamic (dynamic=True would also make the generator's tables symbolic)
    f = torch.compile(_encode(enc), fullgraph=True, backend=backend)
    for S in (8, 13, 32):
        q = torch.randn(1, 2, S, 16, dtype=torch.float64)
        k = torch.randn(1, 2, S, 16, dtype=torch.float64)
        torch._dynamo.mark_dynamic(q, 2)
        torch._dynamo.mark_dynamic(k, 2)
        yq, yk = f(q, k)
        assert torch.allclose(yq, enc.query_reference(q), atol=1e-9)
        assert torch.allclose(yk, enc.key_reference(k), atol=1e-9)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    assert counters["frames"]["total"] == counters["frames"]["ok"]


def test_fullgraph_mixed_generator_with_slots_and_positions():
    from liepos.generator import Generator, direct_sum

    g = direct_sum(lp.rope(8).generator, Generator([-0.1, 0.0], [0.0, 0.0], [1, 3]), lp.nope(2).generator)
    encs = [lp.Encoding(g), lp.alibi(2, 8)]
    for enc in encs:
        torch._dynamo.reset()
        counters.clear()

        def f(q, pos, enc=enc):
            return enc.query(q, pos), enc.key(q, pos)

        cf = torch.compile(f, fullgraph=True, backend="aot_eager")
        for S in (5, 11, 17):
            q = torch.randn(1, 2, S, enc.content_dim, dtype=torch.float64)
            pos = torch.arange(S) + 3
            torch._dynamo.mark_dynamic(q, 2)
            torch._dynamo.mark_dynamic(pos, 0)
            yq, yk = cf(q, pos)
            assert torch.allclose(yq, enc.query_reference(q, pos), atol=1e-9)
            assert torch.allclose(yk, enc.key_reference(q, pos), atol=1e-9)
        assert counters["stats"]["unique_graphs"] == 1
        assert not counters["graph_break"]


def test_compiled_backward():
    enc = lp.rope(8)
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda q: enc.query(q).square().sum(), fullgraph=True, backend="aot_eager")
    for S in (5, 7):
        q = torch.randn(1, 1, S, 8, dtype=torch.float64, requires_grad=True)
        torch._dynamo.mark_dynamic(q, 2)
        f(q).backward()
        (g,) = torch.autograd.grad(enc.query(q).square().sum(), q)
        assert torch.allclose(q.grad, g)
    assert counters["stats"]["unique_graphs"] == 1
