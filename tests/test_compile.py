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
    encs = [lp.Encoding(g), lp.alibi(8, num_heads=2)]
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


# ---------------------------------------------------------------------- the fast path as one opaque op
from liepos import _graph  # noqa: E402
from liepos.generator import Generator, direct_sum  # noqa: E402
from helpers import fast_lane  # noqa: E402

# ops that build tables (angles, scales, polynomial coefficients): none may appear in a compiled graph
TABLE_OPS = ("sin", "cos", "exp", "lgamma", "pow", "remainder", "fmod", "floor", "round", "atan2", "polar")


def _mixed_jordan_nope(layout: str = "interleaved") -> lp.Encoding:
    # RoPE planes, a rotating 2×2 Jordan block (4 dims), a decay, a 3×3 Jordan block, NoPE
    g = direct_sum(lp.rope(8).generator, Generator([0.0], [0.3], [2]), Generator([-0.1, -0.05], [0.0, 0.0], [1, 3]),
                   lp.nope(2).generator)
    return lp.Encoding(g, layout=layout, name="mixed")


GRAPH_ENCODINGS = {
    "rope": lambda: lp.rope(16),
    "rope_half": lambda: lp.rope(16, layout="half"),
    "xpos": lambda: lp.xpos(16),
    "retnet_half": lambda: lp.retnet(16, num_heads=2, layout="half"),
    "alibi": lambda: lp.alibi(8, num_heads=2),
    "mixed": lambda: _mixed_jordan_nope(),
    "mixed_half": lambda: _mixed_jordan_nope("half"),
    "mrope": lambda: lp.mrope(16, sections=(2, 3, 3)),
}


class Recorder:
    """A dynamo backend that records every op of every captured graph, then runs it (or Inductor)."""

    def __init__(self, inductor: bool = False) -> None:
        self.ops: list[str] = []
        self.inductor = inductor
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        for n in gm.graph.nodes:
            if n.op in ("call_function", "call_method"):
                self.ops.append(str(getattr(n.target, "__name__", n.target)))
        if self.inductor:
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        return gm.forward


