"""Table build time before/after the exact (Payne–Hanek) angle reduction, and its accuracy.

RoPE with 64 frequencies (head dim 128) at 1×4096 positions: ``build_tables`` with the previous
reduction (Dekker product + three-part Cody–Waite, exact only for |ω t| < 2^27·2π ≈ 8.4e8) against
the current one (the same where it is exact, Payne–Hanek past it), at positions 0…4095 (near) and
2^40 + 0…4095 (far: millisecond timestamps), timed with ``torch.utils.benchmark``, before and after alternating. The error column
is the largest |angle − exact| over the 4096×64 angles, the exact value from mpmath (2600 bits) on a
sample of 512 of them.

Writes ``benchmarks/results/angles.md``. Run: ``python benchmarks/angles.py``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import mpmath
import torch
from torch.utils import benchmark

import liepos as lp
from liepos import _angles, tables

POSITIONS = 4096
HEAD_DIM = 128  # 64 rotation planes
FAR = 2.0**40
SAMPLE = 512
ROUNDS = 5  # alternating before/after timings per row; the median of each is reported


def previous_reduction(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The reduction before this change: exact product, Cody–Waite only (wrong past 2^27 turns)."""
    return _angles._cody_waite(*_angles._two_prod(freq.to(torch.float64), pos.to(torch.float64)))


def build(enc: lp.Encoding, pos: torch.Tensor) -> tables.Tables:
    plan = tables.make_plan(enc.generator, enc.layout, 0)
    return tables.build_tables(enc.generator, plan, pos, "query")


def max_error(reduce, freqs: torch.Tensor, pos: torch.Tensor) -> float:
    got = reduce(freqs[None, :], pos[:, None])  # (positions, planes)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, got.numel(), (SAMPLE,), generator=g).tolist()
    worst = 0.0
    with mpmath.workprec(2600):
        two_pi = 2 * mpmath.pi
        for i in idx:
            r, c = divmod(i, freqs.numel())
            x = mpmath.mpf(float(freqs[c])) * mpmath.mpf(float(pos[r]))
            exact = x - two_pi * mpmath.nint(x / two_pi)
            err = abs(mpmath.mpf(float(got[r, c])) - exact)
            worst = max(worst, float(min(err, abs(err - two_pi))))
    return worst


def main() -> None:
    torch.set_num_threads(1)
    enc = lp.rope(HEAD_DIM)
    freqs = lp.rope_freqs(HEAD_DIM).to(torch.float64)
    rows = []
    for label, offset in (("near (0…4095)", 0.0), ("far (2^40 + 0…4095)", FAR)):
        pos = offset + torch.arange(POSITIONS, dtype=torch.float64)
        runs: dict[str, list[float]] = {"before": [], "after": []}
        reductions = {"before": previous_reduction, "after": _angles.reduced_angle}
        timer = benchmark.Timer("build(enc, pos)", globals={"build": build, "enc": enc, "pos": pos})
        for _ in range(ROUNDS):  # alternate, so that a busy machine slows both alike
            for name, reduce in reductions.items():
                tables.reduced_angle = reduce  # build_tables looks the reduction up in its module
                try:
                    runs[name].append(timer.blocked_autorange(min_run_time=0.3).median * 1e3)
                finally:
                    tables.reduced_angle = _angles.reduced_angle
        times = {name: statistics.median(v) for name, v in runs.items()}
        for name, reduce in reductions.items():
            times[name + " error"] = max_error(reduce, freqs, pos)
        rows.append((label, times))
    lines = [
        "# Angle reduction: table build time and accuracy",
        "",
        f"`python benchmarks/angles.py` (torch {torch.__version__}, 1 thread): `build_tables` of "
        f"`lp.rope({HEAD_DIM})` at 1×{POSITIONS} positions, median of {ROUNDS} alternating "
        f"`torch.utils.benchmark` runs each; "
        f"error: the largest |angle − exact| on {SAMPLE} sampled angles against mpmath.",
        "",
        "| positions | before (ms) | after (ms) | after / before | error before | error after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, t in rows:
        lines.append(
            f"| {label} | {t['before']:.2f} | {t['after']:.2f} | {t['after'] / t['before']:.2f} | "
            f"{t['before error']:.2e} | {t['after error']:.2e} |"
        )
    lines += ["", f"One ulp of π is {math.ulp(math.pi):.2e}."]
    text = "\n".join(lines) + "\n"
    out = Path(__file__).parent / "results" / "angles.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
