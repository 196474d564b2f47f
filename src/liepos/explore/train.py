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
import pickle
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

import torch
import torch.nn.functional as Fn

from liepos._progress import progress as make_progress
from liepos.explore.evaluate import EVAL_SEED, evaluate
from liepos.explore.learned import LearnedGenerator, snapshot
from liepos.explore.schedule_rows import LearnedScalableSoftmax
from liepos.explore.model import Block, Decoder, ModelConfig
from liepos.explore.tasks import IGNORE, Task

__all__ = [
    "EVAL_SEED",
    "GEN_SCHEDULES",
    "NEGLIGIBLE",
    "Dist",
    "TrainConfig",
    "build_model",
    "evaluate",
    "learned_record",
    "temperature_record",
    "stage_length",
    "train_run",
]

GEN_SCHEDULES = ("cosine", "constant")  # the learned generators' schedule: the model's shape, or flat after warm-up
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
    eval_tokens: int = 32768  # tokens per evaluation length: eval_tokens / max(eval_lens) held-out documents
    d_model: int = 128
    layers: int = 5
    heads: int = 4
    eval_scaling: list = field(default_factory=list)  # context-extension maps applied past train_len
    snapshots: int = 8  # learned-generator snapshots over training (besides the start)
    corpus: str = "stdlib"  # the LM's text: stdlib or kjv (ignored with text_file)
    gen_lr: float | None = None  # learned generators' peak learning rate (None: the model's lr)
    gen_schedule: str = "cosine"  # their schedule after warm-up: cosine (the model's shape) or constant
    curriculum: list = field(default_factory=list)  # training lengths in equal stages (the last: train_len)

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


def _lr(step: int, cfg: TrainConfig, peak: float | None = None, schedule: str = "cosine") -> float:
    """Linear warm-up to ``peak`` (default ``cfg.lr``), then cosine to 0.1 × peak, or constant."""
    peak = cfg.lr if peak is None else peak
    if step < cfg.warmup:
        return peak * (step + 1) / cfg.warmup
    if schedule == "constant":
        return peak
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def stage_length(step: int, cfg: TrainConfig) -> int:
    """The training length at ``step``: ``cfg.curriculum`` in equal stages of the steps, else ``train_len``."""
    if not cfg.curriculum:
        return cfg.train_len
    k = min(len(cfg.curriculum) - 1, step * len(cfg.curriculum) // cfg.steps)
    return int(cfg.curriculum[k])


def build_model(cfg: TrainConfig, task: Task, encoding, seed: int) -> Decoder:
    torch.manual_seed(seed)
    mc = ModelConfig(vocab_size=task.vocab_size, d_model=cfg.d_model, layers=cfg.layers, heads=cfg.heads)
    return Decoder(mc, encoding)


def learned_record(model: Decoder, tol: float) -> list[dict]:
    """One :func:`~liepos.explore.learned.snapshot` per learned generator (layer, head group, part)."""
    out = []
    for li, blk in enumerate(model.blocks):
        for gi, enc in enumerate(cast(Block, blk).encoders):  # Decoder.blocks holds Blocks (a ModuleList types Module)
            for m in enc.modules():
                if isinstance(m, LearnedGenerator):
                    out.append({"layer": li, "group": gi, "start": m.name, **snapshot(m, tol)})
    return out


def temperature_record(model: Decoder) -> list[dict]:
    """The learned temperatures' ``s`` per layer and head group (a ``schedule:ssmax`` row), else empty."""
    out = []
    for li, blk in enumerate(model.blocks):
        for gi, layer in enumerate(cast(Block, blk).layers):
            if layer is not None and isinstance(layer.temperature, LearnedScalableSoftmax):
                out.append({"layer": li, "group": gi, "s": [float(v) for v in layer.temperature.s().detach()]})
    return out


def _optimizer(model: Decoder, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on the linear layers' weights only (never on embeddings, norms or generators).

    With ``cfg.gen_lr`` the learned generators' parameters are a group of their own, at that peak
    learning rate and ``cfg.gen_schedule`` (as GRAPE and LieRE train theirs apart from the model)."""
    decay = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    gen = [p for m in model.modules() if isinstance(m, LearnedGenerator) for p in m.parameters()]
    ids = {id(p) for p in decay} | ({id(p) for p in gen} if cfg.gen_lr is not None else set())
    other = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "role": "model"},
              {"params": other, "weight_decay": 0.0, "role": "model"}]
    if cfg.gen_lr is not None and gen:
        groups.append({"params": gen, "weight_decay": 0.0, "role": "generator"})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def _set_lr(opt: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> None:
    for group in opt.param_groups:
        gen = group.get("role") == "generator"
        group["lr"] = _lr(step, cfg, cfg.gen_lr if gen else None, cfg.gen_schedule if gen else "cosine")


def _save(path, model, opt, state: Mapping[str, Any]) -> None:
    """Write a checkpoint atomically (an interrupted write never replaces a good one)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), **state}, tmp)
    tmp.replace(path)


