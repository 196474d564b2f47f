"""The README's Python examples run as written (in order, sharing one namespace)."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


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
    for i, code in enumerate(blocks()):
        try:
            exec(compile(code, f"README.md python block {i}", "exec"), ns)  # noqa: S102 - our own README
        except Exception as err:  # pragma: no cover - the message names the block
            raise AssertionError(f"README python block {i} failed: {type(err).__name__}: {err}\n{code}") from err
