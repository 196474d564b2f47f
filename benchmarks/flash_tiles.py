"""How the flash calls of the re-centred encodings scale with the threads, each timed by itself beside SDPA's one call.

    python benchmarks/flash_tiles.py                       # T = 4096, float32, all of torch's threads against one
    python benchmarks/flash_tiles.py --length 2048 --threads 2 --rounds 7

``lp.attention`` of a re-centred encoding (xPos, RetNet, decay, ALiBi, Jordan) hands torch's CPU flash kernel
several calls over tiles (diagonal blocks, the tiles between them, a head group's window of keys) and does its
own work between them (encoding q and k per tile, merging by log-sum-exp, the Python between the ops). This
records the flash calls of one untimed call per encoding (their inputs cloned, in the order made), then times,
in interleaved rounds at one thread and at ``--threads``: causal SDPA's one call, the whole ``lp.attention``
call, and each family of equal flash calls (same shapes, causal or not, with or without a per-key mask) run by
itself, inside the same flush of subnormals the call takes. Per family: the calls, their time at one thread and
at ``--threads``, and the speedup (median over rounds of the per-round quotient); per encoding, all its flash
calls together and the rest of the call (the whole call's time less its flash calls', per round). A speedup below
SDPA's is where an encoding scales worse than SDPA: in the kernel's own handling of the tiles it is given, or in
the work between the calls. A call the native re-centring kernel takes instead (``liepos.recentred_kernel``, on a
CPU where oneDNN packs bfloat16) makes no flash calls: its row says 0 calls, and its rest is the whole call.

Writes ``benchmarks/results/flash_tiles_<T>_<threads>t.{json,md}`` (``--out``: another folder), with the CPU
model, its flags, the thread counts and the load average (benchmarks/rounds.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as Fn

import liepos as lp
from liepos import _kernels, attention_pieces
from rounds import interleaved, save, threads  # benchmarks/rounds.py: the timing loop, the writer

RESULTS = Path(__file__).resolve().parent / "results"
HEADS, DIM = 8, 64
NAMES = ("xpos", "retnet", "decay", "alibi", "jordan")


def encoding(name: str) -> lp.Encoding:
    """The attention benchmark's encodings (``build(name, 64, 8)`` where a head count is taken)."""
    return lp.build(name, DIM, HEADS) if name in ("retnet", "alibi") else lp.build(name, DIM)


Call = tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, "torch.Tensor | None", float]


