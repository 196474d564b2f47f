"""The sweep: every (encoding, seed) trained and evaluated once, resumable, summarised over seeds.

Each finished run writes ``runs/<encoding>-seed<S>.json``; a rerun with the same configuration skips
it (resume). A run records its in-distribution figures (``in_distribution``: loss and accuracy at
the training length) and whether it ``learned`` the task there (:func:`learned`), so the table never
reports extrapolation of a task that was not learned without saying so. With ``eval_scaling`` every
encoding that has rotation blocks is evaluated again past the training length with each map
(``eval_scaled``); with learned generators the run has ``learned_generator`` (the final blocks, the
six rows' ``counts`` summed over the model, and the ``trajectory`` of snapshots).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

import liepos as lp
from liepos.encoding import Encoding
from liepos.explore.eval_scaling import scaling_transform
from liepos.explore.model import Decoder, Transform
from liepos.explore.tasks import Task, make_task
from liepos.explore.train import Dist, TrainConfig, evaluate, train_run

__all__ = ["sweep", "collect", "learned", "LEARNED_ACC", "METRICS"]

# a synthetic task is learned when its accuracy at the training length reaches this (issue 15's bar)
LEARNED_ACC = 0.9
METRICS = ("loss", "acc", "loss_tail", "acc_tail")


class RunFileError(ValueError):
    """A file at a run's path that is not a run's result (resuming would misread it)."""


def learned(task: Task, in_distribution: dict) -> bool:
    """Whether a run learned its task in distribution.

    A synthetic task: accuracy ≥ :data:`LEARNED_ACC` at the training length. The LM: its loss there
    beats the best context-free predictor, the byte frequencies of the training text (their entropy).
    """
    if not math.isfinite(in_distribution["loss"]):
        return False
    if task.name == "lm":
        return in_distribution["loss"] < task.unigram_entropy()
    return in_distribution["acc"] >= LEARNED_ACC


def _refusal(model: Decoder, transform: Transform, length: int) -> str | None:
    """Why the map cannot apply to this model's encodings (no rotation block; a map's own refusal), or None."""
    encs = [m.canonical()[0] for blk in model.blocks for m in blk.encoders]  # what forward() hands the map
    if not any(any(enc.generator.complex) for enc in encs):
        return "no rotation block"
    try:
        for enc in encs:
            transform(enc, length)
    except ValueError as err:  # e.g. yarn on a learned, non-geometric spectrum: it needs a base
        return str(err)
    return None


def _safe(name: str) -> str:
    return (name.replace("|", "_or_").replace("+", "_plus_").replace("/", "_").replace(":", "_")
            .replace("=", "-"))


def run_path(out: Path, enc: str, seed: int) -> Path:
    return Path(out) / "runs" / f"{_safe(str(enc))}-seed{seed}.json"


def _learned_generator(rec: dict) -> dict | None:
    if not rec["trajectory"]:
        return None
    final = rec["trajectory"][-1]["generators"]
    counts = dict.fromkeys(lp.classify([[0.0]]).counts, 0)
    for g in final:
        for k, v in g["counts"].items():
            counts[k] += v
    return {"counts": counts, "final": final, "trajectory": rec["trajectory"]}


def _one(cfg: TrainConfig, task: Task, enc: str, seed: int, dist: Dist, progress: bool, desc: str) -> tuple:
    model, rec = train_run(cfg, task, enc, seed, dist, progress, desc=desc)
    t0 = time.time()
    lens = sorted(set(cfg.eval_lens) | {cfg.train_len})  # the training length always: in-distribution figures
    ev = evaluate(model, task, lens, cfg.eval_tokens, dist.device)
    longer = [L for L in cfg.eval_lens if L > cfg.train_len]
    scaled: dict = {}
    for s in cfg.eval_scaling if longer else []:
        transform = scaling_transform(s, cfg.train_len)
        why = _refusal(model, transform, longer[-1])
        scaled[s] = {"not_applied": why} if why else evaluate(model, task, longer, cfg.eval_tokens, dist.device,
                                                              transform=transform)
    ind = {k: ev[str(cfg.train_len)][k] for k in ("loss", "acc")}
    result = {
        "encoding": str(enc), "seed": seed, "parameters": model.num_parameters(), "world_size": dist.world,
        "train_seconds": rec["seconds"], "eval_seconds": time.time() - t0,
        "final_train_loss": rec["train_loss"][-1], "train_loss": rec["train_loss"], "diverged": rec["diverged"],
        "in_distribution": ind, "learned": learned(task, ind), "eval": ev, "eval_scaled": scaled,
        "learned_generator": _learned_generator(rec), "torch": torch.__version__,
    }
    return model, result


def sweep(
    cfg: TrainConfig, encodings: list, seeds: list, out: str | Path, device: str = "auto",
    progress: bool = True, save_model: bool = False, log=None,
) -> dict:
    """Train and evaluate every (encoding, seed); skip finished runs; write the reports. Returns results."""
    from liepos.explore.report import write_reports

    out = Path(out)
    log = log or (lambda *a: print(*a, flush=True))
    dist = Dist(device)
    try:
        if cfg.task != "lm" and cfg.text_file:
            raise ValueError("--text-file only applies to --task lm")
        task = make_task(cfg.task, cfg.text_file)
        info = task.describe()
        if dist.main:
            (out / "runs").mkdir(parents=True, exist_ok=True)
        total, i, t_start = len(encodings) * len(seeds), 0, time.time()
        for enc in encodings:
            for seed in seeds:
                i += 1
                path, key = run_path(out, enc, seed), cfg.key(str(enc), seed, info)
                if path.exists():
                    try:
                        done = json.loads(path.read_text())
                    except (OSError, json.JSONDecodeError):
                        done = {}
                    if not isinstance(done, dict):  # valid JSON, but not a run's result
                        raise RunFileError(f"{path} holds a JSON {type(done).__name__}, not a run's result (an object): "
                                         f"remove it to run {enc} seed {seed} again, or pass another output directory")
                    if done.get("key") == key:
                        if dist.main:
                            log(f"[{i}/{total}] {enc} seed {seed}: finished earlier, skipped ({path})")
                        continue
                model, result = _one(cfg, task, enc, seed, dist, progress, f"[{i}/{total}] {enc} s{seed}")
                result = {"key": key, "task": info, "config": asdict(cfg), **result}
                if dist.main:
                    if save_model:
                        torch.save(model.state_dict(), path.with_suffix(".pt"))
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(result, indent=1))
                    tmp.replace(path)  # atomic: an interrupted run never leaves a half-written result
                    ev = result["eval"]
                    short = "  ".join(f"{L}:{ev[str(L)]['loss']:.3f}" for L in cfg.eval_lens)
                    mark = "" if result["learned"] else " (NOT LEARNED in distribution)"
                    log(f"[{i}/{total}] {enc} seed {seed}: {result['train_seconds']:.0f}s, "
                        f"acc@{cfg.train_len} {result['in_distribution']['acc']:.3f}{mark}, eval loss {short}")
                dist.barrier()
        results = None
        if dist.main:
            results = collect(out, cfg, encodings, seeds, info)
            results["wall_seconds_this_invocation"] = time.time() - t_start
            write_reports(results, out, log=log)
        return results or {}
    finally:
        dist.close()


def _stats(values: list[float]) -> tuple[float, float]:
    v = torch.tensor(values, dtype=torch.float64)
    return float(v.mean()), (float(v.std()) if len(v) > 1 else 0.0)


def _row(rs: list[dict], lens: list[int], source) -> dict:
    row = {}
    for L in lens:
        cells = [source(r, L) for r in rs]
        cells = [c for c in cells if c is not None]
        if not cells:
            continue
        entry = {"diverged": sum(bool(c.get("diverged")) for c in cells), "seeds": len(cells)}
        for metric in METRICS:
            entry[metric], entry[metric + "_std"] = _stats([c[metric] for c in cells])
        row[str(L)] = entry
    acc, acc_std = _stats([r["in_distribution"]["acc"] for r in rs])
    return {"lengths": row, "in_acc": acc, "in_acc_std": acc_std, "learned": sum(r["learned"] for r in rs),
            "seeds": len(rs), "diverged_in_training": sum(r["diverged"] is not None for r in rs),
            "train_seconds": sum(r["train_seconds"] for r in rs) / len(rs),
            "dominant": _dominant(rs)}


def _dominant(rs: list[dict]) -> str | None:
    """The row most blocks of the (final, for learned generators) encoding belong to."""
    lg = rs[0].get("learned_generator")
    if lg:
        counts = lg["counts"]
        return max(counts, key=counts.get)
    return None


def collect(out: Path, cfg: TrainConfig, encodings, seeds, info) -> dict:
    """Every finished run of the sweep and the summary over seeds (a row per encoding and scaling map)."""
    runs = []
    for enc in encodings:
        for seed in seeds:
            r = json.loads(run_path(out, enc, seed).read_text())
            r.pop("train_loss", None)
            runs.append(r)
    summary: dict = {}
    for enc in encodings:
        rs = [r for r in runs if r["encoding"] == str(enc)]
        summary[str(enc)] = _row(rs, cfg.eval_lens, lambda r, L: r["eval"][str(L)]) | {"base": str(enc), "scaling": None}
        for s in cfg.eval_scaling:
            if all("not_applied" not in r["eval_scaled"].get(s, {"not_applied": ""}) for r in rs):
                src = (lambda s_: lambda r, L: r["eval_scaled"][s_].get(str(L), r["eval"][str(L)]))(s)
                summary[f"{enc} @{s}"] = _row(rs, cfg.eval_lens, src) | {"base": str(enc), "scaling": s}
    return {
        "config": asdict(cfg), "encodings": [str(e) for e in encodings], "seeds": list(seeds), "task": info,
        "summary": summary, "runs": runs,
        "train_seconds_total": sum(r["train_seconds"] + r["eval_seconds"] for r in runs),
    }
