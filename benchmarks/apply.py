"""Applying RoPE (both layouts) and Jordan-coupled encodings to queries and keys, against the memory-bound yardsticks.

    python benchmarks/apply.py            # (1, 32, 4096, 128), 9 rounds
    python benchmarks/apply.py --quick    # the same shape, 3 rounds (< 2 minutes)
    python benchmarks/apply.py --shape 1,8,4096,64 --rounds 5   # another (batch, heads, seq, dim)

The Jordan rows: ``build("jordan", dim, rate=-1/8192)`` (dim // 3 real 3×3 blocks, the rest NoPE: the
catalogue's structure; one small rate so that 4096 positions stay in float32's range, which the kernel's
speed does not depend on) and a mixed generator (RoPE planes on half the dims, 3×3 Jordan blocks, NoPE).

Out of place, liepos allocates its outputs as ``clone()`` does, so ``clone()`` of q and k is the
yardstick; in place, the floor is a warm ``copy_`` of q and k into existing buffers (no fresh pages). Each
contender's page faults per call are counted: glibc's malloc either reuses an output's freed pages or
(after trimming the top of its heap) maps fresh ones, which cost a fault each, and which of the two happens
depends on the order of the process's allocations, so a clone's time moves several-fold between runs and settings.
A repeat of a call on one shape at the same times runs the kernel its first call reached (``liepos._replay``; the
run stops if the half layout recorded no lanes); "half (full call)" times the same call on an encoding whose lanes
and kept table rows are let go before each call, so the checks and lookups of the full call are paid every time,
in the same rounds.
Hugging Face's ``apply_rotary_pos_emb`` (half layout, cos/sin given) is a peer when transformers is
installed. Every round times every contender once, in one process, in a rotating order; the figure is
the median over rounds of the ratio to the yardstick measured in the same round.
Writes ``benchmarks/results/apply[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
from pathlib import Path

import torch

import liepos as lp
from rounds import interleaved, ratio, save  # benchmarks/rounds.py: the one timing loop and writer

RESULTS = Path(__file__).resolve().parent / "results"


def _mixed(dim: int) -> lp.Encoding:
    """RoPE planes on half the dims, then 3×3 Jordan blocks (small decays), the rest NoPE."""
    from liepos.generator import Generator, direct_sum

    nb = (dim - dim // 2) // 3
    gens = [lp.rope(dim // 2).generator, Generator(torch.full((nb,), -1 / 8192), torch.zeros(nb), [3] * nb)]
    if dim - dim // 2 - 3 * nb:
        gens.append(lp.nope(dim - dim // 2 - 3 * nb).generator)
    return lp.Encoding(direct_sum(*gens), name="mixed")


def contenders(shape: tuple[int, ...]) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    bq, bk = torch.empty_like(q), torch.empty_like(k)
    pos = torch.arange(shape[2])
    inter, half = lp.rope(shape[-1]), lp.rope(shape[-1], layout="half")
    jordan, mixed = lp.build("jordan", shape[-1], rate=-1 / 8192), _mixed(shape[-1])
    from liepos import _kernels, _pages

    def ops(fn):  # the same call with the compiled kernels off: the torch-op fallback
        def run():
            with _kernels.off():
                return fn()
        return run

    out = {
        "clone": lambda: (q.clone(), k.clone()),
        "copy_ (warm)": lambda: (bq.copy_(q), bk.copy_(k)),
        "interleaved": lambda: (inter.query(q, pos), inter.key(k, pos)),
        "half": lambda: (half.query(q, pos), half.key(k, pos)),
        # in place on the warm buffers (their values drift round after round: timing only)
        "interleaved inplace": lambda: (inter.query(bq, pos, inplace=True), inter.key(bk, pos, inplace=True)),
        "half inplace": lambda: (half.query(bq, pos, inplace=True), half.key(bk, pos, inplace=True)),
    }
    def with_constant(name, value, fn, module=_kernels):  # the same call with a module constant set to value
        def run():
            before = getattr(module, name)
            setattr(module, name, value)
            try:
                return fn()
            finally:
                setattr(module, name, before)
        return run

    def stored(fn):  # a fresh output written through the cache (no non-temporal stores)
        return with_constant("STREAM_ABOVE_BYTES", math.inf, fn)

    def small_pages(fn):  # every fresh output on 4 KiB pages (no transparent huge pages asked)
        return with_constant("HUGE_ABOVE_BYTES", math.inf, fn, _pages)

    def unreplayed(enc, fn):  # the call with the encoding's lanes and kept tables let go first: the full call each time
        def run():
            enc.__dict__.pop("_lanes", None)
            enc.__dict__.pop("_spans", None)
            return fn()
        return run

    out["half"]()  # the first call records a lane per side; the timed ones replay them (liepos._replay)
    if len(half.__dict__.get("_lanes", {})) != 2:
        raise SystemExit("apply.py: the half layout's query and key recorded no lanes: its repeats are not replayed")
    full = lp.rope(shape[-1], layout="half")  # an encoding of its own: the timed "half" keeps its lanes
    out["half (full call)"] = unreplayed(full, lambda: (full.query(q, pos), full.key(k, pos)))
    out["half (not streamed)"] = stored(out["half"])
    out["half (4 KiB pages)"] = small_pages(out["half"])
    out["half (torch ops)"] = ops(out["half"])
    out["half inplace (torch ops)"] = ops(out["half inplace"])
    out["jordan"] = lambda: (jordan.query(q, pos), jordan.key(k, pos))
    out["jordan inplace"] = lambda: (jordan.query(bq, pos, inplace=True), jordan.key(bk, pos, inplace=True))
    out["jordan (torch ops)"] = ops(out["jordan"])
    out["mixed rope+jordan"] = lambda: (mixed.query(q, pos), mixed.key(k, pos))
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        return out
    inv = 1.0 / (10000.0 ** (torch.arange(0, shape[-1], 2, dtype=torch.float32) / shape[-1]))
    ang = torch.outer(pos.float(), inv)
    emb = torch.cat((ang, ang), -1)  # (S, D) Hugging Face's duplicated half layout
    cos, sin = emb.cos()[None], emb.sin()[None]  # (1, S, D)
    out["hf apply_rotary_pos_emb"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)
    return out


def _faulting(fn, tally: list[int]):
    """``fn`` counting the page faults of its calls (minor faults of this process: fresh pages of an output)."""
    def run():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = fn()
        tally[0] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        tally[1] += 1
        return out
    return run


def measure(shape: tuple[int, ...], rounds: int) -> dict[str, dict]:
    fns = contenders(shape)
    tallies = {n: [0, 0] for n in fns}
    times = interleaved({n: _faulting(f, tallies[n]) for n, f in fns.items()}, rounds)
    ratios = {}
    for n, ts in times.items():
        yard = times["copy_ (warm)" if "inplace" in n else "clone"]
        ratios[n] = {"median_ms": statistics.median(ts) * 1e3, "ratio": ratio(ts, yard),
                     "vs": "copy_ (warm)" if "inplace" in n else "clone",
                     "page_faults_per_call": tallies[n][0] / max(1, tallies[n][1])}
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 9, quick 3)")
    p.add_argument("--shape", default="1,32,4096,128", help="batch,heads,seq,dim of q and k (default 1,32,4096,128)")
    p.add_argument("--out", type=Path, help="the folder of the results files (default benchmarks/results/; a folder per "
                   "machine keeps another machine's files of the same name)")
    a = p.parse_args(argv)
    global RESULTS
    RESULTS = a.out.resolve() if a.out else RESULTS
    shape = tuple(int(v) for v in a.shape.split(","))
    if len(shape) != 4 or min(shape) < 1:
        p.error(f"--shape must be four positive integers batch,heads,seq,dim, got {a.shape!r}")
    rounds = a.rounds or (3 if a.quick else 9)
    load = [os.getloadavg()[0]]
    res = measure(shape, rounds)
    load.append(os.getloadavg()[0])
    lines = [f"queries + keys {shape}, float32, median of {rounds} interleaved rounds; page faults per call (fresh "
             f"pages of {2 * math.prod(shape) * 4 / 4096:.0f} in all for two outputs: whether the allocator handed out "
             "new pages or reused mapped ones, which moves a clone several-fold) over every call, warm-up included\n",
             "| contender | time (ms) | ratio | to | page faults per call |", "|---|---|---|---|---|"]
    for n, r in res.items():
        lines.append(f"| {n} | {r['median_ms']:.1f} | {r['ratio']:.2f} | {r['vs']} | {r['page_faults_per_call']:.0f} |")
    text = "\n".join(lines)
    print(text)
    name = ("apply_quick" if a.quick else "apply") + ("" if shape == (1, 32, 4096, 128) else "_" + "x".join(map(str, shape)))
    save(RESULTS, name, "apply.py", load, text, results=res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
