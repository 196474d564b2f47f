"""Interleaved rounds, the one timing loop of the benchmarks: every round times every contender once.

The order rotates from round to round (so no contender always runs first), and each time is
``torch.utils.benchmark.Timer`` on torch's thread count (its default is one thread, and a thread change
recompiles FlexAttention). Ratios are taken per round, then their median, so that drift of a shared
machine hits every contender alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.utils import benchmark


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, number: int = 3) -> dict[str, list[float]]:
    """Seconds per call of every contender, one list entry per round (``number`` calls each, their median)."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # warm: tables cached, kernels and graphs compiled, buffers touched
        for r in range(rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
                timer = benchmark.Timer("fn()", globals={"fn": fns[n]}, num_threads=torch.get_num_threads())
                times[n].append(timer.timeit(number).median)
    return times


def ratio(times: list[float], yardstick: list[float]) -> float:
    """The median over rounds of the per-round ratio to the yardstick."""
    return statistics.median([t / y for t, y in zip(times, yardstick)])
