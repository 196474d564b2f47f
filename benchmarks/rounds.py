"""Interleaved rounds, the one timing loop of the benchmarks: every round times every contender once.

The order rotates from round to round (so no contender always runs first), and each time is
``torch.utils.benchmark.Timer`` on torch's thread count (its default is one thread, and a thread change
recompiles FlexAttention). Ratios are taken per round, then their median, so that drift of a shared
machine hits every contender alike.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

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


def machine() -> dict:
    """The CPU model (``/proc/cpuinfo``'s model name, what ``lscpu`` reads, with its family, model number and the
    largest cache level's size, which tell apart two CPUs a virtual machine names alike), its vector / matrix
    instruction-set flags and torch's thread count."""
    model, flags = platform.processor() or platform.machine(), []
    ids: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = val.strip()
            if key in ("cpu family", "model") and key not in ids:
                ids[key] = val.strip()
            if key == "flags":
                flags = sorted(f for f in val.split() if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
                break
    except OSError:
        pass
    extra = [f"family {ids['cpu family']} model {ids['model']}"] if len(ids) == 2 else []
    cache = _last_level_cache()
    if cache:
        extra.append(cache)
    return {"cpu": model + (f" ({', '.join(extra)})" if extra else ""), "cpu_flags": flags,
            "threads": torch.get_num_threads()}


def _last_level_cache() -> str | None:
    """``"L3 32768K"``: the largest data cache level CPU 0 reports and its size (Linux sysfs), else None."""
    found: tuple[int, str] | None = None
    try:
        for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (d / "type").read_text().strip() == "Instruction":
                continue
            level = int((d / "level").read_text())
            if found is None or level > found[0]:
                found = (level, (d / "size").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if found is None else f"L{found[0]} {found[1]}"


def threads(n: int) -> str:
    """``"1 thread"``, ``"2 threads"``: a thread count as a results file's heading says it."""
    return f"{n} thread" + ("" if n == 1 else "s")


def save(folder: Path, name: str, script: str, load: tuple[float, float], text: str, **fields: object) -> None:
    """``folder/name.{json,md}``: the command, torch, the CPU model and its flags (:func:`machine`), the thread
    count, the 1-minute load average before and after the run, then ``fields`` (json) or the table ``text`` (md)."""
    cmd = " ".join([f"python benchmarks/{script}", *sys.argv[1:]])
    folder.mkdir(parents=True, exist_ok=True)
    here = machine()
    meta = {"command": cmd, "torch": torch.__version__, **here, "load_average": list(load)}
    (folder / f"{name}.json").write_text(json.dumps({**meta, **fields}, indent=1))
    head = (f"`{cmd}` (torch {torch.__version__}, {here['cpu']}, {threads(here['threads'])}, "
            f"1-minute load average {load[0]:.2f} before, {load[1]:.2f} after)\n\nCPU flags: {' '.join(here['cpu_flags'])}")
    (folder / f"{name}.md").write_text(f"{head}\n\n{text}\n")
