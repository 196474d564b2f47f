"""Attention by re-centred query blocks (liepos.recentre): a block whose queries span too much time for one
origin is split, and several-axis positions keep one origin per batch element."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import attention_pieces, faded_keys, recentre
from liepos.faded_keys import _fade_plan
from liepos.generator import direct_sum
from liepos.temperature import ScalableSoftmax

F64 = torch.float64


def test_queries_far_apart_in_one_block_are_split_and_match_the_reference():
    """Decay at rate 0.5 with queries 3000 apart inside one block of two (keys at their own times, half a
    step before each query: the block-by-block path): one origin for both would put e^{0.5·3000} into the
    tables; the block is halved instead, and attention equals the reference."""
    enc = lp.decay([0.5, 0.1, 0.05, 0.01])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 4, dtype=F64, generator=g) for _ in range(3))
    p = torch.tensor([0.0, 3000.0, 3001.0, 9000.0], dtype=F64)
    got = lp.attention(q, k, v, enc, p, p - 0.5, block_size=2)
    want = lp.attention_reference(q, k, v, enc, p, p - 0.5)
    assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_several_axis_positions_per_batch_element_equal_each_element_alone():
    """Positions (batch, seq, axes): every batch element re-centred at its own block origin, as if alone."""
    enc = lp.decay_axial_rope(8, axes=2, rates=[0.3, 0.2, 0.1, 0.05])  # decays: re-centred per block
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=F64, generator=g) for _ in range(3))
    p = torch.stack([torch.stack([torch.arange(5.0), torch.zeros(5)], -1),
                     torch.stack([torch.arange(5.0) * 3 + 100, torch.arange(5.0)], -1)]).to(F64)  # (2, 5, 2)
    got = lp.attention(q, k, v, enc, p, p, block_size=2)
    alone = torch.cat([lp.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], enc, p[i], p[i], block_size=2)
                       for i in range(2)])
    assert torch.allclose(got, alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["decay", "xpos", "jordan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T", [256, 207])  # 207 = 3²·23: blocks of 3 or 23 rows with no partial block left
def test_faded_keys_left_out_change_no_output(name, dtype, T):
    """Past a head's fade window every score is within CLEAR_LOGIT of 0: the faded path (keys beyond the
    window scored 0, grouped keys) equals attention with the fade plan off; an encoding whose norms do
    not stay under its fade (a Jordan block's polynomial growth) gets no fade plan at all."""
    enc = {"decay": lambda: lp.decay(torch.linspace(1.0, 2.0, 16)), "xpos": lambda: lp.xpos(16, scale_base=0.1),
           "jordan": lambda: lp.Encoding(direct_sum(lp.decay(torch.full((13,), 0.5)).generator,
                                                    lp.jordan(3, -0.5).generator))}[name]()
    g = torch.Generator().manual_seed(2)
    # fast fades over a few hundred positions: windows of a few blocks, within a quarter of the sequence
    q = torch.randn(1, 4, T, 16, dtype=F64, generator=g)
    k, v = (torch.randn(1, 2, T, 16, dtype=F64, generator=g) for _ in range(2))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    plans = []
    spy = lambda call, b: plans.append(_fade_plan(call, b)) or plans[-1]  # noqa: E731
    with torch.no_grad(), mock.patch.object(faded_keys, "_fade_plan", spy):
        faded = lp.attention(q, k, v, enc)
    assert (faded_keys.fade_rates(enc) is None) == (name == "jordan") and (plans[0] is None or name != "jordan")
    if T == 256:  # every fading encoding gets a fade plan here
        assert (plans[0] is None) == (name == "jordan")
    with torch.no_grad():
        with mock.patch.object(faded_keys, "_fade_plan", lambda call, b: None):
            whole = lp.attention(q, k, v, enc)
    eps = torch.finfo(dtype).eps
    assert float((faded.double() - whole.double()).abs().max()) <= 16 * eps * float(v.double().abs().max())


def test_a_constant_bias_offset_on_alibi_is_read_as_an_offset_not_a_slope():
    """Key slots ``[c, −m]``: the bias is ``c − m (t − s)``; the slope read from the slots stays ``m`` and
    the constant ``c`` cancels in the softmax: the same attention as plain ALiBi, and as the reference."""
    enc = lp.alibi(8, num_heads=2)
    shifted = enc.replace(key_slots=enc.key_slots + torch.tensor([3.0, 0.0], dtype=F64))
    m, b0 = recentre.linear_bias(shifted, 2)
    m_plain, _ = recentre.linear_bias(enc, 2)
    assert torch.equal(m, m_plain) and torch.allclose(b0, torch.full_like(b0, 3.0))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=F64, generator=g) for _ in range(3))
    p = 7.0 * torch.arange(40, dtype=F64)
    got = lp.attention(q, k, v, shifted, p, p)
    assert torch.allclose(got, lp.attention(q, k, v, enc, p, p), rtol=1e-10, atol=1e-12)
    assert torch.allclose(got, lp.attention_reference(q, k, v, shifted, p, p), rtol=1e-10, atol=1e-12)


