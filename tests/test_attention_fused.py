"""The fused re-centred path (equal, strictly increasing query and key times, causal, no mask): each
block's origin in its middle, and under ALiBi's linear bias the keys that cannot weigh left out per
head. Fused path == general path (the same call with an explicit causal mask, which re-centres at the
latest query of each block and masks) == float64 reference, near 0 and near 10⁶, in every dtype."""

from __future__ import annotations

import math
import types
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import causal_tiling, faded_keys, origin_budget, recentre

from helpers import fast_lane  # noqa: E402
from liepos.causal_tiling import FLASH_ROWS
from liepos.recentre import POLY_ROUNDING

F64 = torch.float64
EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8}
# (encoding, degree of its polynomial parts, T): every block type the fused path re-centres; T spans
# several blocks
CASES = {
    "alibi": (lambda: lp.alibi(16, num_heads=2), 1, 1300),  # blocks of 1024, a per-head window past them
    "decay": (lambda: lp.build("decay", 16), 0, 400),  # rate 1/2: blocks of 118
    "retnet": (lambda: lp.retnet(16, num_heads=2), 0, 400),
    "xpos": (lambda: lp.xpos(16), 0, 300),
    "jordan": (lambda: lp.build("jordan", 15), 2, 200),  # 3x3 blocks at rates 1/2 ... : blocks of 45 in float32
}


def inputs(T: int, heads: int, dim: int, dtype: torch.dtype, seed: int, kv_heads: int | None = None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, T, dim, dtype=F64, generator=g).to(dtype)
    k, v = (torch.randn(1, kv_heads or heads, T, dim, dtype=F64, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def bound(dtype: torch.dtype, degree: int, v: torch.Tensor, T: int) -> float:
    """The precision contract (docs/guide/precision.md): 16·eps·max|v|; polynomial parts of degree n
    lose span^n·eps to cancellation, at most POLY_ROUNDING (bfloat16 with polynomial parts is computed
    in float32 and rounded once)."""
    b = 16 * EPS[dtype]
    if degree and dtype != torch.bfloat16:
        b = max(b, min(POLY_ROUNDING, b * (2.0 * T) ** degree))
    return b * max(1.0, float(v.double().abs().max()))


def three_ways(enc, q, k, v, p, sinks=None):
    T = q.shape[2]
    fused = lp.attention(q, k, v, enc, p, p, sinks=sinks)
    general = lp.attention(q, k, v, enc, p, p, sinks=sinks, attn_mask=torch.ones(T, T, dtype=torch.bool).tril())
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p, sinks=sinks)
    return fused, general, ref


# the lane leaves ALiBi (its long T) to CI: its fused path stays in the lane through the gradient and window tests
@pytest.mark.parametrize("name", [n if n != "alibi" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)])
@pytest.mark.parametrize("dtype", fast_lane(torch.float32, torch.float64, torch.bfloat16))
@pytest.mark.parametrize("offset", fast_lane(10**6 + 17, 0))
def test_fused_equals_general_equals_reference(name, dtype, offset):
    make, degree, T = CASES[name]
    enc = make()
    q, k, v = inputs(T, 2, enc.content_dim, dtype, seed=T + offset)
    p = torch.arange(T) + offset
    fused, general, ref = three_ways(enc, q, k, v, p)
    assert fused.dtype == dtype
    b = bound(dtype, degree, v, T)
    assert float((fused.double() - ref).abs().max()) <= b, name
    assert float((general.double() - ref).abs().max()) <= b, name


@pytest.mark.parametrize("dtype", fast_lane(torch.float32, torch.float64, fast=0))  # the lane keeps the far-key window test
def test_alibi_window_with_sinks_and_grouped_queries(dtype, monkeypatch):
    """Per-head windows (the steep heads leave out early keys) with learned sinks and one kv head."""
    seen = []
    starts = recentre.window_starts
    monkeypatch.setattr(recentre, "window_starts", lambda *a: seen.append(starts(*a)) or seen[-1])
    enc = lp.alibi(16, num_heads=4, slopes=[2.0, 0.5, 0.1, 0.01])  # float64 keeps keys down to e^-750: steep slopes
    T = 1500
    q, k, v = inputs(T, 4, 16, dtype, seed=3, kv_heads=1)
    p = torch.arange(T) + 10**6
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=dtype)
    fused, general, ref = three_ways(enc, q, k, v, p, sinks=sinks)
    assert seen and seen[0][0] > 0 and seen[0][-1] == 0  # the steepest head's window left keys out
    b = bound(dtype, 1, v, T)
    assert float((fused.double() - ref).abs().max()) <= b
    assert float((general.double() - ref).abs().max()) <= b


