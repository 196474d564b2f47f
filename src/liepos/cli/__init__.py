"""The ``liepos`` command line.

Each subcommand lives in the module that owns its capability and provides two functions,
``configure(parser)`` and ``run(args) -> int``; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

# name -> (module, one-line help, examples)
SUBCOMMANDS: dict[str, tuple[str, str, list[str]]] = {
    "tour": (
        "liepos.report",
        "walk the whole theory on live numbers and write a shareable HTML report",
        ["liepos tour", "liepos tour --out my-tour --open"],
    ),
    "classify": (
        "liepos.cli",
        "classify a generator matrix into the seeds' six rows",
        [
            "liepos classify '[[0, 1], [-1, 0]]'",
            "liepos classify '[[-0.1, 1], [-1, -0.1]]'",
            "liepos classify @generator.json",
        ],
    ),
    "catalogue": (
        "liepos.cli",
        "list every catalogue encoding with its classification and identity",
        ["liepos catalogue", "liepos catalogue --head-dim 8 --heads 4"],
    ),
    "plot": (
        "liepos.plot",
        "draw one figure of the tour alone",
        ["liepos plot spectrum --out spectrum.png", "liepos plot trajectories --out rows.png"],
    ),
    "bench": (
        "liepos.bench",
        "time the application of encodings against the peers (same process, same inputs)",
        ["liepos bench --quick"],
    ),
    "diagnose": (
        "liepos.diagnose",
        "probe an existing implementation and say which point of the design space it is",
        ["liepos diagnose hf:llama", "liepos diagnose hf:llama --rope '{\"rope_type\": \"yarn\", \"factor\": 4.0}'"],
    ),
    "explore": (
        "liepos.explore",
        "train small models across the design space and measure what extrapolates",
        ["liepos explore --quick --out runs/quick"],
    ),
}


# ---------------------------------------------------------------------- classify / catalogue
def _parse_matrix(text: str):
    """A JSON nested list, or ``@file.json``; parsed as data, never evaluated."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as err:
            raise SystemExit(f"liepos classify: cannot read {path}: {err.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"liepos classify: MATRIX is not valid JSON ({err.msg} at column {err.colno}): {text!r}") from None
    if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise SystemExit(f"liepos classify: MATRIX must be a JSON list of rows, got {text!r}")
    for row in data:
        for x in row:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise SystemExit(f"liepos classify: MATRIX entries must be numbers, got {x!r}")
    return data


def _configure_classify(p: argparse.ArgumentParser) -> None:
    p.add_argument("matrix", metavar="MATRIX", help="a JSON nested list, e.g. '[[0,1],[-1,0]]', or @file.json")
    p.add_argument("--tol", type=float, default=None, help="eigenvalue clustering tolerance")
    p.add_argument("--json", action="store_true", help="print the classification as JSON")


def _run_classify(args: argparse.Namespace) -> int:
    from liepos.classify import classify

    X = _parse_matrix(args.matrix)
    try:
        c = classify(X, tol=args.tol)
    except (ValueError, TypeError) as err:
        print(f"liepos classify: {err}", file=sys.stderr)
        return 2
    print(json.dumps(c.to_dict(), indent=2) if args.json else str(c))
    return 0


def _configure_catalogue(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head-dim", type=int, default=8, help="head dim used to build each entry (default 8)")
    p.add_argument("--heads", type=int, default=2, help="number of heads (default 2)")


def _run_catalogue(args: argparse.Namespace) -> int:
    from liepos.catalogue import CATALOGUE
    from liepos.classify import classify

    names = list(CATALOGUE)
    width = max(len(n) for n in names)
    print(f"{'name':<{width}}  {'row':<16}  {'blocks (counts)':<40}  identity / paper")
    print("-" * (width + 100))
    for name in names:
        entry = CATALOGUE[name]
        enc = entry.build(args.head_dim, args.heads)
        counts = classify(enc).counts
        summary = ", ".join(f"{k}={v}" for k, v in counts.items() if v)
        print(f"{name:<{width}}  {entry.row:<16}  {summary:<40}  {entry.identity}  [{entry.paper}]")
    return 0


_LOCAL = {
    "classify": (_configure_classify, _run_classify),
    "catalogue": (_configure_catalogue, _run_catalogue),
}


def build_parser() -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(
        f"  {ex}" for _, (_, _, exs) in SUBCOMMANDS.items() for ex in exs
    )
    parser = argparse.ArgumentParser(
        prog="liepos",
        description="Every relative positional encoding is a one-parameter group A(u) = exp(uX).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text, examples) in SUBCOMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=help_text,
            epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name in _LOCAL:
            _LOCAL[name][0](p)
        else:
            try:
                mod = importlib.import_module(module)
                mod.configure(p)
            except (ImportError, AttributeError):
                p.set_defaults(_unavailable=module)
        p.set_defaults(_name=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    if getattr(args, "_unavailable", None):
        print(f"liepos {args.command}: not available (module {args._unavailable} is missing an extra; "
              f"install liepos[plot])", file=sys.stderr)
        return 2
    if args.command in _LOCAL:
        return _LOCAL[args.command][1](args)
    mod = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(mod.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
