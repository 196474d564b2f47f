"""What every subcommand shares: the usage error, and argparse types that refuse bad values by name.

A subcommand module ``liepos/cli/<name>.py`` provides ``HELP`` (one line), ``EXAMPLES`` (a list of
command lines), ``configure(parser)`` and ``run(args) -> int``. Bad input — a flag's value, a path, a
missing optional extra — is raised as :class:`UsageError`; ``liepos.cli.main`` prints it as one line,
``liepos <command>: <message>``, and exits with status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["UsageError", "int_at_least", "real_in", "out_dir", "out_file", "need_extra", "read_json", "shown"]

# how much of a value a message quotes
_SHOWN = 60
# the most an @file argument reads: JSON arguments are matrices and parameter sets, never this big
_MAX_FILE_BYTES = 16 * 2**20
# float64's largest finite value has 309 digits before the point
_MAX_DIGITS = 309


class UsageError(Exception):
    """Bad input to a subcommand, reported as one line and exit status 2 (no traceback)."""


def shown(text: str) -> str:
    """``text`` as a message quotes it: its repr, cut to a readable length."""
    r = repr(text)
    return r if len(r) <= _SHOWN else r[: _SHOWN - 5] + "...'" + f" ({len(text)} characters)"


def int_at_least(low: int, at_most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer >= ``low`` (and <= ``at_most``); the message names the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {shown(text)}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if at_most is not None and value > at_most:
            raise argparse.ArgumentTypeError(f"must be <= {at_most}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def real_in(low: float | None = None, high: float | None = None, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite real number in [low, high] (or (low, high] with ``open_low``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {shown(text)}") from None
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


def _number(flag: str) -> Callable[[str], int | float]:
    """json's hook for a number: an int stays exact, and nothing beyond float64's range is accepted."""

    def parse(text: str) -> int | float:
        digits = len(text.lstrip("-").split(".")[0].split("e")[0].split("E")[0])
        if "." in text or "e" in text or "E" in text:
            value: int | float = float(text)
            ok = value not in (float("inf"), float("-inf"))
        else:
            ok = digits <= _MAX_DIGITS and abs(value := int(text)) <= sys.float_info.max
        if not ok:
            what = f"with {digits} digits" if digits > _MAX_DIGITS else shown(text)
            raise UsageError(f"{flag}: the number {what} is beyond float64 (|x| <= {sys.float_info.max:.4g})")
        return value

    return parse


def _constant(flag: str) -> Callable[[str], float]:
    def refuse(text: str) -> float:
        raise UsageError(f"{flag}: {text} is not a finite number (NaN and Infinity are refused)")

    return refuse


def read_json(flag: str, text: str) -> Any:
    """The JSON value of ``text``, or of the file ``@path``: parsed as data, never evaluated.

    Refused with :class:`UsageError` naming ``flag``: an unreadable or non-UTF-8 file, invalid JSON,
    nesting too deep for the parser, and a number that is not a finite float64 (NaN, Infinity,
    ``1e400``, a 400-digit integer). Integers within range stay Python ints (exact).

    >>> read_json("MATRIX", "[[0, 1], [-1, 0.5]]")
    [[0, 1], [-1, 0.5]]
    >>> read_json("MATRIX", "[1" + "0" * 400 + "]")
    Traceback (most recent call last):
        ...
    liepos.cli._common.UsageError: MATRIX: the number with 401 digits is beyond float64 (|x| <= 1.798e+308)
    """
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            with path.open("rb") as f:
                data = f.read(_MAX_FILE_BYTES + 1)
        except OSError as err:
            raise UsageError(f"{flag} {shown(text)}: cannot read {str(path)!r}: {err.strerror}") from None
        if len(data) > _MAX_FILE_BYTES:
            raise UsageError(f"{flag} {shown(text)}: the file is over {_MAX_FILE_BYTES // 2**20} MiB")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(f"{flag} {shown(str(path))}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                             f"{err.start})") from None
    try:
        return json.loads(text, parse_int=_number(flag), parse_float=_number(flag), parse_constant=_constant(flag))
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}): "
                         f"{shown(text)}") from None
    except RecursionError:
        raise UsageError(f"{flag} is nested too deeply for the JSON parser: {shown(text)}") from None
