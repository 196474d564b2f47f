"""``liepos explore``: train small decoders across the design space, test at longer lengths.

>>> from liepos.explore import from_spec
>>> from_spec("rope", 8).name
'rope'

Command line (see ``liepos explore --help``)::

    liepos explore --encodings rope,alibi,xpos,nope,decay,jordan3 --task lm --train-len 64 \\
        --eval-lens 64,128,256,512,1024 --steps 1000 --seed 0 --out runs/lm
    torchrun --standalone --nproc_per_node 2 -m liepos.explore --quick --out runs/ddp
"""

from __future__ import annotations

import argparse
import sys

from liepos.explore.spec import from_spec, parse_spec, split_heads

__all__ = ["configure", "run", "from_spec", "parse_spec", "split_heads", "QUICK", "DEFAULT_ENCODINGS"]

DEFAULT_ENCODINGS = "rope,alibi,xpos,nope,decay,jordan3"
# the reduced sweep for CI: tiny model, few steps, short lengths (well under 3 minutes on 2 cores)
QUICK = dict(d_model=32, layers=2, heads=2, steps=40, batch_size=16, train_len=32,
             eval_lens=[32, 64, 128, 256], eval_tokens=2048, warmup=5, lr=1e-2)


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return vals


def configure(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--encodings", default=None,
      help=f"comma-separated specs: rope, alibi, xpos, nope, decay, jordanN, retnet, sums a+b "
           f"(split the head dim), '|' between head groups (default {DEFAULT_ENCODINGS})")
    a("--task", default="lm", choices=["lm", "copy", "recall", "count"], help="task (default lm)")
    a("--text-file", default=None, help="train the LM on this file instead of the stdlib sources")
    a("--train-len", type=int, default=None, help="training sequence length (default 64)")
    a("--eval-lens", type=_ints, default=None, help="evaluation lengths (default 64,128,256,512,1024)")
    a("--steps", type=int, default=None, help="training steps per run (default 1000)")
    a("--seed", type=_ints, default=[0], help="seed or comma-separated seeds (default 0)")
    a("--batch-size", type=int, default=None, help="global batch size (default 32)")
    a("--lr", type=float, default=None, help="peak learning rate (default 3e-3)")
    a("--d-model", type=int, default=None, help="model width (default 128)")
    a("--layers", type=int, default=None, help="decoder blocks (default 5)")
    a("--heads", type=int, default=None, help="attention heads (default 4)")
    a("--eval-tokens", type=int, default=None, help="tokens evaluated per length (default 32768)")
    a("--out", default="runs/explore", help="output directory (default runs/explore)")
    a("--quick", action="store_true", help="reduced sweep for CI (tiny model, 40 steps, lengths 32..256)")
    a("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="device (default cpu)")
    a("--threads", type=int, default=None, help="torch CPU threads (default: torch's; 1 with --quick)")
    a("--save-model", action="store_true", help="also save each final state_dict next to its JSON")
    a("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from liepos.explore.train import TrainConfig, sweep

    fields = dict(QUICK) if args.quick else {}
    for name in ("task", "text_file", "train_len", "eval_lens", "steps", "batch_size", "lr", "d_model",
                 "layers", "heads", "eval_tokens"):
        v = getattr(args, name, None)
        if v is not None:
            fields[name] = v
    cfg = TrainConfig(**fields)
    encodings = [e.strip() for e in (args.encodings or DEFAULT_ENCODINGS).split(",") if e.strip()]
    try:
        for e in encodings:
            for _, _, g in split_heads(e, cfg.heads):
                from_spec(g, cfg.d_model // cfg.heads, 1)
        if cfg.train_len < 2 or min(cfg.eval_lens) < 2 or cfg.steps < 1:
            raise ValueError("train-len and eval-lens must be >= 2 and steps >= 1")
    except ValueError as err:
        print(f"liepos explore: {err}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    elif args.quick:
        torch.set_num_threads(1)  # tiny models gain nothing from threads, and lose a lot on a busy machine
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        sweep(cfg, encodings, args.seed, args.out, device=args.device, progress=not args.no_progress,
              save_model=args.save_model)
    except ValueError as err:
        print(f"liepos explore: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("liepos explore: interrupted; rerun the same command to resume from the finished runs",
              file=sys.stderr)
        return 130
    return 0
