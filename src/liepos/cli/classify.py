"""``liepos classify MATRIX``: name the blocks of a generator by the theory's six rows.

MATRIX is a JSON list of rows (or ``@file.json``), read by :func:`liepos.cli._common.read_json`:
parsed as data, never evaluated; invalid JSON, a matrix that is not square, and a number beyond
float64 are all refused the same way (one line, exit status 2).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from liepos.cli._common import UsageError, read_json, real_in, shown

HELP = "classify a generator matrix into the theory's six rows"
EXAMPLES = [
    "liepos classify '[[0, 1], [-1, 0]]'",
    "liepos classify '[[-0.1, 1], [-1, -0.1]]'",
    "liepos classify @generator.json --json",
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("matrix", metavar="MATRIX", help="a JSON nested list, e.g. '[[0,1],[-1,0]]', or @file.json")
    parser.add_argument("--tol", type=real_in(0.0), default=None,
                        help="zero tolerance for rates and frequencies (default: derived from |X| and float64 eps)")
    parser.add_argument("--json", action="store_true", help="print the classification as JSON")


def square_matrix(data: Any, text: str) -> list[list[int | float]]:
    """``data`` as a square matrix of numbers, or a :class:`UsageError` saying what is wrong with it."""
    if not isinstance(data, list) or not data or not all(isinstance(r, list) for r in data):
        raise UsageError(f"MATRIX must be a non-empty JSON list of rows, got {shown(text)}")
    for i, row in enumerate(data):
        for x in row:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise UsageError(f"MATRIX entries must be numbers, got {shown(repr(x))} in row {i}")
    widths = {len(r) for r in data}
    if widths != {len(data)}:
        shape = f"({len(data)}, {widths.pop()})" if len(widths) == 1 else f"{len(data)} rows of lengths {sorted(widths)}"
        raise UsageError(f"MATRIX must be square, got shape {shape}: {shown(text)}")
    return data


def run(args: argparse.Namespace) -> int:
    from liepos.classification import classify

    X = square_matrix(read_json("MATRIX", args.matrix), args.matrix)
    try:
        c = classify(X, tol=args.tol)
    except ValueError as err:  # classify's refusal of a value (DESIGN: ValueError is a bad value)
        raise UsageError(f"MATRIX {shown(args.matrix)}: {err}") from None
    print(json.dumps(c.to_dict(), indent=2) if args.json else str(c))
    return 0
