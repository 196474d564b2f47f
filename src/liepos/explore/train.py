"""Training and evaluation ("train short, test long") of one run, on one process or under torchrun.

One run = (task, encoding, seed): train at ``train_len`` for ``steps`` steps, then evaluate loss and
accuracy at every length in ``eval_lens`` on fixed evaluation batches (and, with ``eval_scaling``,
again with each context-extension map applied past the training length).

Distributed: under ``torchrun`` (``WORLD_SIZE`` > 1) the same code wraps the model in
DistributedDataParallel (gloo on CPU, NCCL on GPU). Every step's global batch is cut into
``micro_batches`` equal slices whatever the world size; each rank takes a contiguous share of the
slices, sums their gradients locally (``no_sync``) and DDP adds the ranks' sums. One process does
the same slices in the same order, so with 1 or 2 processes the gradient is the same sum of the same
float32 slice gradients, bit for bit: ``g₀ + g₁`` either way (IEEE addition is commutative).
Without the slices a batch of 16 on one process and two of 8 round differently (the GEMMs sum in
another order), and training amplifies that rounding (0.03 in jordan3's loss after 40 steps at lr 1e-2).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as Fn

from liepos._progress import progress as make_progress
from liepos.explore.learned import LearnedGenerator, snapshot
from liepos.explore.model import Decoder, ModelConfig, Transform
from liepos.explore.tasks import IGNORE, Task

__all__ = ["TrainConfig", "train_run", "evaluate", "Dist", "EVAL_SEED", "build_model", "learned_record",
           "NEGLIGIBLE"]

EVAL_SEED = 1234  # evaluation batches are the same for every encoding and training seed
# a rate or frequency whose effect over the longest evaluation length is below this is zero when the
# learned blocks are classified: |λ|·L < 0.05 keeps e^{λL} > 0.95, ω·L < 0.05 turns less than 3°
NEGLIGIBLE = 0.05


@dataclass
class TrainConfig:
    task: str = "lm"
    text_file: str | None = None
    train_len: int = 64
    eval_lens: list = field(default_factory=lambda: [64, 128, 256, 512, 1024])
    steps: int = 1000
    batch_size: int = 32  # global batch (split into micro_batches, shared by the ranks)
    micro_batches: int = 2
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 50
    eval_tokens: int = 32768  # tokens per evaluation length
    d_model: int = 128
    layers: int = 5
    heads: int = 4
    eval_scaling: list = field(default_factory=list)  # context-extension maps applied past train_len
    snapshots: int = 4  # learned-generator snapshots over training (besides the start)

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


def learned_record(model: Decoder, tol: float) -> list[dict]:
    """One :func:`~liepos.explore.learned.snapshot` per learned generator (layer, head group, part)."""
    out = []
    for li, blk in enumerate(model.blocks):
        for gi, enc in enumerate(blk.encoders):
            for m in enc.modules():
                if isinstance(m, LearnedGenerator):
                    out.append({"layer": li, "group": gi, "start": m.name, **snapshot(m, tol)})
    return out


def _optimizer(model: Decoder, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on the linear layers' weights only (never on embeddings, norms or generators)."""
    decay = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    ids = {id(p) for p in decay}
    other = [p for p in model.parameters() if id(p) not in ids]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )


def train_run(
    cfg: TrainConfig, task: Task, encoding, seed: int, dist: Dist | None = None, progress: bool = True,
    desc: str = "",
) -> tuple[Decoder, dict]:
    """Train one model; return it (unwrapped) and its record.

    The record: ``train_loss`` per step, ``seconds``, ``diverged`` (the step whose loss was not finite,
    training stops there; ``None`` when it never happened) and ``trajectory`` (learned-generator
    snapshots, empty when nothing is learned)."""
    import contextlib

    dist = dist or Dist("cpu")
    model = build_model(cfg, task, encoding, seed).to(dist.device)
    net = model
    mb = cfg.micro_batches
    if mb % dist.world or cfg.batch_size % mb:
        raise ValueError(f"batch_size {cfg.batch_size} must split into micro_batches {mb}, and those over "
                         f"the world size {dist.world}")
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)
    opt = _optimizer(model, cfg)
    size = cfg.batch_size // mb
    mine = range(dist.rank * (mb // dist.world), (dist.rank + 1) * (mb // dist.world))  # this rank's slices
    tol = NEGLIGIBLE / max(cfg.eval_lens)
    every = max(1, cfg.steps // max(1, cfg.snapshots))
    trajectory = [{"step": 0, "generators": learned_record(model, tol)}]
    chunk = max(1, cfg.steps // 10)
    bar = make_progress(cfg.steps, desc or str(encoding), enabled=progress and dist.main)
    losses, diverged, t0 = [], None, time.time()
    for step in range(cfg.steps):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x, y = task.sample(g, cfg.batch_size, cfg.train_len, "train")  # the global batch, same on every rank
        count = int((y != IGNORE).sum())
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        opt.zero_grad(set_to_none=True)
        val = torch.zeros((), device=dist.device)
        for j, i in enumerate(mine):
            xs = x[i * size : (i + 1) * size].to(dist.device)  # slice i of the global batch
            ys = y[i * size : (i + 1) * size].to(dist.device)
            last = j == len(mine) - 1
            sync = contextlib.nullcontext() if last or dist.world == 1 else net.no_sync()
            with sync:
                loss = _loss(net(xs), ys, count, dist.world)
                loss.backward()
            val = val + loss.detach() / dist.world
        if dist.world > 1:
            import torch.distributed as tdist

            tdist.all_reduce(val)  # the global mean loss, the same number on every rank
        losses.append(float(val))
        if not math.isfinite(losses[-1]):
            diverged = step
            break
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % chunk == 0 or step == cfg.steps - 1:  # ten progress lines per run in a log
            bar.postfix(f"loss {losses[-1]:.3f}")
            bar.update(step + 1 - bar.n)
        if (step + 1) % every == 0 and trajectory[0]["generators"]:
            trajectory.append({"step": step + 1, "generators": learned_record(model, tol)})
    bar.close()
    return model, {"train_loss": losses, "seconds": time.time() - t0, "diverged": diverged,
                   "trajectory": trajectory if trajectory[0]["generators"] else []}


@torch.no_grad()
def evaluate(
    model: Decoder, task: Task, lengths, eval_tokens: int, device=None, batch_tokens: int = 16384,
    transform: Transform | None = None,
) -> dict:
    """Loss and accuracy at every length, on fixed batches (``EVAL_SEED``).

    ``loss``/``acc``: over every scored position; ``loss_tail``/``acc_tail``: over the last quarter
    of each sequence, where the distance from the start is largest. A length whose forward pass
    overflows (growth at long lags) or gives a non-finite loss is recorded with ``diverged: true``
    and NaN figures. ``transform(enc, length)`` changes every encoding (a scaling map).
    """
    model.eval()
    device = device or next(model.parameters()).device
    out = {}
    for L in lengths:
        n = max(2, eval_tokens // L)
        g = torch.Generator().manual_seed(EVAL_SEED + L)
        x, y = task.sample(g, n, L, "eval")
        sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, count
        tail = torch.zeros(3, dtype=torch.float64)  # the same over the last quarter
        per = max(1, batch_tokens // L)
        try:
            for i in range(0, n, per):
                xb, yb = x[i : i + per].to(device), y[i : i + per].to(device)
                logits = model(xb, transform).float()
                ce = Fn.cross_entropy(logits.flatten(0, 1), yb.flatten(), ignore_index=IGNORE,
                                      reduction="none").view_as(yb)  # (n, L)
                ok = (logits.argmax(-1) == yb) & (yb != IGNORE)
                m = yb != IGNORE
                t = slice(L - L // 4, L)
                for acc, mm, cc, kk in ((sums, m, ce, ok), (tail, m[:, t], ce[:, t], ok[:, t])):
                    acc += torch.tensor([float(cc[mm].double().sum()), float(kk.sum()), float(mm.sum())],
                                        dtype=torch.float64)
            bad = not math.isfinite(float(sums[0]))
        except OverflowError:  # lp refuses tables past float range (growth at long lags): a result
            bad = True
        nan = float("nan")
        out[str(L)] = {
            "loss": nan if bad else float(sums[0] / sums[2]), "acc": nan if bad else float(sums[1] / sums[2]),
            "loss_tail": nan if bad else float(tail[0] / max(float(tail[2]), 1.0)),
            "acc_tail": nan if bad else float(tail[1] / max(float(tail[2]), 1.0)),
            "sequences": n, "tokens_scored": int(sums[2]), "diverged": bad,
        }
    model.train()
    return out
