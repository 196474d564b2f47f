"""Helpers shared by several test files (importable because tests/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def bench_script(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` imported as a module, with its folder on ``sys.path`` while the block runs (the
    scripts import their siblings, ``rounds.py`` and ``attention.py``)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))

# one example block (rate, freq, size) per row of the theory's table of six
SEED_ROWS = {
    "growth": (0.3, 0.0, 1),
    "nope": (0.0, 0.0, 1),
    "decay": (-0.5, 0.0, 1),
    "rotation": (0.0, 1.3, 1),
    "damped_rotation": (-0.2, 0.9, 1),
    "polynomial": (0.0, 0.0, 2),
}


def random_basis(d: int, cond: float, seed: int) -> np.ndarray:
    """A random invertible d×d matrix with condition number ``cond``."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((d, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return U @ np.diag(np.logspace(0, np.log10(cond), d)) @ V.T


def conjugated(blocks, cond: float, seed: int) -> np.ndarray:
    """``P J P⁻¹`` for the canonical form J of ``blocks`` and a random P of condition ``cond``."""
    from liepos._jordan import canonical_form

    J = canonical_form(blocks)
    P = random_basis(J.shape[0], cond, seed)
    return P @ J @ np.linalg.inv(P)


class F64Tensor(torch.Tensor):
    """A tensor whose ``.float()`` stays float64."""

    def float(self, *args, **kwargs):  # noqa: A003
        return self.double(*args, **kwargs)


class Torch64:
    """``torch`` with float32 replaced by float64, for running upstream float32 code in float64."""

    float = torch.float64
    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)

    def arange(self, *args, **kwargs):
        return torch.arange(*args, **kwargs).as_subclass(F64Tensor)

    def tensor(self, *args, **kwargs):
        return torch.tensor(*args, **kwargs).as_subclass(F64Tensor)


def fast_lane(*values, fast: int = 1) -> list:
    """Parameter values of which the first ``fast`` run in the everyday lane (``-m "not slow"``) and the
    rest carry the ``slow`` marker: the whole grid still runs in CI, a representative case every day."""
    import pytest

    return [v if i < fast else pytest.param(v, marks=pytest.mark.slow) for i, v in enumerate(values)]


def explore_main(argv: list[str], capsys) -> tuple:
    """``liepos explore ARGV`` in process: (exit status, stderr, stdout); argparse's refusals exit with 2 too."""
    from liepos.cli import explore as cli

    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.err, out.out
