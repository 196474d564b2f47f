"""The apply and attention paths on a GPU: checked against the CPU float64 reference, timed against HF and fused.

    PYTHONPATH=src python benchmarks/gpu.py                        # CUDA, full shapes (well under 5 min, H200)
    PYTHONPATH=src python benchmarks/gpu.py --out $OUT             # where the device machine collects files
    PYTHONPATH=src python benchmarks/gpu.py --device cpu --quick   # the smoke run (< 20 s on 2 CPU cores)
    PYTHONPATH=src python benchmarks/gpu.py --checks-only          # the checks alone, no timing
    PYTHONPATH=src python benchmarks/gpu.py --peak-gbs 2039        # another GPU (A100 80 GB): its bandwidth

**Checks.** Every catalogue encoding of ``benchmarks/attention.py`` (NoPE, RoPE both layouts, xPos, RetNet,
decay, ALiBi, Jordan), built on the CPU as a user builds it and applied to device inputs (the library
computes its float64 tables on the inputs' device from the CPU parameters, then casts), ``enc.query`` / ``enc.key`` at
positions ``0 … S−1`` and ``10⁶ … 10⁶+S−1`` (the encodings that need re-centring with ``origin=`` the
middle of the range, so both signs of ``t − o`` occur; RoPE and NoPE at the absolute times, their tables
float64 then cast) in float32 and bfloat16, and causal ``lp.attention(q, k, v, enc, t, t)`` at both
ranges, are compared with ``query_reference`` / ``key_reference`` / ``lp.attention_reference`` of the CPU
encoding in float64 on the same (dtype-rounded) inputs. The error is ``max |out − ref| / max |ref|``; the
tolerances (:data:`TOL`) are those of the test suite: float32 1e-4 (tests/test_attention.py, far-from-zero
attention), bfloat16 2e-2 for apply (tests/test_kernels.py) and 3e-2 for attention (tests/test_attention.py
``BF16_TOL``); float32 attention with Jordan blocks of degree ≥ 2 ``liepos.recentre.POLY_ROUNDING`` = 2⁻¹⁴,
the precision contract of polynomial blocks (docs/guide/precision.md; ``build("jordan", 64)`` read
4e-6 near 0 and 1e-5 near 10⁶ on the CPU). Attention compares 24 query rows (the
first, middle and last 8), each over every key it sees. The full check shape (1, 8, 256, 64) has at least
``liepos._kernels.MIN_ELEMS`` elements, so the compiled kernels that the timing runs are the ones checked;
the quick one, (1, 4, 64, 32), is below it (the CPU float64 references dominate a quick run). The timed
peers (HF, fused) are checked against liepos' half-layout RoPE on the timing inputs, which do run them.

**Timing.** Warm-up, then interleaved rounds (every contender once per round, the order rotating), each a
CUDA-event interval over ``number`` calls on CUDA (``time.perf_counter`` on the CPU); the figure is the
median over rounds, the ratio the median of per-round ratios (``rounds.ratio``) to HF's apply (apply) or
causal SDPA (attention). Apply: queries and keys (1, 32, 4096, 128) (quick: (1, 4, 256, 64)) in bfloat16
and float32, out of place: liepos RoPE half and interleaved, xPos, decay (one rate 1/8192: the catalogue's
bank, up to rate 1/2, leaves float32 after 176 positions in one factorisation), a ``clone`` of q and k
(the copy floor), HF's ``apply_rotary_pos_emb`` (or its formula, labelled, without transformers) with
cos/sin built as HF does (``cat(freqs, freqs)``, here from float64 angles), and Liger's
``liger_rotary_pos_emb`` (or, without liger_kernel, ``torch.compile`` of the HF formula: one Triton kernel
from Inductor on CUDA). On CUDA the liepos rows run liepos' Triton kernels (:mod:`liepos._triton`); two more
rows per layout time that kernel alone on given tables and the torch ops with it off (``LIEPOS_TRITON=0``).
Attention: (1, 8, 4096, 64) (quick: (1, 8, 128, 64)) bfloat16, ``lp.attention``
per encoding against causal SDPA, and on CUDA ALiBi through FlexAttention (``liepos.attention_flex``, compiled).
On the CPU the times are a smoke run's, not measurements.

**Bytes** of an apply row (the traffic no rotation avoids, the same count for every row): q and k read once
and written once, ``4·B·H·S·D·e`` (``e`` the element size), plus a cos and a sin table of ``S × D`` float32
read once, ``2·S·D·4``. GB/s = bytes / median time (10⁹ bytes); the fraction divides by ``--peak-gbs``
(default 4800 on an H200, 3350 on an H100; otherwise "n/a" unless given).

Writes ``gpu.md`` and ``gpu.json`` into ``--out`` (default ``$OUT`` if set, else ``benchmarks/results``)
after every phase, so a run cut short keeps what it did. Exit status 0 only if every check passed and
every row ran (1 otherwise; 2 when the device is not usable here); a row that raised is FAILED with its
exception. It needs only torch, numpy and liepos (transformers and liger_kernel are used when they
import); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as Fn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/rounds.py, also when imported
import liepos as lp  # noqa: E402
from liepos import _kernels  # noqa: E402
from rounds import ratio, save  # noqa: E402  benchmarks/rounds.py: per-round ratios, the results writer

RESULTS = Path(__file__).resolve().parent / "results"
FAR = 10**6
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# max |out − ref| / max |ref| allowed, per dtype (the test suite's tolerances, see the docstring)
TOL = {"apply": {"float32": 1e-4, "bfloat16": 2e-2}, "attention": {"float32": 1e-4, "bfloat16": 3e-2},
       # Jordan blocks of degree >= 2: re-centring keeps POLY_ROUNDING = 2^-14 relative on each score (liepos.recentre)
       "attention_poly": {"float32": 2.0**-14, "bfloat16": 3e-2}}
PEAK_GBS = {"H200": 4800.0, "H100": 3350.0}  # HBM bandwidth by device name (vendor figures)
# (batch, heads, seq, dim) per phase. The full check shape has >= _kernels.MIN_ELEMS elements, so the
# checks run the compiled kernels that the timing runs; the quick one is smaller (the CPU float64
# references dominate a quick run), and there the compiled kernels are checked by the peers' agreement rows
SHAPES = {
    "full": {"check": (1, 8, 256, 64), "apply": (1, 32, 4096, 128), "attention": (1, 8, 4096, 64)},
    "quick": {"check": (1, 4, 64, 32), "apply": (1, 4, 256, 64), "attention": (1, 8, 128, 64)},
}
if math.prod(SHAPES["full"]["check"]) < _kernels.MIN_ELEMS:
    raise ImportError(f"the full check shape {SHAPES['full']['check']} is below liepos._kernels.MIN_ELEMS")
# (interleaved rounds, calls per round) per phase: the full run stays well under 5 minutes on an H200
# (apply calls take tens of µs there; attention is sized for calls of up to ~0.5 s each)
ROUNDS = {"full": {"apply": (15, 20), "attention": (5, 2)}, "quick": {"apply": (3, 2), "attention": (3, 1)}}


# ---------------------------------------------------------------------- encodings and their device
_T0 = time.perf_counter()


def say(message: str) -> None:
    """Progress on stderr, with the seconds since the script started (a run cut short shows where)."""
    print(f"[gpu.py {time.perf_counter() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


# benchmarks/attention.py encodings(): (name, catalogue entry, options), built by lp.build at any heads and dim
CATALOGUE = [("nope", "nope", {}), ("rope", "rope", {}), ("rope_half", "rope", {"layout": "half"}),
             ("xpos", "xpos", {}), ("retnet", "retnet", {}), ("decay", "decay", {}), ("alibi", "alibi", {}),
             ("jordan", "jordan", {})]


def encodings(heads: int, dim: int) -> dict[str, lp.Encoding]:
    """Every catalogue entry that causal attention takes (growth is refused by design), plus RoPE's half layout."""
    return {name: lp.build(entry, dim, heads, **options) for name, entry, options in CATALOGUE}