def test_bfloat16_sinks_with_alibi_at_far_times_match_the_reference():
    """With sinks, each row's sink logit carries the block's bias offset ``b − m (t − o)``, which spans
    hundreds over a block at spread-out times: it is formed in float32, never rounded to bfloat16
    (a 0.25 step there moves the sink's weight by up to 13 %)."""
    enc = lp.alibi(8, num_heads=2)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 64, 8, dtype=F64, generator=g) for _ in range(3))
    p = 25.0 * torch.arange(64, dtype=F64)
    sinks = torch.tensor([0.5, -0.25], dtype=F64)
    want = lp.attention_reference(q, k, v, enc, p, p, sinks=sinks)
    bf = torch.bfloat16
    got = lp.attention(q.to(bf), k.to(bf), v.to(bf), enc, p, p, sinks=sinks.to(bf))
    as32 = lp.attention(q.to(bf), k.to(bf), v.to(bf), enc, p, p, sinks=sinks.float())
    assert torch.equal(got, as32)
    assert float((got.double() - want).abs().max()) < 0.05


@pytest.mark.parametrize("rate", [2.0, 4.0])
def test_faded_keys_stay_finite_with_tiny_queries_and_huge_keys(rate):
    """The diagonal tiles of the faded path take their origin in the middle of each block, so the factors
    ``e^{±λ (t − o)}`` stay within the diagonal budget; keys of norm 1e10 against queries of 1e-9 (scores of
    order one) in float32 then encode without overflow, and attention equals the float64 one."""
    enc = lp.decay(torch.full((16,), rate))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 256, 16, dtype=F64, generator=g) for _ in range(3))
    q, k = q * 1e-9, k * 1e10
    plans = []
    spy = lambda call, b: plans.append(_fade_plan(call, b)) or plans[-1]  # noqa: E731
    with mock.patch.object(faded_keys, "_fade_plan", spy):
        got = lp.attention(q.float(), k.float(), v.float(), enc)
    assert plans and plans[0] is not None  # the faded path ran
    want = lp.attention_reference(q, k, v, enc)
    assert torch.isfinite(got).all()
    assert float((got.double() - want).abs().max()) <= 1e-5