def recorded(enc: lp.Encoding, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[Call]:
    """The flash calls one ``lp.attention(q, k, v, enc)`` makes, in order: ``(q, k, v, causal, mask, scale)``, cloned."""
    calls: list[Call] = []
    real = attention_pieces._flash

    def spy(q, k, v, dropout, causal, *, attn_mask=None, scale=None):
        calls.append((q.clone(), k.clone(), v.clone(), causal, None if attn_mask is None else attn_mask.clone(), scale))
        return real(q, k, v, dropout, causal, attn_mask=attn_mask, scale=scale)

    attention_pieces._flash = spy
    try:
        with torch.no_grad():
            lp.attention(q, k, v, enc)
    finally:
        attention_pieces._flash = real
    return calls


def family(c: Call) -> str:
    """A family's name: q's and k's shapes (batch·tiles, heads, rows, dim), causal or not, masked or not."""
    q, k, _, causal, mask, _ = c
    return (f"q {tuple(q.shape)}, k rows {k.shape[2]}" + (", causal" if causal else "")
            + (", per-key mask" if mask is not None else ""))


def runner(calls: list[Call]) -> Callable[[], object]:
    """The calls run in order, inside the subnormal flush the attention call takes around each."""
    def run():
        for q, k, v, causal, mask, scale in calls:
            with _kernels.flushed(q.device):
                attention_pieces._flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    return run


def cut(calls: list[Call], n: int) -> list[list[Call]] | None:
    """The calls with their batch (and a per-row mask's) cut in ``n`` equal parts, one list of calls per part; None
    where a batch does not cut evenly. The flash kernel treats every batch row on its own: the parts' outputs, side
    by side, are the whole calls' outputs."""
    if any(c[0].shape[0] % n for c in calls):
        return None
    return [[tuple(t.chunk(n)[i] if isinstance(t, torch.Tensor) and t.shape[0] == c[0].shape[0] else t for t in c)
             for c in calls] for i in range(n)]  # type: ignore[misc]


def at_once(parts: list[list[Call]], pool: ThreadPoolExecutor) -> Callable[[], object]:
    """The parts run at the same time, each on one Python thread at one thread of torch's (the flash kernel lets
    go of the GIL), torch's thread count put back after: whether the kernel's own split of a family over the
    threads is what scales worse, or the machine (cores each slower when all of them run)."""
    runs, n = [runner(p) for p in parts], len(parts)

    def run():
        torch.set_num_threads(1)
        try:
            for f in [pool.submit(r) for r in runs]:
                f.result()
        finally:
            torch.set_num_threads(n)
    return run


def one_thread(f: Callable[[], object], n: int) -> Callable[[], object]:
    """``f`` at one thread, torch's count put back to ``n`` after."""
    def run():
        torch.set_num_threads(1)
        try:
            return f()
        finally:
            torch.set_num_threads(n)
    return run


def measure(T: int, dtype: torch.dtype, rounds: int, names: tuple[str, ...] = NAMES) -> dict[str, dict]:
    """Per contender (SDPA; per encoding its call, its flash calls, each family): median seconds at one and at all
    threads, and the speedup, the median over rounds of the per-round quotient."""
    n = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, DIM, generator=g).to(dtype) for _ in range(3))
    fns: dict[str, Callable[[], object]] = {"sdpa (causal)": lambda: Fn.scaled_dot_product_attention(q, k, v, is_causal=True)}
    counts: dict[str, int] = {"sdpa (causal)": 1}
    parts: dict[str, list[str]] = {}
    split: dict[str, Callable[[], object]] = {}
    pool = ThreadPoolExecutor(n)
    for name in names:
        enc = encoding(name)
        calls = recorded(enc, q, k, v)
        fns[f"{name}: the call"] = lambda enc=enc: lp.attention(q, k, v, enc)
        fns[f"{name}: its flash calls"], counts[f"{name}: its flash calls"] = runner(calls), len(calls)
        groups: dict[str, list[Call]] = {}
        for c in calls:
            groups.setdefault(family(c), []).append(c)
        parts[name] = []
        for fam, cs in groups.items():
            key = f"{name}: {fam}"
            fns[key], counts[key] = runner(cs), len(cs)
            parts[name].append(key)
            pieces = cut(cs, n) if n > 1 else None
            if pieces is not None:
                split[f"{key} (split)"] = at_once(pieces, pool)
    both = {**fns, **{f"{k} (1 thread)": one_thread(f, n) for k, f in fns.items()}, **split}
    times = interleaved(both, rounds, number=1)
    pool.shutdown()
    out: dict[str, dict] = {}
    for key in fns:
        many, one = times[key], times[f"{key} (1 thread)"]
        out[key] = {"calls": counts.get(key), "one_thread_s": statistics.median(one), "threads_s": statistics.median(many),
                    "speedup": statistics.median([a / b for a, b in zip(one, many)])}
        if f"{key} (split)" in times:
            out[key]["split_s"] = statistics.median(times[f"{key} (split)"])
            out[key]["split_speedup"] = statistics.median([a / b for a, b in zip(one, times[f"{key} (split)"])])
    for name in names:  # the rest of the call: its time less its flash calls', per round
        call, flash = f"{name}: the call", f"{name}: its flash calls"
        one = [a - b for a, b in zip(times[f"{call} (1 thread)"], times[f"{flash} (1 thread)"])]
        many = [a - b for a, b in zip(times[call], times[flash])]
        out[f"{name}: the rest"] = {"calls": None, "one_thread_s": statistics.median(one),
                                    "threads_s": statistics.median(many),
                                    "speedup": statistics.median([a / b if b > 0 else float("nan") for a, b in zip(one, many)])}
    out["_families"] = {"order": parts}
    return out


def table(res: dict[str, dict], n: int) -> str:
    head = (f"| contender | calls | 1 thread (ms) | {threads(n)} (ms) | speedup | {n} parts at once, 1 thread each (ms) "
            f"| its speedup |\n|---|---|---|---|---|---|---|\n")
    rows = []
    keys = ["sdpa (causal)"]
    for name, fams in res["_families"]["order"].items():
        keys += [f"{name}: the call", f"{name}: its flash calls", *fams, f"{name}: the rest"]
    for key in keys:
        r = res[key]
        calls = "" if r["calls"] is None else str(r["calls"])
        cut = (f"{r['split_s'] * 1e3:.2f} | {r['split_speedup']:.2f}" if "split_s" in r else " | ")
        rows.append(f"| {key} | {calls} | {r['one_thread_s'] * 1e3:.2f} | {r['threads_s'] * 1e3:.2f} | {r['speedup']:.2f} "
                    f"| {cut} |")
    return head + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096, help="T, the sequence length (default 4096)")
    p.add_argument("--threads", type=int, help="torch's thread count to compare with one (default: as torch starts)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--encodings", nargs="*", default=list(NAMES), choices=list(NAMES))
    p.add_argument("--out", type=Path, help="the folder of the results files (default benchmarks/results/)")
    a = p.parse_args(argv)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    n = torch.get_num_threads()
    load0 = os.getloadavg()[0]
    res = measure(a.length, getattr(torch, a.dtype), a.rounds, tuple(a.encodings))
    text = (f"T = {a.length}, {a.dtype}, batch 1, {HEADS} heads, head dim {DIM}, forward, medians of {a.rounds} "
            f"interleaved rounds; speedup: one thread's time over {threads(n)}' (median of the per-round quotients)"
            f"\n\n{table(res, n)}")
    print(text)
    save((a.out or RESULTS).resolve(), f"flash_tiles_{a.length}_{n}t", "flash_tiles.py", (load0, os.getloadavg()[0]),
         text, length=a.length, dtype=a.dtype, rounds=a.rounds, results=res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
