"""The fast application path (liepos._fast) against the readable path and the dense reference."""

from __future__ import annotations

import contextlib

import pytest
import torch

import liepos as lp
from liepos import _fast, _kernels
from liepos.apply import apply_tables
from liepos.generator import Generator, direct_sum
from helpers import fast_lane


def _mixed(dim: int = 20, layout: str = "interleaved") -> lp.Encoding:
    """RoPE planes + decay + a 3×3 Jordan block + a damped complex Jordan block + NoPE."""
    P = (dim - 10) // 2
    g = direct_sum(
        lp.rope(2 * P).generator,
        Generator([-0.05], [0.3], [2]),
        Generator([-0.1, -0.01, 0.0], [0.0, 0.0, 0.0], [1, 1, 3]),
    )
    if dim > g.dim:
        g = direct_sum(g, lp.nope(dim - g.dim).generator)
    return lp.Encoding(g, layout=layout, name="mixed")


ENCODINGS = {
    "rope": lambda: lp.rope(16),
    "rope_half": lambda: lp.rope(16, layout="half"),
    "xpos": lambda: lp.xpos(16),
    "xpos_half": lambda: lp.xpos(16, layout="half"),
    "retnet": lambda: lp.retnet(16, num_heads=4),
    "nope": lambda: lp.nope(16),
    "decay": lambda: lp.decay(torch.linspace(0.0, 0.1, 16)),
    "jordan3": lambda: lp.jordan(3, -0.1),
    "complex_jordan": lambda: lp.jordan(2, -0.1, 0.5),
    "alibi": lambda: lp.alibi(16, num_heads=4),
    "mixed": lambda: _mixed(),
    "mixed_half": lambda: _mixed(layout="half"),
}
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 0.0}


def _eager(enc: lp.Encoding, x: torch.Tensor, pos, side: str) -> torch.Tensor:
    """The readable path: slots by concatenation, then ``apply_tables``."""
    p = torch.as_tensor(pos, dtype=torch.float64)
    xs = enc._with_slots(x, enc.query_slots if side == "query" else enc.key_slots)
    return apply_tables(xs, enc.tables(p, side))


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("dtype", fast_lane(torch.float64, torch.float32, torch.bfloat16))
@pytest.mark.parametrize("bshd", fast_lane(False, True))
def test_fast_equals_eager_equals_dense(name, dtype, bshd):
    enc = ENCODINGS[name]()
    torch.manual_seed(0)
    H, Hk = 4, 2  # grouped queries: keys have fewer heads (unless the parameters are per head)
    if enc.num_heads is not None:
        Hk = H
    d = enc.content_dim
    mk = lambda h: (torch.randn(2, 7, h, d, dtype=dtype).transpose(1, 2) if bshd  # noqa: E731
                    else torch.randn(2, h, 7, d, dtype=dtype))
    q, k = mk(H), mk(Hk)
    pos = torch.arange(5, 12)
    for side, x in (("query", q), ("key", k)):
        fast = enc.query(x, pos) if side == "query" else enc.key(x, pos)
        eager = _eager(enc, x, pos, side)
        ref = (enc.query_reference if side == "query" else enc.key_reference)(x.double(), pos)
        assert fast.dtype == eager.dtype and fast.shape == eager.shape
        scale = ref.abs().amax().clamp_min(1.0)
        if dtype == torch.bfloat16:
            # both compute in float32 and round once; allow one bfloat16 ulp of disagreement
            assert ((fast.double() - eager.double()).abs() <= 2**-7 * eager.double().abs() + 1e-6).all()
            assert float((fast.double() - ref).abs().max() / scale) < 2e-2
        else:
            assert float((fast.double() - eager.double()).abs().max() / scale) <= TOL[dtype]
            assert float((fast.double() - ref).abs().max() / scale) <= TOL[dtype] * 10
        if bshd and enc.num_slots == 0 and enc.plan.partner != "gather":
            # the output keeps the input's memory order (no .contiguous() copy)
            assert fast.stride(2) > fast.stride(1)