def test_the_origin_budget_is_the_documented_one():
    """``e^{|λ| span} ≤ e^30`` (or a cube root of the dtype's range) and a polynomial span of
    ``min(512, (2^-14 / eps)^(1/n))`` for a largest Jordan block of degree n (slots: degree one), computed in
    float32 for half-precision inputs; no polynomial limit without coupling or slots."""
    import math
    from types import SimpleNamespace

    from liepos import origin_budget

    decay, jordan, alibi = lp.decay([1.0, 0.5, 0.25, 0.1]), lp.jordan(3, -0.1), lp.alibi(8, num_heads=2)
    cube_root = math.log(torch.finfo(torch.float32).max) / 3  # 29.57: below 30 in float32
    assert origin_budget.origin_span(decay, torch.float64) == 30.0
    assert origin_budget.origin_span(decay, torch.float32) == origin_budget.origin_span(decay, torch.bfloat16) == cube_root
    assert origin_budget.poly_span(lp.rope(8), torch.float32) == math.inf
    assert origin_budget.poly_span(alibi, torch.float32) == 512.0  # degree one: (2^-14 / 2^-23) = 2^9
    assert origin_budget.poly_span(jordan, torch.float32) == 2.0**4.5  # degree two: (2^9)^(1/2)
    assert origin_budget.poly_span(jordan, torch.float64) == 512.0  # (2^38)^(1/2), capped
    for dtype, span in [(torch.float64, 512.0), (torch.float32, 2.0**4.5), (torch.bfloat16, 2.0**4.5)]:
        call = SimpleNamespace(enc=jordan, venc=None, q=torch.zeros(1, dtype=dtype))
        rate, limit, poly = origin_budget.budget(call)
        assert (rate, poly) == (0.1, span), dtype
        assert limit == (30.0 if dtype == torch.float64 else cube_root)


def test_within_the_budget_is_every_distance_to_the_row_origin_up_to_the_limits_inclusive():
    from liepos import origin_budget

    b = (2.0, 30.0, 100.0)  # rate, exponent budget, polynomial span
    o = torch.tensor([1000.0], dtype=F64)
    at = lambda *ts: torch.tensor([ts], dtype=F64)  # noqa: E731  (1, n): one row
    assert origin_budget.within(at(), o, b)  # no times: nothing to exceed
    assert origin_budget.within(at(1000.0, 1015.0, 985.0), o, b)  # 2 · 15 = 30: at the limit
    assert not origin_budget.within(at(1000.0, 1015.5), o, b)  # 31 > 30
    assert origin_budget.within(at(900.0), o, (0.0, 30.0, 100.0))  # a span of 100: at the limit
    assert not origin_budget.within(at(899.0), o, (0.0, 30.0, 100.0))


def test_diagonal_tiles_are_sized_as_documented():
    """``tile_size``: every time within ``allowed`` of the middle origin (``2⌊allowed⌋ + 1`` rows); below 32
    rows that, a whole sequence when it fits, else the multiple of the flash kernel's 32 rows giving the fewest
    flash calls, the larger on a tie; and the diagonal budget is ``min(32, log(max) / 2)``."""
    import math

    from liepos import causal_tiling as ct

    assert ct.tile_size(math.inf, 300) == 300
    assert ct.tile_size(10.7, 1000) == 21 and ct.tile_size(15.0, 1000) == 31  # below 32 rows: 2⌊a⌋ + 1
    assert ct.tile_size(50.0, 101) == 101  # 2·50 + 1 = T: the whole sequence, one causal block
    assert ct.tile_size(20.0, 1000) == 32  # 41 rows allowed: the one multiple of 32 below
    assert ct.tile_size(48.0, 100) == 96  # 97 allowed: 64 and 96 rows both take 3 flash calls, the larger wins
    for a, T in [(40.0, 1000), (100.0, 2048), (300.0, 4096)]:
        top, w = 2 * math.floor(a) + 1, ct.tile_size(a, T)
        calls = {u: sum(map(len, ct.tile_plan(T, u))) for u in range(32, top + 1, 32)}
        assert w % 32 == 0 and calls[w] == min(calls.values()) and w == max(u for u, n in calls.items() if n == calls[w])
    b = (1.0, 29.0, 512.0)
    assert ct.diagonal_budget(b, torch.float32) == ct.diagonal_budget(b, torch.bfloat16) == (1.0, 32.0, 512.0)
    assert ct.diagonal_budget(b, torch.float16) == (1.0, math.log(torch.finfo(torch.float16).max) / 2, 512.0)


