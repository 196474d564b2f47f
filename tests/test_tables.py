"""The tables' plan and range check: the partner layout each plan names, the tables left out when nothing
scales or rotates, and the several-axis range check against every position and block computed directly."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos.tables import check_range, make_plan

F64 = torch.float64
RATES = [[-1.0, -1 / 7, 0.0, 20.0], [0.5, -1.0, 0.0, -3.0]]  # (axes, blocks), times `rate`
NUS = [[1.0, 1.0, 1.0, 1.0], [0.5, 2.0, -1.0, 1.0]]
SIZES, COMPLEX = [1, 3, 2, 1], [False, True, False, False]


def two_axes(rate: float, rates=RATES, sizes=SIZES, cplx=COMPLEX) -> lp.Generator:
    freqs = [[w if c else 0.0 for w, c in zip(row, cplx)] for row in ([0.0, 0.3, 0.0, 0.0], [0.0, 0.1, 0.0, 0.0])]
    return lp.Generator([[rate * r for r in row] for row in rates], freqs, sizes, complex=cplx, allow_growth=True,
                        axes=2, nus=NUS)


def one_axis(rate: float, rates=RATES, sizes=SIZES, cplx=COMPLEX) -> lp.Generator:
    freqs = [w if c else 0.0 for w, c in zip([0.0, 0.3, 0.0, 0.0], cplx)]
    return lp.Generator([rate * r for r in rates[0]], freqs, sizes, complex=cplx, allow_growth=True)


def refused(g: lp.Generator, pos, side: str, dtype: torch.dtype, fade: bool = False) -> bool:
    try:
        check_range(g, torch.tensor(pos, dtype=F64), side, dtype, fade=fade)
    except OverflowError:
        return True
    return False


@pytest.mark.parametrize("enc, mode", [
    (lp.rope(8), "pairs"), (lp.rope(8, layout="half"), "halves"), (lp.jordan(3, freq=0.5), "pairs"),
    (lp.nope(4), "none"), (lp.decay([0.1, 0.2]), "none"), (lp.jordan(3), "none"), (lp.alibi(4, num_heads=2), "none"),
])
def test_plan_names_the_partner_layout_of_its_planes(enc, mode):
    """``partner``: "none" without rotation planes, "pairs" for planes (2k, 2k+1), "halves" for (k, k+P);
    ``partner_index`` is the involution that swaps the two dims of every plane and fixes the others."""
    plan = make_plan(enc.generator, enc.layout, 0)
    assert plan.partner == mode
    idx = plan.partner_index
    assert torch.equal(idx[idx], torch.arange(plan.dim))
    moved = int((idx != torch.arange(plan.dim)).sum())
    assert moved == 2 * plan.planes
    if mode == "pairs":
        i = torch.arange(plan.dim)
        assert torch.equal(idx[idx != i], (i ^ 1)[idx != i])


@pytest.mark.parametrize("enc, has_a, has_b", [
    (lp.nope(4), False, False), (lp.jordan(3), False, False), (lp.alibi(4, num_heads=2), False, False),
    (lp.decay([0.1, 0.2]), True, False), (lp.rope(8), True, True),
])
def test_tables_leave_out_what_neither_scales_nor_rotates(enc, has_a, has_b):
    """``Tables.a`` is ``None`` when no dimension scales or rotates, ``b`` when none rotates (the apply then
    skips the product); present otherwise."""
    t = enc.tables(torch.arange(3.0, dtype=F64), "query")
    assert (t.a is not None) == has_a and (t.b is not None) == has_b


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(-300.0, 300.0), st.floats(-300.0, 300.0)), min_size=1, max_size=8),
       st.sampled_from(["query", "key"]), st.booleans(), st.floats(0.05, 3.0),
       st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), st.booleans())
def test_several_axis_range_check_refuses_exactly_the_tables_that_leave_the_dtype(times, side, fade, rate, dtype,
                                                                                  zero_block):
    """Two axes: ``λ·t = Σ_a λ_a t_a`` per block against every position computed directly (the scale
    overflows, the query scale underflows unless ``fade``, a coupling ``τ^k/k!`` overflows); with the
    second axis at 0 the decision is the one-axis generator's."""
    work = torch.float32 if dtype == torch.bfloat16 else dtype
    top, bottom = math.log(torch.finfo(work).max), math.log(torch.finfo(work).tiny)
    rates = RATES if zero_block else [row[:2] + [w] + row[3:] for row, w in zip(RATES, (0.25, -0.5))]
    expected = False
    for t in times:
        for b, n in enumerate(SIZES):
            E = sum(rate * rates[a][b] * t[a] for a in range(2))
            E = E if side == "query" else -E
            expected |= E >= top or (side == "query" and not fade and E <= bottom)
            tau = abs(sum(NUS[a][b] * t[a] for a in range(2)))
            expected |= n > 1 and tau > 0 and (n - 1) * math.log(tau) - math.lgamma(n) >= top
    assert refused(two_axes(rate, rates), times, side, dtype, fade) == expected
    first = [(t[0], 0.0) for t in times]
    assert refused(two_axes(rate, rates), first, side, dtype, fade) == \
        refused(one_axis(rate, rates), [t[0] for t in times], side, dtype, fade)


@pytest.mark.parametrize("side, fade", [("query", False), ("query", True), ("key", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_several_axis_range_check_decides_like_one_axis_at_the_exact_limits(side, fade, dtype):
    """At the limits themselves (``λt`` exactly ``log max`` or ``log tiny``, ``τ`` exactly the dtype's max),
    the several-axis check refuses exactly when the one-axis check does."""
    top, bottom = math.log(torch.finfo(dtype).max), math.log(torch.finfo(dtype).tiny)
    unit = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    for rates, t in [(unit, top), (unit, -top), (unit, bottom), (unit, -bottom)]:
        got = refused(two_axes(1.0, rates), [(t, 0.0)], side, dtype, fade)
        assert got == refused(one_axis(1.0, rates), [t], side, dtype, fade), (t, side, fade)
    zero, sizes, real = [[0.0] * 4, [0.0] * 4], [1, 1, 2, 1], [False] * 4
    big = torch.finfo(dtype).max  # τ = max: the size-2 block's τ^1/1! reaches log max exactly
    assert refused(two_axes(1.0, zero, sizes, real), [(big, 0.0)], side, dtype, fade) == \
        refused(one_axis(1.0, zero, sizes, real), [big], side, dtype, fade)