def _spy_flash(monkeypatch) -> list:
    """(head size of q, whether a per-key bias rode along) of every flash call of the fused pieces."""
    from liepos import attention_pieces

    seen, real = [], attention_pieces._flash

    def spy(q, k, v, *a, attn_mask=None, **kw):
        seen.append((q.shape[-1], attn_mask is not None))
        return real(q, k, v, *a, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention_pieces, "_flash", spy)
    return seen


# the lane keeps the per-key mask in the gradient test below
@pytest.mark.parametrize("dtype", fast_lane(torch.bfloat16, torch.float64, torch.float32, fast=0))
def test_alibi_bias_rides_as_a_per_key_mask_on_the_content(dtype, monkeypatch):
    """ALiBi's bias ``−m_h (t − s) = m_h (s − o) − m_h (t − o)``: the flash kernel gets q and k of the
    content's head size with ``m_h (s − o)`` as its broadcast mask, the row's constant is left out, and a
    sink logit moves by it. Two batch rows at different times (near 10 and past 10⁶), sinks, grouped keys,
    a window: fused == general == float64 reference."""
    seen = _spy_flash(monkeypatch)
    enc = lp.alibi(16, num_heads=4, slopes=[0.5, 0.25, 0.05, 0.01])
    T = 1300
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 4, T, 16, dtype=F64, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, T, 16, dtype=F64, generator=g).to(dtype) for _ in range(2))
    p = torch.stack((torch.arange(T, dtype=F64) + 10, torch.arange(T, dtype=F64) + 10**6 + 3))
    sinks = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=dtype)
    fused, general, ref = three_ways(enc, q, k, v, p, sinks=sinks)
    assert seen and all(d == 16 and masked for d, masked in seen)  # no slot columns: head size 16
    b = bound(dtype, 1, v, T)
    assert float((fused.double() - ref).abs().max()) <= b
    assert float((general.double() - ref).abs().max()) <= b


def test_alibi_bias_gradients_with_learned_sinks_and_learned_slopes(monkeypatch):
    """Through the per-key mask: gradients of q, k, v and a learned sink equal the general path's. When
    the slopes themselves need a gradient the bias rides in the slot columns (the mask has none)."""
    seen = _spy_flash(monkeypatch)
    T = 1100
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, T, 8, dtype=F64, generator=g).requires_grad_() for _ in range(3))
    sinks = torch.tensor([0.3, -0.7], dtype=F64, requires_grad=True)
    p = torch.arange(T) + 10**6
    for learned in (False, True):
        enc = lp.alibi(8, num_heads=2, slopes=[0.5, 0.02])
        leaves = [q, k, v, sinks]
        if learned:
            enc.key_slots.requires_grad_(True)
            leaves.append(enc.key_slots)
        seen.clear()
        grads = []
        for mask in (None, torch.ones(T, T, dtype=torch.bool).tril()):
            out = lp.attention(q, k, v, enc, p, p, attn_mask=mask, sinks=sinks)
            grads.append(torch.autograd.grad((out * torch.cos(out)).sum(), leaves))
        assert seen and all(masked != learned for _, masked in seen)
        for a, b in zip(*grads):
            assert float((a - b).abs().max()) <= 1e-9 * max(1.0, float(b.abs().max()))


def test_alibi_window_keeps_a_far_key_that_wins():
    """A key 1200 tokens back whose content score beats its bias must stay in the window."""
    enc = lp.alibi(16, num_heads=2, slopes=[0.5, 0.25])
    T = 1400
    q, k, v = inputs(T, 2, 16, F64, seed=5)
    u = torch.zeros(16, dtype=F64)
    u[0] = 1.0
    q[:, :, 1100:] = 30.0 * u  # every late query points along u ...
    k[:, :, 50] = 100.0 * u  # ... and so does one early key: score 30·100/4 = 750 > 0.5·1350
    p = torch.arange(T)
    fused, general, ref = three_ways(enc, q, k, v, p)
    w = ref[0, 0, -1] - v[0, 0, 50]
    assert float(w.abs().max()) < 1e-6  # the far key does carry the last row of the steep head
    assert float((fused - ref).abs().max()) <= 1e-10
    assert float((general - ref).abs().max()) <= 1e-10


