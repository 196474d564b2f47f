"""``lp.attention`` inside ``torch.compile(fullgraph=True)`` and ``torch.export``, and on meta tensors.

The eager call decides on real data (the length a length-dependent encoding is resolved at, finite keys,
tiles, windows), so traced it is one opaque op (``liepos::attention``): every catalogue encoding compiles
with no graph break, one graph for every length (frames counted by dynamo's ``CompileCounter``), the
length-dependent encodings included, and equals the eager call bit for bit; the backward (a recomputation)
equals eager's; an exported program names the encoding by its structure and runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import liepos as lp
from liepos import _graph, _graph_key, scaling

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from helpers import fast_lane  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _build(name):
    try:
        return lp.build(name, 16, 2)
    except (TypeError, ValueError):
        return lp.build(name, 16)


def _inputs(enc, S, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed + S)
    q, k, v = (torch.randn(1, enc.num_heads or 2, S, enc.content_dim, generator=g, dtype=dtype) for _ in range(3))
    t = torch.arange(S) + 3
    pos = t if enc.num_axes is None else torch.stack([t, t // 2, t % 3][: enc.num_axes], -1)  # (S, axes)
    return q, k, v, pos


def _attend(enc):
    return lambda q, k, v, pos: lp.attention(q, k, v, enc, pos, pos, causal=True)


@pytest.mark.parametrize("name", list(lp.CATALOGUE))
@pytest.mark.parametrize("dynamic", fast_lane(True, False))
def test_every_catalogue_encoding_compiles_fullgraph_one_frame(name, dynamic):
    """Static: one length called twice, one frame; dynamic: three lengths, one frame. Bit-equal to eager."""
    enc = _build(name)
    torch._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()
    f = torch.compile(_attend(enc), fullgraph=True, backend=cnt, dynamic=dynamic)
    for S in ((7, 7) if not dynamic else (5, 11, 18)):
        q, k, v, pos = _inputs(enc, S)
        assert torch.equal(f(q, k, v, pos), _attend(enc)(q, k, v, pos))
    assert cnt.frame_count == 1 and cnt.op_count == 1  # one graph: the op, nothing traced around it
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("name", ["xpos", "alibi", "jordan", "mrope"])
def test_the_compiled_backward_equals_eager_with_sinks(name):
    enc = _build(name)
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")  # the fakes and the registered backward

    def loss(q, k, v, pos, sinks):
        return (lp.attention(q, k, v, enc, pos, pos, sinks=sinks) * torch.linspace(-1, 1, 16)).square().sum()

    f = torch.compile(loss, fullgraph=True, backend=cnt, dynamic=True)
    for S in (6, 13):
        q, k, v, pos = (t.requires_grad_() if t.is_floating_point() else t for t in _inputs(enc, S))
        sinks = torch.randn(q.shape[1], dtype=torch.float64, requires_grad=True)
        got = torch.autograd.grad(f(q, k, v, pos, sinks), (q, k, v, sinks))
        want = torch.autograd.grad(loss(q, k, v, pos, sinks), (q, k, v, sinks))
        for a, b in zip(got, want):
            assert torch.allclose(a, b, atol=1e-12, rtol=1e-12)
    assert cnt.frame_count == 1


LENGTH_DEPENDENT = {
    "dynamic": lambda: scaling.dynamic(lp.rope(16), factor=2.0, original_max_position_embeddings=16),
    "longrope": lambda: scaling.longrope(lp.rope(16), short_factor=[1.0] * 8, long_factor=[1.5 + 0.1 * i for i in range(8)],
                                         original_max_position_embeddings=16, factor=4.0),
    "dynamic_half": lambda: scaling.dynamic(lp.rope(16, layout="half"), factor=4.0, original_max_position_embeddings=8),
}


@pytest.mark.parametrize("name", list(LENGTH_DEPENDENT))
def test_a_length_dependent_encoding_compiled_once_serves_every_length(name):
    """Seven lengths on both sides of the original context: one frame (no recompile, no break), each call the
    eager one bit for bit, and the eager one is the encoding resolved at that length (``at_length``)."""
    enc = LENGTH_DEPENDENT[name]()
    torch._dynamo.reset()
    counters.clear()
    cnt = CompileCounter()
    f = torch.compile(lambda q, k, v: lp.attention(q, k, v, enc), fullgraph=True, backend=cnt, dynamic=True)
    for S in (3, 9, 15, 17, 26, 40, 71):
        q, k, v, _ = _inputs(enc, S)
        y = f(q, k, v)
        assert torch.equal(y, lp.attention(q, k, v, enc))
        assert torch.allclose(y, lp.attention_reference(q, k, v, enc.at_length(S)), atol=1e-10)
    assert cnt.frame_count == 1 and not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("name", ["rope", "decay", "alibi", "mrope"])
def test_meta_tensors_get_their_shapes_through(name):
    enc = _build(name)
    q = torch.empty(2, enc.num_heads or 2, 9, enc.content_dim, device="meta")
    v = torch.empty(2, q.shape[1], 9, 5, device="meta", dtype=torch.bfloat16)
    pos = _inputs(enc, 9)[3]
    out = lp.attention(q, q, v.float(), enc, pos, pos)
    assert out.is_meta and out.shape == (2, q.shape[1], 9, 5) and out.dtype == torch.float32


SCALED = {
    "linear": lambda: scaling.linear(lp.rope(16), factor=2.0),
    **LENGTH_DEPENDENT,
    "query_scale": lambda: lp.xpos(16, layout="half").replace(query_scale=torch.linspace(0.5, 2.0, 16)),
    "basis": lambda: lp.Encoding(lp.rope(4).generator.__class__(
        [0.0, 0.0], [1.0, 0.1], [1, 1], basis=torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))[0])),
}


@pytest.mark.parametrize("name", [*lp.CATALOGUE, *SCALED])
def test_the_graph_constant_is_the_structure_and_rebuilds_an_equal_encoding(name):
    enc = SCALED[name]() if name in SCALED else _build(name)
    key = _graph.graph_id(enc)
    assert isinstance(key, str) and json.loads(key)["sizes"] == list(enc.generator.sizes)
    twin = _graph_key.rebuild(key)
    assert twin is not enc and _graph_key.key(twin) == key
    S = 12
    x, _, _, pos = _inputs(enc, S)
    a, b = (e.at_length(S + 3) for e in (enc, twin))
    assert torch.equal(a.query(x, pos), b.query(x, pos)) and torch.equal(a.key(x, pos), b.key(x, pos))


def test_an_opaque_length_rule_is_named_when_it_cannot_be_rebuilt():
    enc = lp.rope(8).replace(length_rule=lambda L: lp.rope(8))
    with pytest.raises(ValueError, match="not a liepos scaling map"):
        _graph_key.rebuild(_graph_key.key(enc))


class Block(torch.nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.enc = enc
        self.fixed = enc.at_length(4096)  # enc.query of a length-dependent encoding needs its length

    def forward(self, q, k, v):
        return lp.attention(q, k, v, self.enc), self.fixed.query(q), self.fixed.key(k)


CHILD = r"""
import sys, torch, liepos  # a bare import registers liepos' torch ops once torch is loaded
torch.set_num_threads(int(sys.argv[3]))  # the parent's: bit-equal sums need the same split of the work
ep = torch.export.load(sys.argv[1])
io = torch.load(sys.argv[2])
out = ep.module()(*io["in"])
print(all(torch.equal(a, b) for a, b in zip(out, io["out"])))
"""


@pytest.mark.slow  # export and a fresh interpreter
@pytest.mark.parametrize("name", ["xpos", "longrope"])
def test_torch_export_runs_in_a_fresh_process(name, tmp_path):
    enc = LENGTH_DEPENDENT[name]() if name in LENGTH_DEPENDENT else _build(name)
    mod = Block(enc)
    q, k, v, _ = _inputs(enc, 9)
    S = torch.export.Dim("S", min=2, max=4096)
    ep = torch.export.export(mod, (q, k, v), dynamic_shapes=({2: S}, {2: S}, {2: S}))
    ops = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in ops] == ["liepos.attention.default", "liepos.encode.default", "liepos.encode.default"]
    for n in ops:  # the encoding's structure as a string, no integer id
        key = n.args[14] if "attention" in str(n.target) else n.args[3]
        assert isinstance(key, str) and json.loads(key)["rates"]["shape"]
    q2, k2, v2, _ = _inputs(enc, 21, seed=1)  # another length than the traced one
    assert all(torch.equal(a, b) for a, b in zip(ep.module()(q2, k2, v2), mod(q2, k2, v2)))
    torch.export.save(ep, tmp_path / "block.pt2")
    torch.save({"in": (q2, k2, v2), "out": mod(q2, k2, v2)}, tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "block.pt2"), str(tmp_path / "io.pt"),
                        str(torch.get_num_threads())],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


@pytest.mark.parametrize("name", ["rope", "alibi", "jordan", "mrope", "retnet"])
def test_meta_tensors_through_query_and_key(name):
    """Meta initialisation (FSDP, a model built on the meta device): the encoded shape, dtype and memory order."""
    enc = _build(name)
    q, _, _, pos = _inputs(enc, 9)
    for x in (q.to("meta"), q.to("meta", torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)):
        for _side, f in (("query", enc.query), ("key", enc.key)):
            real = f(torch.zeros(x.shape, dtype=x.dtype).as_strided(x.shape, x.stride()), pos)
            got = f(x, pos)
            assert got.is_meta and got.shape == real.shape and got.dtype == real.dtype and got.stride() == real.stride()


FRESH_COMPILE = r"""
import sys, torch
{imports}
enc = {build}
f = torch.compile(lambda q, p: enc.query(q, p), backend="aot_eager", fullgraph=True)
q = torch.randn(1, 2, 6, enc.content_dim, dtype=torch.float64)
p = torch.arange(6)
print(torch.equal(f(q, p), enc.query(q, p)))
"""


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize("imports,build", [
    ("import liepos as lp", "lp.rope(8)"),
    ("import liepos as lp", "lp.Encoding(lp.rope(8).generator)"),
    ("from liepos.catalogue import alibi", "alibi(8, num_heads=2)"),
])
def test_an_encoding_compiles_in_a_fresh_process_whatever_was_imported(imports, build):
    """The structure writer that names an encoding inside a graph is loaded by the facade and by the
    catalogue: a first compile in a fresh interpreter finds it."""
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    code = FRESH_COMPILE.format(imports=imports, build=build)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


def _small(S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, S, 8, dtype=torch.float64, generator=g) for _ in range(3))


@pytest.mark.slow
def test_a_kv_cache_under_torch_compile_runs_the_eager_call_and_fills_the_cache():
    """A KVCache is state the op cannot hold: traced, the call stays the eager code, so the cache grows by each
    step's keys and prefill + decode equal the full forward."""
    enc = lp.rope(8)
    q, k, v = _small(6)
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, cache: lp.attention(q, k, v, enc, cache=cache), backend="eager")
    cache = lp.KVCache()
    first = f(q[:, :, :4], k[:, :, :4], v[:, :, :4], cache)
    assert len(cache) == 4
    step = f(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], cache)
    assert len(cache) == 6
    assert torch.allclose(torch.cat((first, step), 2), lp.attention(q, k, v, enc), atol=1e-12)


