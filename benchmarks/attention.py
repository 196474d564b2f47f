"""lp.attention for every catalogue encoding, as a ratio to causal SDPA, with FlexAttention ALiBi as a peer.

    python benchmarks/attention.py            # T = 2048 … 16384, float32 and bfloat16
    python benchmarks/attention.py --quick    # T = 2048, float32 and bfloat16 (< 2 minutes)
    python benchmarks/attention.py --breakdown --lengths 8192   # where the time of the re-centred ones goes
    python benchmarks/attention.py --memory --lengths 8192      # their peak memory without a gradient
    python benchmarks/attention.py --quick --threads 2          # on two threads (default: torch's)
    python benchmarks/attention.py --quick --backward           # forward + backward against SDPA's
    python benchmarks/attention.py --quick --flush-denormal     # subnormals flushed (this process only)
    python benchmarks/attention.py --quick --compare flush      # kept and flushed in the same rounds
    python benchmarks/attention.py --quick --compare threads    # 1 thread and all threads in the same rounds

Shape: batch 1, 8 heads, head dim 64, causal self-attention over positions 0 … T − 1. Every round times
every contender once, in one process, in an interleaved order (so a change in machine load hits all
of them alike); the figure is the median over rounds of each contender's time divided by causal SDPA's
time in the same round. ``--compare flush`` times every contender twice per round, with subnormals kept and
with ``torch.set_flush_denormal(True)`` around the call (what a user who sets it gets: the calling thread
flushed), and reports each ratio under both and its change, the median over rounds of the per-round
quotient of the two ratios; ``--compare threads`` likewise at one thread and at ``--threads`` (default: all of
torch's), the change being how much worse than SDPA an encoding scales. FlexAttention's ALiBi is a compiled
``score_mod`` (``torch.compile`` of ``flex_attention`` with a causal block mask), compiled once before timing.
``--backward`` times forward + backward (q, k and v need a gradient) against SDPA's forward + backward.

Nothing can flatter: every run records the CPU model and its instruction-set flags, the thread count,
the dtype, the shape, forward or forward + backward, whether subnormals were flushed, and for every
encoding the path that ran, observed on one untimed call and asserted (a fused encoding that fell back
to the general path, ALiBi without its per-key mask, or a kernel in another dtype than asked stops the
run instead of being timed as the fast path).
Writes ``benchmarks/results/attention[_quick][_<threads>t][_bwd][_ftz|_flush_ab|_threads_ab].{json,md}``
(``--breakdown`` / ``--memory``: ``attention_breakdown[_<threads>t]`` / ``attention_memory[_<threads>t]``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as Fn

import liepos as lp
from liepos import attention_pieces, recentre, recentred_kernel
from rounds import interleaved, machine, ratio, save, threads  # benchmarks/rounds.py: the timing loop, the machine, the writer

HEADS, DIM = 8, 64
RESULTS = Path(__file__).resolve().parent / "results"


def encodings() -> dict[str, lp.Encoding]:
    """Every catalogue entry that causal attention takes (growth is refused by design), plus RoPE's half layout."""
    return {
        "nope": lp.nope(DIM),
        "rope": lp.rope(DIM),
        "rope_half": lp.rope(DIM, layout="half"),
        "xpos": lp.xpos(DIM),
        "retnet": lp.retnet(DIM, num_heads=HEADS),
        "decay": lp.build("decay", DIM, HEADS),
        "alibi": lp.alibi(DIM, num_heads=HEADS),
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


def _inputs(T: int, dtype: torch.dtype, backward: bool):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, HEADS, T, DIM, generator=g).to(dtype).requires_grad_(backward) for _ in range(3))


def _step(f, qkv: tuple, backward: bool):
    """One forward (no gradient) or one forward + backward of ``f(q, k, v)`` (gradients let go after)."""
    if not backward:
        return lambda: f(*qkv)

    def both():
        with torch.enable_grad():
            out = f(*qkv)
            out.backward(torch.ones_like(out))
        for x in qkv:
            x.grad = None

    return both