def resolve_device(name: str) -> torch.device:
    """The ``--device`` as a torch device; SystemExit with a one-line message when it is not usable here."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        _refuse(f"--device {name!r} is not a torch device ({err})")
    if device.type not in ("cpu", "cuda"):
        _refuse(f"--device must be cpu or cuda[:N], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        _refuse(f"--device {name!r} but torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build "
                f"{torch.version.cuda}): run on a machine with a GPU, or pass --device cpu for the smoke run")
    return device


def _refuse(message: str) -> None:
    """Exit with status 2 and one line on stderr (no traceback): the run cannot start here."""
    print(f"gpu.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def device_name(device: torch.device) -> str:
    """The GPU's name (which picks the default ``--peak-gbs``), or the CPU and its thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def peak_gbs(given: float | None, name: str) -> float | None:
    """``--peak-gbs`` if given, else the known HBM bandwidth of the device named ``name``, else None."""
    if given is not None:
        return given
    return next((v for k, v in PEAK_GBS.items() if k in name), None)


# ---------------------------------------------------------------------- checks
def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int, n: int = 3) -> list[torch.Tensor]:
    """``n`` standard normal tensors of ``shape``, rounded to ``dtype`` (on the CPU: the same on every device)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(n)]


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out − ref| / max |ref|`` in float64 on the CPU (inf when out is not finite)."""
    out = out.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out - ref).abs().max()) / max(float(ref.abs().max()), 1e-300)