@pytest.mark.slow  # the lane keeps positions under compile in the tensor-position tests
def test_positions_as_lists_under_torch_compile_equal_eager():
    """Positions given as a list are not a tensor the op can take: the traced eager code runs, bit for bit."""
    enc = lp.rope(8)
    q, k, v = _small(4)
    t = [3.0, 5.0, 8.0, 13.0]
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: lp.attention(q, k, v, enc, t, t), backend="eager")
    assert torch.equal(f(q, k, v), lp.attention(q, k, v, enc, t, t))


@pytest.mark.parametrize("flags", [dict(causal=1), dict(allow_bidirectional="no"), dict(block_size=2.0)],
                         ids=["causal", "allow_bidirectional", "block_size"])
def test_flags_of_the_wrong_type_under_torch_compile_get_the_eager_message(flags):
    """A flag of the wrong type is not routed to the op (whose schema would refuse it with its own words): the
    compiled call raises the eager call's error, naming the argument."""
    enc = lp.rope(8)
    q, k, v = _small(4)
    with pytest.raises((TypeError, ValueError)) as eager:
        lp.attention(q, k, v, enc, **flags)
    assert f"`{next(iter(flags))}`" in str(eager.value)
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: lp.attention(q, k, v, enc, **flags), backend="eager")
    with pytest.raises(type(eager.value)) as compiled:
        f(q, k, v)
    assert str(eager.value) in str(compiled.value)


