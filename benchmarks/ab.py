"""One change of the fused attention path, old against new, in the same process and the same rounds.

    python benchmarks/ab.py diagonal-exponent --encodings decay retnet --threads 1 --dtype bfloat16
    python benchmarks/ab.py clear-in-encoding --encodings decay retnet --threads 2
    python benchmarks/ab.py only-tile --encodings xpos --dtype bfloat16 --lengths 2048
    python benchmarks/ab.py raw-bounds --encodings alibi --backward
    python benchmarks/ab.py native-norms --encodings alibi retnet --lengths 2048 8192
    python benchmarks/ab.py native-kernel --encodings decay retnet --dtype bfloat16 --lengths 1024 2048 4096
    python benchmarks/ab.py native-kernel --everywhere      # the kernel timed on a CPU where it does not run
    python benchmarks/ab.py kernel-buffers --encodings decay jordan --threads 2
    python benchmarks/ab.py block-rows --encodings alibi --threads 2
    python benchmarks/ab.py span-tables --encodings decay jordan --threads 2
    python benchmarks/ab.py sliced-rows --encodings decay jordan alibi --threads 2
    python benchmarks/ab.py head-groups --encodings alibi --threads 2 --lengths 2048 8192
    python benchmarks/ab.py term-bounds --encodings jordan --threads 2
    python benchmarks/ab.py shared-own-keys --encodings alibi --threads 2 --lengths 4096 8192
    python benchmarks/ab.py head-views --encodings retnet --threads 2 --lengths 4096 8192
    python benchmarks/ab.py windowed-keys --encodings retnet --threads 2 --lengths 4096 8192 16384

Separate runs of ``attention.py`` move by 10-25 % on a shared 2-core machine, more than most single changes
make, so each change is timed here against the code it replaced, restored for the old contender's call alone
(a switch below: a module constant or function of the path as it was). Every round times causal SDPA, the
new and the old call once each, in a rotating order; the figure is the median over rounds of the per-round
quotient ``(new / SDPA) / (old / SDPA)``: below 1, the change is faster. Shape as ``attention.py``'s (batch 1,
8 heads, head dim 64, positions 0 … T − 1); the outputs of old and new are compared once and their largest
difference recorded. Writes ``benchmarks/results/ab_<switch>_<dtype>[_<threads>t][_bwd].{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as Fn
from attention import _inputs, _step, encodings  # benchmarks/attention.py: the same shape and steps
from rounds import interleaved, machine, save, threads

import liepos as lp
from liepos import _kernels, attend, attention_call, attention_pieces, causal_tiling, faded_keys, recentre, recentred_kernel

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def _patched(module: object, name: str, value: object) -> Iterator[None]:
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def _merge_without_only(*a, real=attention_pieces._merge_into, **kw):
    return real(*a, **{**kw, "only": False})


def _sliced_view(self, x):
    """``Rows.view`` as it was: three ops (slice, unflatten, slice) whatever records a gradient."""
    y = x[:, :, self.start : self.start + self.count * self.period]  # (B, H, count·period, *r)
    return y.unflatten(2, (self.count, self.period))[:, :, :, self.a : self.b]  # (B, H, count, width, *r)


def _span_tables_afresh(enc, p0, S, side, dtype, fade, device):
    """``Encoding._span_tables`` as it was: the range checked and the window looked up at every call."""
    from liepos.apply import work_dtype
    from liepos.tables import check_span

    check_span(enc.generator, float(p0), float(p0 + S - 1), side, dtype, fade=fade)
    return enc._range_tables(p0, S, side, work_dtype(dtype), True, device)


# each switch: what it restores, and a context manager that restores it for the old contender's call
SWITCHES: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager]]] = {
    "diagonal-exponent": ("diagonal blocks' factors within e^{±22} (now e^{±32})",
                          lambda: _patched(causal_tiling, "DIAGONAL_EXPONENT", 22.0)),
    "clear-in-encoding": ("the between tiles' q and k cleared in a pass after their encoding (now in it)",
                          lambda: _patched(causal_tiling, "clear_thresholds", lambda *a: None)),
    "only-tile": ("the only tile written into a float32 state and cast back (now it is the output)",
                  lambda: _patched(attention_pieces, "_merge_into", _merge_without_only)),
    "raw-bounds": ("ALiBi's tiles each finding their largest entries and clearing (now one pass for all)",
                   lambda: _patched(recentre, "raw_clearing", lambda *a: None)),
    "native-norms": ("the keys' and queries' row norms (ALiBi's windows, faded keys) by torch's vector_norm (now one "
                     "native pass reading half precision as stored)", lambda: _patched(_kernels, "norms", lambda x: None)),
    "sliced-rows": ("a tile's rows taken as three slicing ops (now one as_strided where nothing records a gradient)",
                    lambda: _patched(attention_pieces.Rows, "view", _sliced_view)),
    "head-groups": ("each run of heads with an equal first key in calls of its own (now neighbouring runs share a call "
                    "where it adds few keys)", lambda: _patched(recentre, "MERGE_PAIRS", 0)),
    "shared-own-keys": ("ALiBi's per-head windows as calls per group of heads, each with its share of the block's own "
                        "keys (now the own keys in one call over every head)",
                        lambda: _patched(recentre, "pieces_by_heads", attention_pieces.pieces_per_group)),
    "head-views": ("the faded path's head subsets copied (index_select; now a view where they are a run of heads)",
                   lambda: _patched(faded_keys, "take_heads", lambda x, hs: x.index_select(1, torch.tensor(hs)))),
    "windowed-keys": ("the faded path's near keys as one tile per block distance (now one tile of the m blocks of "
                      "keys before each query block)", lambda: _patched(faded_keys, "WINDOWED", False)),
    "block-rows": ("the re-centred path's query blocks as long as the origin's span allows (now whole multiples of the "
                   "flash kernel's 32-row blocks)", lambda: _patched(recentre, "BLOCK_ROWS", 1)),
    "span-tables": ("each tile's range check and table rows looked up afresh (now kept per range while the "
                    "encoding's parameters hold)", lambda: _patched(lp.Encoding, "_span_tables", _span_tables_afresh)),
    "term-bounds": ("Jordan's between tiles each finding their largest entries and clearing in passes of their own "
                    "(now bounded by the tables' row sums and cleared as they are encoded)",
                    lambda: _patched(causal_tiling, "term_bounds", lambda *a: None)),
    "in-buffers": ("the plain causal self-attention's q and k encoded into fresh tensors (now into the thread's reused "
                   "buffers, their pages mapped)", lambda: _patched(attend, "IN_BUFFERS", False)),
    "lazy-float32": ("a float32 linear-bias call's q multiplied by c in a pass of its own before the path is chosen (now "
                     "read as given on the fused linear-bias path, as bfloat16 is)",
                     lambda: _patched(attention_call, "LAZY_DTYPES", (torch.bfloat16,))),
    "kernel-buffers": ("the native re-centring kernel's encoded q and k in fresh tensors (now in the thread's reused "
                       "buffers, their pages mapped)", lambda: _patched(recentred_kernel, "slot", lambda *a: None)),
    "native-kernel": ("a fading encoding's tiles, one flash call per family, merged per row (now one native kernel "
                      "re-centring every pair of blocks where it pays)",
                      lambda: _patched(causal_tiling, "pays", lambda *a: False)),
}


def measure(switch: str, names: list[str], T: int, dtype: torch.dtype, rounds: int, backward: bool) -> dict:
    qkv = _inputs(T, dtype, backward)
    restore = SWITCHES[switch][1]
    sdpa = _step(lambda q, k, v: Fn.scaled_dot_product_attention(q, k, v, is_causal=True), qkv, backward)
    out = {}
    for name in names:
        enc = encodings()[name]
        new = _step(lambda q, k, v, enc=enc: lp.attention(q, k, v, enc), qkv, backward)

        def old(new=new):
            with restore():
                new()

        calls, real = [], recentred_kernel.kernel
        recentred_kernel.kernel = lambda *x, calls=calls, real=real: calls.append(1) or real(*x)  # its calls
        try:
            with torch.no_grad():
                a = lp.attention(*qkv, enc)
                ran = len(calls)
                with restore():
                    b = lp.attention(*qkv, enc)
        finally:
            recentred_kernel.kernel = real
        want = {"native-kernel": (1, 0), "kernel-buffers": (1, 1)}.get(switch)
        if want is not None and (ran, len(calls) - ran) != want:
            raise SystemExit(f"{name} at T = {T} in {dtype}: the native kernel ran {ran} times in the new call and "
                             f"{len(calls) - ran} in the old one ({want[0]} and {want[1]} expected): nothing to compare "
                             "here")
        times = interleaved({"sdpa": sdpa, "new": new, "old": old}, rounds, number=1)
        q = [(n / s) / (o / s) for s, n, o in zip(times["sdpa"], times["new"], times["old"])]
        out[name] = {"new": statistics.median(n / s for s, n in zip(times["sdpa"], times["new"])),
                     "old": statistics.median(o / s for s, o in zip(times["sdpa"], times["old"])),
                     "quotient": statistics.median(q), "quotients": q,
                     "max_abs_diff": float((a.float() - b.float()).abs().max())}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("switch", choices=sorted(SWITCHES))
    p.add_argument("--encodings", nargs="+", default=["decay", "retnet"], choices=sorted(encodings()))
    p.add_argument("--lengths", type=int, nargs="+", default=[2048])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, help="torch's thread count (default: as torch starts)")
    p.add_argument("--backward", action="store_true", help="forward + backward (q, k, v need a gradient)")
    p.add_argument("--everywhere", action="store_true",
                   help="native-kernel only: the new call takes the kernel on this CPU too, as on the kind it was "
                        "timed on (recentred_kernel.measured_here), so it can be timed where it does not run by default")
    p.add_argument("--out", type=Path, help="the folder of the results files (default benchmarks/results/; a folder per "
                   "machine keeps another machine's files of the same name)")
    a = p.parse_args(argv)
    global RESULTS
    RESULTS = a.out.resolve() if a.out else RESULTS
    if a.everywhere and a.switch != "native-kernel":
        p.error(f"--everywhere applies to the native-kernel switch only, got {a.switch}")
    if a.backward and a.switch == "native-kernel":
        p.error("--backward: the native kernel never runs with a gradient (the tiling serves both contenders)")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.everywhere:
        recentred_kernel._MEASURED["here"] = True
    dtype = getattr(torch, a.dtype)
    load0 = os.getloadavg()[0]
    results = {T: measure(a.switch, a.encodings, T, dtype, a.rounds, a.backward) for T in a.lengths}
    meta = machine()
    lines = [f"old: {SWITCHES[a.switch][0]}{' (the kernel forced on this CPU)' if a.everywhere else ''}; {a.dtype}, "
             f"{'forward + backward' if a.backward else 'forward'}, "
             f"{threads(meta['threads'])}, {meta['cpu']}\n\nCPU flags: {' '.join(meta['cpu_flags'])}\n",
             "| encoding | T | new / SDPA | old / SDPA | quotient new / old (median of rounds) | max abs difference |",
             "|---|---|---|---|---|---|"]
    for T, res in results.items():
        for n, r in res.items():
            lines.append(f"| {n} | {T} | {r['new']:.3f} | {r['old']:.3f} | **{r['quotient']:.3f}** | "
                         f"{r['max_abs_diff']:.2e} |")
    text = "\n".join(lines)
    print(text)
    name = (f"ab_{a.switch}_{a.dtype}" + (f"_{a.threads}t" if a.threads else "") + ("_bwd" if a.backward else "")
            + ("_everywhere" if a.everywhere else ""))
    save(RESULTS, name, "ab.py", (load0, os.getloadavg()[0]), text, machine=meta, dtype=a.dtype,
         backward=a.backward, results={str(T): r for T, r in results.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
