"""Replayed calls (``liepos._replay``): a repeat of ``query`` / ``key`` on one shape runs the recorded kernel at once,
with the bits of the full call, and takes the full call again whenever anything it was recorded under changed:
the times (in place too), the parameters (in place, a new storage, a gradient asked), the kernels switched off,
autograd, another shape or layout of the input."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _kernels, _replay

ENCODINGS = {
    "rope": lambda: lp.rope(64),
    "rope_half": lambda: lp.rope(64, layout="half"),
    "xpos": lambda: lp.xpos(64),
    "decay": lambda: lp.build("decay", 64, 4),
    "retnet": lambda: lp.retnet(64, num_heads=4),
    "jordan": lambda: lp.build("jordan", 64),
    "alibi": lambda: lp.alibi(64, num_heads=4),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


@pytest.fixture(autouse=True)
def small_calls_record_lanes(monkeypatch):
    """Lanes for the small shapes of these tests too (by default only calls of 2^16 elements or more record one)."""
    monkeypatch.setattr(_replay, "LANE_MIN_ELEMS", 0)


class Spy:
    """Counts the calls a recorded lane served (``Encoding._replayed`` returned a tensor) and those where a lane
    of the call's key was there but declined (None)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served = self.declined = 0
        replayed = lp.Encoding._replayed

        def spied(enc, x, positions, side):
            lanes = enc.__dict__.get("_lanes") or {}
            had = _replay.lane_key(x, side) in lanes
            y = replayed(enc, x, positions, side)
            self.served += y is not None
            self.declined += had and y is None
            return y

        monkeypatch.setattr(lp.Encoding, "_replayed", spied)


def _full(enc: lp.Encoding, side: str, x: torch.Tensor, positions) -> torch.Tensor:
    """The full call: a fresh copy of the encoding holds no lane."""
    fresh = copy.copy(enc)
    fresh.__dict__.pop("_lanes", None)
    out = getattr(fresh, side)(x, positions)
    assert not fresh.__dict__.get("_lanes") or fresh.__dict__["_lanes"] is not enc.__dict__.get("_lanes")
    return out


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("side", ["query", "key"])
def test_a_repeat_is_served_by_its_lane_with_the_full_calls_bits(name, dtype, side, monkeypatch):
    spy = Spy(monkeypatch)
    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 120, enc.content_dim, generator=g).to(dtype)
    # times within every encoding's range without an origin (the catalogue decay's fastest rate, 1/2, underflows
    # float32 past t = 174)
    for positions in (None, torch.arange(120), torch.arange(40, 160).view(1, -1)):
        first = getattr(enc, side)(x, positions)
        served = spy.served
        again = getattr(enc, side)(x, positions)
        assert spy.served == served + 1, "the repeat was not served by its lane"
        full = _full(enc, side, x, positions)
        assert _bits_equal(first, full) and _bits_equal(again, full)


@pytest.mark.skipif(_kernels._missing() is not None, reason="no C++ compiler or ninja: the native ops are not built")
def test_the_half_layout_lane_runs_the_native_rotation_into_a_fresh_output(monkeypatch):
    spy = Spy(monkeypatch)
    enc = lp.rope(64, layout="half")
    x = torch.randn(1, 8, 4096, 64)
    pos = torch.arange(4096)
    enc.query(x, pos)
    monkeypatch.setattr(_kernels, "_ran", set())  # the ops this call runs, the process's record left as it was
    y = enc.query(x, pos)
    assert spy.served == 1 and "halves torch.float32" in _kernels._ran
    assert y.data_ptr() != x.data_ptr() and _bits_equal(y, _full(enc, "query", x, pos))


def test_times_changed_in_place_take_the_full_call(monkeypatch):
    spy = Spy(monkeypatch)
    enc = lp.rope(64, layout="half")
    x = torch.randn(1, 2, 100, 64)
    pos = torch.arange(100)
    enc.key(x, pos)
    pos.add_(7)  # the same tensor object, other times
    y = enc.key(x, pos)
    assert spy.declined == 1 and spy.served == 0
    assert _bits_equal(y, _full(enc, "key", x, torch.arange(7, 107)))
    pos.numpy()[3] = 50  # a write torch's version counter does not see
    y = enc.key(x, pos)
    assert spy.declined == 2 and spy.served == 0
    assert _bits_equal(y, _full(enc, "key", x, pos.clone()))


@pytest.mark.parametrize("change", ["in place", "new storage"])
def test_parameters_changed_take_the_full_call(change, monkeypatch):
    spy = Spy(monkeypatch)
    enc = lp.build("decay", 64, 4)
    x = torch.randn(1, 4, 60, 64)  # times 0 … 59: rates twice the catalogue's stay in float32's range
    before = enc.query(x)
    rates = enc.generator.rates
    with torch.no_grad():
        if change == "in place":
            rates.mul_(2)
        else:
            rates.data = rates.data * 2
    y = enc.query(x)
    assert spy.served == 0 and spy.declined == 1
    assert not torch.equal(y, before) and _bits_equal(y, _full(enc, "query", x, None))


def test_a_gradient_asked_of_the_input_or_the_parameters_takes_the_full_call(monkeypatch):
    spy = Spy(monkeypatch)
    enc = lp.rope(64)
    x = torch.randn(1, 2, 64, 64)
    enc.query(x)
    xg = x.clone().requires_grad_(True)
    enc.query(xg).sum().backward()  # the same shape, strides and dtype: the lane's key, but a gradient is asked
    assert xg.grad is not None and spy.served == 0
    enc.generator.freqs.requires_grad_(True)  # no new version, no new storage: a learned encoding now
    y = enc.query(x)
    y.sum().backward()
    assert spy.served == 0 and enc.generator.freqs.grad is not None


