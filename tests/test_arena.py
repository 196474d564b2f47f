"""The arena streamed tiles write their own encodings into (``attention_pieces.Arena``): reused from tile to tile
and call to call on one thread, bounded, never under autograd, and the output bit for bit the same as with fresh
tensors."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

import liepos as lp
from liepos import _fast, attention_pieces
from liepos.attention_pieces import Arena, arena

F64 = torch.float64


def _qkv(T: int = 1024, H: int = 4, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, T, 64, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("name", ["decay", "jordan", "retnet"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_tiles_write_into_the_arena_and_give_the_same_bits(name, dtype, monkeypatch, tiling):
    """Every streamed tile's encodings land in this thread's arena (the same storage on a second call), and the
    output equals the same call with every encoding a fresh tensor."""
    enc = lp.build(name, 64, 4) if name != "jordan" else lp.build(name, 64)
    q, k, v = _qkv(2048 if name == "retnet" else 1024, dtype=dtype)
    taken: list[int] = []
    real = Arena.slot

    def spy(self, slot_name, device):
        take = real(self, slot_name, device)
        return lambda shape, dt: taken.append((t := take(shape, dt)).untyped_storage().data_ptr()) or t

    monkeypatch.setattr(Arena, "slot", spy)
    with torch.no_grad():
        got = lp.attention(q, k, v, enc)
        first = set(taken)
        taken.clear()
        again = lp.attention(q, k, v, enc)
        assert taken and set(taken) <= first  # the second call reuses the first's buffers
        monkeypatch.setattr(Arena, "slot", lambda self, slot_name, device: None)
        fresh = lp.attention(q, k, v, enc)
    assert torch.equal(got, fresh) and torch.equal(again, fresh)


@pytest.mark.parametrize("name", ["decay", "jordan"])
def test_one_batch_row_keeps_the_heads_order_and_its_first_tile_is_the_output(name, monkeypatch, tiling):
    """With one batch row every tile's rows keep the heads outermost in memory, its encodings in the arena too
    (the order a fresh output of ``query`` takes), so the flash kernel, which writes in q's order, gives the
    first tile (the diagonal blocks, every row in order, never cleared) as the ``(1, H, T, D)`` output itself:
    no copy into a fresh state. The output equals that of a batch of two (whose tiles are copies, merged into a fresh state)."""
    enc = lp.build(name, 64, 4) if name != "jordan" else lp.build(name, 64)
    q, k, v = _qkv()
    outs, orders = [], []
    real = attention_pieces._flash

    def spy(q_, k_, v_, *a, **kw):
        orders.append(q_.transpose(0, 1).is_contiguous())
        o, L = real(q_, k_, v_, *a, **kw)[:2]
        outs.append(o)  # kept alive: its memory cannot be handed to another tensor of the call
        return o, L

    monkeypatch.setattr(attention_pieces, "_flash", spy)
    with torch.no_grad():
        got = lp.attention(q, k, v, enc)
        assert len(outs) > 1 and orders[0], orders  # the diagonal blocks' (the others' may be cleared copies)
        assert got.is_contiguous() and got.untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr()
        two = lp.attention(*(torch.cat([t, t]) for t in (q, k, v)), enc)
    assert torch.allclose(two[:1], got, rtol=0, atol=2e-6) and torch.equal(two[0], two[1])


def test_one_block_over_every_row_is_the_output_in_its_own_order(monkeypatch):
    """A first tile that is one block over every row is the output whatever its memory order: q, k and v as
    (B, S, H, D) tensors seen as (B, H, S, D), as a model's projections give them, are encoded in that order,
    the flash kernel writes its output in it, and that output is returned, not copied."""
    outs = []
    real = attention_pieces._flash

    def spy(*a, **kw):
        o, L = real(*a, **kw)[:2]
        outs.append(o)  # kept alive: its memory cannot be handed to another tensor of the call
        return o, L

    monkeypatch.setattr(attention_pieces, "_flash", spy)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 256, 4, 64, generator=g).transpose(1, 2) for _ in range(3))  # (1, 4, 256, 64) views
    with torch.no_grad():
        got = lp.attention(q, k, v, lp.xpos(64))  # 256 rows: one causal block
    assert len(outs) == 1 and got.untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr() and not got.is_contiguous()
    assert torch.allclose(got, lp.attention(q.double(), k.double(), v.double(), lp.xpos(64)).float(), atol=1e-5)


@pytest.mark.parametrize("sinks", [False, True])
def test_the_only_tile_in_bfloat16_is_the_output(sinks, monkeypatch):
    """A stream whose one tile holds every row (one causal piece; xPos over 2048 rows is one causal block) returns
    the flash kernel's bfloat16 output itself: no float32 state written, merged and cast back, and the same bits as
    that path. With sinks, which are folded into the float32 state after the last tile, the state is kept."""
    outs, merged = [], []
    real, real_merge = attention_pieces._flash, attention_pieces._kernels.merge

    def spy(*a, **kw):
        o, L = real(*a, **kw)[:2]
        outs.append(o)  # kept alive: its memory cannot be handed to another tensor of the call
        return o, L

    monkeypatch.setattr(attention_pieces, "_flash", spy)
    monkeypatch.setattr(attention_pieces._kernels, "merge", lambda *a: merged.append(1) or real_merge(*a))
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 1024, 64, generator=g).bfloat16() for _ in range(3))
    s = torch.randn(4, generator=g) if sinks else None
    with torch.no_grad():
        got = attention_pieces.pieces(q, [(k, v, True)], 0.125, s)
        same = got.untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr()
        assert len(outs) == 1 and same != sinks and bool(merged) == sinks
        if not sinks:  # the same through the encoded call
            enc_out = lp.attention(q, k, v, lp.xpos(64))
            assert len(outs) == 2 and enc_out.untyped_storage().data_ptr() == outs[1].untyped_storage().data_ptr()
        real_into = attention_pieces._merge_into
        monkeypatch.setattr(attention_pieces, "_merge_into", lambda *a, **kw: real_into(*a, **{**kw, "only": False}))
        kept = attention_pieces.pieces(q, [(k, v, True)], 0.125, s)  # through the float32 state
    assert got.dtype == torch.bfloat16 and torch.equal(got, kept)


def test_the_small_tiles_backward_takes_its_temporaries_from_the_arena(monkeypatch):
    """A bfloat16 backward forms its small tiles' products in buffers of this thread's arena (the same storage on
    a second step: pages already mapped), and its gradients are bit for bit those of fresh temporaries."""
    enc = lp.build("decay", 64, 4)
    raw = _qkv(dtype=torch.bfloat16)
    taken: list[int] = []
    real = Arena.slot

    def spy(self, slot_name, device):
        take = real(self, slot_name, device)
        return lambda shape, dt: taken.append((t := take(shape, dt)).untyped_storage().data_ptr()) or t

    def grads():
        q, k, v = (x.clone().requires_grad_() for x in raw)
        lp.attention(q, k, v, enc).square().sum().backward()
        return [x.grad for x in (q, k, v)]

    monkeypatch.setattr(Arena, "slot", spy)
    got = grads()
    first = set(taken)
    taken.clear()
    again = grads()
    assert taken and set(taken) <= first  # the second backward reuses the first's buffers
    monkeypatch.setattr(attention_pieces, "arena", lambda: contextlib.nullcontext(Arena(cap=0)))  # every one fresh
    fresh = grads()
    for a, b, c in zip(got, again, fresh):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_autograd_tiles_never_take_the_arena(monkeypatch):
    """Tiles made for the backward are saved by autograd: a later call that rewrites the arena leaves their
    gradients as they were."""
    enc = lp.build("decay", 64, 4)
    q, k, v = _qkv()
    q.requires_grad_(True)
    out = lp.attention(q, k, v, enc)
    (want,) = torch.autograd.grad(out.square().sum(), q, retain_graph=True)
    with torch.no_grad():
        lp.attention(*(t.flip(2) for t in _qkv(seed=1)), enc)  # rewrites this thread's arena
    (got,) = torch.autograd.grad(out.square().sum(), q)
    assert torch.equal(got, want)


def test_the_arena_is_bounded_and_a_nested_call_gets_its_own():
    a = Arena(cap=1 << 20)
    small = a.slot("q", torch.device("cpu"))((4, 8, 16), torch.float32)
    assert a.nbytes() == small.numel() * 4
    big = a.slot("k", torch.device("cpu"))((1, 1 << 20), torch.float32)  # 4 MiB: over the cap, not kept
    assert big.shape == (1, 1 << 20) and a.nbytes() == small.numel() * 4
    grown = a.slot("k", torch.device("cpu"))((1, 200_000), torch.float32)  # 0.8 MiB: the other buffer makes way
    assert a.nbytes() <= a.cap and grown.untyped_storage().data_ptr() != small.untyped_storage().data_ptr()
    with arena() as outer, arena() as inner:
        assert outer is not inner and outer.busy and not inner.busy
    with arena() as again:
        assert again is outer  # this thread's arena, free again
    seen = []
    worker = threading.Thread(target=lambda: seen.append(attention_pieces._ARENAS.__dict__.get("arena")))
    worker.start()
    worker.join()
    assert seen == [None]  # another thread has none of this one's


def test_transform_into_is_checked():
    enc = lp.build("decay", 64, 4)
    x = torch.randn(1, 4, 8, 64)
    ft = enc._range_tables(0, 8, "key", torch.float32, True, x.device)
    into = torch.empty(1, 4, 8, 64)
    assert _fast.transform(x, ft, False, into=into) is into
    assert torch.equal(into, enc.key(x, torch.arange(8)))
    with pytest.raises(ValueError, match="shape"):
        _fast.transform(x, ft, False, into=torch.empty(1, 4, 8, 63))
    with pytest.raises(ValueError, match="dtype"):
        _fast.transform(x, ft, False, into=torch.empty(1, 4, 8, 64, dtype=F64))
    with pytest.raises(ValueError, match="share no memory"):
        _fast.transform(x, ft, False, into=x.view(1, 4, 8, 64))


@pytest.mark.parametrize("name", ["decay", "jordan", "retnet", "damped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [200, 2100])
def test_every_element_of_an_arena_buffer_is_written_before_it_is_read(name, dtype, T, monkeypatch):
    """Buffers handed out full of NaN (what a reused buffer may hold is anything) give the output of fresh
    tensors, bit for bit: every element an encoding's kernel reads back was written in this call."""
    if name == "damped":
        enc = lp.Encoding(lp.Generator(-torch.logspace(-1, -4, 32, dtype=F64), lp.rope_freqs(64), [1] * 32))
    else:
        enc = lp.build(name, 64, 2) if name != "jordan" else lp.build(name, 64)
    q, k, v = _qkv(T, H=2, dtype=dtype, seed=T)
    real = Arena.slot

    def poisoned(self, slot_name, device):
        take = real(self, slot_name, device)
        return lambda shape, dt: take(shape, dt).fill_(float("nan"))

    with torch.no_grad():
        monkeypatch.setattr(Arena, "slot", poisoned)
        got = lp.attention(q, k, v, enc, torch.arange(T) + 10**4)
        monkeypatch.setattr(Arena, "slot", lambda self, slot_name, device: None)
        want = lp.attention(q, k, v, enc, torch.arange(T) + 10**4)
    assert torch.equal(got, want)


