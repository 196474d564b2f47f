"""The README's and the guides' Python examples run as written.

The README's blocks run in order in one namespace; each guide under docs/guide runs after them, in a
copy of that namespace."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
GUIDES = sorted((README.parent / "docs" / "guide").glob("*.md"))


def blocks(path: Path = README):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    setup = [b.strip() for b in bash if "pip install" in b]
    assert len(setup) == 2, setup
    assert setup[0].endswith("liepos tour") and setup[1].endswith("python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert setup[1] in ci


@pytest.mark.slow
def test_readme_python_examples_run():
    torch.manual_seed(0)
    ns: dict = {}
    _run(README, ns)
    for guide in GUIDES:
        _run(guide, dict(ns))


def _run(path: Path, ns: dict) -> None:
    for i, code in enumerate(blocks(path)):
        try:
            exec(compile(code, f"{path.name} python block {i}", "exec"), ns)  # noqa: S102 - our own docs
        except Exception as err:  # pragma: no cover - the message names the block
            raise AssertionError(f"{path.name} python block {i} failed: {type(err).__name__}: {err}\n{code}") from err