def _row(enc: str, what: str, dtype: str, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]], tol: float) -> dict:
    """One check row: ``fn()`` gives (device output, CPU float64 reference); an exception is a FAILED row."""
    row = {"encoding": enc, "what": what, "dtype": dtype, "tol": tol}
    try:
        out, ref = fn()
        err = _error(out, ref)
        row.update(error=err, ok=err <= tol)
    except Exception as exc:  # anything that does not run on the device is reported, not raised
        row.update(error=None, ok=False, failed=f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
        traceback.print_exc(file=sys.stderr)
    return row


def _plant(out: torch.Tensor) -> torch.Tensor:
    """A planted error (``--plant-error``): one entry moved by the output's largest magnitude."""
    out = out.clone()
    out.view(-1)[0] += out.abs().max()
    return out


def check_encoding(name: str, enc: lp.Encoding, device: torch.device, shape: tuple[int, ...],
                   plant: bool) -> list[dict]:
    """Apply (query and key) and causal attention of one encoding, near 0 and near 10⁶, both dtypes."""
    B, H, S, D = shape
    denc = enc  # as a user has it: built on the CPU, applied to device inputs
    # the attention rows compared (each over all the keys it sees): the first, middle and last 8 queries
    rows_at = torch.cat((torch.arange(8), torch.arange(S // 2 - 4, S // 2 + 4), torch.arange(S - 8, S)))
    kind = "attention_poly" if max(enc.generator.sizes) > 2 else "attention"
    rows = []
    for where, start in (("near 0", 0), ("near 1e6", FAR)):
        pos = torch.arange(S, dtype=torch.float64) + start  # (S,) on the CPU: the library moves it
        origin = start + S // 2 if enc.needs_recentring else None  # both signs of t − o
        at = f"t={start}..{start + S - 1}" + ("" if origin is None else f", origin={origin}")
        for dname, dtype in DTYPES.items():
            q, k, v = _inputs(shape, dtype, seed=len(rows))
            q64, k64, v64 = q.double(), k.double(), v.double()

            def query(q=q, q64=q64, pos=pos, origin=origin):
                out = denc.query(q.to(device), pos, origin=origin)
                return (_plant(out) if plant else out), enc.query_reference(q64, pos, origin=origin)

            def key(k=k, k64=k64, pos=pos, origin=origin):
                return denc.key(k.to(device), pos, origin=origin), enc.key_reference(k64, pos, origin=origin)

            def attend(q=q, k=k, v=v, q64=q64, k64=k64, v64=v64, pos=pos):
                out = lp.attention(q.to(device), k.to(device), v.to(device), denc, pos, pos)[:, :, rows_at]
                return out, lp.attention_reference(q64[:, :, rows_at], k64, v64, enc, pos[rows_at], pos)

            rows.append(_row(name, f"query {where} ({at})", dname, query, TOL["apply"][dname]))
            rows.append(_row(name, f"key {where} ({at})", dname, key, TOL["apply"][dname]))
            rows.append(_row(name, f"attention causal {where}", dname, attend, TOL[kind][dname]))
    return rows


def checks(device: torch.device, shape: tuple[int, ...], plant: str | None) -> list[dict]:
    """Every encoding's check rows (``plant``: the encoding whose query outputs get a planted error)."""
    rows = []
    for name, enc in encodings(shape[1], shape[3]).items():
        rows += check_encoding(name, enc, device, shape, plant == name)
    return rows


# ---------------------------------------------------------------------- timing
def _timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """Seconds per call of ``fn`` over ``number`` calls: CUDA events on CUDA, ``perf_counter`` on the CPU."""
    if device.type == "cuda":
        def cuda(fn, number):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / number  # ms -> s
        return cuda

    def cpu(fn, number):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    return cpu


def interleaved_events(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int,
                       number: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Seconds per call of every contender, one entry per round (the order rotating each round), as
    ``rounds.interleaved`` does, but timed by :func:`_timer` (CUDA events: ``torch.utils.benchmark``
    measures host time). A contender that raises (at warm-up or later) is left out, its error returned."""
    timer, failed = _timer(device), {}
    with torch.no_grad():
        for n, fn in list(fns.items()):
            try:
                fn(), fn()  # warm: tables cached, kernels compiled, allocator primed
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as exc:
                failed[n] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                traceback.print_exc(file=sys.stderr)
        names = [n for n in fns if n not in failed]
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:
                times[n].append(timer(fns[n], number))
    return times, failed


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``rotate_half``: ``cat(−x₂, x₁)`` of the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _hf_formula(q, k, cos, sin):
    """HF's ``apply_rotary_pos_emb`` written out (cos/sin ``(1, S, D)`` broadcast over heads)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (1, S, D) -> (1, 1, S, D)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def peers() -> dict[str, Callable]:
    """HF's apply and a fused one, each ``(q, k, cos, sin) -> (q', k')``, labelled by what they really are."""
    out = {}
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        out["hf apply_rotary_pos_emb"] = apply_rotary_pos_emb
    except Exception:  # not installed (or broken): the formula, labelled
        out["HF formula (transformers not installed)"] = _hf_formula
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        out["liger_rotary_pos_emb"] = liger_rotary_pos_emb
    except Exception:
        out["fused (torch.compile/Inductor), liger_kernel not installed"] = torch.compile(_hf_formula, dynamic=False)
    return out


def hf_tables(S: int, D: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``(1, S, D)`` as HF lays them out (``cat(freqs, freqs)``), from float64 angles, cast to ``dtype``."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))  # (D/2,) lp.rope's frequencies
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)  # (S, D/2)
    emb = torch.cat((ang, ang), -1)  # (S, D): HF's duplicated half layout
    return emb.cos()[None].to(device, dtype), emb.sin()[None].to(device, dtype)  # (1, S, D)


def apply_contenders(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[dict, dict]:
    """The timed applies of q and k (each ``() -> (q', k')``) and the peers' agreement rows with liepos' half RoPE."""
    B, H, S, D = shape
    q, k = (t.to(device) for t in _inputs(shape, dtype, seed=100, n=2))
    pos = torch.arange(S, dtype=torch.float64)  # (S,)
    encs = encodings(H, D)
    half, inter, xpos = (encs[n] for n in ("rope_half", "rope", "xpos"))
    # one small rate, so that S positions stay in float32's range in one factorisation (the catalogue's bank
    # reaches rate 1/2: 176 positions); the kernel's speed does not depend on the rate (benchmarks/apply.py)
    decay = lp.build("decay", D, rate=1 / 8192)
    cos, sin = hf_tables(S, D, dtype, device)
    fns = {
        "clone of q, k (copy floor)": lambda: (q.clone(), k.clone()),
        "liepos rope half": lambda: (half.query(q, pos), half.key(k, pos)),
        "liepos rope interleaved": lambda: (inter.query(q, pos), inter.key(k, pos)),
        "liepos xpos": lambda: (xpos.query(q, pos), xpos.key(k, pos)),
        "liepos decay (rate 1/8192)": lambda: (decay.query(q, pos), decay.key(k, pos)),
    }
    if device.type == "cuda":  # the liepos rows above run the Triton kernels there; the kernel alone and the torch ops
        fns.update(_triton_rows(q, k, pos, half, inter))
    dname = str(dtype).removeprefix("torch.")
    agree = {}
    for label, f in peers().items():
        fns[label] = lambda f=f: f(q, k, cos, sin)

        def both(f=f):  # the peer's q', k' against liepos' half RoPE on the same device, as one tensor each
            with torch.no_grad():
                yq, yk = f(q, k, cos, sin)
                rq, rk = half.query(q, pos), half.key(k, pos)
            return torch.stack((yq, yk)), torch.stack((rq, rk)).to("cpu", torch.float64)
        agree[label] = _row(label, f"agrees with liepos rope half on {tuple(shape)}", dname, both, TOL["apply"][dname])
    return fns, agree


def _triton_rows(q, k, pos, half, inter) -> dict[str, Callable]:
    """CUDA only: liepos' Triton kernel alone on given tables, and the torch ops with it off (``LIEPOS_TRITON=0``)."""
    from liepos import _triton

    if not _triton.available():
        return {}
    out: dict[str, Callable] = {}
    for label, enc in (("half", half), ("interleaved", inter)):
        fq, fk = (enc._fast_tables(pos.to(q.device), side, torch.float32, True) for side in ("query", "key"))
        out[f"liepos rope {label}: Triton kernel alone (tables given)"] = (
            lambda fq=fq, fk=fk: (_triton.apply(q, fq), _triton.apply(k, fk)))

        def torch_ops(enc=enc):
            os.environ["LIEPOS_TRITON"] = "0"
            try:
                return enc.query(q, pos), enc.key(k, pos)
            finally:
                os.environ.pop("LIEPOS_TRITON")
        out[f"liepos rope {label}: torch ops (LIEPOS_TRITON=0)"] = torch_ops
    return out


def bytes_moved(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """q, k read and written once (4·B·H·S·D·e) plus a cos and a sin table of S × D float32 read once."""
    B, H, S, D = shape
    return 4 * B * H * S * D * torch.finfo(dtype).bits // 8 + 2 * S * D * 4


def time_apply(shape, device, rounds: int, number: int, peak: float | None) -> tuple[list[dict], list[dict]]:
    """Apply rows (both dtypes: time, ratio to HF, GB/s, fraction of peak) and the peers' agreement rows."""
    rows, agree = [], []
    for dname, dtype in DTYPES.items():
        say(f"apply {dname} {shape} ...")
        fns, peer_rows = apply_contenders(shape, dtype, device)
        agree += list(peer_rows.values())
        times, failed = interleaved_events(fns, device, rounds, number)
        hf = next((n for n in times if "hf" in n.lower()), None)
        nbytes = bytes_moved(shape, dtype)
        for n in fns:
            if n in failed:
                rows.append({"contender": n, "dtype": dname, "failed": failed[n]})
                continue
            med = statistics.median(times[n])
            gbs = nbytes / med / 1e9
            rows.append({"contender": n, "dtype": dname, "median_s": med, "bytes": nbytes, "gbs": gbs,
                         "ratio_to_hf": None if hf is None else ratio(times[n], times[hf]),
                         "fraction_of_peak": None if peak is None else gbs / peak})
    return rows, agree


def time_attention(shape, device, rounds: int, number: int) -> list[dict]:
    """``lp.attention`` of every encoding (bfloat16, causal, positions 0 … S−1) against causal SDPA."""
    say(f"attention bfloat16 {shape} ...")
    q, k, v = (t.to(device) for t in _inputs(shape, torch.bfloat16, seed=200))
    fns = {"sdpa (causal)": lambda: Fn.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for name, enc in encodings(shape[1], shape[3]).items():
        fns[f"lp.attention {name}"] = lambda e=enc: lp.attention(q, k, v, e)
    if device.type == "cuda":  # ALiBi's bias as a FlexAttention score_mod (compiled), where torch has it
        try:
            from liepos.attention_flex import flex_attention
        except ImportError:
            pass
        else:
            alibi = encodings(shape[1], shape[3])["alibi"]
            fns["flex_attention alibi (score_mod)"] = lambda: flex_attention(q, k, v, alibi)
    times, failed = interleaved_events(fns, device, rounds, number)
    rows = []
    for n in fns:
        if n in failed:
            rows.append({"contender": n, "dtype": "bfloat16", "failed": failed[n]})
        else:
            rows.append({"contender": n, "dtype": "bfloat16", "median_s": statistics.median(times[n]),
                         "ratio_to_sdpa": ratio(times[n], times["sdpa (causal)"]) if "sdpa (causal)" in times
                         else None})
    return rows


# ---------------------------------------------------------------------- report
def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _md(head: list[str], body: list[list[str]]) -> str:
    """A markdown table: the header ``head``, then one line per list of cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])


def _timed(r: dict, cells: Callable[[dict], list[str]], width: int) -> list[str]:
    """A timed row's cells: name, dtype, then ``cells(r)``, or FAILED with its exception (``width`` cells in all)."""
    rest = [f"FAILED: {r['failed']}"] + [""] * (width - 3) if "failed" in r else cells(r)
    return [r["contender"], r["dtype"], *rest]


def check_table(rows: list[dict]) -> str:
    return _md(["encoding", "what", "dtype", "max error", "tolerance", "ok"], [
        [r["encoding"], r["what"], r["dtype"], f"FAILED: {r['failed']}" if "failed" in r else f"{r['error']:.2e}",
         f"{r['tol']:.0e}", "ok" if r["ok"] else "NOT OK"] for r in rows])


def apply_table(rows: list[dict], shape) -> str:
    head = ["contender", "dtype", "time (µs)", "ratio to HF", "GB/s", "fraction of peak"]
    cells = lambda r: [f"{r['median_s'] * 1e6:.1f}", _num(r["ratio_to_hf"], ".2f"), f"{r['gbs']:.1f}",  # noqa: E731
                       _num(r["fraction_of_peak"], ".1%")]
    return (f"Apply of q and k {tuple(shape)}, out of place (median of interleaved rounds; bytes in the docstring)\n\n"
            + _md(head, [_timed(r, cells, len(head)) for r in rows]))


def attention_table(rows: list[dict], shape) -> str:
    head = ["contender", "dtype", "time (ms)", "ratio to SDPA"]
    cells = lambda r: [f"{r['median_s'] * 1e3:.3f}", _num(r["ratio_to_sdpa"], ".2f")]  # noqa: E731
    return (f"Causal attention {tuple(shape)} (median of interleaved rounds)\n\n"
            + _md(head, [_timed(r, cells, len(head)) for r in rows]))


def report(res: dict) -> str:
    """The markdown of everything measured so far."""
    m = res["meta"]
    parts = [f"Device: {m['device_name']} (`{m['device']}`), torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"peak {_num(m['peak_gbs'], '.0f')} GB/s, wall {m['wall_s']:.1f} s",
             f"\nChecks against the CPU float64 reference, shape {tuple(m['shapes']['check'])}\n",
             check_table(res["checks"])]
    if res.get("agree"):
        parts += ["\nTimed peers against liepos (same device, same inputs)\n", check_table(res["agree"])]
    if res.get("apply"):
        parts += ["", apply_table(res["apply"], m["shapes"]["apply"])]
    if res.get("attention"):
        parts += ["", attention_table(res["attention"], m["shapes"]["attention"])]
    ks = res.get("kernels") or {}
    parts.append(f"\nliepos compiled kernels: {len(ks.get('compiled', []))} variants compiled, "
                 f"failed: {ks.get('failed') or 'none'}")
    parts.append(f"\nAll checks passed and every row ran: {'yes' if passed(res) else 'NO'}")
    return "\n".join(parts)


def passed(res: dict) -> bool:
    """Every check and agreement row ok, and no timed row FAILED."""
    rows = res["checks"] + res.get("agree", [])
    timed = res.get("apply", []) + res.get("attention", [])
    return bool(rows) and all(r["ok"] for r in rows) and not any("failed" in r for r in timed)


def write(res: dict, out: Path, load0: float, t0: float) -> None:
    res["meta"]["wall_s"] = time.perf_counter() - t0
    res["kernels"] = _kernels.status()
    save(out, "gpu", "gpu.py", (load0, os.getloadavg()[0]), report(res), **res)


# ---------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for the smoke run")
    p.add_argument("--quick", action="store_true", help="small shapes, 3 rounds (the CPU smoke run, < 20 s)")
    p.add_argument("--checks-only", action="store_true", help="run the checks, leave out the timing")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS,
                   help="folder for gpu.md and gpu.json (default $OUT if set, else benchmarks/results)")
    p.add_argument("--peak-gbs", type=float, default=None,
                   help="memory bandwidth to divide by (default 4800 on an H200, 3350 on an H100, else n/a)")
    p.add_argument("--plant-error", metavar="ENCODING", help=argparse.SUPPRESS)  # tests: a check must be able to fail
    a = p.parse_args(argv)
    if a.peak_gbs is not None and not a.peak_gbs > 0:
        p.error(f"--peak-gbs must be a positive number of GB/s, got {a.peak_gbs}")
    if a.plant_error is not None and a.plant_error not in encodings(1, 4):
        p.error(f"--plant-error must name an encoding ({', '.join(encodings(1, 4))}), got {a.plant_error!r}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    device = resolve_device(a.device)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    mode = "quick" if a.quick else "full"
    shapes, rounds = SHAPES[mode], ROUNDS[mode]
    name = device_name(device)
    peak = peak_gbs(a.peak_gbs, name)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": str(device), "device_name": name, "cuda": torch.version.cuda, "peak_gbs": peak, "mode": mode,
            "shapes": shapes, "rounds": rounds, "planted_error": a.plant_error}
    res: dict = {"meta": meta, "checks": []}
    say(f"checks on {name} {shapes['check']} ...")
    res["checks"] = checks(device, shapes["check"], a.plant_error)
    write(res, a.out, load0, t0)
    if not a.checks_only:
        res["apply"], res["agree"] = time_apply(shapes["apply"], device, *rounds["apply"], peak)
        write(res, a.out, load0, t0)
        res["attention"] = time_attention(shapes["attention"], device, *rounds["attention"])
        write(res, a.out, load0, t0)
    print(report(res))
    say(f"wrote {a.out / 'gpu.md'} and {a.out / 'gpu.json'}")
    return 0 if passed(res) else 1


if __name__ == "__main__":
    sys.exit(main())
