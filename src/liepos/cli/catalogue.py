"""``liepos catalogue``: every catalogue entry built at one head dim, with its classification and identity."""

from __future__ import annotations

import argparse

from liepos.cli._common import UsageError, int_at_least

HELP = "list every catalogue encoding with its classification and identity"
EXAMPLES = ["liepos catalogue", "liepos catalogue --head-dim 8 --heads 4"]

# far above any model's head dim (256) and head count; keeps a typo from allocating gigabytes
_MAX_HEAD_DIM = 2**16
_MAX_HEADS = 2**12


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head-dim", type=int_at_least(1, _MAX_HEAD_DIM), default=8,
                        help="head dim used to build each entry (default 8)")
    parser.add_argument("--heads", type=int_at_least(1, _MAX_HEADS), default=2, help="number of heads (default 2)")


def run(args: argparse.Namespace) -> int:
    from liepos.catalogue import CATALOGUE, build
    from liepos.classification import classify

    rows = []
    for name, entry in CATALOGUE.items():
        try:
            enc = build(name, args.head_dim, args.heads)
        except ValueError as err:  # the entry refuses this head dim or head count
            raise UsageError(f"--head-dim {args.head_dim} --heads {args.heads}: the entry {name!r} refuses "
                             f"them: {err}") from None
        counts = classify(enc).counts
        rows.append((name, entry, ", ".join(f"{k}={v}" for k, v in counts.items() if v)))
    width = max(len(name) for name, _, _ in rows)
    print(f"{'name':<{width}}  {'row':<16}  {'blocks (counts)':<40}  identity / paper")
    print("-" * (width + 100))
    for name, entry, summary in rows:
        print(f"{name:<{width}}  {entry.row:<16}  {summary:<40}  {entry.identity}  [{entry.paper}]")
    return 0