def contenders(T: int, dtype: torch.dtype, flex: bool, backward: bool = False) -> dict:
    qkv = _inputs(T, dtype, backward)
    out = {"sdpa (causal)": _step(lambda q, k, v: Fn.scaled_dot_product_attention(q, k, v, is_causal=True),
                                  qkv, backward)}
    for name, enc in encodings().items():
        out[name] = _step(lambda q, k, v, enc=enc: lp.attention(q, k, v, enc), qkv, backward)
    if flex and not backward:
        f = flex_alibi(T, dtype)
        out["flex alibi (compiled)"] = lambda: f(*qkv)
    return out


# the path each encoding must take: "sdpa" (one SDPA call, no re-centring), "fused" (the flash pieces of
# the re-centred fused path, never the general block loop), "fused+mask" (ALiBi: the per-key mask on
# the content's head size), "fused+faded" (a decay's keys past its fade as one key of score 0, through a
# per-key count mask: RetNet's fast heads and decay once T passes their fade), "kernel" (the native kernel
# that re-centres every pair of blocks in registers, liepos.recentred_kernel: a fading encoding, or one of fading
# Jordan blocks, where it pays)
EXPECTED = {"nope": ("sdpa",), "rope": ("sdpa",), "rope_half": ("sdpa",), "xpos": ("fused",),
            "retnet": ("fused", "fused+faded", "kernel"), "decay": ("fused", "fused+faded", "kernel"), "alibi": ("fused+mask",),
            "jordan": ("fused", "kernel")}
# encodings whose half-precision call attends in float32 today (the polynomial parts of Jordan blocks),
# asserted so, and named in the path column; ALiBi's bfloat16 content is attended in bfloat16 (its slots
# ride as the kernel's float32 mask)
HALF_IN_FLOAT32 = {"jordan"}


def path(name: str, T: int, dtype: torch.dtype, backward: bool) -> str:
    """The path one untimed call of ``name`` takes, observed (flash pieces, their dtypes and masks, the
    general block loop) and asserted against :data:`EXPECTED`."""
    enc = encodings()[name]
    flash, general, native = [], [], []
    real_flash, real_run, real_kernel = attention_pieces._flash, recentre._run, recentred_kernel.kernel

    def spy_flash(q, k, v, *a, attn_mask=None, **kw):
        flash.append((q.dtype, q.shape[-1], attn_mask is not None))
        return real_flash(q, k, v, *a, attn_mask=attn_mask, **kw)

    attention_pieces._flash = spy_flash
    recentre._run = lambda *a, **kw: general.append(1) or real_run(*a, **kw)
    recentred_kernel.kernel = lambda qe, *a: native.append(qe.dtype) or real_kernel(qe, *a)
    try:
        with torch.no_grad() if not backward else torch.enable_grad():
            _step(lambda q, k, v: lp.attention(q, k, v, enc), _inputs(T, dtype, backward), backward)()
    finally:
        attention_pieces._flash, recentre._run, recentred_kernel.kernel = real_flash, real_run, real_kernel
    kinds = sorted({str(d).replace("torch.", "") for d in [f[0] for f in flash] + native})
    masked = bool(flash) and any(m for _, _, m in flash)
    seen = "sdpa" if not flash and not general and not native else "general" if general else (
        "kernel" if native and not flash else "fused" if not masked else "fused+mask" if name == "alibi" else "fused+faded")
    want = EXPECTED[name]
    asked = str(dtype).replace("torch.", "")
    if dtype in (torch.bfloat16, torch.float16) and name in HALF_IN_FLOAT32:
        asked = "float32"
    if seen not in want or ((flash or native) and kinds != [asked]) or (
            seen == "fused+mask" and any(d != DIM for _, d, _ in flash)):
        raise SystemExit(f"{name} at T = {T}, {dtype}: expected the {' or '.join(want)} path, ran {seen} "
                         f"(flash calls {len(flash)}, dtypes {kinds}, head sizes {sorted({d for _, d, _ in flash})})")
    if native:
        return f"{seen}: {len(native)} native kernel call{'s' if len(native) > 1 else ''} in {'/'.join(kinds)}" + (
            f", {len(flash)} flash calls" if flash else "")
    return seen if not flash else f"{seen}: {len(flash)} flash calls in {'/'.join(kinds)}"