@pytest.mark.parametrize("name", ["alibi", "decay", "jordan"])
def test_fused_gradients_equal_the_general_path(name):
    make, _, T = CASES[name]
    enc = make()
    leaves = [t.requires_grad_() for t in inputs(T, 2, enc.content_dim, F64, seed=11)]
    p = torch.arange(T) + 10**6
    grads = []
    for mask in (None, torch.ones(T, T, dtype=torch.bool).tril()):
        out = lp.attention(*leaves, enc, p, p, attn_mask=mask)
        grads.append(torch.autograd.grad((out * torch.cos(out)).sum(), leaves))
    for a, b in zip(*grads):
        assert float((a - b).abs().max()) <= 1e-9 * max(1.0, float(b.abs().max()))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.floats(0.05, 2.0), st.integers(1, 300), st.sampled_from([0, 10**6, 10**9]),
       st.sampled_from([torch.float64, torch.float32]), st.booleans(), st.integers(0, 10**6))
def test_decays_at_any_rate_and_time(rate, T, offset, dtype, real, seed):
    """Random rates (blocks of 2·29.6/rate), integer or real times, near 0 and far."""
    enc = lp.decay([rate, rate / 5, rate / 50, 0.0])
    q, k, v = inputs(T, 2, 4, dtype, seed)
    g = torch.Generator().manual_seed(seed)
    p = (torch.cumsum(torch.rand(T, dtype=F64, generator=g) * 2 + 0.01, 0) if real else torch.arange(T, dtype=F64))
    p = p + offset
    fused, general, ref = three_ways(enc, q, k, v, p)
    b = bound(dtype, 0, v, T)
    assert float((fused.double() - ref).abs().max()) <= b
    assert float((general.double() - ref).abs().max()) <= b


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(1, 500), st.floats(0.3, 100.0), st.booleans(), st.integers(0, 10**6))
def test_every_time_of_a_block_is_within_the_span_of_its_origin(T, allowed, real, seed):
    g = torch.Generator().manual_seed(seed)
    steps = torch.rand(2, T, dtype=F64, generator=g) * 3 + 0.01 if real else torch.ones(2, T, dtype=F64)
    t = torch.cumsum(steps, -1) + 10**6  # (batch 2, T), strictly increasing
    blocks = recentre._blocks(types.SimpleNamespace(qpos=t), (0.0, math.inf, allowed))
    assert blocks[0][0] == 0 and blocks[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    for lo, hi, o in blocks:
        assert float((t[:, lo:hi] - o).abs().max()) <= allowed or hi == lo + 1
        if not real:
            assert bool((o == o.round()).all())  # integer times keep an integer origin (cached tables)
    # the flash kernel runs whole multiples of its row blocks markedly faster: every block but the last is one
    assert all(hi - lo < FLASH_ROWS or (hi - lo) % FLASH_ROWS == 0 for lo, hi, _ in blocks[:-1])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 600), st.integers(1, 80))
def test_tiles_cover_the_causal_triangle_once(T, size):
    """Diagonal blocks (causal) and off-diagonal tiles (keys all before queries) hold every pair
    ``s ≤ t`` exactly once and no other, and only about log2(T / size) tile families are needed."""
    diag, off = recentre.tile_plan(T, size)
    idx = torch.arange(T, dtype=F64).view(1, 1, T, 1)  # each row's own index, to read back what a tile holds
    cov = torch.zeros(T, T, dtype=torch.int64)
    for rows, o in diag:
        r = rows.gather(idx)[:, 0, :, 0].long()  # (count, w)
        assert 0 <= o < rows.width and rows.width <= size
        i, j = torch.tril_indices(rows.width, rows.width)
        cov.index_put_((r[:, i].flatten(), r[:, j].flatten()), torch.ones(r.shape[0] * i.numel(), dtype=torch.int64),
                       accumulate=True)
    for rq, rk in off:
        a, b = rq.gather(idx)[:, 0, :, 0].long(), rk.gather(idx)[:, 0, :, 0].long()  # (count, w), (count, S)
        assert bool((b.amax(-1) < a.amin(-1)).all())  # an origin fits between the keys and the queries
        assert int(b.amax(-1).add(1).sub(a.amin(-1)).abs().max()) == 0  # ... at the first query, next to the last key
        rr = a.unsqueeze(-1).expand(-1, -1, b.shape[1])  # (count, w, S)
        cc = b.unsqueeze(1).expand(-1, a.shape[1], -1)  # (count, w, S)
        cov.index_put_((rr.flatten(), cc.flatten()), torch.ones(rr.numel(), dtype=torch.int64), accumulate=True)
    assert torch.equal(cov, torch.ones(T, T, dtype=torch.int64).tril())
    assert len(off) <= 2 * max(1, math.ceil(math.log2(max(T / size, 1))))


