"""The ``liepos`` command line: one table of subcommands, one module each, one way to fail.

A subcommand module (contract in :mod:`liepos.cli._common`) gives ``HELP``, ``EXAMPLES``,
``configure(parser)`` and ``run(args) -> int``. :func:`main` builds the parser from :data:`SUBCOMMANDS`
and runs the chosen one. Bad input never shows a traceback: a flag argparse refuses and a
:class:`~liepos.cli._common.UsageError` raised by a subcommand are both printed as one line,
``liepos <command>: <message>``, with exit status 2 (argparse's refusals leave :func:`main` by
``SystemExit(2)``, as argparse does; a refusal inside ``run`` makes it return 2). Ctrl-C and a reader
that leaves (``liepos catalogue | head -1``) end it quietly with the shell's statuses 130 and 141.
Anything else raised inside liepos, an ImportError included, is a bug and keeps its traceback.

>>> parser = build_parser()
>>> list(SUBCOMMANDS) == ["tour", "classify", "catalogue", "plot", "bench", "diagnose", "explore", "extend"]
True
>>> parser.parse_args(["catalogue", "--heads", "4"]).heads
4
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType
from typing import NoReturn

from liepos.cli._common import UsageError

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# the shell's statuses for a command ended by SIGINT (Ctrl-C) and by SIGPIPE (128 + the signal number)
_INTERRUPTED, _BROKEN_PIPE = 130, 141

# name -> the module that implements it, in the order `liepos --help` lists them
SUBCOMMANDS: dict[str, str] = {
    "tour": "liepos.cli.tour",
    "classify": "liepos.cli.classify",
    "catalogue": "liepos.cli.catalogue",
    "plot": "liepos.cli.plot",
    "bench": "liepos.cli.bench",
    "diagnose": "liepos.cli.diagnose",
    "explore": "liepos.cli.explore",
    "extend": "liepos.cli.extend",
}

class _ParseError(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, but a refusal is raised (to be printed as one line) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        raise _ParseError(self.prog, message)


def _text(mod: ModuleType) -> tuple[str, list[str]]:
    return mod.HELP, list(mod.EXAMPLES)


def _examples(examples: list[str]) -> str:
    return "examples:\n" + "\n".join(f"  {e}" for e in examples)


def build_parser() -> argparse.ArgumentParser:
    """The ``liepos`` parser with every subcommand configured by its module."""
    modules = {name: importlib.import_module(path) for name, path in SUBCOMMANDS.items()}
    texts = {name: _text(mod) for name, mod in modules.items()}
    parser = _Parser(
        prog="liepos",
        description="Every relative positional encoding is a one-parameter group A(u) = exp(uX).",
        epilog=_examples([e for _, examples in texts.values() for e in examples]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in modules.items():
        help_text, examples = texts[name]
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=_examples(examples),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Run ``liepos`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # argparse would blame the top-level parser; the subcommand's flags are the ones misspelt
            prog = f"liepos {args.command}" if getattr(args, "command", None) else "liepos"
            raise _ParseError(prog, f"unrecognized arguments: {' '.join(extra)}")
    except _ParseError as err:
        print(f"{err.prog}: {_one_line(str(err))}", file=sys.stderr)
        raise SystemExit(2) from None
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a reader that left is seen here, not in Python's exit flush
        return status
    except UsageError as err:
        print(f"liepos {args.command}: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"liepos {args.command}: interrupted", file=sys.stderr)
        return _INTERRUPTED
    except BrokenPipeError:  # the reader (`| head`) left: stop quietly, and keep Python's exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _BROKEN_PIPE