PEERS = {"sdpa (causal)": "torch SDPA, is_causal", "flex alibi (compiled)": "torch.compile of flex_attention"}


def measure(T: int, dtype: torch.dtype, rounds: int, flex: bool, backward: bool = False,
            compare: str | None = None, threads: int | None = None) -> dict[str, dict]:
    paths = {n: path(n, T, dtype, backward) for n in encodings()}
    fns = contenders(T, dtype, flex, backward)
    if compare is not None:
        fns = {**fns, **{f"{n} {VARIANT[compare]}": _variant(f, compare, threads) for n, f in fns.items()}}
    times = interleaved(fns, rounds, number=1)
    out = {}
    for n, ts in times.items():
        variant = compare is not None and n.endswith(f" {VARIANT[compare]}")
        base = times["sdpa (causal)" + (f" {VARIANT[compare]}" if variant else "")]
        plain = n[: -len(VARIANT[compare]) - 1] if variant else n
        out[n] = {"median_s": statistics.median(ts), "ratio": ratio(ts, base), "path": paths.get(plain, PEERS.get(plain, "?"))}
        if variant:  # the per-round quotient of this setting's ratio and the plain one's: the change it makes
            plain_ts, plain_base = times[plain], times["sdpa (causal)"]
            out[plain]["change"] = statistics.median(
                [(t / b) / (pt / pb) for t, b, pt, pb in zip(ts, base, plain_ts, plain_base)])
    return out


# the name suffix of a contender timed under the compared setting
VARIANT = {"flush": "(flushed)", "threads": "(1 thread)"}


def _variant(f, compare: str, threads: int | None):
    """``f`` under the compared setting: subnormals flushed on the calling thread, or one thread (torch's own
    count, or ``threads``, put back after)."""
    if compare == "flush":
        def flushed():
            torch.set_flush_denormal(True)
            try:
                return f()
            finally:
                torch.set_flush_denormal(False)
        return flushed

    def one_thread():
        torch.set_num_threads(1)
        try:
            return f()
        finally:
            torch.set_num_threads(threads or ALL_THREADS)
    return one_thread


ALL_THREADS = torch.get_num_threads()  # as torch starts, before any --threads


# profiler op names counted as encoding q, k (and v): the one-pass kernels' elementwise work
ENCODE_OPS = {"aten::mul", "aten::mul_", "aten::addcmul_", "aten::add_", "aten::neg", "aten::index", "aten::select",
              "aten::copy_"} | {f"liepos_native::{op}" for op in ("scale", "planes", "terms", "terms_", "halves", "halves_")}


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
            r = timed(lambda enc=enc: lp.attention(q, k, v, enc))
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
            lines.append(f"| {name} | {peak(lambda enc=enc: lp.attention(q, k, v, enc)):.0f} |")
    return "\n".join(lines)


def changes(results: dict, compare: str) -> str:
    """Per encoding and length, the quotient of its ratio under the compared setting and its plain ratio."""
    what = {"flush": "ratio with subnormals flushed / ratio with them kept",
            "threads": "ratio at 1 thread / ratio at all threads (below 1: scales worse than SDPA)"}[compare]
    lines = [f"\n{what} (median over rounds of the per-round quotient)\n"]
    for dname, by_t in results.items():
        Ts = list(by_t)
        lines.append(f"\n{dname}\n")
        lines.append("| encoding | " + " | ".join(f"T = {T}" for T in Ts) + " |")
        lines.append("|---|" + "---|" * len(Ts))
        names = [n for n in dict.fromkeys(n for T in Ts for n in by_t[T]) if "change" in by_t[Ts[0]].get(n, {})]
        for n in names:
            if n == "sdpa (causal)":
                continue
            lines.append(f"| {n} | " + " | ".join(f"{by_t[T][n]['change']:.2f}" if n in by_t[T] else "not run"
                                                   for T in Ts) + " |")
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


