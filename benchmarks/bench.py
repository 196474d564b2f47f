"""Same-process benchmarks of applying positional encodings, against the peers.

Every provider gets the same ``q`` and ``k`` (``(batch, heads, seq, dim)``, keys with ``kv_heads``)
in the same process and is timed with ``torch.utils.benchmark.Timer.blocked_autorange`` (median and
interquartile range). Peak memory is the peak of glibc's allocated bytes (``mallinfo2``: heap plus
``mmap``-ed blocks) sampled after every aten op of the call, forward and backward, above the bytes
allocated before it: every output, temporary and tensor saved for backward, but not scratch memory a
single kernel allocates and frees inside itself (see :func:`peak_allocated`).

Providers: ``clone`` (q.clone(), k.clone(): the bandwidth yardstick), liepos eager (interleaved and
half layouts, in place, a mixed generator), liepos under ``torch.compile``, Hugging Face's
``apply_rotary_pos_emb`` (tables given, and with ``LlamaRotaryEmbedding`` building them),
rotary-embedding-torch, x-transformers, torchtune (when installed) and a dense per-position matrix
``x ↦ M(t) x`` with the matrices precomputed, and the same with ``M(t) = matrix_exp(t·X)`` built on
every call, which is how LieRE-style learned generators are applied.

This file is part of the source checkout, not of the wheel (it reads glibc and ``/proc`` and imports
the peers). Run it with ``liepos bench`` (``--quick``: the target shape only, under a minute) or
``python benchmarks/run.py``; both write ``results.{json,md}`` (``quick.{json,md}``) to the folder
``--out`` names (default: ``liepos-bench`` in the user's cache folder, never inside the checkout), and
exit with status 1 when a target is missed (its line says ``MISSED``).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.benchmark import Timer

import liepos as lp

__all__ = ["bench_alibi", "bench_case", "inputs", "markdown", "mixed_encoding", "peak_memory", "run", "run_suite", "targets"]


# ---------------------------------------------------------------------- measurement
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]


def _malloc_bytes() -> Callable[[], int] | None:
    """glibc's count of bytes currently allocated (heap + mmap), or None where unavailable."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        f = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _MallInfo2

    def allocated() -> int:
        m = f()
        return int(m.uordblks + m.hblkhd)

    return allocated


class _PeakAllocated(TorchDispatchMode):
    """Samples glibc's allocated bytes after every aten op (forward and backward): the peak of
    live tensors, saved tensors and temporaries between ops. Scratch memory that one kernel
    allocates and frees internally is not seen."""

    def __init__(self, allocated: Callable[[], int]) -> None:
        super().__init__()
        self.allocated = allocated
        self.base = allocated()
        self.peak = self.base

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.allocated())
        return out


def peak_allocated(fn: Callable[[], Any]) -> int | None:
    """Peak bytes allocated above the starting point while ``fn()`` runs (glibc ``mallinfo2``
    sampled after every aten op, including backward ops), or ``None`` off glibc."""
    allocated = _malloc_bytes()
    if allocated is None:
        return None
    gc.collect()
    with _PeakAllocated(allocated) as probe:
        out = fn()
        del out
    return max(0, probe.peak - probe.base)


def peak_memory(fn: Callable[[], Any]) -> int | None:
    """Peak allocation while ``fn()`` runs (:func:`peak_allocated`); the growth of the peak
    resident set (``VmHWM``) where glibc's counters are unavailable."""
    b = peak_allocated(fn)
    if b is not None:
        return b
    return peak_rss(fn)


def peak_rss(fn: Callable[[], Any]) -> int | None:
    """Bytes the peak resident set grows by while ``fn()`` runs (Linux), else ``None``."""
    try:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _rss_kib("VmRSS:")
        out = fn()
        peak = _rss_kib("VmHWM:")
        del out
        return max(0, peak - before) * 1024
    except OSError:
        return None


