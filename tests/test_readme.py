"""The README's and the docs' Python examples run as written, each ALONE in a fresh interpreter.

Every ```python block of README.md and of docs/**/*.md is run by itself in a new `python` process (its own
imports, its own inputs, nothing from an earlier block), after the README's set-up command; a failure
names the file and the block."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def _example(page: Path, i: int, code: str):
    name = f"{page.relative_to(ROOT)}:{i}"
    return pytest.param(page, i, code, id=name)


EXAMPLES = [_example(page, i, code) for page in PAGES for i, code in enumerate(blocks(page))]


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    setup = [b.strip() for b in bash if "pip install" in b]
    assert len(setup) == 2, setup
    assert setup[0].endswith("liepos tour") and setup[1].endswith("python -m pytest -n auto --dist loadfile")
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup[1] in ci


def test_every_page_with_examples_is_found():
    assert blocks(README), "the README's quickstart"
    assert any(p.values[0].parent.name == "guide" for p in EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("page,index,code", EXAMPLES)
def test_example_runs_alone_in_a_fresh_interpreter(page, index, code, tmp_path):
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        f"{page.relative_to(ROOT)} python block {index} fails alone:\n{r.stderr[-3000:]}\n--- the block ---\n{code}")
