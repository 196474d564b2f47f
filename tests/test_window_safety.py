"""ALiBi's key window (keys far before a query block left out under a linear bias) is exact for any
data: with adversarial key norms, anti-aligned own keys and timestamps far apart, attention with the
window equals attention with every key kept."""

from __future__ import annotations

from unittest import mock

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
