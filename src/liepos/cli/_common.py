"""What every subcommand shares: the usage error, and argparse types that refuse bad values by name.

A subcommand module ``liepos/cli/<name>.py`` provides ``HELP`` (one line), ``EXAMPLES`` (a list of
command lines), ``configure(parser)`` and ``run(args) -> int``. Bad input — a flag's value, a path, a
missing optional extra — is raised as :class:`UsageError`; ``liepos.cli.main`` prints it as one line,
``liepos <command>: <message>``, and exits with status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["UsageError", "int_at_least", "real_in", "out_dir", "out_file", "need_extra"]


class UsageError(Exception):
    """Bad input to a subcommand, reported as one line and exit status 2 (no traceback)."""


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer >= ``low`` (the message names the value)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def real_in(low: float | None = None, high: float | None = None, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite real number in [low, high] (or (low, high] with ``open_low``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if low is not None and (value <= low if open_low else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if open_low else '>='} {low:g}, got {value:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


def out_dir(flag: str, path: str | os.PathLike) -> Path:
    """Create (if needed) and return a writable output folder, or raise :class:`UsageError` naming ``flag``.

    Checked before any long work starts, so a write-protected output fails at once."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {str(p)!r} is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{flag} {str(p)!r} cannot be created: {err.strerror}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {str(p)!r} is not writable")
    return p.resolve()


def out_file(flag: str, path: str | os.PathLike, suffixes: tuple[str, ...] | None = None) -> Path:
    """A writable output file path (its folder is created), with one of ``suffixes`` when given."""
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise UsageError(f"{flag} {str(p)!r} must end in {' or '.join(suffixes)}")
    if p.exists() and p.is_dir():
        raise UsageError(f"{flag} {str(p)!r} is a folder, not a file")
    out_dir(flag, p.parent if str(p.parent) else ".")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {str(p)!r} is not writable")
    return p.resolve()


def need_extra(module: str, extra: str) -> None:
    """Raise :class:`UsageError` saying which extra to install when ``module`` cannot be imported.

    Only a missing top-level package is reported this way; an ImportError from inside liepos is a bug."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"needs the optional package {module!r}: pip install -e \".[{extra}]\"")