def _spy_tiles(monkeypatch) -> list:
    seen = []
    real = causal_tiling.made
    for module in (causal_tiling, faded_keys):
        monkeypatch.setattr(module, "made",
                            lambda shape, makers, *a, **kw: seen.append(len(makers)) or real(shape, makers, *a, **kw))
    return seen


TILED = {
    # (encoding, degree, T): diagonal blocks of 128 (decay at 1/2: at most 177 rows in the diagonal
    # budget, the multiple of 32 with the fewest flash calls) or 32 (3x3 Jordan in float32), and binary
    # levels up to half the triangle, last nodes cut short
    "decay": (lambda: lp.decay(torch.tensor([[0.5, 0.1, 0.01, 0.0], [0.3, 0.05, 0.0, 0.0]]).repeat(2, 1)), 0, 1000),
    # 3x3 and rotating 2x2 Jordan blocks at rates 1/2 … 1/20 (the catalogue's slowest, 1/2048, makes
    # scores of 10⁵ at lag 700: conditioning no float32 path meets, fused or general)
    "jordan": (lambda: lp.Encoding(lp.Generator([-0.5, -0.2, -0.05, -0.1], [0, 0, 0, 0.3], [3, 3, 3, 2])), 2, 700),
}


@pytest.mark.parametrize("name", fast_lane(*sorted(TILED, reverse=True)))  # the lane: the Jordan blocks
@pytest.mark.parametrize("dtype", fast_lane(torch.float32, torch.float64, torch.bfloat16))
def test_tiled_path_over_many_levels_with_batch_groups_and_sinks(name, dtype, monkeypatch):
    """Two batch rows at different times (near 0 and past 10⁶), grouped keys, learned sinks: the tiled
    path (taken: counted) == the general path == the float64 reference."""
    seen = _spy_tiles(monkeypatch)
    make, degree, T = TILED[name]
    enc = make()
    H = enc.num_heads or 4
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, H, T, enc.content_dim, dtype=F64, generator=g).to(dtype)
    k, v = (torch.randn(2, H // 2, T, enc.content_dim, dtype=F64, generator=g).to(dtype) for _ in range(2))
    p = torch.stack((torch.arange(T, dtype=F64), torch.arange(T, dtype=F64) + 10**6 + 3))  # (2, T)
    sinks = torch.linspace(-1.0, 2.0, H, dtype=dtype)
    fused, general, ref = three_ways(enc, q, k, v, p, sinks=sinks)
    assert seen and seen[0] >= 5  # diagonal families and several binary levels
    b = bound(dtype, degree, v, T)
    assert float((fused.double() - ref).abs().max()) <= b
    assert float((general.double() - ref).abs().max()) <= b


def test_tiled_gradients_equal_the_general_path(monkeypatch):
    seen = _spy_tiles(monkeypatch)
    make, _, T = TILED["decay"]
    enc = make()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, T, 4, dtype=F64, generator=g).requires_grad_()
    k, v = (torch.randn(2, 2, T, 4, dtype=F64, generator=g).requires_grad_() for _ in range(2))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64, requires_grad=True)
    p = torch.stack((torch.arange(T, dtype=F64) + 7, torch.arange(T, dtype=F64) + 10**6))
    grads = []
    for mask in (None, torch.ones(T, T, dtype=torch.bool).tril()):
        out = lp.attention(q, k, v, enc, p, p, attn_mask=mask, sinks=sinks)
        grads.append(torch.autograd.grad((out * torch.cos(out)).sum(), (q, k, v, sinks)))
    assert seen  # the first (unmasked) call was tiled
    for a, b in zip(*grads):
        assert float((a - b).abs().max()) <= 1e-9 * max(1.0, float(b.abs().max()))


