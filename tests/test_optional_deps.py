"""``import liepos`` needs torch and numpy only: in a fresh interpreter it loads none of the optional
packages (tqdm, rich, transformers, matplotlib, sympy, scipy) beyond what torch itself imports, nor
the interop or diagnosis modules; they load on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

OPTIONAL = ("tqdm", "rich", "transformers", "matplotlib", "sympy", "scipy")
HEAVY_PARTS = ("liepos.interop", "liepos.diagnosis", "liepos.explore", "liepos.tour", "liepos.cli")

PROBE = """
import json, sys
import torch, numpy
before = set(sys.modules)
import liepos
after = set(sys.modules) - before
print(json.dumps(sorted(after)))
"""


def _loaded_by_liepos() -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_liepos_loads_no_optional_package():
    loaded = _loaded_by_liepos()
    bad = sorted(m for m in loaded if m.split(".")[0] in OPTIONAL)
    assert not bad, bad


@pytest.mark.slow
def test_import_liepos_leaves_the_heavy_parts_for_first_use():
    loaded = _loaded_by_liepos()
    bad = sorted(m for m in loaded if m.startswith(HEAVY_PARTS))
    assert not bad, bad


@pytest.mark.slow
def test_first_use_loads_them():
    probe = "import sys, liepos as lp; lp.from_hf; print('liepos.interop' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"
