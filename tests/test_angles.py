"""Angles ω·t mod 2π, exact for every finite float64 ω and t, against mpmath."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _angles
from liepos._angles import inv_two_pi_bits, reduced_angle
from liepos.tables import reduced_angle as tables_reduced_angle

F64 = torch.float64
# the bound of the module docstring: a faithful rounding of the exact reduced value, plus 2^-70
ABS_FLOOR = 2.0**-70
PREC_BITS = 2600  # enough for |ω t| up to 2^2048 with 500 bits to spare after the reduction


def exact_reduced(w: float, t: float) -> mpmath.mpf:
    """ω t − 2π·round(ω t / 2π) from the exact float64 inputs, with 300 bits past the integer part
    (at most PREC_BITS)."""
    size = math.frexp(w)[1] + math.frexp(t)[1] if w and t else 0
    with mpmath.workprec(min(PREC_BITS, 300 + max(size, 0))):
        x = mpmath.mpf(w) * mpmath.mpf(t)
        two_pi = 2 * mpmath.pi
        return x - two_pi * mpmath.nint(x / two_pi)


def assert_exact(ws: list[float], ts: list[float], fn=reduced_angle) -> None:
    got = fn(torch.tensor(ws, dtype=F64), torch.tensor(ts, dtype=F64)).tolist()
    for w, t, r in zip(ws, ts, got):
        ref = exact_reduced(w, t)
        with mpmath.workprec(PREC_BITS):
            err = abs(mpmath.mpf(r) - ref)
            # the two reductions ±π agree on cos and sin: compare on the circle
            err = min(err, abs(abs(mpmath.mpf(r) - ref) - 2 * mpmath.pi))
        bound = math.ulp(abs(float(ref))) + ABS_FLOOR
        assert err <= bound, (w, t, r, float(ref), float(err))


log_freq = st.floats(-6.0, 3.0).map(lambda e: 10.0**e)
far_time = st.tuples(st.floats(-3.0, 300.0), st.sampled_from([-1.0, 1.0])).map(lambda p: p[1] * 10.0**p[0])
int_time = st.integers(0, 2**53).map(float)
finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(log_freq, st.one_of(far_time, int_time)), min_size=1, max_size=8))
def test_matches_mpmath_for_times_up_to_1e300(pairs):
    ws, ts = zip(*pairs)
    assert_exact(list(ws), list(ts))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(finite, finite)
def test_matches_mpmath_for_every_finite_float64(w, t):
    assert_exact([w], [t])  # includes products past the float64 range (1e300 · 1e300)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(log_freq, st.floats(0.0, 18.0).map(lambda e: 10.0**e)), min_size=1, max_size=8))
def test_per_frequency_path_matches_mpmath(pairs):
    """The reduction through ω/(2π) formed once per frequency (|ω t| < 2^80·2π: t up to 1e18)."""
    ws, ts = zip(*pairs)
    assert_exact(list(ws), list(ts), fn=lambda w, t: _angles._per_frequency(w, t))
    w = torch.tensor(ws, dtype=F64)[None, :]  # (1, n): broadcast as the tables do
    t = torch.tensor(ts, dtype=F64)[:, None]  # (n, 1)
    assert torch.equal(torch.diagonal(_angles._per_frequency(w, t)), _angles._per_frequency(w[0], t[:, 0]))


def test_extremes_and_near_multiples_of_two_pi():
    big = 1.7976931348623157e308
    tiny = 5e-324
    ws = [1.0, 1.0, big, big, tiny, 1e-300, 1.0, 1.0, 0.0, -3.0]
    ts = [1e22, 2.0**31 - 1, big, -big, 3.0, 1e-10, 6381956970095103.0 * 2.0**797, 0.0, 1e300, 7.0]
    assert_exact(ws, ts)
    # convergents of 2π: ω t lands within 1e-9 of a multiple of 2π (the reduced angle is tiny)
    ts = [710.0, 103993.0 * 2, 833719.0 * 2, 4272943.0 * 2, 411557987.0 * 2, 2549491779.0 * 2]
    assert_exact([1.0] * len(ts), ts)


def test_both_reductions_agree_where_both_apply():
    """The Cody–Waite path (eager, |ω t| < 2^27·2π) and Payne–Hanek (compiled graphs, far times)."""
    g = torch.Generator().manual_seed(0)
    w = torch.exp(torch.empty(2000, dtype=F64).uniform_(-14, 7, generator=g))
    t = torch.empty(2000, dtype=F64).uniform_(0, 1, generator=g) * (_angles._CODY_WAITE_LIMIT / w)
    cw = _angles._cody_waite(*_angles._two_prod(w, t))
    ph = _angles._payne_hanek(w, t)
    assert float((cw - ph).abs().max()) <= 2 * 2.0**-52 * math.pi
    assert_exact(w[:50].tolist(), t[:50].tolist(), fn=_angles._payne_hanek)


def test_table_of_inverse_two_pi_is_the_digits_of_mpmath():
    bits = _angles.TABLE_BITS
    with mpmath.workprec(bits + 64):
        ref = int(mpmath.floor(mpmath.mpf(2) ** bits / (2 * mpmath.pi)))
    assert inv_two_pi_bits(bits) == ref
    # every row is frac(2^{24b}/(2π)) to 159 bits
    with mpmath.workprec(bits + 64):
        for b in (0, 1, 17, _angles._TABLE_SIZE - 1):
            row = _angles._G[:, b].tolist()
            want = mpmath.frac(mpmath.mpf(2) ** (24 * b) / (2 * mpmath.pi))
            assert abs(sum(mpmath.mpf(v) for v in row) - want) < mpmath.mpf(2) ** -158


@pytest.mark.parametrize("shift", [2.0**27, 2.0**40, 2.0**48, 2.0**52])
def test_rope_scores_do_not_drift_under_a_shift_of_time(shift):
    """Issue 13 item 3: a shift of 2^40 (millisecond timestamps) moved scores by 3.3e-5; now ~eps."""
    enc = lp.rope(64)
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 32, 64, dtype=F64, generator=g) for _ in range(2))
    p = torch.arange(32, dtype=F64)
    ref = enc.query(q, p) @ enc.key(k, p).transpose(-1, -2)  # (1, 1, 32, 32)
    far = enc.query(q, p + shift) @ enc.key(k, p + shift).transpose(-1, -2)
    assert float((far - ref).abs().max() / ref.abs().max()) < 1e-13


def test_rope_tables_at_1e18_are_the_exact_cosines():
    enc = lp.rope(16)
    t = 1e18 + 128.0 * torch.arange(4, dtype=F64)  # float64 spacing at 1e18 is 128
    tab = enc.tables(t, "query")
    w = lp.rope_freqs(16).tolist()
    with mpmath.workprec(PREC_BITS):
        for i, ti in enumerate(t.tolist()):
            for j, wj in enumerate(w):
                want = float(mpmath.cos(mpmath.mpf(wj) * mpmath.mpf(ti)))
                assert abs(float(tab.a[i, 2 * j]) - want) < 1e-15


def test_int64_times_past_2_53_are_refused_unless_float64_holds_them():
    """Times are float64: an int64 time float64 cannot hold (past 2^53) is refused, never rounded."""
    enc = lp.rope(8)
    q = torch.randn(1, 1, 1, 8, dtype=F64)
    for t in (2**53 + 1, 2**60 + 3):
        with pytest.raises(ValueError, match="exactly representable"):
            enc.query(q, torch.tensor([t], dtype=torch.int64))
    # 2^60 is a float64: accepted, and equal to the float64 time
    assert torch.equal(enc.query(q, torch.tensor([2**60], dtype=torch.int64)), enc.query(q, torch.tensor([2.0**60], dtype=F64)))
    exact = enc.query(q, torch.tensor([2**53 - 1], dtype=torch.int64))
    other = enc.query(q, torch.tensor([2**53 - 2], dtype=torch.int64))
    assert not torch.equal(exact, other)  # below 2^53 adjacent integer times stay apart


def test_gradient_is_that_of_the_product():
    w = torch.tensor([0.3, 1e-4, 2.0], dtype=F64, requires_grad=True)
    t = torch.tensor([5.0, 1e12, 1e20], dtype=F64, requires_grad=True)
    r = reduced_angle(w, t)
    gw, gt = torch.autograd.grad(r.sum(), (w, t))
    assert torch.equal(gw, t.detach()) and torch.equal(gt, w.detach())
    assert torch.autograd.gradcheck(lambda a, b: reduced_angle(a, b), (w[:1], t[:1]))
    assert torch.autograd.gradgradcheck(lambda a, b: reduced_angle(a, b) ** 2, (w[:1], t[:1]))


def test_tables_keeps_reduced_angle_importable():
    w, t = torch.tensor([1.0, 2.0], dtype=F64), torch.tensor([1e30, 3.0], dtype=F64)
    assert torch.equal(tables_reduced_angle(w, t), reduced_angle(w, t))


def test_broadcasting_and_dtypes():
    w = torch.tensor([[1.0, 1e-3]], dtype=torch.float32)  # (1, 2)
    t = torch.tensor([[1e10], [3.0]], dtype=F64)  # (2, 1)
    r = reduced_angle(w, t)  # (2, 2)
    assert r.shape == (2, 2) and r.dtype == F64
    assert_exact([float(w[0, 1])], [1e10])
    assert math.isclose(float(r[0, 1]), float(exact_reduced(float(w[0, 1]), 1e10)), rel_tol=1e-15)


def test_inside_torch_compile_exact_where_it_applies_and_nan_past_it():
    """Compiled graphs take the per-frequency reduction (no data-dependent branch, no frexp):
    equal to eager up to |ω t| < 2^80·2π, NaN past it (never a wrong angle)."""
    import torch._dynamo

    torch._dynamo.reset()
    f = torch.compile(reduced_angle, fullgraph=True, backend="aot_eager")
    w = lp.rope_freqs(16).to(F64)[None, :]  # (1, 8)
    t = torch.tensor([0.0, 3.0, 2.0**40 + 1, 1e18, 1e24], dtype=F64)[:, None]  # (5, 1)
    assert torch.equal(f(w, t), reduced_angle(w, t))
    out = f(w, torch.tensor([[1e26]], dtype=F64))  # ω = 1: 1e26 > 2^80·2π; ω ≈ 3e-4: below
    assert torch.isnan(out[0, 0])
    assert torch.isnan(f(w, torch.tensor([[1e25]], dtype=F64))[0, 0])  # 1e25: past 2^80·2π ≈ 7.6e24 too
    assert torch.equal(out[0, -1:], reduced_angle(w[0, -1:], torch.tensor([1e26], dtype=F64)))


def test_each_reduction_is_chosen_strictly_below_its_limit():
    """``_products_below`` answers "every |ω t| below the limit and both operands split": strictly (a
    product at the limit, an operand at the split limit, or a NaN takes the next reduction)."""
    one = torch.tensor([1.0], dtype=torch.float64)
    limit = _angles._CODY_WAITE_LIMIT
    assert _angles._products_below(one, torch.tensor([limit / 2], dtype=torch.float64), limit)
    assert not _angles._products_below(one, torch.tensor([limit], dtype=torch.float64), limit)
    split = torch.tensor([_angles._SPLIT_LIMIT], dtype=torch.float64)
    tiny = torch.tensor([2.0**-1000], dtype=torch.float64)
    assert not _angles._products_below(split, tiny, math.inf)  # ω at the split limit
    assert not _angles._products_below(tiny, split, math.inf)  # t at the split limit
    assert _angles._products_below(split / 2, tiny, math.inf)
    assert not _angles._products_below(one, torch.tensor([math.nan], dtype=torch.float64), limit)


def test_every_row_of_the_table_is_frac_of_a_power_of_two_over_two_pi():
    """All rows, not a few: ``G[:, b]`` sums to ``frac(2^{24b}/(2π))`` (no integer bit kept in any row)."""
    with mpmath.workprec(_angles.TABLE_BITS + 64):
        for b in range(_angles._TABLE_SIZE):
            want = mpmath.frac(mpmath.mpf(2) ** (24 * b) / (2 * mpmath.pi))
            got = sum(mpmath.mpf(v) for v in _angles._G[:, b].tolist())
            assert abs(got - want) < mpmath.mpf(2) ** -158, b


def test_products_just_past_the_cody_waite_limit_are_exact():
    """Between 2^27·2π and 2^28·2π the Cody–Waite split is no longer exact (k·_C1 needs 54 bits):
    the reduction there must be another one, exact against mpmath."""
    limit = 2.0**27 * 2 * math.pi  # the documented limit, not the module's constant
    ws = [1.0, 0.7853981633974483, 3.3e-3]
    ts = [limit / w * (1 + j / 16) for w in ws for j in range(1, 16)]
    assert_exact([w for w in ws for _ in range(1, 16)], ts)


def test_tiny_frequencies_at_far_times_are_exact():
    """0 < |ω| < 2^-800 at times that make ω t large: the per-frequency split of ω/(2π) would be
    subnormal, so these take Payne–Hanek (and stay exact)."""
    for w, t in [(1.7 * 2.0**-1000, 2.0**1010), (2.0**-900, 1.3 * 2.0**905), (3 * 2.0**-850, 5.1 * 2.0**860)]:
        assert_exact([w], [t])  # one product per call: each alone is below the per-frequency limit


def test_eager_reduction_below_the_cody_waite_limit_is_cody_waite():
    """The cheapest exact reduction is the one taken: below 2^27·2π the eager result is Cody–Waite's bit
    for bit (the other reductions agree with it to one ulp, so only this identity tells them apart)."""
    g = torch.Generator().manual_seed(3)
    w = torch.exp(torch.empty(500, dtype=F64).uniform_(-14, 7, generator=g))
    t = torch.rand(500, dtype=F64, generator=g) * (_angles._CODY_WAITE_LIMIT / w.max())  # max|ω|·max|t| < limit
    assert torch.equal(reduced_angle(w, t), _angles._cody_waite(*_angles._two_prod(w, t)))


def _reduction_taken(w: float, t: float, monkeypatch) -> str:
    """The name of the reduction ``reduced_angle`` runs for one product (eager mode)."""
    taken = []
    for name in ("_cody_waite", "_per_frequency", "_payne_hanek"):
        fn = getattr(_angles, name)
        monkeypatch.setattr(_angles, name, lambda *a, _fn=fn, _name=name: taken.append(_name) or _fn(*a))
    reduced_angle(torch.tensor([w], dtype=F64), torch.tensor([t], dtype=F64))
    monkeypatch.undo()
    assert len(taken) == 1, taken
    return taken[0].lstrip("_")


@pytest.mark.parametrize("w, t, want", [
    (1.0, 2.0**27 * 2 * math.pi * 0.99, "cody_waite"),  # below the Cody–Waite limit
    (1.0, 2.0**27 * 2 * math.pi * 1.5, "per_frequency"),  # past it: k·_C1 would need more than 53 bits
    (1.0, 2.0**78, "per_frequency"),  # |ω t / 2π| ≈ 2^75.3, below 2^80 turns
    (0.5, 2.0**81 * 2 * math.pi * 0.99, "per_frequency"),  # just below 2^80 turns
    (1.0, 2.0**80 * 2 * math.pi * 1.01, "payne_hanek"),  # past 2^80 turns
    (2.0**-800, 2.0**840, "per_frequency"),  # the smallest frequency whose split stays normal
    (2.0**-800 * (1 - 2.0**-52), 2.0**840, "payne_hanek"),  # one ulp below it: a subnormal third part
    (2.0**-900, 2.0**940, "payne_hanek"),  # a tiny frequency at a product the per-frequency path could hold
])
def test_each_product_takes_the_cheapest_exact_reduction(w, t, want, monkeypatch):
    """The path is part of the contract (its cost, and which error bound applies): Cody–Waite below 2^27·2π,
    the per-frequency split up to 2^80 turns for frequencies of at least 2^-800, Payne–Hanek past either;
    and the angle is exact on each."""
    assert _reduction_taken(w, t, monkeypatch) == want
    assert_exact([w], [t])
