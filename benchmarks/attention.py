"""lp.attention for every catalogue encoding, as a ratio to causal SDPA, with FlexAttention ALiBi as a peer.

    python benchmarks/attention.py            # T = 2048 … 16384, float32 and bfloat16
    python benchmarks/attention.py --quick    # T = 2048, float32 and bfloat16 (< 2 minutes)
    python benchmarks/attention.py --breakdown --lengths 8192   # where the time of the re-centred ones goes
    python benchmarks/attention.py --memory --lengths 8192      # their peak memory without a gradient

Shape: batch 1, 8 heads, head dim 64, causal self-attention over positions 0 … T − 1. Every round times
every contender once, in one process, in an interleaved order (so a change in machine load hits all
of them alike); the figure is the median over rounds of each contender's time divided by causal SDPA's
time in the same round. FlexAttention's ALiBi is a compiled ``score_mod`` (``torch.compile`` of
``flex_attention`` with a causal block mask), compiled once before timing.
Writes ``benchmarks/results/attention[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as Fn

import liepos as lp
from rounds import interleaved, ratio  # benchmarks/rounds.py: the one timing loop

HEADS, DIM = 8, 64
RESULTS = Path(__file__).resolve().parent / "results"


def encodings() -> dict[str, lp.Encoding]:
    """Every catalogue entry that causal attention takes (growth is refused by design), plus RoPE's half layout."""
    return {
        "nope": lp.nope(DIM),
        "rope": lp.rope(DIM),
        "rope_half": lp.rope(DIM, layout="half"),
        "xpos": lp.xpos(DIM),
        "retnet": lp.retnet(HEADS, DIM),
        "decay": lp.build("decay", DIM, HEADS),
        "alibi": lp.alibi(HEADS, DIM),
        "jordan": lp.build("jordan", DIM),
    }


