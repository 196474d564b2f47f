"""The native terms op against the per-variant C kernel it replaced, on apply.py's Jordan rows.

    python benchmarks/terms_kernel.py                 # 1 and 2 threads, float32 and bfloat16, 9 rounds
    python benchmarks/terms_kernel.py --rounds 5 --threads 1 --dtypes float32

The earlier kernel (``src/liepos/_kernels.py`` at ``--old`` in this repository's git history: a C file
generated per variant with its width, offsets and masks as constants, built by the system C compiler and
called through ctypes) is loaded from git as a module of its own, for this comparison only. Both are called
on the same inputs with the same tables: the terms of ``build("jordan", dim, rate=-1/8192)`` and of apply.py's
mixed generator, for queries and keys (the key's terms are the transposed ones), out of place and in place (in place with the
tables of position 0, the same terms and masks, so that the buffers keep their values round after round),
at ``(1, 32, 4096, 128)`` and ``(1, 8, 4096, 64)``. Every round times every contender once, in one process,
in a rotating order; the figure is the median over rounds of the per-round ratio new / old.
Writes ``benchmarks/results/terms_kernel.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path

import torch

import liepos as lp
from apply import _mixed  # benchmarks/apply.py: the mixed generator of its Jordan rows
from liepos import _fast, _kernels
from rounds import interleaved, ratio, save  # benchmarks/rounds.py: the one timing loop and writer

RESULTS = Path(__file__).resolve().parent / "results"
OLD = "40ac963"  # the last commit with the ctypes kernels
SHAPES = ((1, 32, 4096, 128), (1, 8, 4096, 64))


def old_kernels(rev: str) -> types.ModuleType:
    """``src/liepos/_kernels.py`` at ``rev``, as a module of its own (its own cache of built variants)."""
    root = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "show", f"{rev}:src/liepos/_kernels.py"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    mod = types.ModuleType("liepos_old_kernels")
    mod.__file__ = f"<{rev}:src/liepos/_kernels.py>"
    sys.modules[mod.__name__] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def captured_terms(enc: lp.Encoding, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> list[tuple]:
    """The (tables, offsets, masks) the encoding hands the terms op for its query and its key."""
    calls: list[tuple] = []
    real = _kernels.apply_terms

    def spy(x, T, offsets, masks, into=None):
        calls.append((T, offsets, masks))
        return real(x, T, offsets, masks, into=into)

    _fast._kernels.apply_terms = spy
    try:
        enc.query(q, pos)
        enc.key(k, pos)
    finally:
        _fast._kernels.apply_terms = real
    if len(calls) != 2:
        raise RuntimeError(f"{enc!r}: expected one terms call for the query and one for the key, got {len(calls)}")
    return calls


def contenders(old: types.ModuleType, shape: tuple[int, ...], dtypes: list[torch.dtype],
               only: str = "") -> tuple[dict, list[tuple[str, str, str]]]:
    fns: dict = {}
    pairs = []
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        q = torch.randn(*shape, generator=g).to(dtype)
        k = torch.randn(*shape, generator=g).to(dtype)
        bq, bk = q.clone(), k.clone()
        pos = torch.arange(shape[2])
        for name, enc in (("jordan", lp.build("jordan", shape[-1], rate=-1 / 8192)), ("mixed", _mixed(shape[-1]))):
            (tq, oq, mq), (tk, ok, mk) = captured_terms(enc, q, k, pos)
            # in place, the tables of position 0 (the identity, the same terms and masks): a buffer keeps its values
            # round after round (at the positions they grow as u^2 and would reach inf), and the speed of the
            # kernels does not depend on the tables' values
            (tq0, _, _), (tk0, _, _) = captured_terms(enc, q, k, torch.zeros_like(pos))
            for mode in ("fresh", "inplace"):
                tag = f"{'x'.join(map(str, shape))} {str(dtype)[6:]} {name} {mode}"
                if only not in tag:
                    continue
                for who, mod in (("new", _kernels), ("old", old)):
                    def fn(mod=mod, mode=mode, q=q, k=k, bq=bq, bk=bk, tq=tq, oq=oq, mq=mq, tk=tk, ok=ok, mk=mk, tq0=tq0,
                           tk0=tk0):
                        if mode == "fresh":
                            a, b = mod.apply_terms(q, tq, oq, mq), mod.apply_terms(k, tk, ok, mk)
                        else:  # in place on warm buffers
                            a, b = mod.apply_terms(bq, tq0, oq, mq, into=bq), mod.apply_terms(bk, tk0, ok, mk, into=bk)
                        if a is None or b is None:
                            raise RuntimeError("a native kernel did not run")
                    fns[f"{tag} {who}"] = fn
                pairs.append((tag, f"{tag} new", f"{tag} old"))
                if mode == "fresh":  # the two kernels agree (the same tables, the same sums)
                    torch.testing.assert_close(_kernels.apply_terms(q, tq, oq, mq), old.apply_terms(q, tq, oq, mq),
                                               rtol=0, atol=0)
                    torch.testing.assert_close(_kernels.apply_terms(k, tk, ok, mk), old.apply_terms(k, tk, ok, mk),
                                               rtol=0, atol=0)
    return fns, pairs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    p.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes of x, comma-separated (default float32,bfloat16)")
    p.add_argument("--only", default="", help="only the settings whose name contains this (e.g. 'float32 mixed')")
    p.add_argument("--old", default=OLD, help=f"the git revision of the ctypes kernels (default {OLD})")
    a = p.parse_args(argv)
    dtypes = [getattr(torch, n) for n in a.dtypes.split(",")]
    old = old_kernels(a.old)
    load = [os.getloadavg()[0]]
    rows, res = [], {}
    for nt in (int(n) for n in a.threads.split(",")):
        torch.set_num_threads(nt)
        for shape in SHAPES:
            fns, pairs = contenders(old, shape, dtypes, a.only)
            # calls per timing: about 30 ms of work, so that one descheduling on a loaded machine is a small part
            times = interleaved(fns, a.rounds, number=3 if shape[1] * shape[3] > 1024 else 30) if fns else {}
            for tag, new, was in pairs:
                r = ratio(times[new], times[was])
                res[f"{nt}t {tag}"] = {"new_ms": min(times[new]) * 1e3, "old_ms": min(times[was]) * 1e3, "new/old": r}
                rows.append(f"| {nt} | {tag} | {min(times[new]) * 1e3:.2f} | {min(times[was]) * 1e3:.2f} | {r:.3f} |")
    load.append(os.getloadavg()[0])
    text = "\n".join([f"queries + keys, the terms op new / the ctypes kernel of {a.old}, median of {a.rounds} interleaved "
                      "rounds (times: the fastest round)\n", "| threads | setting | new (ms) | old (ms) | new / old |",
                      "|---|---|---|---|---|", *rows])
    print(text)
    save(RESULTS, "terms_kernel", "terms_kernel.py", load, text, results=res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