def _positions(enc, S, shift=0):
    t = torch.arange(S) + shift
    return t if enc.num_axes is None else torch.stack([t, t // 2, t % 3][: enc.num_axes], -1)  # (S, axes)


@pytest.mark.parametrize("name", list(GRAPH_ENCODINGS))
@pytest.mark.parametrize("given", [False, True])
def test_one_graph_no_tables_in_it_across_lengths(name, given):
    enc = GRAPH_ENCODINGS[name]()
    torch._dynamo.reset()
    counters.clear()
    rec = Recorder()
    if given:
        def f(q, k, pos):
            return enc.query(q, pos), enc.key(k, pos)
    else:
        def f(q, k, pos):
            return enc.query(q), enc.key(k)
    cf = torch.compile(f, fullgraph=True, backend=rec)
    H = enc.num_heads or 2
    for S in (8, 13, 32, 100):
        torch.manual_seed(S)
        q = torch.randn(1, H, S, enc.content_dim, dtype=torch.float64)
        k = torch.randn(1, H, S, enc.content_dim, dtype=torch.float64)
        pos = _positions(enc, S, shift=3 if given else 0)
        for t in (q, k):
            torch._dynamo.mark_dynamic(t, 2)
        torch._dynamo.mark_dynamic(pos, 0)
        yq, yk = cf(q, k, pos)
        p = pos if given else None
        assert torch.allclose(yq, enc.query_reference(q, p), atol=1e-10, rtol=1e-10)
        assert torch.allclose(yk, enc.key_reference(k, p), atol=1e-10, rtol=1e-10)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert rec.graphs == 1  # one compilation for 4 lengths: 0 recompiles
    assert rec.ops.count("encode") == 2, rec.ops  # one opaque op per side: the eager fast path
    built = [o for o in rec.ops if any(o == t or o.endswith("." + t) for t in TABLE_OPS)]
    assert not built, built


@pytest.mark.slow
def test_graph_tables_with_inductor_origin_scale_gqa_batched_positions():
    enc = lp.xpos(16, layout="half").replace(query_scale=torch.linspace(0.5, 2.0, 16))
    torch._dynamo.reset()
    counters.clear()
    rec = Recorder(inductor=True)

    def f(q, k, pos, origin):
        return enc.query(q, pos, origin=origin), enc.key(k, pos, origin=origin)

    cf = torch.compile(f, fullgraph=True, backend=rec)
    for S in (9, 21, 40):
        q = torch.randn(2, 4, S, 16, dtype=torch.float64)
        k = torch.randn(2, 2, S, 16, dtype=torch.float64)  # grouped queries: fewer key heads
        pos = torch.stack([torch.arange(S), torch.arange(S) * 2 + 1])  # per batch element (2, S)
        origin = torch.tensor([float(S), 1.0], dtype=torch.float64)
        for t in (q, k):
            torch._dynamo.mark_dynamic(t, 2)
        torch._dynamo.mark_dynamic(pos, 1)
        yq, yk = cf(q, k, pos, origin)
        assert torch.allclose(yq, enc.query_reference(q, pos, origin=origin), atol=1e-10)
        assert torch.allclose(yk, enc.key_reference(k, pos, origin=origin), atol=1e-10)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert not [o for o in rec.ops if o in TABLE_OPS]


@pytest.mark.parametrize("name", ["rope_half", "alibi", "mixed"])
def test_graph_bfloat16_equals_eager(name):
    enc = GRAPH_ENCODINGS[name]()
    torch._dynamo.reset()
    cf = torch.compile(lambda q: enc.query(q), fullgraph=True, backend="inductor")
    for S in (7, 30):
        q = torch.randn(1, enc.num_heads or 2, S, enc.content_dim).to(torch.bfloat16)
        torch._dynamo.mark_dynamic(q, 2)
        y, ref = cf(q), enc.query(q)
        assert y.dtype == ref.dtype and y.shape == ref.shape
        # both compute in float32 from the same float32 tables and round once: one ulp at most
        assert ((y.double() - ref.double()).abs() <= 2**-7 * ref.double().abs() + 1e-6).all()


@pytest.mark.parametrize("backend", fast_lane("aot_eager", "inductor"))
@pytest.mark.parametrize("name", ["rope_half", "mixed", "alibi"])
def test_backward_through_the_graph_equals_eager(backend, name):
    enc = GRAPH_ENCODINGS[name]()
    torch._dynamo.reset()
    counters.clear()
    w = torch.randn(enc.dim, dtype=torch.float64)

    def loss(q, k):
        return ((enc.query(q) * w).sum(-1) * enc.key(k).sum(-1)).square().sum()

    cf = torch.compile(loss, fullgraph=True, backend=backend)
    for S in (6, 11):
        q = torch.randn(1, enc.num_heads or 2, S, enc.content_dim, dtype=torch.float64, requires_grad=True)
        k = torch.randn(1, enc.num_heads or 2, S, enc.content_dim, dtype=torch.float64, requires_grad=True)
        torch._dynamo.mark_dynamic(q, 2)
        torch._dynamo.mark_dynamic(k, 2)
        gq, gk = torch.autograd.grad(cf(q, k), (q, k))
        rq, rk = torch.autograd.grad(loss(q, k), (q, k))
        assert torch.allclose(gq, rq, atol=1e-9) and torch.allclose(gk, rk, atol=1e-9)
    assert counters["stats"]["unique_graphs"] == 1


def test_learnable_generator_keeps_the_differentiable_traced_path():
    from liepos.nn import LearnableEncoding

    mod = LearnableEncoding(8)
    torch._dynamo.reset()
    rec = Recorder()
    enc = mod()  # the encoding of the current parameters (its generator's tables require grad)
    cf = torch.compile(lambda q: enc.query(q).square().sum(), fullgraph=True, backend=rec)
    q = torch.randn(1, 1, 5, 8, dtype=torch.float32)
    params = [p for p in mod.parameters() if p.requires_grad]
    got = torch.autograd.grad(cf(q), params)
    want = torch.autograd.grad(mod().query(q).square().sum(), params)
    for g, r in zip(got, want):
        assert torch.allclose(g, r, atol=1e-5)
    assert not any("encode" in o for o in rec.ops)  # the tables are traced: they carry the gradient


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_inplace_under_compile(backend):
    enc = lp.rope(16, layout="half")
    torch._dynamo.reset()
    rec = Recorder(inductor=backend == "inductor")
    cf = torch.compile(lambda q: enc.query(q, inplace=True), fullgraph=True, backend=rec)
    for S in (9, 300):  # 300: big enough for the compiled one-pass kernel inside the op
        q = torch.randn(1, 2, S, 16, dtype=torch.float64)
        torch._dynamo.mark_dynamic(q, 2)
        ref = enc.query_reference(q)
        out = cf(q)
        assert torch.allclose(q, ref, atol=1e-12) and torch.allclose(out, ref, atol=1e-12)
    assert rec.ops.count("encode_") == 1, rec.ops  # the mutating op, no copy
    # a gradient into q: the out-of-place op (its transpose as backward) and a copy back
    q = torch.randn(1, 2, 9, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64)
    g = torch.autograd.grad((cf(q.clone()) * w).sum(), q)[0]
    assert torch.allclose(g, torch.autograd.grad((enc.query_reference(q) * w).sum(), q)[0], atol=1e-12)
    alibi = lp.alibi(8, num_heads=2)
    # fullgraph: dynamo reports the ValueError raised while tracing (with its message)
    with pytest.raises(Exception, match=r"ValueError.*slots make it 10"):
        torch.compile(lambda q: alibi.query(q, inplace=True), fullgraph=True, backend="aot_eager")(
            torch.randn(1, 2, 5, 8))


def test_compiled_equals_eager_with_the_one_pass_kernel_inside():
    from liepos import _kernels

    for enc in (lp.rope(128, layout="half"), lp.rope(128)):
        torch._dynamo.reset()
        cf = torch.compile(lambda q, k, enc=enc: (enc.query(q), enc.key(k)), fullgraph=True, backend="inductor")
        q = torch.randn(1, 4, 200, 128)  # over MIN_ELEMS: the compiled half-layout kernel runs in the op
        k = torch.randn(1, 4, 200, 128).transpose(1, 2).contiguous().transpose(1, 2)  # BSHD
        yq, yk = cf(q, k)
        assert torch.equal(yq, enc.query(q)) and torch.equal(yk, enc.key(k))  # the same routine, bit for bit
        assert yk.stride() == enc.key(k).stride()
    assert not _kernels.status()["failed"]


def _opcheck_encodings():
    return (lp.alibi(8, num_heads=2), lp.rope(8), lp.xpos(8, layout="half"), _mixed_jordan_nope(), lp.nope(8))


@pytest.mark.slow  # the whole grid: 5 encodings x 4 ways of giving positions x 2 sides x 2 dtypes, 4 ops
def test_ops_meet_their_fakes_and_autograd_over_the_grid():
    _opcheck_grid(_opcheck_encodings(), range(4), ("query", "key"), (torch.float64, torch.bfloat16))


def test_ops_meet_their_fakes_and_autograd_and_the_constant_marker_is_dynamos():
    """One representative case per op for the fast lane: ALiBi (slots, a width change) and a
    Jordan + NoPE sum (a coupling), int64 positions with an origin, the key side, bfloat16."""
    alibi, _, _, jordan, _ = _opcheck_encodings()
    _opcheck_grid((alibi, jordan), (3,), ("key",), (torch.bfloat16,))
    _the_constant_marker_is_dynamos()


def _opcheck_grid(encs, which, sides, dtypes):
    for enc in encs:
        i = _graph.graph_id(enc)
        assert _graph.graph_id(enc) == i
        # the positions as the caller gives them (None, int64, float64 per batch element) and an origin
        cases = ((torch.arange(5, dtype=torch.float64), None), (torch.arange(6, dtype=torch.float64).reshape(2, 3) * 1.5,
                 None), (None, torch.tensor(2.0, dtype=torch.float64)), (torch.arange(4) + 7, torch.tensor([3.0])))
        for pos, origin in (cases[j] for j in which):
            S = 4 if pos is None else pos.shape[-1]
            B = 1 if pos is None or pos.dim() == 1 else pos.shape[0]
            for side in sides:
                for dtype in dtypes:
                    x = torch.randn(B, 2, S, enc.content_dim, dtype=torch.float64).to(dtype).requires_grad_()
                    torch.library.opcheck(torch.ops.liepos.encode.default, (x, pos, origin, i, side, True))
                    y = torch.ops.liepos.encode(x.detach(), pos, origin, i, side, True)
                    g = torch.randn_like(y)
                    torch.library.opcheck(torch.ops.liepos.encode_transposed.default,
                                          (g[..., : enc.content_dim], pos, origin, i, side, True, dtype))
                xf = torch.randn(B, 2, S, enc.dim, dtype=torch.float64)
                torch.library.opcheck(torch.ops.liepos.encode_.default, (xf, pos, origin, i, side))
                torch.library.opcheck(torch.ops.liepos.encode.default, (xf.requires_grad_(), pos, origin, i, side, False))


def _the_constant_marker_is_dynamos():
    import copy

    enc = lp.rope(8)
    twin = copy.deepcopy(enc)  # the same structure: the same graph constant, and either encodes alike
    key = _graph.graph_id(enc)
    assert _graph.graph_id(twin) == key and _graph.graph_id(_graph.encoding_of(key)) == key
    other = lp.rope(8, layout="half")  # another structure: another constant
    assert _graph.graph_id(other) != key and _graph.graph_id(_graph.encoding_of(_graph.graph_id(other))) != key
    # liepos marks its constant functions without importing dynamo: the public decorator's marker
    marked = torch.compiler.assume_constant_result(lambda: 0)
    assert getattr(marked, "_dynamo_marked_constant", False) is True
    assert getattr(_graph.usable, "_dynamo_marked_constant", False) is True


def test_angles_past_2_80_two_pi_exact_in_the_op_nan_only_where_traced():
    """docs/guide/precision.md: inside torch.compile the op's tables are the eager ones (Payne–Hanek past
    2^80·2π); only the traced path (here: positions requiring grad) gives NaN there, never a wrong angle."""
    enc = lp.rope(8)
    torch._dynamo.reset()
    cf = torch.compile(lambda q, p: enc.query(q, p), fullgraph=True, backend="aot_eager")
    q = torch.randn(1, 1, 2, 8, dtype=torch.float64)
    pos = torch.tensor([1e25, 3e26], dtype=torch.float64)  # ω = 1: past 2^80·2π
    assert torch.equal(cf(q, pos), enc.query(q, pos))  # the eager tables (exact reduction), no NaN
    traced = cf(q, pos.clone().requires_grad_())
    assert torch.isnan(traced[..., :2]).all() and not torch.isnan(traced[..., -2:]).any()  # ω ≈ 1e-3: below


# ---------------------------------------------------------------------- nothing around the op
def _code(f, *args):
    """The Python and C++ code Inductor wrote for ``f(*args)`` (one graph), and ``f``'s output."""
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(f, *args)
    return out, "\n".join(codes)


@pytest.mark.parametrize("case", ["int64", "float32", "none", "origin", "batched"])
def test_the_compiled_graph_is_the_op_and_nothing_else(case):
    """The positions reach the op as the caller gave them: no int64 → float64 conversion, no arange,
    no subtraction of the origin in the graph — each a tiny Inductor kernel (``cpp_fused_…``) whose
    OpenMP region waits on a descheduled thread of a loaded machine. The op converts them itself."""
    pytest.importorskip("torch._inductor")
    enc = lp.xpos(16, layout="half")
    torch._dynamo.reset()
    counters.clear()
    rec = Recorder(inductor=True)

    def f(q, pos, origin):
        if case == "none":
            return enc.query(q)
        return enc.query(q, pos, origin=origin if case == "origin" else None)

    cf = torch.compile(f, fullgraph=True, backend=rec)
    for S in (8, 13, 100):
        q = torch.randn(2, 2, S, 16)
        pos = torch.arange(S) + 5
        if case == "float32":
            pos = pos.float() * 0.5
        elif case in ("batched", "origin"):
            pos = torch.stack([pos, 2 * pos])  # (B, S)
        origin = torch.tensor([3, 40])  # int64, one per batch element: converted inside the op too
        torch._dynamo.mark_dynamic(q, 2)
        torch._dynamo.mark_dynamic(pos, pos.dim() - 1)
        if S == 8:  # compiled once: the code of the first call
            out, code = _code(cf, q, pos, origin)
            assert "torch.ops.liepos.encode.default" in code
            assert "cpp_fused" not in code, code  # no Inductor kernel of its own: the op, nothing else
        else:
            out = cf(q, pos, origin)
        p = None if case == "none" else pos
        o = origin if case == "origin" else None
        assert torch.equal(out, enc.query(q, p, origin=o))  # the eager fast path, bit for bit
        assert torch.allclose(out.double(), enc.query_reference(q.double(), p, origin=o), atol=1e-5)
    assert rec.graphs == 1 and counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    # in the FX graph as dynamo captured it: the op, and no conversion, arange or subtraction
    assert [o for o in rec.ops if o not in ("size", "sym_size", "getitem")] == ["encode"], rec.ops


def test_the_reference_path_still_reads_the_positions_under_compile():
    enc = lp.xpos(8)
    torch._dynamo.reset()
    cf = torch.compile(lambda q, p: (enc.query(q, p), enc.query_reference(q, p)), fullgraph=True, backend="aot_eager")
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    y, ref = cf(q, torch.arange(6) + 2)
    assert torch.allclose(y, ref, atol=1e-12) and torch.allclose(ref, enc.query_reference(q, torch.arange(6) + 2))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_calls_refuse_what_eager_refuses(backend):
    """The op checks the positions on real data, as the eager path does, with the eager message:
    NaN or inf positions, a NaN origin, scales that overflow (nothing silently NaN or inf)."""
    enc = lp.xpos(16, layout="half")
    torch._dynamo.reset()
    cf = torch.compile(lambda q, p, o: enc.query(q, p, origin=o), fullgraph=True, backend=backend)
    q = torch.randn(1, 2, 4, 16)
    good = torch.arange(4.0)
    zero = torch.tensor(0.0, dtype=torch.float64)
    assert torch.equal(cf(q, good, zero), enc.query(q, good, origin=zero))
    cases = [(torch.tensor([0.0, float("nan"), 2.0, 3.0]), zero, ValueError),
             (torch.tensor([0.0, 1.0, float("inf"), 3.0]), zero, ValueError),
             (good, torch.tensor(float("nan"), dtype=torch.float64), ValueError),
             (good + 1e18, zero, OverflowError)]
    for pos, origin, err in cases:
        with pytest.raises(err) as eager:
            enc.query(q, pos, origin=origin)
        with pytest.raises(err) as compiled:
            cf(q, pos, origin)
        assert str(compiled.value) == str(eager.value)


def test_an_encoding_first_met_in_a_fake_implementation_is_rebuilt_real():
    """The key of an encoding no longer alive (a program saved elsewhere, a twin collected) is rebuilt
    inside the op's fake implementation, under opcheck's fake and proxy modes: the rebuilt encoding is
    made of real tensors, and the op still meets its fake."""
    import gc

    enc = lp.alibi(8, num_heads=2)
    key = _graph.graph_id(enc)
    del enc
    gc.collect()
    _graph._rebuilt.pop(key, None)
    assert _graph._live(key) is None
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.liepos.encode.default, (x, torch.arange(5.0, dtype=torch.float64), None, key, "query", True))
    assert _graph.graph_id(_graph._rebuilt[key]) == key


def test_a_live_twin_is_found_when_the_first_of_its_structure_dies():
    import gc

    first, twin = lp.rope(8), lp.rope(8)
    key = _graph.graph_id(first)
    assert _graph.graph_id(twin) == key
    del first
    gc.collect()
    assert _graph._live(key) is twin
