"""The attention benchmark's comparisons (benchmarks/attention.py ``--compare``, not timings): every contender is
timed under both settings in the same rounds, the change of each ratio is the median of its per-round quotients,
and the compared setting (subnormals flushed, one thread) is put back after every call."""

import pytest
import torch
from helpers import bench_script


@pytest.fixture(scope="module")
def attention():
    with bench_script("attention") as module:
        yield module


@pytest.mark.parametrize("compare", ["flush", "threads"])
def test_each_ratio_change_is_the_median_of_its_per_round_quotients(attention, compare, monkeypatch):
    """Times made up per round: the change of an encoding is median_r (t_v / s_v) / (t / s) over the rounds, with
    its plain ratio against plain SDPA and its compared one against SDPA under the same setting."""
    v = attention.VARIANT[compare]
    fake = {"sdpa (causal)": [1.0, 2.0, 1.0], f"sdpa (causal) {v}": [1.0, 1.0, 2.0],
            "rope": [2.0, 4.0, 3.0], f"rope {v}": [3.0, 2.0, 4.0]}
    monkeypatch.setattr(attention, "encodings", lambda: {"rope": None})
    monkeypatch.setattr(attention, "path", lambda *a: "sdpa")
    monkeypatch.setattr(attention, "contenders", lambda *a: {"sdpa (causal)": None, "rope": None})
    monkeypatch.setattr(attention, "interleaved", lambda fns, rounds, number: {n: fake[n] for n in fns})
    got = attention.measure(64, torch.float32, 3, False, compare=compare, threads=2)
    quotients = sorted((fake[f"rope {v}"][r] / fake[f"sdpa (causal) {v}"][r]) / (fake["rope"][r] / fake["sdpa (causal)"][r])
                       for r in range(3))
    assert got["rope"]["change"] == pytest.approx(quotients[1])
    assert got["rope"]["ratio"] == pytest.approx(sorted([2.0, 2.0, 3.0])[1])
    assert got[f"rope {v}"]["ratio"] == pytest.approx(sorted([3.0, 2.0, 2.0])[1])
    text = attention.changes({"float32": {64: got}}, compare)
    assert "| rope | " in text and "sdpa" not in text.split("\n", 3)[-1]


def test_the_compared_settings_are_put_back_after_each_call(attention):
    threads = []
    before = torch.get_num_threads()
    attention._variant(lambda: threads.append(torch.get_num_threads()), "threads", before)()
    assert threads == [1] and torch.get_num_threads() == before
    tiny = lambda: float(torch.tensor(1e-30) * torch.tensor(1e-10))  # noqa: E731  a subnormal product
    flushed = []
    attention._variant(lambda: flushed.append(tiny()), "flush", None)()
    assert tiny() != 0.0  # the caller's thread keeps subnormals after the call
    if torch.set_flush_denormal(True):  # a CPU with a flush mode: the call saw it
        torch.set_flush_denormal(False)
        assert flushed == [0.0]
