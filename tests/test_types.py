"""The type check: mypy, configured by pyproject.toml's [tool.mypy] (``python -m mypy`` from the repository
root), over src/liepos: no error anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a cold run takes minutes on two cores (a warm .mypy_cache: seconds)
def test_mypy_reports_no_error(monkeypatch):
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # the config's `files` are relative to the repository root; its cache: .mypy_cache
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy exited {status}:\n{stdout}{stderr}"
