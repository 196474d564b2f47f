"""A patched model's ``generate`` against the same model unpatched: ``python benchmarks/generate.py [--quick]``.

Issue 14 item 3: with the patch, greedy generation stays within 1.05× of upstream for RoPE (the
encoded-key path: the new key rotated once, the model's own backend) and within 1.15× for every
other encoding (the raw-key path: keys kept encoded at a cache origin beside HF's cache,
:mod:`liepos.interop.hf_decode`, so a step encodes its query and its new key only).

One random-weight Llama (no download; 512 wide, 8 heads, 4 key/value heads, head dim 64), a
512-token prompt and 32 new tokens, greedy; one row per encoding. After one untimed round of every
variant (what a process pays once is not timed), the variants run in interleaved
rounds in one process (each round times every variant once, in a rotating order); the figure is the
median over rounds of the ratio to upstream in the same round, so that drift of a shared machine hits
every variant alike. ``--layers 2 4 8`` repeats it per
layer count: the overhead per layer and new token shows whether Python overhead grows with depth.

Writes ``benchmarks/results/generate.{json,md}`` (not with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import liepos as lp
from liepos._progress import progress
from liepos.interop import patch_model, unpatch_model

# the target ratios: RoPE from the config 1.05x, every other encoding 1.15x
BOUNDS = {"rope (config)": 1.05, "rope (liepos)": 1.05, "xpos": 1.15, "alibi": 1.15, "retnet": 1.15,
          "decay": 1.15}
HIDDEN, HEADS = 512, 8


def model(layers: int, hidden: int = HIDDEN, heads: int = HEADS) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // 2, vocab_size=512,
                      max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def variants(head_dim: int, heads: int) -> dict:
    """``None``: upstream; ``"config"``: what the config means; else the liepos encoding patched in."""
    build = lp.catalogue.build
    return {
        "upstream": None,
        "rope (config)": "config",
        "rope (liepos)": lp.rope(head_dim, layout="half"),
        "xpos": build("xpos", head_dim, heads),
        "alibi": build("alibi", head_dim, heads),
        "retnet": build("retnet", head_dim, heads),
        "decay": build("decay", head_dim, heads),
    }


def run(layers: int, prompt: int, new: int, rounds: int, bar) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of one ``generate`` per variant and round, every variant once per round: wall-clock, and
    the thread's CPU time (``time.thread_time``: one torch thread, so the whole computation; without the
    time the thread waited descheduled, which on a shared machine is what makes wall-clock ratios drift)."""
    m = model(layers)
    x = torch.randint(0, 512, (1, prompt), generator=torch.Generator().manual_seed(1))
    vs = variants(HIDDEN // HEADS, HEADS)
    times: dict[str, list[float]] = {k: [] for k in vs}
    cpu: dict[str, list[float]] = {k: [] for k in vs}
    tokens: dict[str, torch.Tensor] = {}
    names = list(vs)
    with torch.no_grad():
        for name in names:  # one untimed round: what a process pays once (kernel builds, caches) is not timed
            unpatch_model(m)
            if vs[name] is not None:
                patch_model(m, None if vs[name] == "config" else vs[name])
            m.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # a rotating order
                enc = vs[name]
                unpatch_model(m)
                if enc is not None:
                    patch_model(m, None if enc == "config" else enc)
                t0, c0 = time.perf_counter(), time.thread_time()
                out = m.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
                tokens[name] = out
                bar.update()
    unpatch_model(m)
    for name in ("rope (config)", "rope (liepos)"):  # the same model computes the same tokens
        if not torch.equal(tokens[name], tokens["upstream"]):
            raise AssertionError(f"{name}: greedy tokens differ from upstream's")
    return times, cpu


def profile(layers: int, prompt: int, steps: int = 20, top: int = 8) -> None:
    """Where a decode step's time goes: ``cProfile`` of ``steps`` one-token forwards after a prefill,
    per variant, the functions of largest own time in µs per layer and step (profiler overhead included)."""
    import cProfile
    import pstats

    m = model(layers)
    x = torch.randint(0, 512, (1, prompt), generator=torch.Generator().manual_seed(1))
    for name, enc in variants(HIDDEN // HEADS, HEADS).items():
        unpatch_model(m)
        if enc is not None:
            patch_model(m, None if enc == "config" else enc)
        with torch.no_grad():
            out = m(x, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(3):
                m(nxt, past_key_values=cache, use_cache=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(steps):
                m(nxt, past_key_values=cache, use_cache=True)
            prof.disable()
        stats = pstats.Stats(prof).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
        total = sum(v[2] for v in stats.values())
        rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
        per = 1e6 / (steps * layers)
        print(f"{name}: {total * per:.0f} µs per layer and step in all")
        for (file, _line, fn), v in rows:
            where = fn if file == "~" else f"{Path(file).name}:{fn}"
            print(f"    {v[2] * per:7.1f} µs  {v[1] / (steps * layers):5.1f} calls  {where}")
    unpatch_model(m)


def _table(results: dict, prompt: int, new: int, rounds: int) -> tuple[list[str], list[dict], bool]:
    """The printed table, the JSON rows, and whether every bound is met (on the CPU-time ratio)."""
    lines = [f"Llama {HIDDEN} wide, {HEADS} heads ({HEADS // 2} kv), prompt {prompt} + {new} new tokens, greedy, "
             f"1 thread; medians of {rounds} interleaved rounds (ratio: median of the per-round ratios; CPU: the "
             "thread's CPU time, wall: wall-clock)", "",
             "| layers | encoding | generate (wall) | vs upstream (wall) | vs upstream (CPU) | bound | met (CPU) | "
             "extra per layer and token (CPU) |", "|---|---|---|---|---|---|---|---|"]
    rows, ok = [], True
    for L, (times, cpu) in results.items():
        base = statistics.median(cpu["upstream"])
        for name, ts in times.items():
            # the median over rounds of the ratio to upstream in the same round (drift cancels within a round)
            ratio = statistics.median(t / u for t, u in zip(ts, times["upstream"]))
            ratio_cpu = statistics.median(t / u for t, u in zip(cpu[name], cpu["upstream"]))
            bound = BOUNDS.get(name)
            met = bound is None or ratio_cpu <= bound
            ok &= met
            extra = (statistics.median(cpu[name]) - base) / (L * new) * 1e6  # µs per layer and new token, prefill in
            rows.append({"layers": L, "encoding": name, "median_s": statistics.median(ts), "ratio": ratio,
                         "ratio_cpu": ratio_cpu, "bound": bound, "met_cpu": met, "met_wall": bound is None or
                         ratio <= bound, "extra_cpu_us_per_layer_token": extra, "times_s": ts, "cpu_s": cpu[name]})
            lines.append(f"| {L} | {name} | {statistics.median(ts) * 1e3:.1f} ms | {ratio:.3f}x | {ratio_cpu:.3f}x | "
                         f"{'' if bound is None else f'{bound:.2f}x'} | {'' if bound is None else met} | "
                         f"{'' if bound is None else f'{extra:.0f} µs'} |")
    return lines, rows, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 layers, a 64-token prompt, 3 rounds; writes nothing")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, --quick 3)")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer counts (default 4)")
    p.add_argument("--profile", action="store_true", help="where a decode step's time goes, per variant (cProfile)")
    args = p.parse_args(argv)
    if args.profile:
        torch.set_num_threads(1)
        profile((args.layers or [4])[0], 64 if args.quick else 512)
        return 0
    layer_counts = args.layers or ([2] if args.quick else [4])
    prompt, new = (64, 16) if args.quick else (512, 32)
    rounds = args.rounds or (3 if args.quick else 7)
    torch.set_num_threads(1)
    n_var = len(variants(HIDDEN // HEADS, HEADS))
    load = [os.getloadavg()[0]]  # the machine is shared: the 1-minute load average before and after
    with progress(rounds * n_var * len(layer_counts), "generate") as bar:
        results = {L: run(L, prompt, new, rounds, bar) for L in layer_counts}
    load.append(os.getloadavg()[0])
    lines, rows, ok = _table(results, prompt, new, rounds)
    lines.append(f"\n1-minute load average: {load[0]:.1f} before, {load[1]:.1f} after")
    print("\n".join(lines))
    if not args.quick:
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        meta = {"hidden": HIDDEN, "heads": HEADS, "prompt": prompt, "new": new, "rounds": rounds,
                "torch": torch.__version__, "load_average_1min": load,
                "command": " ".join(["python benchmarks/generate.py", *sys.argv[1:]])}
        (out / "generate.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        (out / "generate.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