def test_parameters_that_start_requiring_grad_after_compiling_are_refused_by_the_compiled_graph():
    """The op cannot carry a generator's gradient; a graph compiled for a frozen encoding whose rates later
    require grad says so (and how to recompile) instead of returning attention without that gradient."""
    enc = lp.decay(torch.linspace(0.05, 0.3, 8, dtype=torch.float64))
    q, k, v = _small(5)
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: lp.attention(q, k, v, enc), fullgraph=True, backend="eager")
    assert torch.equal(f(q, k, v), lp.attention(q, k, v, enc))
    enc.generator.rates.requires_grad_(True)
    try:
        with pytest.raises(RuntimeError, match="require grad since this graph was compiled"):
            f(q, k, v)
    finally:
        enc.generator.rates.requires_grad_(False)


@pytest.mark.parametrize("Sq, Sk", [(3, 0), (0, 4)])
def test_the_compiled_backward_of_a_call_with_nothing_to_attend_is_zero(Sq, Sk):
    """No keys or no queries: the output is zeros that depend on no input, so its share of every gradient is 0,
    compiled as eagerly (where autograd reports the unused inputs as None)."""
    enc = lp.rope(8)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, Sq, 8, dtype=torch.float64, generator=g).requires_grad_()
    k, v = (torch.randn(1, 2, Sk, 8, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))

    def loss(q, k, v):
        out = lp.attention(q, k, v, enc, torch.arange(float(Sq)), torch.arange(float(Sk)))
        return out.sum() + q.square().sum() + k.sum() + v.sum()

    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    torch._dynamo.reset()
    f = torch.compile(loss, fullgraph=True, backend=CompileCounterWithBackend("aot_eager"))
    got = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
