"""RoPE on queries and keys under ``torch.compile``: compiled liepos vs eager liepos vs Hugging Face.

    python benchmarks/compile.py            # (1, 32, 4096, 128) float32, 9 rounds
    python benchmarks/compile.py --quick    # the same shape, 3 rounds

Contenders, on the same q, k and positions: liepos eager and ``torch.compile(fullgraph=True)`` (Inductor,
the sequence axis marked dynamic) for both layouts; Hugging Face's ``apply_rotary_pos_emb`` (half
layout, cos/sin given) eager and compiled. ``clone()`` of q and k is the yardstick (every contender
allocates two fresh outputs). Every round times every contender once, in one process, in a rotating
order; a figure is the median over rounds of the ratio to the yardstick of the same round, and the
"vs eager" column the median ratio to liepos eager in the same layout (target: compiled ≤ eager).
Compilation happens before timing (it is reported separately: cold compile seconds of the first call).
Writes ``benchmarks/results/compile[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import liepos as lp
from rounds import interleaved, ratio, save  # benchmarks/rounds.py: the one timing loop and writer

RESULTS = Path(__file__).resolve().parent / "results"


def _compiled(fn, q, k, pos):
    """``torch.compile(fn, fullgraph=True)`` with the sequence axis dynamic, and its cold-call seconds."""
    cf = torch.compile(fn, fullgraph=True)
    for t in (q, k, pos):
        torch._dynamo.mark_dynamic(t, 2 if t.dim() == 4 else 0)
    t0 = time.perf_counter()
    cf(q, k, pos)
    return (lambda: cf(q, k, pos)), time.perf_counter() - t0


def contenders(shape: tuple[int, ...]) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    pos = torch.arange(shape[2])
    out, cold = {"clone": lambda: (q.clone(), k.clone())}, {}
    for layout in ("interleaved", "half"):
        enc = lp.rope(shape[-1], layout=layout)

        def f(q, k, pos, enc=enc):
            return enc.query(q, pos), enc.key(k, pos)

        out[f"liepos {layout} eager"] = lambda f=f: f(q, k, pos)
        out[f"liepos {layout} compiled"], cold[f"liepos {layout} compiled"] = _compiled(f, q, k, pos)
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        return out, cold
    inv = 1.0 / (10000.0 ** (torch.arange(0, shape[-1], 2, dtype=torch.float32) / shape[-1]))
    ang = torch.outer(pos.float(), inv)
    emb = torch.cat((ang, ang), -1)  # (S, D) Hugging Face's duplicated half layout
    cos, sin = emb.cos()[None], emb.sin()[None]  # (1, S, D)
    out["hf eager"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)

    def hf(q, k, pos):
        return apply_rotary_pos_emb(q, k, cos[:, : q.shape[2]], sin[:, : q.shape[2]])

    out["hf compiled"], cold["hf compiled"] = _compiled(hf, q, k, pos)
    return out, cold


def measure(shape: tuple[int, ...], rounds: int) -> tuple[dict[str, dict], dict]:
    fns, cold = contenders(shape)
    times = interleaved(fns, rounds)
    res = {}
    for n, ts in times.items():
        eager = next((e for e in (f"liepos {lay} eager" for lay in ("interleaved", "half")) if n.startswith(e[:-6])), None)
        if n.startswith("hf"):
            eager = "liepos half eager"
        res[n] = {"median_ms": statistics.median(ts) * 1e3,
                  "vs_clone": ratio(ts, times["clone"]),
                  "vs_eager": None if eager is None else ratio(ts, times[eager]),
                  "eager": eager}
    return res, cold


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 9, quick 3)")
    a = p.parse_args(argv)
    shape = (1, 32, 4096, 128)
    rounds = a.rounds or (3 if a.quick else 9)
    load = [os.getloadavg()[0]]  # the machine is shared: the 1-minute load average before and after
    res, cold = measure(shape, rounds)
    load.append(os.getloadavg()[0])
    lines = [f"queries + keys {shape}, float32, median of {rounds} interleaved rounds\n",
             "| contender | time (ms) | vs clone | vs liepos eager (same layout) | cold compile (s) |",
             "|---|---|---|---|---|"]
    for n, r in res.items():
        ve = "" if r["vs_eager"] is None else f"{r['vs_eager']:.2f}"
        c = f"{cold[n]:.1f}" if n in cold else ""
        lines.append(f"| {n} | {r['median_ms']:.1f} | {r['vs_clone']:.2f} | {ve} | {c} |")
    text = "\n".join(lines)
    print(text)
    print(f"1-minute load average: {load[0]:.1f} before, {load[1]:.1f} after")
    name = "compile_quick" if a.quick else "compile"
    save(RESULTS, name, "compile.py", load, text, results=res, cold_compile_s=cold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
