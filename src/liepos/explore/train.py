"""Training, evaluation ("train short, test long"), the sweep, resume and the reports.

One run = (task, encoding, seed): train at ``train_len`` for ``steps`` steps, then evaluate loss and
accuracy at every length in ``eval_lens`` on fixed evaluation batches. Each finished run writes
``runs/<encoding>-seed<S>.json``; a rerun with the same configuration skips it (resume).

Distributed: under ``torchrun`` (``WORLD_SIZE`` > 1) the same code wraps the model in
DistributedDataParallel (gloo on CPU, NCCL on GPU). Every rank draws the same *global* batch from
the step's generator and keeps its contiguous slice; the loss is ``Σ token losses / global count ×
world`` so DDP's gradient average equals the single-process gradient of the global batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as Fn

from liepos.explore.model import Decoder, ModelConfig
from liepos.explore.tasks import IGNORE, Task, make_task

__all__ = ["TrainConfig", "train_run", "evaluate", "sweep", "Dist", "write_reports", "EVAL_SEED"]

EVAL_SEED = 1234  # evaluation batches are the same for every encoding and training seed


@dataclass
class TrainConfig:
    task: str = "lm"
    text_file: str | None = None
    train_len: int = 64
    eval_lens: list = field(default_factory=lambda: [64, 128, 256, 512, 1024])
    steps: int = 1000
    batch_size: int = 32  # global batch (split across ranks)
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 50
    eval_tokens: int = 32768  # tokens per evaluation length
    d_model: int = 128
    layers: int = 5
    heads: int = 4

    def key(self, encoding: str, seed: int, task_info: dict) -> str:
        d = asdict(self) | {"encoding": encoding, "seed": seed, "data": task_info.get("sha256", task_info)}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- distributed
class Dist:
    """The process group, if any: ``rank``, ``world``, ``device``; set up from torchrun's environment."""

    def __init__(self, device: str = "auto") -> None:
        import torch.distributed as dist

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = torch.device(device)
        self.owned = False
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            self.owned = True
        if dist.is_available() and dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if self.owned and dist.is_initialized():
            dist.destroy_process_group()


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar, or a plain-print fallback when tqdm is missing (or a silent one off rank 0)."""

    class Plain:
        def __init__(self) -> None:
            self.n, self.t0, self.post = 0, time.time(), ""
            if enabled:
                print(f"{desc}: 0/{total}", flush=True)

        def update(self, k: int = 1) -> None:
            self.n += k
            if enabled and (self.n == total or self.n % max(1, total // 10) == 0):
                print(f"{desc}: {self.n}/{total} {self.post} ({time.time() - self.t0:.0f}s)", flush=True)

        def set_postfix_str(self, s: str) -> None:
            self.post = s

        def close(self) -> None:
            pass

    if not enabled:
        p = Plain()
        return p
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return Plain()
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


# ---------------------------------------------------------------------- training
def _loss(logits: torch.Tensor, y: torch.Tensor, count: int, world: int) -> torch.Tensor:
    """Σ token losses / global count × world (DDP averages over ranks → the global mean)."""
    total = Fn.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE, reduction="sum")
    return total * (world / max(count, 1))


def _lr(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def build_model(cfg: TrainConfig, task: Task, encoding, seed: int) -> Decoder:
    torch.manual_seed(seed)
    mc = ModelConfig(vocab_size=task.vocab_size, d_model=cfg.d_model, layers=cfg.layers, heads=cfg.heads)
    return Decoder(mc, encoding)


def train_run(
    cfg: TrainConfig, task: Task, encoding, seed: int, dist: Dist | None = None, progress: bool = True,
    desc: str = "",
) -> tuple[Decoder, dict]:
    """Train one model; return it (unwrapped) and ``{"train_loss": [...], "seconds": ...}``."""
    dist = dist or Dist("cpu")
    model = build_model(cfg, task, encoding, seed).to(dist.device)
    net = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        if cfg.batch_size % dist.world:
            raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the world size {dist.world}")
        net = DDP(model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    per = cfg.batch_size // dist.world
    lo = dist.rank * per
    bar = _progress(cfg.steps, desc or str(encoding), progress and dist.main)
    losses, t0 = [], time.time()
    for step in range(cfg.steps):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x, y = task.sample(g, cfg.batch_size, cfg.train_len, "train")  # the global batch, same on every rank
        count = int((y != IGNORE).sum())
        x, y = x[lo : lo + per].to(dist.device), y[lo : lo + per].to(dist.device)  # this rank's slice
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = _loss(net(x), y, count, dist.world)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # the global mean loss, for the record (all-reduced so every rank logs the same number)
        val = loss.detach() / dist.world
        if dist.world > 1:
            import torch.distributed as tdist

            tdist.all_reduce(val)
        losses.append(float(val))
        bar.update(1)
        if step % 10 == 0 or step == cfg.steps - 1:
            bar.set_postfix_str(f"loss {losses[-1]:.3f}")
    bar.close()
    return model, {"train_loss": losses, "seconds": time.time() - t0}


@torch.no_grad()
def evaluate(model: Decoder, task: Task, lengths, eval_tokens: int, device=None, batch_tokens: int = 16384) -> dict:
    """Loss and accuracy at every length, on fixed batches (``EVAL_SEED``).

    ``loss``/``acc``: over every scored position; ``loss_tail``/``acc_tail``: over the last quarter
    of each sequence, where the distance from the start is largest.
    """
    model.eval()
    device = device or next(model.parameters()).device
    out = {}
    for L in lengths:
        n = max(2, eval_tokens // L)
        g = torch.Generator().manual_seed(EVAL_SEED + L)
        x, y = task.sample(g, n, L, "eval")
        sums = torch.zeros(4, dtype=torch.float64)  # loss, correct, count, (tail: loss, correct, count)
        tail = torch.zeros(3, dtype=torch.float64)
        per = max(1, batch_tokens // L)
        for i in range(0, n, per):
            xb, yb = x[i : i + per].to(device), y[i : i + per].to(device)
            logits = model(xb).float()
            ce = Fn.cross_entropy(logits.flatten(0, 1), yb.flatten(), ignore_index=IGNORE, reduction="none").view_as(yb)
            ok = (logits.argmax(-1) == yb) & (yb != IGNORE)
            m = yb != IGNORE
            sums[0] += float(ce[m].double().sum()); sums[1] += float(ok.sum()); sums[2] += float(m.sum())
            t = slice(L - L // 4, L)
            mt = m[:, t]
            tail[0] += float(ce[:, t][mt].double().sum()); tail[1] += float(ok[:, t].sum()); tail[2] += float(mt.sum())
        out[str(L)] = {
            "loss": float(sums[0] / sums[2]), "acc": float(sums[1] / sums[2]),
            "loss_tail": float(tail[0] / max(tail[2], 1)), "acc_tail": float(tail[1] / max(tail[2], 1)),
            "sequences": n, "tokens_scored": int(sums[2]),
        }
    model.train()
    return out


# ---------------------------------------------------------------------- the sweep
def _safe(name: str) -> str:
    return name.replace("|", "_or_").replace("+", "_plus_").replace("/", "_")


def sweep(
    cfg: TrainConfig, encodings: list, seeds: list, out: str | Path, device: str = "auto",
    progress: bool = True, save_model: bool = False, log=None,
) -> dict:
    """Train and evaluate every (encoding, seed); skip finished runs; write the reports. Returns results."""
    out = Path(out)
    log = log or (lambda *a: print(*a, flush=True))
    dist = Dist(device)
    try:
        if cfg.task != "lm" and cfg.text_file:
            raise ValueError("--text-file only applies to --task lm")
        task = make_task(cfg.task, cfg.text_file)
        info = task.describe()
        runs_dir = out / "runs"
        if dist.main:
            runs_dir.mkdir(parents=True, exist_ok=True)
        total = len(encodings) * len(seeds)
        i = 0
        t_start = time.time()
        for enc in encodings:
            for seed in seeds:
                i += 1
                path = runs_dir / f"{_safe(str(enc))}-seed{seed}.json"
                key = cfg.key(str(enc), seed, info)
                if path.exists():
                    try:
                        done = json.loads(path.read_text())
                    except (OSError, json.JSONDecodeError):
                        done = {}
                    if done.get("key") == key:
                        if dist.main:
                            log(f"[{i}/{total}] {enc} seed {seed}: finished earlier, skipped ({path})")
                        continue
                model, rec = train_run(cfg, task, enc, seed, dist, progress, desc=f"[{i}/{total}] {enc} s{seed}")
                t0 = time.time()
                ev = evaluate(model, task, cfg.eval_lens, cfg.eval_tokens, dist.device)
                result = {
                    "key": key, "encoding": str(enc), "seed": seed, "task": info, "config": asdict(cfg),
                    "parameters": model.num_parameters(), "world_size": dist.world,
                    "train_seconds": rec["seconds"], "eval_seconds": time.time() - t0,
                    "final_train_loss": rec["train_loss"][-1], "train_loss": rec["train_loss"], "eval": ev,
                    "torch": torch.__version__,
                }
                if dist.main:
                    if save_model:
                        torch.save(model.state_dict(), path.with_suffix(".pt"))
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(result, indent=1))
                    tmp.replace(path)  # atomic: an interrupted run never leaves a half-written result
                    short = "  ".join(f"{L}:{ev[str(L)]['loss']:.3f}" for L in cfg.eval_lens)
                    log(f"[{i}/{total}] {enc} seed {seed}: {rec['seconds']:.0f}s, eval loss {short}")
                dist.barrier()
        results = None
        if dist.main:
            results = collect(out, cfg, encodings, seeds, info)
            results["wall_seconds_this_invocation"] = time.time() - t_start
            write_reports(results, out, log=log)
        return results or {}
    finally:
        dist.close()


def collect(out: Path, cfg: TrainConfig, encodings, seeds, info) -> dict:
    runs = []
    for enc in encodings:
        for seed in seeds:
            p = Path(out) / "runs" / f"{_safe(str(enc))}-seed{seed}.json"
            r = json.loads(p.read_text())
            r.pop("train_loss", None)
            runs.append(r)
    summary: dict = {}
    for enc in encodings:
        rs = [r for r in runs if r["encoding"] == str(enc)]
        row = {}
        for L in cfg.eval_lens:
            for metric in ("loss", "acc", "loss_tail", "acc_tail"):
                v = torch.tensor([r["eval"][str(L)][metric] for r in rs], dtype=torch.float64)
                row.setdefault(str(L), {})[metric] = float(v.mean())
                row[str(L)][metric + "_std"] = float(v.std()) if len(v) > 1 else 0.0
        summary[str(enc)] = row
    return {
        "config": asdict(cfg), "encodings": [str(e) for e in encodings], "seeds": list(seeds), "task": info,
        "summary": summary, "runs": runs,
        "train_seconds_total": sum(r["train_seconds"] + r["eval_seconds"] for r in runs),
    }


def table(results: dict, metric: str = "loss") -> str:
    cfg = results["config"]
    lens = cfg["eval_lens"]
    head = "| encoding | " + " | ".join(f"{L}{'*' if L == cfg['train_len'] else ''}" for L in lens) + " |"
    rows = [head, "|" + "---|" * (len(lens) + 1)]
    many = len(results["seeds"]) > 1
    for enc, row in results["summary"].items():
        cells = []
        for L in lens:
            m, s = row[str(L)][metric], row[str(L)][metric + "_std"]
            cells.append(f"{m:.3f} ± {s:.3f}" if many else f"{m:.3f}")
        rows.append(f"| {enc} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_reports(results: dict, out: Path, log=print) -> None:
    out = Path(out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    cfg = results["config"]
    text = [
        f"# liepos explore: task {cfg['task']}, train length {cfg['train_len']} (* marks it), "
        f"{cfg['steps']} steps, seeds {results['seeds']}",
        "", "## eval loss (nats/token, all positions)", "", table(results, "loss"),
        "", "## eval accuracy (all positions)", "", table(results, "acc"),
        "", "## eval loss, last quarter of each sequence", "", table(results, "loss_tail"), "",
    ]
    (out / "table.md").write_text("\n".join(text))
    log("\n".join(text[2:5]))
    try:
        plot(results, out / "loss_vs_length.png")
        log(f"wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'loss_vs_length.png'}")
    except ImportError:
        log(f"wrote {out / 'table.md'}, {out / 'results.json'} (matplotlib missing: no plot)")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    lens = cfg["eval_lens"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in ((axes[0], "loss", "eval loss (all positions)"), (axes[1], "loss_tail", "eval loss (last quarter)")):
        for enc, row in results["summary"].items():
            m = [row[str(L)][metric] for L in lens]
            s = [row[str(L)][metric + "_std"] for L in lens]
            ax.errorbar(lens, m, yerr=s, marker="o", capsize=3, label=enc)
        ax.axvline(cfg["train_len"], color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(label)
        ax.set_title(f"{cfg['task']}: train {cfg['train_len']}, {cfg['steps']} steps")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
