"""``liepos bench``: run the benchmark suite of a source checkout (``benchmarks/bench.py``).

The suite is not in the wheel (it reads glibc and ``/proc`` and imports the peers), so this command
finds it: ``--suite FILE`` when given, else ``benchmarks/bench.py`` of the checkout liepos is imported
from (``src/liepos`` → ``benchmarks``), else of the current folder. From an installed wheel with no
checkout around, it says so and what to do.

The results go to ``--out DIR``, by default ``liepos-bench`` in the user's cache folder
(``$XDG_CACHE_HOME``, else ``~/.cache``): never into the checkout, so a run leaves ``git status``
clean. The exit status is 1 when a target is missed on this machine (each target's line says
``met`` or ``MISSED``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from liepos.cli._common import UsageError, int_at_least, out_dir

HELP = ("time the application of encodings against the peers (same process, same inputs; from a source "
        "checkout); exit status 1 when a target is missed")
EXAMPLES = ["liepos bench --quick", "python benchmarks/run.py --quick --threads 2"]

_SUITE = Path("benchmarks") / "bench.py"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="the target shape only (about 2 minutes on two cores, longer under load)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for the results .json and .md (default: liepos-bench in the user's cache "
                             "folder, $XDG_CACHE_HOME or ~/.cache; never the checkout)")
    parser.add_argument("--threads", type=int_at_least(1), default=None,
                        help="torch.set_num_threads (default: all cores)")
    parser.add_argument("--suite", default=None, metavar="FILE",
                        help="the suite to run (default: benchmarks/bench.py of the source checkout)")


def find_suite(suite: str | os.PathLike | None = None) -> Path:
    """The benchmark suite file: ``suite``, or the checkout's ``benchmarks/bench.py`` (see the module doc)."""
    if suite is not None:
        path = Path(suite)
        if not path.is_file() or path.suffix != ".py":
            raise UsageError(f"--suite {str(path)!r} is not a Python file")
        return path.resolve()
    package = Path(__file__).resolve().parents[1]  # src/liepos/cli/bench.py -> src/liepos
    checkout = package.parents[1]  # src/liepos -> the checkout
    for root in (checkout, Path.cwd()):
        if (root / _SUITE).is_file():
            return (root / _SUITE).resolve()
    raise UsageError(f"the benchmark suite ({_SUITE}) is part of the source checkout, not of the wheel, and none "
                     f"was found next to {package} or in {Path.cwd()}: clone the repository "
                     "and run `liepos bench` there (or `python benchmarks/run.py`), or pass --suite FILE")


def load_suite(suite: str | os.PathLike | None = None) -> ModuleType:
    """Import the benchmark suite file (:func:`find_suite` of ``suite``) as a module; it is not in the package."""
    path = find_suite(suite)
    spec = importlib.util.spec_from_file_location("liepos_benchmark_suite", path)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(mod)
    return mod


def default_out() -> Path:
    """Where results go without ``--out``: ``liepos-bench`` in the user's cache folder, outside any checkout."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "liepos-bench"


def run(args: argparse.Namespace) -> int:
    path = find_suite(args.suite)
    out = out_dir("--out", args.out if args.out is not None else default_out())  # before any work
    print(f"liepos bench: results go to {out}", file=sys.stderr)
    return int(load_suite(path).run(args.quick, out, args.threads))