def test_tiles_keep_a_query_whose_factor_underflows():
    """A late query of a wide tile meets its keys through a decay e^{-λ(t−p)} below float32's smallest
    normal: refused by ``enc.query`` (it cannot know where the keys are), kept by the tile (every key is
    before the origin, so those scores are smaller still) — and the output is the reference's."""
    enc = lp.decay([2.0, 0.0])
    with pytest.raises(OverflowError, match="underflows"):
        enc.query(torch.ones(1, 1, 1, 2), [100.0])
    # diagonal blocks of 32 rows (at most 2·⌊44.4 / 2⌋ + 1 = 45): tiles up to 256 rows, e^{-2·255} underflows
    T = 400
    q, k, v = inputs(T, 1, 2, torch.float32, seed=9)
    p = torch.arange(T)
    fused, general, ref = three_ways(enc, q, k, v, p)
    assert float((fused.double() - ref).abs().max()) <= bound(torch.float32, 0, v, T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diagonal_blocks_at_the_edge_of_their_budget(dtype):
    """The diagonal budget lets a block's factors reach e^{±DIAGONAL_EXPONENT} (e^{±32}): a masked pair
    (the block's last key seen from its first query) scores e^{2.2·28}·q_i k_i, far above every visible
    one, and the causal kernel overwrites it before the softmax; the smallest factor stays a normal number
    and so does every visible product of factors (``e^{−λ(t − s)} ≥ e^{−64}``). The output is the reference's."""
    rate = 2.2  # allowed 32 / 2.2 = 14.5 around the origin: blocks of 29 rows
    enc = lp.decay([rate, 0.5, 0.0])
    T = 512
    size = causal_tiling.tile_size(origin_budget.allowed(causal_tiling.diagonal_budget((rate, 0.0, math.inf), dtype)),
                                   T)
    assert size == 2 * math.floor(causal_tiling.DIAGONAL_EXPONENT / rate) + 1 == 29
    q, k, v = inputs(T, 2, 3, dtype, seed=12)
    q, k = 8 * q, 8 * k
    o = size // 2
    qe = enc.query(torch.ones(1, 1, 1, 3), torch.tensor([float(size - 1 - o)]))  # F(t − o): the block's last query
    assert float(qe[..., 0]) >= torch.finfo(torch.float32).tiny * 2.0**60
    p = torch.arange(T) + 10**6
    fused, general, ref = three_ways(enc, q, k, v, p)
    assert torch.isfinite(fused).all()
    assert float((fused.double() - ref).abs().max()) <= bound(dtype, 0, v, T)


def test_times_that_are_not_a_unit_range_keep_the_blocks(monkeypatch):
    seen = _spy_tiles(monkeypatch)
    enc = lp.build("decay", 4)
    q, k, v = inputs(300, 1, 4, F64, seed=2)
    p = torch.arange(300, dtype=F64) * 2  # strictly increasing, step 2
    fused, _, ref = three_ways(enc, q, k, v, p)
    assert not seen
    assert float((fused - ref).abs().max()) <= bound(F64, 0, v, 300)


def test_streamed_tiles_are_let_go_one_at_a_time_and_equal_the_saved_ones(monkeypatch):
    """Without a gradient each tile is made, attended, merged and dropped before the next is made (the
    encodings of one tile alive at a time); with one, all are kept for the backward. Same output."""
    from liepos import attention_pieces

    alive, peak = [], []
    real = attention_pieces._merge_into

    def spy(state, shape, p, *a, **kw):
        alive.append(weakref.ref(p.q))
        peak.append(sum(r() is not None for r in alive))
        return real(state, shape, p, *a, **kw)

    monkeypatch.setattr(attention_pieces, "_merge_into", spy)
    enc = lp.build("decay", 8)
    q, k, v = inputs(1200, 2, 8, F64, seed=4)
    p = torch.arange(1200) + 10**6
    streamed = lp.attention(q, k, v, enc, p, p)
    assert len(peak) >= 6 and max(peak) == 1
    alive.clear(), peak.clear()
    with torch.no_grad():  # streamed for certain: the first tile too is made into the arena
        assert torch.equal(lp.attention(q, k, v, enc, p, p), streamed)
    assert len(peak) >= 6 and max(peak) == 1
    saved = lp.attention(q.requires_grad_(), k, v, enc, p, p)
    assert float((saved.detach() - streamed).abs().max()) <= 1e-13


def test_pieces_refuse_keys_and_values_of_different_head_counts():
    """The flash kernel would read past the values' heads by the keys' strides: refused, not garbage."""
    from liepos.attention_pieces import pieces

    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)
    with pytest.raises(ValueError, match="one head count"):
        pieces(q, [(k, torch.randn(1, 2, 8, 16), True)], 0.25)
    with pytest.raises(ValueError, match="one head count"):
        pieces(q, [(torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16), True)], 0.25)
    with pytest.raises(ValueError, match="as many values as keys"):  # the kernel would read past v's rows
        pieces(q, [(k, torch.randn(1, 4, 2, 16), True)], 0.25)


