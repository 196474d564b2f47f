"""The sweep: every (encoding, seed) trained and evaluated once, resumable, summarised over seeds.

Each finished run writes ``runs/<encoding>-seed<S>.json``; a rerun with the same configuration skips
it, and a run interrupted mid-training continues from its last checkpoint
(``runs/<encoding>-seed<S>.ckpt.pt``, removed when the run finishes). Every run file records its
``provenance`` (:mod:`liepos.explore.provenance`). The summary (:func:`collect`) keeps the runs that
did not learn apart (``not_learned``) and gives every figure of the learned ones with its bootstrap
95 % interval over documents and seeds (:mod:`liepos.explore.stats`); ``delta`` is the paired
change from the training length. A run records its in-distribution figures (``in_distribution``: loss and accuracy at
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
from functools import partial
from typing import cast
from pathlib import Path

import numpy as np
import torch

from liepos.classification import classify
from liepos.explore.eval_scaling import scaling_transform
from liepos.explore.evaluate import EVAL_SEED, evaluate, evaluate_passkey
from liepos.explore.model import Block, Decoder, Transform
from liepos.explore.provenance import provenance
from liepos.explore.stats import binomial_interval, headline, interval
from liepos.explore.tasks import PasskeyTask, Task, TextTask, make_task
from liepos.explore.train import Dist, TrainConfig, temperature_record, train_run
from liepos.explore.usage import block_usage

__all__ = ["LEARNED_ACC", "METRICS", "RunFileError", "collect", "eval_docs", "learned", "refusal", "summarise", "sweep"]

# a synthetic task is learned when its accuracy at the training length reaches this (the study's bar)
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
    if isinstance(task, TextTask):  # the LM task
        return in_distribution["loss"] < task.unigram_entropy()
    return in_distribution["acc"] >= LEARNED_ACC


def refusal(model: Decoder, transform: Transform, length: int) -> str | None:
    """Why the map cannot apply to this model's encodings (no rotation block; a map's own refusal), or None."""
    # what forward() hands the map (Decoder.blocks holds Blocks; a ModuleList types its items Module)
    encs = [enc for blk in model.blocks for enc, _ in cast(Block, blk).canonical()]
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
    counts = dict.fromkeys(classify([[0.0]]).counts, 0)
    for g in final:
        for k, v in g["counts"].items():
            counts[k] += v
    return {"counts": counts, "final": final, "trajectory": rec["trajectory"]}


def eval_docs(cfg: TrainConfig) -> int:
    """Held-out documents of the longest length: ``eval_tokens`` tokens per length, at least 2."""
    return max(2, cfg.eval_tokens // max(cfg.eval_lens + [cfg.train_len]))


def _evaluate(model, task: Task, cfg: TrainConfig, lens: list, dist: Dist, transform=None) -> dict:
    if isinstance(task, PasskeyTask):
        return evaluate_passkey(model, task, lens, cfg.eval_tokens, cfg.train_len, dist.device, transform=transform)
    every = sorted(set(cfg.eval_lens) | {cfg.train_len})
    return evaluate(model, task, lens, eval_docs(cfg), cfg.train_len, dist.device, transform=transform,
                    reference=every)


def _one(cfg: TrainConfig, task: Task, enc: str, seed: int, dist: Dist, progress: bool, desc: str,
         checkpoint: Path | None = None, key: str | None = None, prov: dict | None = None) -> tuple:
    model, rec = train_run(cfg, task, enc, seed, dist, progress, desc=desc, checkpoint=checkpoint, key=key)
    t0 = time.time()
    lens = sorted(set(cfg.eval_lens) | {cfg.train_len})  # the training length always: in-distribution figures
    ev = _evaluate(model, task, cfg, lens, dist)
    longer = [L for L in cfg.eval_lens if L > cfg.train_len]
    scaled: dict = {}
    for s in cfg.eval_scaling if longer else []:
        transform = scaling_transform(s, cfg.train_len)
        why = refusal(model, transform, longer[-1])
        scaled[s] = {"not_applied": why} if why else _evaluate(model, task, cfg, longer, dist, transform)
    ind = {k: ev[str(cfg.train_len)][k] for k in ("loss", "acc")}
    probe, _ = task.sample(torch.Generator().manual_seed(EVAL_SEED), 8, cfg.train_len, "eval")  # (8, T)
    result = {
        "encoding": str(enc), "seed": seed, "parameters": model.num_parameters(), "world_size": dist.world,
        "train_seconds": rec["seconds"], "eval_seconds": time.time() - t0, "resumed_at_step": rec["resumed_at"],
        "final_train_loss": rec["train_loss"][-1], "train_loss": rec["train_loss"], "diverged": rec["diverged"],
        "in_distribution": ind, "learned": learned(task, ind), "eval": ev, "eval_scaled": scaled,
        "learned_generator": _learned_generator(rec), "learned_temperature": temperature_record(model) or None,
        "torch": torch.__version__, "provenance": prov or provenance(),
        "block_usage": block_usage(model, probe.to(dist.device)),
    }
    return model, result


def sweep(
    cfg: TrainConfig, encodings: list, seeds: list, out: str | Path, device: str = "auto",
    progress: bool = True, save_model: bool = False, log=None, arguments: list | None = None,
) -> dict:
    """Train and evaluate every (encoding, seed); skip finished runs; write the reports. Returns results."""
    from liepos.explore.report import write_reports

    out = Path(out)
    log = log or (lambda *a: print(*a, flush=True))
    dist = Dist(device)
    try:
        if cfg.task != "lm" and cfg.text_file:
            raise ValueError("--text-file only applies to --task lm")
        task = make_task(cfg.task, cfg.text_file, cfg.corpus)
        info = task.describe()
        if dist.main:
            (out / "runs").mkdir(parents=True, exist_ok=True)
        total, i, t_start = len(encodings) * len(seeds), 0, time.time()
        prov = provenance(arguments)  # at the start: the commit whose code this process runs
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
                ckpt = path.with_name(path.stem + ".ckpt.pt")
                model, result = _one(cfg, task, enc, seed, dist, progress, f"[{i}/{total}] {enc} s{seed}", ckpt, key,
                                     prov)
                result = {"key": key, "task": info, "config": asdict(cfg), **result}
                if dist.main:
                    if save_model:
                        torch.save(model.state_dict(), path.with_suffix(".pt"))
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(result, indent=1))
                    tmp.replace(path)  # atomic: an interrupted run never leaves a half-written result
                    ckpt.unlink(missing_ok=True)
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


def _paired(cells: list[dict], refs: list[dict]) -> dict:
    """Loss and accuracy with intervals, and the paired change from the reference (training) length."""
    n = np.asarray(cells[0]["doc_tokens"], dtype=np.float64)
    loss = np.array([c["doc_loss"] for c in cells], dtype=np.float64)  # (seeds, docs)
    corr = np.array([c["doc_correct"] for c in cells], dtype=np.float64)
    loss0 = np.array([c["doc_loss"] for c in refs], dtype=np.float64)
    corr0 = np.array([c["doc_correct"] for c in refs], dtype=np.float64)
    pos = [c["by_position"] for c in cells]
    return {"loss": interval(loss, n), "acc": interval(corr, n), "delta": interval(loss - loss0, n),
            "acc_delta": interval(corr - corr0, n),
            "loss_tail": float(np.mean([c["loss_tail"] for c in cells])),
            "by_position": {k: float(np.mean([p[k] for p in pos])) for k in pos[0]}}


def _passkey(cells: list[dict], refs: list[dict]) -> dict:
    acc = binomial_interval([c["acc"] * c["tokens_scored"] for c in cells], [c["tokens_scored"] for c in cells]) \
        if all(not c["diverged"] for c in cells) else (float("nan"),) * 3
    one = np.ones(1)  # the probes' loss is one figure per seed: the interval resamples the seeds
    return {"loss": interval([[c["loss"]] for c in cells], one), "acc": acc,
            "delta": interval([[c["loss"] - r["loss"]] for c, r in zip(cells, refs)], one),
            "acc_tail": float(np.mean([c["acc_tail"] for c in cells]))}


def _by_distance(rs: list[dict], source, lens: list[int]) -> dict:
    """Passkey accuracy by distance bucket, pooled over the lengths, with its interval over seeds and probes."""
    out: dict = {}
    labels: list[str] = []
    for L in lens:
        for lab in (source(rs[0], L) or {}).get("by_distance", {}):
            if lab not in labels:
                labels.append(lab)
    for lab in labels:
        c = [sum(source(r, L)["by_distance"].get(lab, [0, 0])[0] for L in lens if source(r, L)) for r in rs]
        n = [sum(source(r, L)["by_distance"].get(lab, [0, 0])[1] for L in lens if source(r, L)) for r in rs]
        out[lab] = binomial_interval(c, n) + (int(sum(n)),)
    return out


def _row(rs: list[dict], cfg: dict, source) -> dict:
    """The learned runs' figures per length (intervals over documents and seeds); the others apart."""
    T = cfg["train_len"]
    ok = [r for r in rs if r["learned"]]
    row: dict = {}
    for L in cfg["eval_lens"]:
        cells = [source(r, L) for r in ok]
        if not cells or any(c is None for c in cells):
            continue
        refs = [r["eval"][str(T)] for r in ok]
        entry = {"diverged": sum(bool(c.get("diverged")) for c in cells), "seeds": len(cells)}
        entry |= _paired(cells, refs) if "doc_loss" in cells[0] else _passkey(cells, refs)
        row[str(L)] = entry
    out = {"lengths": row, "learned": len(ok), "seeds": len(rs),
           "learned_seeds": [r["seed"] for r in ok], "not_learned": {
               str(r["seed"]): {"in_distribution": r["in_distribution"],
                                "far": (source(r, headline(cfg)) or {}).get("loss")} for r in rs if not r["learned"]},
           "in_acc": float(np.mean([r["in_distribution"]["acc"] for r in ok])) if ok else float("nan"),
           "diverged_in_training": sum(r["diverged"] is not None for r in rs),
           "train_seconds": sum(r["train_seconds"] for r in rs) / len(rs), "dominant": _dominant(rs)}
    if ok and "by_distance" in (source(ok[0], max(cfg["eval_lens"])) or {}):
        out["by_distance"] = _by_distance(ok, source, cfg["eval_lens"])
    return out


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
    return summarise(asdict(cfg), [str(e) for e in encodings], list(seeds), info, runs)


def _scaled_cell(name: str, r: dict, L: int) -> dict | None:
    """The cell of map ``name`` at length ``L`` (the plain one up to the training length)."""
    return r["eval_scaled"][name].get(str(L), r["eval"].get(str(L)))


def summarise(cfg: dict, encodings: list[str], seeds: list[int], info: dict, runs: list[dict]) -> dict:
    """The results dict of finished runs: config, runs and the summary (a row per encoding and map)."""
    summary: dict = {}
    for enc in encodings:
        rs = [r for r in runs if r["encoding"] == enc]
        summary[enc] = _row(rs, cfg, lambda r, L: r["eval"].get(str(L))) | {"base": enc, "scaling": None}
        for s in cfg["eval_scaling"]:
            if all("not_applied" not in r["eval_scaled"].get(s, {"not_applied": ""}) for r in rs):
                src = partial(_scaled_cell, s)
                summary[f"{enc} @{s}"] = _row(rs, cfg, src) | {"base": enc, "scaling": s}
    return {
        "config": cfg, "encodings": encodings, "seeds": seeds, "task": info,
        "summary": summary, "runs": runs,
        "train_seconds_total": sum(r["train_seconds"] + r["eval_seconds"] for r in runs),
    }