def write(results: dict, name: str, rounds: int, setting: dict) -> None:
    text = table(results) + (changes(results, setting["compare"]) if setting.get("compare") else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["python benchmarks/attention.py", *sys.argv[1:]]), "torch": torch.__version__,
            **machine(), **setting, "shape": [1, HEADS, "T", DIM], "rounds": rounds,
            "load_average_after": list(os.getloadavg())}
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    paths = "\n".join(f"- {d} T = {T}: " + "; ".join(f"{n}: {r['path']}" for n, r in rs.items())
                      for d, by_t in results.items() for T, rs in by_t.items())
    (RESULTS / f"{name}.md").write_text(
        f"`{meta['command']}` (torch {torch.__version__}, {meta['cpu']}, {threads(meta['threads'])}"
        f"{' (and 1, compared)' if setting.get('compare') == 'threads' else ''}, {setting['pass']}, subnormals "
        f"{_subnormals(setting)}, load average "
        f"after the run {', '.join(f'{x:.2f}' for x in meta['load_average_after'])})\n\n"
        f"CPU flags: {' '.join(meta['cpu_flags'])}\n{text}\n\npaths (observed on an untimed call, asserted):\n"
        f"{paths}\n")


def _subnormals(setting: dict) -> str:
    if setting.get("compare") == "flush":
        return "kept and flushed, compared"
    return "flushed" if setting["flush_denormal"] else "kept"


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
    p.add_argument("--threads", type=int, help="torch's thread count (default: as torch starts)")
    p.add_argument("--backward", action="store_true", help="forward + backward (q, k, v need a gradient)")
    p.add_argument("--flush-denormal", action="store_true",
                   help="flush subnormals to zero in this process (torch.set_flush_denormal) to show the difference")
    p.add_argument("--compare", choices=sorted(VARIANT),
                   help="time every contender also with subnormals flushed (flush) or at one thread (threads), "
                        "in the same rounds, and report the change of every ratio")
    p.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"], help="dtypes (default float32 bfloat16)")
    p.add_argument("--out", type=Path, help="the folder of the results files (default benchmarks/results/; a folder per "
                   "machine keeps another machine's files of the same name)")
    a = p.parse_args(argv)
    global RESULTS
    RESULTS = a.out.resolve() if a.out else RESULTS
    if a.compare == "flush" and a.flush_denormal:
        p.error("--compare flush times both settings itself: leave out --flush-denormal")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if (a.flush_denormal or a.compare == "flush") and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormal / --compare flush: this CPU has no flush-to-zero mode torch can set")
    if a.compare == "flush":
        torch.set_flush_denormal(False)  # kept, but for the flushed contenders' calls
    if a.breakdown or a.memory:
        load0, parts = os.getloadavg()[0], []
        for T in a.lengths or [8192]:
            for d in a.dtypes:
                parts.append((breakdown if a.breakdown else memory)(T, getattr(torch, d)))
                print(parts[-1])
        kind = "breakdown" if a.breakdown else "memory"
        save(RESULTS, f"attention_{kind}" + (f"_{a.threads}t" if a.threads else ""), "attention.py",
             (load0, os.getloadavg()[0]), "\n\n".join(parts), kind=kind)
        return 0
    Ts = a.lengths or ([2048] if a.quick else [2048, 4096, 8192, 16384])
    rounds = a.rounds or (3 if a.quick else 5)
    results: dict[str, dict] = {}
    name = ("attention_quick" if a.quick else "attention") + (f"_{a.threads}t" if a.threads else "") + (
        "_bwd" if a.backward else "") + ("_ftz" if a.flush_denormal else "") + (f"_{a.compare}_ab" if a.compare else "")
    setting = {"pass": "forward + backward" if a.backward else "forward", "flush_denormal": a.flush_denormal,
               "dtypes": a.dtypes, "compare": a.compare}
    for dtype in (getattr(torch, d) for d in a.dtypes):
        dname = str(dtype).replace("torch.", "")
        results[dname] = {}
        for T in Ts:
            print(f"{dname} T={T} ...", file=sys.stderr, flush=True)
            results[dname][T] = measure(T, dtype, rounds, not a.no_flex and T <= a.flex_max_length, a.backward,
                                        a.compare, a.threads)
            write(results, name, rounds, setting)  # after every length: a run cut short keeps what it measured
    print(table(results) + (changes(results, a.compare) if a.compare else ""))
    return 0 if all(math.isfinite(r["ratio"]) for d in results.values() for t in d.values() for r in t.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