def test_kernels_off_give_the_torch_ops_bits_and_a_layout_of_its_own_is_a_lane_of_its_own(monkeypatch):
    spy = Spy(monkeypatch)
    enc = lp.rope(64, layout="half")
    x = torch.randn(1, 4, 512, 64)
    enc.query(x)
    with _kernels.off():
        _kernels._ran.clear()
        y = enc.query(x)
        assert not any(r.startswith("halves") for r in _kernels._ran)
        assert _bits_equal(y, _full(enc, "query", x, None))
    bshd = torch.randn(1, 512, 4, 64).transpose(1, 2)  # the same shape, other strides
    y = enc.query(bshd)
    assert spy.served == 1 and _bits_equal(y, _full(enc, "query", bshd, None))
    assert len(enc.__dict__["_lanes"]) == 2


def test_lanes_are_bounded_and_the_oldest_goes_first():
    enc = lp.rope(16)
    for S in range(1, _replay.LANES + 3):
        enc.query(torch.randn(1, 1, S, 16))
    lanes = enc.__dict__["_lanes"]
    assert len(lanes) == _replay.LANES
    assert min(key[1][2] for key in lanes) == 3  # S = 1 and 2 let go


def _call(enc: lp.Encoding, side: str, x: torch.Tensor, positions, full: bool = False):
    try:
        return _full(enc, side, x, positions) if full else getattr(enc, side)(x, positions)
    except OverflowError:  # beyond the dtype's range at these times: refused either way
        return "refused"


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(ENCODINGS)), p0=st.integers(0, 5000), S=st.integers(1, 70),
       heads=st.sampled_from([1, 4]), side=st.sampled_from(["query", "key"]), shaped=st.booleans())
def test_any_repeat_equals_the_full_call(name, p0, S, heads, side, shaped):
    enc = ENCODINGS[name]()
    if enc.num_heads is not None:
        heads = enc.num_heads
    x = torch.randn(1, heads, S, enc.content_dim)
    pos = torch.arange(p0, p0 + S)
    pos = pos.view(1, -1) if shaped else pos
    for times in (pos, pos, pos + 1, pos):  # a repeat, the same lane key at other times, and back
        got, want = _call(enc, side, x, times), _call(enc, side, x, times, full=True)
        if isinstance(want, str):
            assert isinstance(got, str)
        else:
            assert not isinstance(got, str) and _bits_equal(got, want)


def test_under_tritons_interpreter_the_full_call_runs(monkeypatch):
    # TRITON_INTERPRET=1 sends CPU tensors to the Triton kernels (as the suite tests them): a lane recorded before
    # would run the native kernel instead, so it declines
    spy = Spy(monkeypatch)
    enc = lp.rope(64, layout="half")
    x = torch.randn(1, 2, 64, 64)
    enc.query(x)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    enc.query(x)
    assert spy.declined == 1 and spy.served == 0


def test_kept_span_tables_follow_the_parameters_and_their_range_check():
    # the tiles' ranges (Encoding._span) keep their range check and table rows per range while the stamp holds
    enc = lp.build("decay", 64, 4)
    x = torch.randn(1, 4, 50, 64)
    first = enc._span(x, 10, "query")
    assert len(enc.__dict__["_spans"]) == 1
    assert _bits_equal(enc._span(x, 10, "query"), first)
    with torch.no_grad():
        enc.generator.rates.mul_(2)  # rates in place: another stamp, so the tables are looked up again
    fresh = lp.build("decay", 64, 4)
    with torch.no_grad():
        fresh.generator.rates.mul_(2)
    assert _bits_equal(enc._span(x, 10, "query"), fresh._span(x, 10, "query"))
    assert not torch.equal(enc._span(x, 10, "query"), first)
    with torch.no_grad():
        enc.generator.rates.mul_(100)  # the fastest rate now underflows float32 within the range: refused again
    with pytest.raises(OverflowError):
        enc._span(x, 10, "query")


def test_a_decode_step_records_no_lane(monkeypatch):
    # below LANE_MIN_ELEMS the times move every call (decode): a lane would be recorded and declined each time
    monkeypatch.setattr(_replay, "LANE_MIN_ELEMS", 1 << 16)
    enc = lp.rope(64, layout="half")
    for t in range(3):
        enc.query(torch.randn(1, 8, 1, 64), torch.tensor([t]))
    assert not enc.__dict__.get("_lanes")
    enc.query(torch.randn(1, 8, 128, 64))  # 2^16 elements: a prefill's lane
    assert len(enc.__dict__["_lanes"]) == 1


def test_a_pickled_or_copied_encoding_carries_no_kept_tables_or_lanes():
    import pickle

    enc = lp.rope(64, layout="half")
    x = torch.randn(1, 4, 256, 64)
    enc.query(x)
    enc._span(x, 5, "key")
    assert enc.__dict__["_lanes"] and enc.__dict__["_spans"]
    for other in (pickle.loads(pickle.dumps(enc)), copy.deepcopy(enc), copy.copy(enc)):
        assert "_lanes" not in other.__dict__ and "_spans" not in other.__dict__
        assert _bits_equal(other.query(x), enc.query(x))
    assert len(pickle.dumps(enc)) < 10_000  # the generator's few parameters, no tables