def flex_alibi(T: int, dtype: torch.dtype):
    """FlexAttention with ALiBi as a compiled score_mod (Press et al.'s slopes) and a causal block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)], dtype=dtype)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, 1, 1, T, T, device="cpu")
    fn = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: fn(q, k, v, score_mod=alibi, block_mask=mask)


def contenders(T: int, dtype: torch.dtype, flex: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, DIM, generator=g).to(dtype) for _ in range(3))
    out = {"sdpa (causal)": lambda: Fn.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for name, enc in encodings().items():
        out[name] = lambda enc=enc: lp.attention(q, k, v, enc)
    if flex:
        f = flex_alibi(T, dtype)
        out["flex alibi (compiled)"] = lambda: f(q, k, v)
    return out


def measure(T: int, dtype: torch.dtype, rounds: int, flex: bool) -> dict[str, dict]:
    times = interleaved(contenders(T, dtype, flex), rounds, number=1)
    base = times["sdpa (causal)"]
    return {n: {"median_s": statistics.median(ts), "ratio": ratio(ts, base)} for n, ts in times.items()}


# profiler op names counted as encoding q, k (and v): the one-pass kernels' elementwise work
ENCODE_OPS = {"aten::mul", "aten::mul_", "aten::addcmul_", "aten::add_", "aten::neg", "aten::index", "aten::select",
              "aten::copy_", "liepos::apply_terms", "liepos::rotate_halves"}  # the last two: native kernels


def breakdown(T: int, dtype: torch.dtype) -> str:
    """One profiled call per re-centred encoding: self time in the flash kernel, in encoding, in the rest."""
    from torch.profiler import profile

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, DIM, generator=g).to(dtype) for _ in range(3))

    def timed(fn) -> dict[str, float]:
        fn()  # warm
        with profile() as prof:
            fn()
        out = {"flash": 0.0, "encode": 0.0, "other": 0.0, "calls": 0}
        for ev in prof.key_averages():
            kind = "flash" if "flash" in ev.key else "encode" if ev.key in ENCODE_OPS else "other"
            out[kind] += ev.self_cpu_time_total / 1e3  # ms
            out["calls"] += ev.count if kind == "flash" else 0
        return out

    with torch.no_grad():
        base = sum(timed(lambda: Fn.scaled_dot_product_attention(q, k, v, is_causal=True)).values())
        lines = [f"\n{dtype} T = {T}: profiler self time / causal SDPA's ({base:.0f} ms), one call each\n",
                 "| encoding | total | flash kernel (calls) | encoding q, k | everything else |", "|---|---|---|---|---|"]
        for name in ("retnet", "decay", "alibi", "jordan"):
            enc = encodings()[name]
            r = timed(lambda: lp.attention(q, k, v, enc))
            tot = r["flash"] + r["encode"] + r["other"]
            lines.append(f"| {name} | {tot / base:.2f} | {r['flash'] / base:.2f} ({r['calls']}) | "
                         f"{r['encode'] / base:.2f} | {r['other'] / base:.2f} |")
    return "\n".join(lines)


def memory(T: int, dtype: torch.dtype) -> str:
    """Peak of the bytes one call allocates (no gradient), against SDPA's: the profiler's allocation
    events (``profile_memory=True``) summed in time order, each op's own allocations and frees."""
    from torch.profiler import profile

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, DIM, generator=g).to(dtype) for _ in range(3))

    def peak(fn) -> float:
        fn()  # warm
        with profile(profile_memory=True) as prof:
            fn()
        now = top = 0
        for ev in sorted(prof.events(), key=lambda e: e.time_range.start):
            now += ev.self_cpu_memory_usage
            top = max(top, now)
        return top / 2**20  # MiB

    lines = [f"\n{dtype} T = {T}: peak MiB allocated by one call without a gradient (q is "
             f"{q.numel() * q.element_size() / 2**20:.0f} MiB)\n", "| contender | peak (MiB) |", "|---|---|"]
    with torch.no_grad():
        lines.append(f"| sdpa (causal) | {peak(lambda: Fn.scaled_dot_product_attention(q, k, v, is_causal=True)):.0f} |")
        for name in ("retnet", "decay", "alibi", "jordan"):
            enc = encodings()[name]
            lines.append(f"| {name} | {peak(lambda: lp.attention(q, k, v, enc)):.0f} |")
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = []
    for dname, by_t in results.items():
        Ts = list(by_t)
        lines.append(f"\n{dname}: time / causal SDPA (median of interleaved rounds; SDPA's own time in ms)\n")
        lines.append("| encoding | " + " | ".join(f"T = {T}" for T in Ts) + " |")
        lines.append("|---|" + "---|" * len(Ts))
        names = list(dict.fromkeys(n for T in Ts for n in by_t[T]))  # every contender, in order
        for n in names:
            cells = []
            for T in Ts:
                r = by_t[T].get(n)
                cells.append("not run" if r is None else f"{r['median_s'] * 1e3:.0f} ms" if n == "sdpa (causal)"
                             else f"{r['ratio']:.2f}")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(results: dict, name: str, rounds: int) -> None:
    text = table(results)
    RESULTS.mkdir(exist_ok=True)
    meta = {"command": " ".join(["python benchmarks/attention.py", *sys.argv[1:]]), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "shape": [1, HEADS, "T", DIM], "rounds": rounds, "load_average_after": list(os.getloadavg())}
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (RESULTS / f"{name}.md").write_text(f"`{meta['command']}` (torch {torch.__version__}, "
                                        f"{meta['threads']} threads, load average after the run "
                                        f"{', '.join(f'{x:.2f}' for x in meta['load_average_after'])})\n{text}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="T = 2048 only, 3 rounds")
    p.add_argument("--lengths", type=int, nargs="*", help="sequence lengths (default 2048 4096 8192 16384)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 3)")
    p.add_argument("--no-flex", action="store_true", help="leave out the compiled FlexAttention peer")
    p.add_argument("--flex-max-length", type=int, default=8192,
                   help="longest T FlexAttention runs at (its CPU bfloat16 kernel is ~27x SDPA at T = 8192)")
    p.add_argument("--breakdown", action="store_true", help="profile one call per re-centred encoding instead")
    p.add_argument("--memory", action="store_true", help="peak memory of one call per re-centred encoding instead")
    a = p.parse_args(argv)
    if a.breakdown or a.memory:
        for T in a.lengths or [8192]:
            print((breakdown if a.breakdown else memory)(T, torch.float32))
        return 0
    Ts = a.lengths or ([2048] if a.quick else [2048, 4096, 8192, 16384])
    rounds = a.rounds or (3 if a.quick else 5)
    results: dict[str, dict] = {}
    name = "attention_quick" if a.quick else "attention"
    for dtype in (torch.float32, torch.bfloat16):
        dname = str(dtype).replace("torch.", "")
        results[dname] = {}
        for T in Ts:
            print(f"{dname} T={T} ...", file=sys.stderr, flush=True)
            results[dname][T] = measure(T, dtype, rounds, flex=not a.no_flex and T <= a.flex_max_length)
            write(results, name, rounds)  # after every length: a run cut short keeps what it measured
    print(table(results))
    return 0 if all(math.isfinite(r["ratio"]) for d in results.values() for t in d.values() for r in t.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