def test_per_batch_and_real_positions():
    enc = _mixed()
    x = torch.randn(2, 3, 6, enc.content_dim, dtype=torch.float64)
    pos = torch.tensor([[0.5, 1.5, 2.0, 7.25, 9.0, 11.0], [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
    assert torch.allclose(enc.query(x, pos), enc.query_reference(x, pos), atol=1e-12)
    assert torch.allclose(enc.key(x, pos), enc.key_reference(x, pos), atol=1e-12)
    alibi = lp.alibi(8, num_heads=3)
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    assert torch.allclose(alibi.query(x, pos), alibi.query_reference(x, pos), atol=1e-12)
    assert torch.allclose(alibi.key(x, pos), alibi.key_reference(x, pos), atol=1e-12)


def test_transport_through_fast_path():
    enc = lp.xpos(8)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    s = torch.arange(5)
    assert torch.allclose(enc.key(k, s, origin=3.0), enc.transport(enc.key(k, s), 3.0), atol=1e-12)


@pytest.mark.parametrize("name", ["rope", "rope_half", "mixed", "mixed_half", "alibi", "jordan3"])
def test_backward_is_the_transpose(name):
    enc = ENCODINGS[name]()
    x = torch.randn(1, enc.num_heads or 2, 4, enc.content_dim, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(4)
    assert torch.autograd.gradcheck(lambda x: enc.query(x, pos), (x,))
    assert torch.autograd.gradcheck(lambda x: enc.key(x, pos), (x,))


def test_backward_saves_only_tables():
    enc = lp.rope(32)
    x = torch.randn(1, 4, 64, 32, requires_grad=True)
    y0 = x * 1.0
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = enc.query(y0, torch.arange(64))
    assert not any(t.numel() >= y0.numel() for t in saved)
    y.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_eager(dtype):
    enc = _mixed(24)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 8, 24, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 3, 8, 24, dtype=dtype)
    pos = torch.arange(8)
    (gf,) = torch.autograd.grad(enc.key(x, pos), x, g)
    (ge,) = torch.autograd.grad(_eager(enc, x, pos, "key"), x, g)
    assert gf.dtype == dtype
    assert torch.allclose(gf.double(), ge.double(), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)


def test_learnable_parameters_and_positions_get_gradients():
    rates = torch.tensor([-0.1, -0.02], dtype=torch.float64, requires_grad=True)
    freqs = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 1, 3, 4, dtype=torch.float64)

    def f(r, w, p):
        return lp.Encoding(Generator(r, w, [1, 1])).query(x, p)

    p = torch.tensor([0.0, 1.5, 3.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (rates, freqs, p))


def test_inplace_equals_out_of_place_and_backprops():
    for enc in (lp.rope(16), lp.rope(16, layout="half"), _mixed(16), lp.xpos(16, layout="half")):
        x = torch.randn(1, 2, 5, 16)
        ref = enc.query(x, torch.arange(5))
        y = x.clone()
        out = enc.query(y, torch.arange(5), inplace=True)
        assert out.data_ptr() == y.data_ptr()
        assert torch.allclose(out, ref, atol=1e-6)
        leaf = torch.randn(1, 2, 5, 16, requires_grad=True)
        z = enc.key(leaf * 1.0, torch.arange(5), inplace=True)
        z.square().sum().backward()
        (ge,) = torch.autograd.grad(enc.key(leaf, torch.arange(5)).square().sum(), leaf)
        assert torch.allclose(leaf.grad, ge, atol=1e-5)
    with pytest.raises(ValueError, match="inplace"):
        lp.alibi(8, num_heads=2).query(torch.randn(1, 2, 3, 8), inplace=True)


def test_decode_reads_a_cached_row_and_the_cache_is_bounded():
    _fast.CACHE.clear()
    enc = lp.xpos(16)
    k = torch.randn(1, 2, 1, 16)
    enc.key(torch.randn(1, 2, 100, 16), torch.arange(100))
    misses = _fast.CACHE.misses
    for t in range(100, 120):  # one window serves every step
        y = enc.key(k, [t])
        assert torch.allclose(y, enc.key_reference(k.double(), [t]).float(), atol=1e-5)
    assert _fast.CACHE.misses - misses <= 1
    for n in range(1, 400, 7):  # many lengths, many windows: the cache stays bounded
        enc.query(torch.randn(1, 1, n, 16), torch.arange(n) + 3 * n)
    assert len(_fast.CACHE) <= _fast.CACHE.max_entries


def test_cache_follows_the_generator_version():
    _fast.CACHE.clear()
    x = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    a, b = lp.rope(8, base=100.0), lp.rope(8, base=10000.0)
    assert not torch.allclose(a.query(x), b.query(x))
    assert torch.allclose(b.query(x), b.query_reference(x), atol=1e-12)


@pytest.mark.parametrize("name", ["rope_half", "xpos_half", "mixed_half", "retnet"])
@pytest.mark.parametrize("inplace", [False, True])
def test_half_layout_in_cache_sized_slabs_equals_the_readable_path(name, inplace, monkeypatch):
    """The half-layout rotation runs in slabs of rows; a slab of 3 rows (many slabs, a ragged last one)
    gives what one slab gives, in and out of place, with per-batch and shared tables."""
    enc = ENCODINGS[name]()
    torch.manual_seed(1)
    x = torch.randn(2, enc.num_heads or 3, 11, enc.content_dim, dtype=torch.float64)
    for pos in (torch.arange(11) + 7.0, torch.rand(2, 11, dtype=torch.float64) * 50):
        want = _eager(enc, x, pos, "query")
        monkeypatch.setattr(_fast, "_SLAB_BYTES", 3 * x[..., :1, : x.shape[-1] // 2].numel() * 8)
        y = x.clone()
        got = enc.query(y, pos, inplace=inplace) if not enc.num_slots else enc.query(y, pos)
        assert torch.allclose(got, want, atol=1e-12)
        if inplace:
            assert got.data_ptr() == y.data_ptr()


def _eval_terms(x: torch.Tensor, offsets, masks, T: torch.Tensor) -> torch.Tensor:
    """``y[…, d] = Σ_j [masks[j][d]] T[…, j, d] · x[…, d + o_j]`` in plain torch (the kernel's definition)."""
    D = x.shape[-1]
    y = torch.zeros_like(x)
    for j, o in enumerate(offsets):
        m = torch.tensor(masks[j], dtype=torch.bool)
        cols = torch.arange(D) + o
        ok = m & (cols >= 0) & (cols < D)
        assert bool((ok == m).all())  # a term never reaches past the row
        y[..., ok] += T[..., j, ok] * x[..., cols[ok]]
    return y


@pytest.mark.parametrize("name", ["jordan3", "complex_jordan", "mixed", "mixed_half"])
@pytest.mark.parametrize("side", ["query", "key"])
def test_shifted_terms_are_the_transform_and_their_transpose(name, side):
    """The term tables of a coupled encoding (what the native kernel reads) reproduce the dense transform,
    and the transposed terms (offsets negated, tables shifted) its transpose: checked in plain torch, so
    it holds where no compiler is."""
    enc = ENCODINGS[name]()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, enc.content_dim, dtype=torch.float64)
    pos = torch.arange(4, 10)
    ft = enc._build_fast(pos.double(), side, torch.float64, True)
    assert ft.terms is not None
    offsets, masks, T = ft.terms
    ref = (enc.query_reference if side == "query" else enc.key_reference)(x, pos)
    assert torch.allclose(_eval_terms(x, offsets, masks, T), ref, atol=1e-12)
    g = torch.randn_like(x)
    to, tm, tT = _fast._transposed_terms(ft)
    # <g, M x> = <Mᵀ g, x>
    lhs = (g * _eval_terms(x, offsets, masks, T)).sum()
    rhs = (_eval_terms(g, to, tm, tT) * x).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-12)
    assert torch.equal(ft.rows(1, 4).terms[2], T[..., 1:4, :, :])  # rows slice the term tables too


@pytest.mark.parametrize("name", ["rope", "xpos", "decay", "mixed", "mixed_half", "jordan3", "complex_jordan"])
@pytest.mark.parametrize("layout", ["contiguous", "odd_row_stride", "odd_offset"])
@pytest.mark.parametrize("kernels", [True, False])
def test_fast_path_equals_the_readable_path_in_every_layout(name, layout, kernels):
    """The compiled kernels and the run-by-run torch ops (``_kernels.off()``: complex views where the
    strides allow, the coupling by columns) equal the readable path on a contiguous copy, also when
    the rows are not complex-aligned (an odd row stride, an odd storage offset)."""
    enc = ENCODINGS[name]()
    d = enc.content_dim
    g = torch.Generator().manual_seed(0)
    # an odd width, an even sequence: only the row stride is odd (the batch and head strides are even)
    wide = torch.randn(2, 3, 6, d + 1 + d % 2, dtype=torch.float64, generator=g)
    if layout == "contiguous":
        x = wide[..., :d].contiguous()
    elif layout == "odd_row_stride":
        x = wide[..., :d]  # (2, 3, 6, d) with an odd row stride
    else:
        x = wide.reshape(-1)[1 : 1 + 36 * d].view(2, 3, 6, d)  # storage offset 1
    pos = 3.0 * torch.arange(6, dtype=torch.float64) + 2.0
    for side, fn in (("query", enc.query), ("key", enc.key)):
        want = _eager(enc, x.contiguous(), pos, side)
        with contextlib.nullcontext() if kernels else _kernels.off():
            got = fn(x, pos)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (side, float((got - want).abs().max()))


def test_table_cache_counts_hits_and_misses():
    """A second ``get`` of a key is a hit that does not build; ``clear`` empties it and resets the counts."""
    cache, built = _fast.TableCache(), []
    ft = _fast.fast_tables(lp.rope(8).tables(torch.arange(4.0, dtype=torch.float64), "query"), 8, torch.float32)
    assert cache.get("k", lambda: built.append(1) or ft) is ft and (cache.hits, cache.misses, len(built)) == (0, 1, 1)
    assert cache.get("k", lambda: built.append(1) or ft) is ft and (cache.hits, cache.misses, len(built)) == (1, 1, 1)
    cache.clear()
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
    # bounded by entries alone, and by bytes alone (the newest entry always stays)
    few, small = _fast.TableCache(max_entries=2), _fast.TableCache(max_bytes=ft.nbytes() + 1)
    for k in range(3):
        few.get(k, lambda: ft)
        small.get(k, lambda: ft)
    assert len(few) == 2 and len(small) == 1
    assert few.get(2, lambda: None) is ft and few.hits == 1  # the newest kept, the oldest evicted


@pytest.mark.parametrize("name", ["rope", "mixed", "xpos_half"])
def test_half_precision_in_per_head_chunks_equals_one_chunk(name, monkeypatch):
    """bfloat16 runs in float32 scratch a few heads at a time: one head per chunk gives the same bits as
    all heads in one chunk (and the readable path's values)."""
    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, enc.content_dim, generator=g).to(torch.bfloat16)
    pos = torch.arange(5, dtype=torch.float64) + 7.0
    whole = enc.query(x, pos)
    monkeypatch.setattr(_fast, "_CHUNK_ELEMS", 1)
    _fast.CACHE.clear()
    assert torch.equal(enc.query(x, pos), whole)
    want = _eager(enc, x.to(torch.float64), pos, "query")
    assert torch.allclose(whole.double(), want, rtol=2e-2, atol=2e-2)


def test_an_encoding_that_neither_scales_rotates_nor_couples_runs_no_kernel(monkeypatch):
    """NoPE's tables are the identity: the fast tables say so, and the apply returns ``x`` itself in place (a
    copy otherwise) without entering the kernel dispatch."""
    enc = lp.nope(16)
    ft = _fast.fast_tables(enc.tables(torch.arange(4.0, dtype=torch.float64), "query"), 16, torch.float32)
    assert ft.identity and ft.runs[0].kind == "copy"
    monkeypatch.setattr(_fast, "transform", lambda *a, **k: pytest.fail("the identity ran a kernel"))
    x = torch.randn(1, 2, 4, 16)
    assert _fast.apply_fast(x, ft, inplace=True) is x
    y = _fast.apply_fast(x, ft)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()


def test_contiguous_coupled_columns_are_read_by_a_slice_not_a_gather():
    """``y[dst] += c · z[src]``: source columns that form one range are read as a slice (no index kernel),
    others by a gather; both give ``y[d] += c_p · x[s]`` with ``z`` read before any write."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, generator=g)
    coef = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    for src, gathered in [([2, 3, 4], False), ([1, 3, 6], True), ([5, 4, 3], False)]:
        dst = [3, 4, 7]
        out = x.clone()
        with Ops() as mode:
            _fast._couple(out, (dst, src, coef), False, lambda t: t)
        want = x.clone()
        for p, (d, s) in enumerate(zip(dst, src)):
            want[:, d] += coef[p] * x[:, s]
        assert torch.allclose(out, want, rtol=0, atol=1e-15), src
        assert ("aten.index" in mode.ops) == gathered, (src, mode.ops)
