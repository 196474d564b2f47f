"""The documentation site builds with warnings as errors: guides, glossary, the API reference from the
docstrings (their doctests rendered as code), and the tour embedded as one page."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))


def _scripts_module(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_the_doctest_fences_of_the_api_reference():
    mod = _scripts_module("griffe_doctests")
    assert doctest.testmod(mod).failed == 0
    text = "Identity.\n\n    >>> x = 1\n    >>> x + 1\n    2\n"
    assert mod.fence(text).splitlines() == ["Identity.", "", "    ```pycon", "    >>> x = 1", "    >>> x + 1",
                                            "    2", "    ```"]
    assert mod.fence(mod.fence(text)) == mod.fence(text)  # an already fenced block is left alone


def test_every_guide_reaches_the_nav():
    hooks = _scripts_module("docs_hooks")
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(ROOT / "docs")
    nav = hooks.on_config(config)["nav"]
    guides = next(item[hooks.GUIDES] for item in nav if isinstance(item, dict) and hooks.GUIDES in item)
    listed = {next(iter(g.values())) for g in guides}
    assert listed == {p.relative_to(ROOT / "docs").as_posix() for p in GUIDES}


@pytest.mark.slow
def test_the_site_builds_strict_with_the_api_reference_and_the_tour(tmp_path):
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    env = dict(os.environ, LIEPOS_DOCS_TOUR_DPI="30", PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    for guide in GUIDES:
        assert (site / "guide" / f"{guide.stem}.html").exists(), guide.name
    tour = site / "tour" / "index.html"
    assert "id='playground'" in tour.read_text(encoding="utf-8")
    assert not (site / "tour" / "figures").exists(), "the embedded tour is one self-contained page"
    api = (site / "api" / "algebra.html").read_text(encoding="utf-8")
    assert "Generator" in api and "from_matrix" in api and "&gt;&gt;&gt;" in api  # a doctest, rendered as code
    assert "language-pycon" in api or "highlight" in api
