"""ALiBi's key window (keys far before a query block left out under a linear bias) is exact for any
data: with adversarial key norms, anti-aligned own keys and timestamps far apart, attention with the
window equals attention with every key kept."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import recentre

F64 = torch.float64


def _all_keys(call, qe, lo, slopes, knorm):
    return [0] * qe.shape[1]  # the window off: every block weighs every earlier key


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    heads=st.sampled_from([2, 4]),
    gaps=st.lists(st.sampled_from([1.0, 3.0, 40.0, 300.0, 1000.0, 5000.0]), min_size=3, max_size=12),
    norms=st.lists(st.floats(-3.0, 3.0), min_size=12, max_size=12),  # log10 of each key's norm
    anti=st.lists(st.booleans(), min_size=12, max_size=12),  # own key anti-aligned with its query
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 10**6),
)
def test_the_key_window_changes_no_output(heads, gaps, norms, anti, dtype, seed):
    S = len(gaps)
    enc = lp.alibi(8, num_heads=heads)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, S, 8, dtype=F64, generator=g) for _ in range(3))
    scale = 10.0 ** torch.tensor(norms[:S], dtype=F64)  # (S,)
    k = k / k.norm(dim=-1, keepdim=True) * scale.view(1, 1, S, 1)
    flip = torch.tensor(anti[:S]).view(1, 1, S, 1)
    k = torch.where(flip, -q / q.norm(dim=-1, keepdim=True) * scale.view(1, 1, S, 1), k)
    p = torch.cumsum(torch.tensor(gaps, dtype=F64), 0)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with torch.no_grad():
        windowed = lp.attention(q, k, v, enc, p, p)
        with mock.patch.object(recentre, "window_starts", _all_keys):
            whole = lp.attention(q, k, v, enc, p, p)
    eps = torch.finfo(dtype).eps
    assert float((windowed.double() - whole.double()).abs().max()) <= 16 * eps * float(v.double().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("own_norm", [1e2, 1e4])
def test_the_window_keeps_the_earlier_keys_a_far_block_weighs_most(dtype, own_norm):
    """The worst case for the window's bound on the row maximum: a block 3000 steps after the keys before
    it, whose own keys are large and anti-aligned (each own score far below the bias of the earlier keys),
    so the row's largest weight sits on the nearest earlier key at a lag of 3000 — the bound
    ``min(C_own, C_near + m·lag)`` must count that lag and the block's own keys, or the window cuts the keys
    that carry the answer. Attention equals the one with every key kept, and the float64 reference."""
    H, S = 2, 16
    enc = lp.alibi(8, num_heads=H, slopes=[0.5, 0.25])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, S, 8, dtype=F64, generator=g) for _ in range(3))
    q = q / q.norm(dim=-1, keepdim=True) * 4.0
    k = k / k.norm(dim=-1, keepdim=True) * 0.1  # the keys before the far block: small content scores
    k[:, :, 8:] = -q[:, :, 8:] / 4.0 * own_norm  # the far block's own keys, anti-aligned with its queries
    p = torch.cat((torch.arange(8.0, dtype=F64), 3000.0 + torch.arange(8.0, dtype=F64)))  # two blocks
    qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
    with torch.no_grad():
        windowed = lp.attention(qd, kd, vd, enc, p, p, block_size=8)
        with mock.patch.object(recentre, "window_starts", _all_keys):
            whole = lp.attention(qd, kd, vd, enc, p, p, block_size=8)
    want = lp.attention_reference(q, k, v, enc, p, p)
    eps = torch.finfo(dtype).eps
    assert float((windowed.double() - whole.double()).abs().max()) <= 16 * eps * float(v.abs().max())
    assert float((windowed.double() - want).abs().max()) <= 1e3 * eps * float(v.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_with_no_content_the_window_starts_exactly_at_the_drop_lag(dtype):
    """Queries of zero content score only the bias ``−m (t − s)``, so the row's largest is the own key's and
    a key weighs ``e^{−m lag}``: the window keeps exactly the keys with ``m · lag ≤ −log(tiny) − log(eps) +
    log(keys)`` from the block's first query (the dtype's smallest normal times its rounding, shared by every
    key) and leaves out every earlier one — the cut the bound promises, no key more, no key less."""
    S, m = 1100, 1.0  # two blocks (an ALiBi block spans at most 1024 steps, cut to 32-row multiples): the second starts at 1024
    enc = lp.alibi(8, num_heads=1, slopes=[m])
    g = torch.Generator().manual_seed(1)
    q = torch.zeros(1, 1, S, 8, dtype=dtype)
    k, v = (torch.randn(1, 1, S, 8, dtype=F64, generator=g).to(dtype) for _ in range(2))
    p = torch.arange(float(S), dtype=F64)
    seen, real = [], recentre.window_starts
    spy = lambda call, qe, lo, slopes, knorm: seen.append((lo, real(call, qe, lo, slopes, knorm))) or seen[-1][1]  # noqa: E731
    with torch.no_grad(), mock.patch.object(recentre, "window_starts", spy):
        windowed = lp.attention(q, k, v, enc, p, p)
    info = torch.finfo(dtype)
    drop = -math.log(info.tiny) - math.log(info.eps) + math.log(S)
    (lo, starts), = seen
    assert lo == 1024 and starts == [math.ceil(lo - drop / m)], (lo, starts, drop)
    with torch.no_grad(), mock.patch.object(recentre, "window_starts", _all_keys):
        whole = lp.attention(q, k, v, enc, p, p)
    assert float((windowed.double() - whole.double()).abs().max()) <= 16 * info.eps * float(v.double().abs().max())


def test_head_groups_partition_the_heads_and_never_start_after_a_member():
    """``recentre.head_groups``: adjacent heads in order, every head in one group, a group's first key at or before
    every member's own (more keys than a window, never fewer), runs of equal starts never split, the keys a merge
    adds under ``MERGE_PAIRS``; with ``MERGE_PAIRS = 0`` the groups are the runs of equal starts."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(0, 5000), min_size=1, max_size=16), st.integers(1, 2048), st.sampled_from([0, 1 << 19]))
    def check(starts, rows, merge):
        with mock.patch.object(recentre, "MERGE_PAIRS", merge):
            groups = recentre.head_groups(starts, rows)
        assert groups[0][0] == 0 and groups[-1][1] == len(starts)
        assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
        for h0, h1, first in groups:
            assert first == min(starts[h0:h1])
            if h1 - h0 > 1 and len(set(starts[h0:h1])) > 1:
                assert sum(s - first for s in starts[h0:h1]) * rows < merge
        for (_, a1, _), (b0, _, _) in zip(groups, groups[1:]):
            if merge == 0:
                assert starts[a1 - 1] != starts[b0]  # a run of equal starts is one group

    check()
    assert recentre.head_groups([750, 479, 0, 0, 0, 0, 0, 0], 1024) == [(0, 2, 479), (2, 8, 0)]