def _resume(path, key: str | None, model, opt, device) -> dict | None:
    """The state of a checkpoint written for this ``key``, loaded into ``model`` and ``opt``; else None."""
    if path is None or not path.exists():
        return None
    try:
        ck = torch.load(path, map_location=device, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, pickle.UnpicklingError):  # truncated, foreign
        return None
    if ck.get("key") != key:
        return None
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    return ck


class _RunState(TypedDict):
    """What a checkpoint holds besides the model's and the optimiser's state."""

    key: str | None
    step: int
    train_loss: list[float]
    trajectory: list[dict[str, Any]]
    seconds: float


def _step(net, x, y, mine, size: int, dist: Dist) -> torch.Tensor:
    """Forward and backward over this rank's slices of the global batch; the global mean loss."""
    import contextlib

    count = int((y != IGNORE).sum())
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
    return val


def train_run(
    cfg: TrainConfig, task: Task, encoding, seed: int, dist: Dist | None = None, progress: bool = True,
    desc: str = "", checkpoint=None, key: str | None = None, checkpoint_every: int | None = None,
) -> tuple[Decoder, dict]:
    """Train one model; return it (unwrapped) and its record.

    The record: ``train_loss`` per step, ``seconds``, ``diverged`` (the step whose loss was not finite,
    training stops there; ``None`` when it never happened), ``trajectory`` (learned-generator
    snapshots, empty when nothing is learned) and ``resumed_at`` (the step a checkpoint gave, or 0).

    ``checkpoint`` (a path): the model, the optimiser and the record so far are saved there every
    ``checkpoint_every`` steps (default a tenth of the run) under ``key``; a run that finds a
    checkpoint of the same key continues from its step. Every step's batch and learning rate depend
    on the step alone, so a resumed run ends with the same numbers as an uninterrupted one."""
    dist = dist or Dist("cpu")
    model = build_model(cfg, task, encoding, seed).to(dist.device)
    net: torch.nn.Module = model
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
    ck_every = checkpoint_every or max(1, cfg.steps // 10)
    state: _RunState = {"key": key, "step": 0, "train_loss": [],
                        "trajectory": [{"step": 0, "generators": learned_record(model, tol)}], "seconds": 0.0}
    ck = _resume(checkpoint, key, model, opt, dist.device)
    start = 0 if ck is None else int(ck["step"])
    if ck is not None:
        state["train_loss"], state["trajectory"], state["seconds"] = ck["train_loss"], ck["trajectory"], ck["seconds"]
    chunk = max(1, cfg.steps // 10)
    bar = make_progress(cfg.steps, desc or str(encoding), enabled=progress and dist.main)
    losses, trajectory, t0 = state["train_loss"], state["trajectory"], time.time()
    diverged: int | None = None
    for step in range(start, cfg.steps):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x, y = task.sample(g, cfg.batch_size, stage_length(step, cfg), "train")  # the global batch, every rank
        _set_lr(opt, step, cfg)
        opt.zero_grad(set_to_none=True)
        losses.append(float(_step(net, x, y, mine, size, dist)))
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
        if checkpoint is not None and dist.main and (step + 1) % ck_every == 0 and step + 1 < cfg.steps:
            _save(checkpoint, model, opt, state | {"step": step + 1, "seconds": state["seconds"] + time.time() - t0})
    bar.close()
    if trajectory[0]["generators"] and trajectory[-1]["step"] != len(losses) and diverged is None:
        trajectory.append({"step": len(losses), "generators": learned_record(model, tol)})  # the end, always
    return model, {"train_loss": losses, "seconds": state["seconds"] + time.time() - t0, "diverged": diverged,
                   "trajectory": trajectory if trajectory[0]["generators"] else [], "resumed_at": start}