def test_equal_times_starting_anywhere_take_the_tiled_triangle(monkeypatch):
    """Times ``t₀ + 0 … T − 1`` with ``t₀ ≠ 0`` are a unit range too: the causal triangle is tiled (not the
    general block-by-block path), and attention equals the reference."""
    from liepos import causal_tiling

    plans, real = [], causal_tiling.tile_plan
    monkeypatch.setattr(causal_tiling, "tile_plan", lambda T, size: plans.append((T, size)) or real(T, size))
    enc = lp.decay(torch.full((8,), 0.01))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 96, 8, dtype=F64, generator=g) for _ in range(3))
    p = torch.arange(96, dtype=F64) + 1000.0
    got = lp.attention(q, k, v, enc, p, p)
    assert plans and plans[0][0] == 96
    assert torch.allclose(got, lp.attention_reference(q, k, v, enc, p, p), rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), big_row=st.integers(0, 511), big=st.floats(1.0, 1e6),
       rate=st.floats(0.01, 0.5), retnet=st.booleans())
def test_the_sampled_norms_never_change_the_fade_plan(seed, big_row, big, rate, retnet):
    """The fade plan reads every 16th row's norms first and gives up early only when even those windows (at
    most the true ones) reach past the share of the sequence (WINDOW_SHARE); the plan is the one from every
    row's norms, whatever row holds the largest norm (a single huge row off the sample included)."""
    enc = lp.retnet(16, num_heads=4) if retnet else lp.decay(torch.full((16,), rate))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 512, 16, generator=g) for _ in range(3))
    q[0, :, big_row] *= big
    plans = {}
    for sample in (faded_keys.SAMPLE, 1):
        seen: list = []
        spy = lambda call, b, seen=seen: seen.append(_fade_plan(call, b)) or seen[-1]  # noqa: E731
        with torch.no_grad(), mock.patch.object(faded_keys, "_fade_plan", spy), \
                mock.patch.object(faded_keys, "SAMPLE", sample):
            lp.attention(q, k, v, enc)
        plans[sample] = seen
    assert plans[1] and plans[faded_keys.SAMPLE] == plans[1]


@pytest.mark.parametrize("sinks", [False, True])
def test_bfloat16_alibi_is_attended_without_a_float32_copy(sinks, monkeypatch):
    """ALiBi in bfloat16 on the fused path reads the caller's q, k, v as they are (no float32 copy, q not
    multiplied by c before the kernel): the flash kernel gets bfloat16 and the call is never widened; its output
    equals the widened call's (float32 q·c rounded to bfloat16, scale 1) to a bfloat16 rounding, and the float64
    attention to the precision contract."""
    from liepos import attend
    enc = lp.alibi(64, num_heads=4)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 4, 1024, 64, generator=g).bfloat16() for _ in range(3))
    s = torch.randn(4, generator=g).bfloat16() if sinks else None
    widenings, real = [], attend.widened
    spy = lambda call: widenings.append(call.lazy) or real(call)  # noqa: E731
    monkeypatch.setattr(attend, "widened", spy)
    dtypes, real_flash = [], attention_pieces._flash
    monkeypatch.setattr(attention_pieces, "_flash", lambda q, *a, **kw: dtypes.append(q.dtype) or real_flash(q, *a, **kw))
    with torch.no_grad():
        got = lp.attention(q, k, v, enc, sinks=s)
        assert widenings == [] and dtypes and set(dtypes) == {torch.bfloat16}
        monkeypatch.setattr(attend, "takes_fused_bias", lambda call: False)
        old = lp.attention(q, k, v, enc, sinks=s)
        assert widenings == [True]  # widened once, before the temperature and the dispatch
        want = lp.attention(q.double(), k.double(), v.double(), enc, sinks=None if s is None else s.double())
    vmax = float(v.double().abs().max())
    assert float((got.double() - old.double()).abs().max()) <= 2**-7 * vmax
    assert float((got.double() - want).abs().max()) <= 16 * 2**-8 * vmax