def _time(fn: Callable[[], Any], min_run_time: float) -> dict:
    m = Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return {"median_s": m.median, "iqr_s": m.iqr, "runs": len(m.times)}


# ---------------------------------------------------------------------- encodings and peers
def mixed_encoding(dim: int) -> lp.Encoding:
    """RoPE planes + two decays + a 3×3 Jordan block + NoPE to ``dim`` (interleaved)."""
    rot = dim - 8
    g = lp.direct_sum(
        lp.rope(rot).generator,
        lp.Generator([-0.01, -0.001, -0.005], [0.0, 0.0, 0.0], [1, 1, 3]),
        lp.nope(dim - rot - 5).generator,
    )
    return lp.Encoding(g, name="mixed")


def _hf():
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return apply_rotary_pos_emb


def _hf_tables(S: int, D: int, dtype: torch.dtype, offset: int = 0):
    inv = lp.rope_freqs(D).to(torch.float32)
    t = torch.arange(offset, offset + S, dtype=torch.float32)
    f = torch.outer(t, inv)
    emb = torch.cat((f, f), -1)
    return emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]


def _hf_build(D: int, dtype: torch.dtype, S: int, offset: int = 0):
    """Hugging Face's per-forward table build (LlamaRotaryEmbedding.forward's computation)."""
    inv = lp.rope_freqs(D).to(torch.float32)
    pos = torch.arange(offset, offset + S)[None]

    def build():
        f = (inv[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    return build


def providers(B: int, H: int, Hk: int, S: int, D: int, dtype: torch.dtype, offset: int, compiled: bool) -> dict:
    """name -> (setup() -> args, fn(*args) -> outputs); every provider encodes q and k."""
    out: dict[str, Any] = {}
    pos = torch.arange(offset, offset + S)
    rope_i, rope_h, mixed = lp.rope(D), lp.rope(D, layout="half"), mixed_encoding(D)
    out["clone"] = lambda q, k: (q.clone(), k.clone())
    out["liepos"] = lambda q, k: (rope_i.query(q, pos), rope_i.key(k, pos))
    out["liepos_half"] = lambda q, k: (rope_h.query(q, pos), rope_h.key(k, pos))
    out["liepos_mixed"] = lambda q, k: (mixed.query(q, pos), mixed.key(k, pos))
    out["liepos_inplace"] = lambda q, k: (rope_i.query(q, pos, inplace=True), rope_i.key(k, pos, inplace=True))
    if compiled:
        f = torch.compile(lambda q, k, p: (rope_h.query(q, p), rope_h.key(k, p)), fullgraph=True)
        out["liepos_compiled"] = lambda q, k: f(q, k, pos)
    hf = _hf()
    if hf is not None:
        cos, sin = _hf_tables(S, D, dtype, offset)
        out["hf"] = lambda q, k: hf(q, k, cos, sin)
        build = _hf_build(D, dtype, S, offset)

        def hf_build(q, k):
            c, s = build()
            return hf(q, k, c, s)

        out["hf_with_tables"] = hf_build
    try:
        from rotary_embedding_torch import RotaryEmbedding

        rot = RotaryEmbedding(D, cache_if_possible=True)
        out["rotary_embedding_torch"] = lambda q, k: (
            rot.rotate_queries_or_keys(q, offset=offset), rot.rotate_queries_or_keys(k, offset=offset)
        )
    except Exception:  # noqa: BLE001
        pass
    try:
        from x_transformers.x_transformers import RotaryEmbedding as XRot
        from x_transformers.x_transformers import apply_rotary_pos_emb as xapply

        xr = XRot(D)
        freqs, _ = xr(torch.arange(offset, offset + S, dtype=torch.float32))
        out["x_transformers"] = lambda q, k: (xapply(q, freqs), xapply(k, freqs))
    except Exception:  # noqa: BLE001
        pass
    try:
        from torchtune.modules import RotaryPositionalEmbeddings

        tt = RotaryPositionalEmbeddings(D, max_seq_len=offset + S)
        ipos = pos[None]
        # torchtune wants (b, s, h, d): give it the transposed views
        out["torchtune"] = lambda q, k: (tt(q.transpose(1, 2), input_pos=ipos), tt(k.transpose(1, 2), input_pos=ipos))
    except Exception:  # noqa: BLE001
        pass
    if D <= 128 and S <= 4096:
        # interleaved layout: storage order = canonical, so F(t) = A(t)ᵀ and G(s) = A(−s) in storage order
        t64 = pos.to(torch.float64)
        M = rope_i.generator.exp(t64).transpose(-1, -2).to(torch.float32 if dtype == torch.bfloat16 else dtype)
        MK = rope_i.generator.exp(-t64).to(M.dtype)  # (S, D, D)

        def dense(x, M):
            # (B, H, S, D) -> (S, D, B·H): one (D × D) matrix per position, batched over positions
            B_, H_, S_, D_ = x.shape
            xs = x.to(M.dtype).permute(2, 3, 0, 1).reshape(S_, D_, B_ * H_)
            return (M @ xs).reshape(S_, D_, B_, H_).permute(2, 3, 0, 1).to(x.dtype)

        out["dense_matrix"] = lambda q, k: (dense(q, M), dense(k, MK))
        X = rope_i.generator.matrix().to(M.dtype)  # interleaved layout: storage order = canonical
        tpos = pos.to(M.dtype)

        def lie_re(q, k):
            # LieRE: the per-position matrices are exp(t·X) of the (learned) generator, built each call
            A = torch.linalg.matrix_exp(tpos[:, None, None] * X)  # (S, D, D) = A(t)
            return dense(q, A.transpose(-1, -2)), dense(k, torch.linalg.matrix_exp(-tpos[:, None, None] * X))

        out["dense_matrix_exp"] = lie_re
    return out


def inputs(B, H, Hk, S, D, dtype, grad=False, seed=0):
    """Seeded q (B, H, S, D) and k (B, Hk, S, D) in ``dtype``, leaves requiring grad when ``grad``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, S, D, generator=g).to(dtype)
    if grad:
        q.requires_grad_(True)
        k.requires_grad_(True)
    return q, k


def bench_case(
    B: int, H: int, Hk: int, S: int, D: int, dtype: torch.dtype, *, offset: int = 0, backward: bool = False,
    compiled: bool = False, min_run_time: float = 0.5, only: list[str] | None = None, memory: bool = False,
    projected: bool = False,
) -> list[dict]:
    """Time every provider on one shape; returns one row per provider.

    ``projected``: forward+backward where q and k come out of an op inside the step (``x * 1.0``, a
    stand-in for the q/k projections of a layer), as in a model: every provider pays the same
    allocation, and in-place application becomes possible (a leaf cannot be modified in place)."""
    rows = []
    provs = providers(B, H, Hk, S, D, dtype, offset, compiled)
    for name, fn in provs.items():
        if only is not None and name not in only:
            continue
        if backward and name == "liepos_inplace" and not projected:
            continue
        q, k = inputs(B, H, Hk, S, D, dtype, grad=backward)
        if backward and projected:

            def step(fn=fn, q=q, k=k):
                yq, yk = fn(q * 1.0, k * 1.0)
                (yq.sum() + yk.sum()).backward()
                q.grad = k.grad = None
        elif backward:
            gq, gk = torch.ones_like(q), torch.ones_like(k)

            def step(fn=fn, q=q, k=k, gq=gq, gk=gk):
                yq, yk = fn(q, k)
                # a scalar loss: its gradient is a broadcast view, so no provider pays for grad outputs
                (yq.sum() + yk.sum()).backward()
                q.grad = k.grad = None
        else:

            def step(fn=fn, q=q, k=k):
                with torch.no_grad():
                    return fn(q, k)

        try:
            t0 = time.perf_counter()
            step()  # warm-up (table caches, compilation)
            warm = time.perf_counter() - t0
            r = _time(step, min_run_time)
            mem = peak_memory(step) if memory else None
        except Exception as err:  # noqa: BLE001 - a peer that fails on a shape is reported, not fatal
            rows.append({"provider": name, "error": f"{type(err).__name__}: {err}"[:200]})
            continue
        elems = (B * H + B * Hk) * S * D
        r.update(
            provider=name, batch=B, heads=H, kv_heads=Hk, seq=S, dim=D, offset=offset,
            dtype=str(dtype).replace("torch.", ""),
            pass_=("proj+fwd+bwd" if projected else "fwd+bwd") if backward else "fwd",
            warmup_s=warm, peak_bytes=mem,
            gbps=elems * torch.finfo(dtype).bits / 8 * 2 / r["median_s"] / 1e9,
        )
        rows.append(r)
        del q, k
        gc.collect()
    return rows


def bench_alibi(S: int = 8192, H: int = 8, D: int = 64, min_run_time: float = 1.0) -> list[dict]:
    """ALiBi through slots (lp.attention) against SDPA with a materialised float bias, causal."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D, generator=g) for _ in range(3))
    enc = lp.alibi(D, num_heads=H)
    slopes = lp.alibi_slopes(H).to(torch.float32)

    def slots():
        with torch.no_grad():
            return lp.attention(q, k, v, enc)

    def bias():
        with torch.no_grad():
            t = torch.arange(S, dtype=torch.float32)
            lag = t[:, None] - t[None, :]
            b = -slopes[:, None, None] * lag  # (H, S, S)
            b = b.masked_fill(lag < 0, -math.inf)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=b[None])

    rows = []
    for name, fn in (("liepos_alibi_slots", slots), ("sdpa_float_bias", bias)):
        fn()
        r = _time(fn, min_run_time)
        r.update(provider=name, heads=H, seq=S, dim=D, dtype="float32", pass_="fwd", peak_bytes=peak_memory(fn))
        rows.append(r)
    return rows


# ---------------------------------------------------------------------- suite and targets
TARGET = dict(B=1, H=32, Hk=32, S=4096, D=128)


def _find(rows, provider, **kw):
    for r in rows:
        if r.get("provider") == provider and all(r.get(k) == v for k, v in kw.items()) and "error" not in r:
            return r
    return None


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets as measured ratios (value, bound, met)."""
    out = []
    sel = dict(seq=TARGET["S"], dim=TARGET["D"], dtype="float32", heads=32, kv_heads=32)
    f = lambda p, pas="fwd": _find(rows, p, pass_=pas, **sel)  # noqa: E731

    def add(name, num, den, key, bound, kind):
        if num is None or den is None or num.get(key) in (None, 0) or den.get(key) in (None, 0):
            out.append({"target": name, "value": None, "bound": bound, "met": None})
            return
        v = num[key] / den[key]
        out.append({"target": name, "value": v, "bound": bound, "met": v >= bound if kind == ">=" else v <= bound})

    add("throughput vs HF apply_rotary_pos_emb (x, >=)", f("hf"), f("liepos"), "median_s", 2.5, ">=")
    add("time vs clone of q and k (x, <=)", f("liepos"), f("clone"), "median_s", 1.5, "<=")
    add("mixed generator time vs RoPE (x, <=)", f("liepos_mixed"), f("liepos"), "median_s", 1.3, "<=")
    add("speed-up vs dense per-position matrix, precomputed (x, >=)", f("dense_matrix"), f("liepos"), "median_s", 10.0, ">=")
    add("speed-up vs dense matrix_exp per position, LieRE (x, >=)", f("dense_matrix_exp"), f("liepos"), "median_s", 10.0, ">=")
    add("fwd+bwd peak memory vs HF (x, <=)", f("liepos", "fwd+bwd"), f("hf", "fwd+bwd"), "peak_bytes", 0.6, "<=")
    add("fwd+bwd peak memory vs HF after a projection, liepos in place (x, <=)", f("liepos_inplace", "proj+fwd+bwd"),
        f("hf", "proj+fwd+bwd"), "peak_bytes", 0.6, "<=")
    a, b = _find(rows, "liepos_alibi_slots"), _find(rows, "sdpa_float_bias")
    add("ALiBi slots time vs SDPA float bias (x, <=)", a, b, "median_s", 1.2, "<=")
    add("ALiBi slots peak memory vs SDPA float bias (x, <=)", a, b, "peak_bytes", 0.25, "<=")
    return out


def run_suite(quick: bool = False, log: Callable[[str], None] = print) -> dict:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rows: list[dict] = []
    mrt = 0.2 if quick else 0.5
    B, H, S, D = TARGET["B"], TARGET["H"], TARGET["S"], TARGET["D"]
    log(f"target shape (batch {B}, heads {H}, seq {S}, dim {D}), float32, forward")
    rows += bench_case(B, H, H, S, D, torch.float32, min_run_time=mrt, compiled=not quick,
                       only=["clone", "liepos", "liepos_inplace", "liepos_mixed", "hf", "dense_matrix",
                             "dense_matrix_exp"] if quick else None)
    log("  forward+backward after a projection, with peak memory (in place possible)")
    rows += bench_case(B, H, H, S, D, torch.float32, backward=True, projected=True, min_run_time=mrt, memory=True,
                       only=["liepos", "liepos_inplace", "hf"])
    log("  forward+backward with peak memory")
    rows += bench_case(B, H, H, S, D, torch.float32, backward=True, min_run_time=mrt, memory=True,
                       only=["clone", "liepos", "hf"] if quick else ["clone", "liepos", "liepos_half", "liepos_mixed",
                                                                      "hf", "rotary_embedding_torch", "x_transformers"])
    if not quick:
        cases = [
            (1, 32, 8, 512, 128, torch.float32),
            (1, 32, 8, 16384, 128, torch.float32),
            (1, 32, 32, 4096, 64, torch.float32),
            (1, 32, 32, 4096, 256, torch.float32),
            (1, 32, 8, 4096, 128, torch.bfloat16),
        ]
        for c in cases:
            log(f"  prefill {c}")
            rows += bench_case(*c, min_run_time=mrt)
        log("  decode: 1 token at position 4096, batch 8, 32 query / 8 kv heads")
        rows += bench_case(8, 32, 8, 1, 128, torch.float32, offset=4096, min_run_time=mrt)
        rows += bench_case(8, 32, 8, 1, 128, torch.bfloat16, offset=4096, min_run_time=mrt)
        log("  ALiBi through slots vs SDPA with a float bias (8192 tokens, 8 heads, dim 64)")
        rows += bench_alibi()
    else:
        log("  ALiBi through slots vs SDPA with a float bias (2048 tokens, quick)")
        rows += bench_alibi(S=2048, min_run_time=0.2)
    meta = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "processor": platform.processor(), **_cpu(), "quick": quick,
        "capability": torch.backends.cpu.get_cpu_capability(), "wall_s": time.perf_counter() - t0,
    }
    return {"meta": meta, "rows": rows, "targets": targets(rows)}


def _cpu() -> dict:
    """The CPU model and its instruction-set flags, from the sibling ``rounds.py`` (this file is also loaded by path,
    by ``liepos bench``, with no sibling importable by name)."""
    spec = importlib.util.spec_from_file_location("liepos_benchmark_rounds", Path(__file__).with_name("rounds.py"))
    rounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rounds)
    here = rounds.machine()
    return {"cpu": here["cpu"], "cpu_flags": here["cpu_flags"]}


def _fmt_bytes(b):
    return "" if b is None else f"{b / 2**20:.0f} MiB"


def markdown(res: dict) -> str:
    lines = ["| provider | pass | dtype | B×H/Hk×S×D | median | IQR | GB/s | vs clone | vs HF | peak mem |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in res["rows"] if "error" not in r and "batch" in r]
    for r in rows:
        key = dict(pass_=r["pass_"], dtype=r["dtype"], seq=r["seq"], dim=r["dim"], heads=r["heads"],
                   kv_heads=r["kv_heads"], offset=r["offset"], batch=r["batch"])
        c, h = _find(rows, "clone", **key), _find(rows, "hf", **key)
        lines.append(
            f"| {r['provider']} | {r['pass_']} | {r['dtype']} | {r['batch']}×{r['heads']}/{r['kv_heads']}×{r['seq']}"
            f"{'@' + str(r['offset']) if r['offset'] else ''}×{r['dim']} | {r['median_s'] * 1e3:.3f} ms | "
            f"{r['iqr_s'] * 1e3:.3f} | {r['gbps']:.1f} | {r['median_s'] / c['median_s'] if c else float('nan'):.2f} | "
            f"{h['median_s'] / r['median_s'] if h else float('nan'):.2f}× | {_fmt_bytes(r.get('peak_bytes'))} |"
        )
    for r in res["rows"]:
        if "batch" not in r and "error" not in r:
            lines.append(f"| {r['provider']} | fwd | float32 | 1×{r['heads']}×{r['seq']}×{r['dim']} | "
                         f"{r['median_s'] * 1e3:.1f} ms | {r['iqr_s'] * 1e3:.1f} | | | | {_fmt_bytes(r.get('peak_bytes'))} |")
    errs = [r for r in res["rows"] if "error" in r]
    lines += ["", "| target | measured | bound | met |", "|---|---|---|---|"]
    for t in res["targets"]:
        v = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['target']} | {v} | {t['bound']} | {t['met']} |")
    if errs:
        lines += ["", "Providers that failed: " + "; ".join(f"{r['provider']}: {r['error']}" for r in errs)]
    m = res["meta"]
    lines += ["", f"torch {m['torch']}, {m['threads']} threads on {m['cpu_count']} CPUs ({m['capability']}), "
              f"suite wall time {m['wall_s']:.0f} s."]
    if "cpu" in m:
        lines += ["", f"CPU: {m['cpu']}; flags: {' '.join(m['cpu_flags'])}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- entry point
def run(quick: bool, out: Path, threads: int | None = None, log: Callable[[str], None] = print) -> int:
    """Run the suite (``quick``: the target shape only) and write ``out/{results|quick}.{json,md}``.

    Returns 0 when every measured target is met, 1 when one is missed (each is printed, a miss as ``MISSED``)."""
    if threads:
        torch.set_num_threads(threads)
    res = run_suite(quick=quick, log=log)
    name = "quick" if quick else "results"
    (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
    (out / f"{name}.md").write_text(markdown(res))
    log("")
    for t in res["targets"]:
        log(target_line(t))
    log(f"\nwrote {out / (name + '.json')} and {out / (name + '.md')}")
    return verdict(res["targets"], log)


def target_line(t: dict) -> str:
    """One target as the run prints it: ``met``, ``MISSED`` or ``not measured``."""
    v = "n/a" if t["value"] is None else f"{t['value']:.2f}"
    word = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
    return f"  {t['target']:52s} {v:>7s}  (bound {t['bound']}): {word}"


def verdict(targets: list[dict], log: Callable[[str], None] = print) -> int:
    """0 when no measured target is missed, else 1, saying plainly which were missed."""
    missed = [t["target"] for t in targets if t["met"] is False]
    if missed:
        log(f"{len(missed)} of {len(targets)} targets MISSED on this machine: {'; '.join(missed)} "
            "(timings depend on the load: see the threads and CPUs above)")
        return 1
    return 0