@pytest.mark.parametrize("B", [1, 2])  # one batch row: the tiles are views of x; two: copies
def test_the_tiles_rows_as_one_node_give_the_gradient_of_one_gather_per_tile(B):
    """``row_source`` (one autograd node, one buffer) equals a gather per tile: the same tiles forward, and for
    any weighting of them the same gradient, to float32 rounding (only the order of the sums differs)."""
    from liepos.attention_pieces import row_source
    from liepos.causal_tiling import tile_plan

    diag, off = tile_plan(300, 32)
    rows = [d[0] for d in diag] + [t[0] for t in off] + [t[1] for t in off]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, 3, 300, 8, generator=g, requires_grad=True)
    weights = [torch.randn(r.gather(x.detach()).shape, generator=g) for r in rows]
    grads = []
    for one_node in (True, False):
        source = row_source(x, rows) if one_node else (lambda r: r.gather(x))
        tiles = [source(r) for r in rows]
        assert all(torch.equal(a, r.gather(x.detach())) for a, r in zip(tiles, rows))
        (gx,) = torch.autograd.grad(sum((t * w).sum() for t, w in zip(tiles, weights)), [x])
        grads.append(gx)
    assert torch.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("faded", [False, True])
def test_tiled_attention_gradients_do_not_depend_on_how_the_rows_are_gathered(faded, monkeypatch):
    """Decay over the tiled triangle, and a fast decay on the faded-keys path, forward + backward in float32: q, k
    and v's gradients with every tile's rows gathered by one node per tensor equal those with a gather per tile."""
    from liepos import causal_tiling, faded_keys

    g = torch.Generator().manual_seed(4)
    leaves = [torch.randn(1, 2, 700, 16, generator=g).requires_grad_() for _ in range(3)]
    enc = lp.decay(torch.full((16,), 0.5) if faded else torch.linspace(0.05, 0.5, 16))
    plans = []
    real_plan = faded_keys._fade_plan
    monkeypatch.setattr(faded_keys, "_fade_plan", lambda call, b: plans.append(real_plan(call, b)) or plans[-1])
    got, nodes = [], []
    real = attention_pieces._Gather.apply
    monkeypatch.setattr(attention_pieces._Gather, "apply", lambda *a: nodes.append(1) or real(*a))
    for one_node in (True, False):
        if not one_node:
            assert len(nodes) == 3  # q, k and v: one node each
            lazy = lambda x, rows: (lambda r: r.gather(x))  # noqa: E731
            monkeypatch.setattr(causal_tiling, "row_source", lazy)
            monkeypatch.setattr(faded_keys, "row_source", lazy)
        out = lp.attention(*leaves, enc)
        got.append((out.detach(), torch.autograd.grad((out * out.cos()).sum(), leaves)))
    assert (plans[0] is not None) == faded  # the path the case is about
    (a, ga), (b, gb) = got
    assert torch.equal(a, b)
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_the_rows_view_without_a_gradient_is_the_sliced_view_of_any_layout():
    """``Rows.view`` without autograd is one ``as_strided``: the same elements, shape and memory as the three slices it
    takes under autograd, for tensors laid out in any order of their axes and of 3 or 4 dims, writes through it
    landing in the tensor; rows past the end are refused, not clamped."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from liepos.attention_pieces import Rows

    @settings(max_examples=60, deadline=None)
    @given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 40), st.sampled_from([0, 1, 2, 3, 5]),
           st.permutations(range(4)), st.booleans(), st.data())
    def check(B, H, T, D, order, narrow, data):
        shape = (B, H, T, D) if D else (B, H, T)
        order = [i for i in order if i < len(shape)]
        base = torch.randn(*[shape[i] + (1 if narrow and i == len(shape) - 1 else 0) for i in order])
        x = base.permute(*[order.index(i) for i in range(len(shape))])  # (B, H, T[, D(+1)]) in another memory order
        x = x[..., :shape[-1]] if narrow else x
        period = data.draw(st.integers(1, T))
        count = data.draw(st.integers(1, T // period))
        start = data.draw(st.integers(0, T - count * period))
        a = data.draw(st.integers(0, period - 1))
        r = Rows(start, count, period, a, data.draw(st.integers(a + 1, period)))
        got = r.view(x)
        with torch.enable_grad():
            want = r.view(x.detach().requires_grad_(True)).detach()
        moving = [i for i, n in enumerate(got.shape) if n > 1]  # a stride of an axis of size 1 steps nowhere
        assert got.shape == want.shape and torch.equal(got, want)
        assert [got.stride(i) for i in moving] == [want.stride(i) for i in moving]
        assert got.data_ptr() == want.data_ptr()
        got.fill_(7.0)
        assert bool((want == 7.0).all())
        with pytest.raises(ValueError):
            Rows(start + T, 1, 1, 0, 1).view(x)

    check()