def test_bfloat16_alibi_with_a_cache_is_widened(monkeypatch):
    """Every path but the fused one reads float32 q, k, v with q times c: a call with a cache is widened
    first (once), and agrees with the float64 attention; a temperature, which would scale the bfloat16
    queries, is refused with slots before any of it."""
    from liepos import attend
    enc = lp.alibi(16, num_heads=2)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g).bfloat16() for _ in range(3))
    widenings, real = [], attend.widened
    monkeypatch.setattr(attend, "widened", lambda call: widenings.append(call.lazy) or real(call))
    vmax = float(v.double().abs().max())
    with torch.no_grad():
        got = lp.attention(q, k, v, enc, cache=lp.KVCache())
        want = lp.attention(q.double(), k.double(), v.double(), enc)
        assert widenings == [True]
        assert float((got.double() - want).abs().max()) <= 16 * 2**-8 * vmax
        with pytest.raises(ValueError, match="its slots add a bias"):
            lp.attention(q, k, v, enc, temperature=ScalableSoftmax(0.5))
    assert widenings == [True]


@pytest.mark.parametrize("T", [2048, 4096])
def test_a_head_fades_only_where_its_window_spans_at_most_the_share(T):
    """The faded path pays where a head's window of key blocks is short against the sequence: RetNet (8 heads,
    dim 64) at T = 2048 keeps every head in the tiled triangle (its fastest head's window, 768 keys, is more
    than a quarter), at T = 4096 fades that head alone; every faded head's window is within the share."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 8, T, 64, generator=g) for _ in range(3))
    plans = []
    spy = lambda call, b: plans.append(_fade_plan(call, b)) or plans[-1]  # noqa: E731
    with torch.no_grad(), mock.patch.object(faded_keys, "_fade_plan", spy):
        lp.attention(q, k, v, lp.build("retnet", 64, 8))
    if T == 2048:
        assert plans == [None]
        return
    rows, groups, whole = plans[0]
    assert list(groups.values()) == [[0]] and whole == list(range(1, 8))
    assert all(m * rows <= faded_keys.WINDOW_SHARE * T for m in groups)


@pytest.mark.parametrize("hs", [[0], [1, 2, 3], [0, 2], [3, 1]])
def test_take_heads_is_a_view_for_a_run_of_heads_and_a_copy_otherwise(hs):
    x = torch.randn(2, 4, 5, 3)
    y = faded_keys.take_heads(x, hs)
    assert torch.equal(y, x[:, hs])
    run = hs == list(range(hs[0], hs[0] + len(hs)))
    assert (y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == run


def test_the_faded_path_reads_its_heads_as_views_and_equals_the_copies(monkeypatch):
    """RetNet at T = 4096: head 0 fades, heads 1–7 are tiled whole; both subsets are runs, read as views; the output
    is the one copies of the subsets give, bit for bit."""
    enc = lp.build("retnet", 64, 8)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 8, 4096, 64, generator=g) for _ in range(3))
    taken, real = [], faded_keys.take_heads
    monkeypatch.setattr(faded_keys, "take_heads", lambda x, hs: taken.append(list(hs)) or real(x, hs))
    with torch.no_grad():
        views = lp.attention(q, k, v, enc)
        assert [0] in taken and list(range(1, 8)) in taken
        monkeypatch.setattr(faded_keys, "take_heads", lambda x, hs: x.index_select(1, torch.tensor(hs)))
        copies = lp.attention(q, k, v, enc)
    assert torch.equal(views, copies)


def _fast_fading(dim: int = 64, heads: int = 4, rate: float = 0.07) -> lp.Encoding:
    """A decay whose head 0 fades within a few hundred lags (its keys before that score 0) and the others not."""
    rates = torch.full((heads, dim), 1e-4, dtype=torch.float64)
    rates[0] = rate
    return lp.decay(rates)


@pytest.mark.parametrize("T, B, Hk, dtype, blocks", [
    (1600, 1, 4, torch.float32, None),  # n = 12 blocks and a partial one (64 rows), one call of windows
    (1536, 2, 2, torch.float32, None),  # two batch rows (windows copied), grouped keys
    (1600, 1, 4, torch.float32, 3),  # windows of three blocks per flash call
    (1600, 1, 4, torch.bfloat16, None),  # (float64 keeps every key: no faded path)
])
def test_the_faded_near_keys_as_windows_equal_the_tiles_per_distance(T, B, Hk, dtype, blocks):
    """Without a gradient the faded head's query blocks see the m blocks of keys before them in one tile per block
    (each window encoded at its block's first query, the rows before time 0 masked out), the windows of a flash call
    within WINDOW_BYTES: the output is the tiles per block distance's, and the whole tiled triangle's, to the
    dtype's rounding; with a gradient the tiles per distance run."""
    enc = _fast_fading(heads=4)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, 4, T, 64, generator=g, dtype=F64).to(dtype)
    k, v = (torch.randn(B, Hk, T, 64, generator=g, dtype=F64).to(dtype) for _ in range(2))
    tiles, real, plans = [], faded_keys._window_tile, []
    spy_plan = lambda call, b: plans.append(_fade_plan(call, b)) or plans[-1]  # noqa: E731

    def spy(*a, **kw):
        tiles.append(a[1].count)
        return real(*a, **kw)

    with torch.no_grad(), mock.patch.object(faded_keys, "_window_tile", spy), \
            mock.patch.object(faded_keys, "_fade_plan", spy_plan):
        windowed = lp.attention(q, k, v, enc)
        rows, groups, _ = plans[0]
        (m, heads), = groups.items()
        assert m >= 2 and heads == [0]  # head 0 fades over m ≥ 2 blocks of keys: the windows ran
        n, rest = divmod(T, rows)
        per = n - 1
        if blocks is not None:  # a budget of `blocks` windows (the faded call's keys: head 0's, or every grouped head)
            per = blocks
            size = B * (1 if Hk == 4 else Hk) * m * rows * 64 * q.element_size()
            tiles.clear()
            with mock.patch.object(faded_keys, "WINDOW_BYTES", blocks * size):
                windowed = lp.attention(q, k, v, enc)
        assert tiles == [min(per, n - a) for a in range(1, n, per)] + ([1] if rest else [])
        tiles.clear()
        with mock.patch.object(faded_keys, "WINDOWED", False):
            distances = lp.attention(q, k, v, enc)
        with mock.patch.object(faded_keys, "_fade_plan", lambda call, b: None):
            whole = lp.attention(q, k, v, enc)
        assert not tiles
    eps = torch.finfo(torch.float32 if dtype == torch.bfloat16 else dtype).eps
    scale = float(v.double().abs().max())
    # bfloat16 outputs: each path rounds its float32 result once (2^-8 relative), so the two may differ by an ulp
    tol = torch.finfo(torch.bfloat16).eps * scale if dtype == torch.bfloat16 else 64 * eps * scale
    assert float((windowed.double() - distances.double()).abs().max()) <= tol
    assert float((windowed.double() - whole.double()).abs().max()) <= tol
    if dtype != torch.bfloat16:
        qg = q.clone().requires_grad_()
        with mock.patch.object(faded_keys, "_window_tile", spy):
            y = lp.attention(qg, k, v, enc)
        y.sum().backward()
        assert not tiles and qg.grad is not None and bool(torch.isfinite(qg.grad).all())
        assert float((y.detach().double() - windowed.double()).abs().max()) <= 64 * eps * scale