def _spy_faded(monkeypatch) -> list:
    """(heads, blocks of keys seen whole, rows per block) of every faded group."""
    seen, real = [], faded_keys._faded
    monkeypatch.setattr(faded_keys, "_faded", lambda call, m, n_b: seen.append((call.q.shape[1], m, n_b))
                        or real(call, m, n_b))
    # heads with windows up to half the sequence take the faded path (its result holds for any window; the
    # default share, a quarter, is chosen for speed): the windows of these short sequences are faded
    monkeypatch.setattr(faded_keys, "WINDOW_SHARE", 0.5)
    return seen


# the lane keeps the faded keys in test_faded_keys_follow_the_data_norms
@pytest.mark.parametrize("dtype", fast_lane(torch.bfloat16, torch.float64, torch.float32, fast=0))
def test_faded_keys_score_zero_exactly_to_the_contract(dtype, monkeypatch):
    """Heads that fade within the sequence see the keys of their last blocks and every earlier key as
    score 0 (their count and mean value): per head windows (a fast and a slow head), a short last block,
    times near 10⁶, learned sinks, grouped keys under a shared decay: fused == float64 reference."""
    seen = _spy_faded(monkeypatch)
    enc = lp.decay(torch.tensor([[0.3] * 16, [0.1] * 16], dtype=F64))  # float32: windows ~80 and ~230 keys
    T = 1200
    q, k, v = inputs(T, 2, 16, dtype, seed=21)
    p = torch.arange(T) + 10**6 + 5
    sinks = torch.tensor([0.5, -1.0], dtype=dtype)
    fused = lp.attention(q, k, v, enc, p, p, sinks=sinks)
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p, sinks=sinks)
    assert seen and all(h == 1 for h, _, _ in seen) and len({m for _, m, _ in seen}) == 2  # one group per head
    assert float((fused.double() - ref).abs().max()) <= bound(dtype, 0, v, T)
    seen.clear()
    shared = lp.build("decay", 16, rate=0.2)
    q, k, v = inputs(777, 4, 16, dtype, seed=22, kv_heads=2)
    fused = lp.attention(q, k, v, shared)
    ref = lp.attention_reference(q.double(), k.double(), v.double(), shared)
    assert seen == [(4, seen[0][1], seen[0][2])]
    assert float((fused.double() - ref).abs().max()) <= bound(dtype, 0, v, 777)


def test_faded_keys_follow_the_data_norms(monkeypatch):
    """The window is a bound for any data: a far key that still scores (large norms) widens it, so the
    output stays the reference's."""
    seen = _spy_faded(monkeypatch)
    enc = lp.build("decay", 16, rate=0.5)
    T = 600
    q, k, v = inputs(T, 1, 16, F64, seed=23)
    lp.attention(q, k, v, enc)
    k[:, :, 10] *= 1e12  # one huge early key: it scores above 2^-59 for ~55 lags more
    fused = lp.attention(q, k, v, enc)
    ref = lp.attention_reference(q, k, v, enc)
    assert len(seen) == 2 and seen[1][1] > seen[0][1]  # more blocks seen whole
    assert float((fused - ref).abs().max()) <= bound(F64, 0, v, T)


def test_faded_heads_equal_the_tiled_triangle_with_gradients(monkeypatch):
    """RetNet's fast heads faded, its slow ones tiled: the output and the gradients of q, k, v and the
    learned rates equal the tiled path's (every head tiled)."""
    seen = _spy_faded(monkeypatch)
    T = 1600
    enc = lp.retnet(16, num_heads=3)
    g = torch.Generator().manual_seed(24)
    leaves = [torch.randn(1, 3, T, 16, generator=g).requires_grad_() for _ in range(3)]
    rates = enc.generator.rates.clone().requires_grad_()
    enc = enc.replace(generator=enc.generator.with_params(rates=rates))
    outs = []
    for faded in (True, False):
        if not faded:
            monkeypatch.setattr(faded_keys, "_fade_plan", lambda *a: None)
        out = lp.attention(*leaves, enc)
        outs.append((out, torch.autograd.grad((out * torch.cos(out)).sum(), [*leaves, rates])))
    assert seen and seen[0][0] == 1  # the first head alone
    (a, ga), (b, gb) = outs
    assert float((a - b).detach().abs().max()) <= bound(torch.float32, 0, leaves[2].detach(), T)
    for x, y in zip(ga, gb):
        assert float((x - y).abs().max()) <= 1e-4 * max(1.0, float(y.abs().max()))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), w=st.sampled_from([1, 7, 64, 128]), causal=st.booleans(),
       biased=st.booleans(), dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
def test_small_tile_backward_is_the_flash_backward(seed, w, causal, biased, dtype):
    """The backward of a small tile by its definition (P = e^{c q kᵀ + β − L}, dV = Pᵀ dO, dS = P ∘ (dO vᵀ −
    rowsum(dO ∘ O)), dQ = c dS k, dK = c dSᵀ q) equals the flash kernel's backward of the same tile: to float
    rounding in float32 and float64, to a bfloat16 rounding of the gradients' scale in bfloat16."""
    from liepos import attention_pieces as ap

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 2, w, 16, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    bias = (torch.randn(3, 2, 1, w, generator=g, dtype=torch.float64) * 4).to(
        torch.float32 if dtype == torch.bfloat16 else dtype) if biased else None
    o, L = ap._flash(q, k, v, 0.0, causal, attn_mask=bias, scale=0.25)
    dO = torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)
    want = ap._flash_backward(dO, q, k, v, o, L, 0.0, causal, attn_mask=bias, scale=0.25)
    got = ap._small_backward(dO, q, k, v, o, L, 0.0, causal, attn_mask=bias, scale=0.25)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2**-6}[dtype]
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert float((a.double() - b.double()).abs().max()) <= tol * max(1.0, float(b.double().abs().max()))


def test_bfloat16_training_takes_the_small_tile_backward_and_matches_float64(monkeypatch):
    """A bfloat16 forward + backward of a tiled decay at T = 1024 forms its small tiles' backward by their
    definition (the flash backward runs for the wide ones only) and its gradients agree with the float64 call's
    to bfloat16's precision."""
    from liepos import attention_pieces as ap

    calls, real = [], ap._small_backward
    monkeypatch.setattr(ap, "_small_backward", lambda *a, **kw: calls.append(a[1].shape) or real(*a, **kw))
    enc = lp.build("decay", 32, 2)
    g = torch.Generator().manual_seed(8)
    raw = [torch.randn(1, 2, 1024, 32, generator=g, dtype=torch.float64) for _ in range(3)]
    grads = {}
    for dtype in (torch.bfloat16, torch.float64):
        q, k, v = (x.to(dtype).requires_grad_() for x in raw)
        lp.attention(q, k, v, enc).backward(torch.ones(1, 2, 1024, 32, dtype=dtype))
        grads[dtype] = [x.grad.double() for x in (q, k, v)]
    assert calls and all(max(s[2], 1) <= ap.SMALL_TILE for s in calls)
    for a, b in zip(grads[torch.bfloat16], grads[torch.float64]):
        assert float((a - b).abs().max()) <= 2**-5 * float(b.abs().max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_jordan_is_as_accurate_as_its_conditioning_allows(seed):
    """``build("jordan", 64)`` on N(0, 1) inputs reaches logits of 10⁵ by 512 tokens (the binomial terms of its
    slow 3×3 blocks grow like u²); over 2048 a rounding of q and k alone moves the float64 output by up to
    3e-3·max|v|: the float32 output is as far from the float64 one as such a perturbation
    (within 2⁻¹⁴·max|v| plus four times the largest of three), not closer than float32 itself allows."""
    enc = lp.build("jordan", 64)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 2048, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        want = lp.attention(q.double(), k.double(), v.double(), enc)
        got = lp.attention(q, k, v, enc).double()
        moved = []
        for s in range(3):
            h = torch.Generator().manual_seed(100 + s)
            qp, kp = (x.double() * (1 + 2.0**-24 * torch.randn(x.shape, generator=h, dtype=F64)) for x in (q, k))
            moved.append(float((lp.attention(qp, kp, v.double(), enc) - want).abs().max()))
    scale = float(v.abs().max())
    assert float((got - want).abs().max()) <= POLY_ROUNDING * scale + 4 * max(moved)
