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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (warnings as errors), built once for this module."""
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, LIEPOS_DOCS_TOUR_DPI="30", PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return site


@pytest.mark.slow
def test_the_site_builds_strict_with_the_api_reference_and_the_tour(site):
    for guide in GUIDES:
        assert (site / "guide" / f"{guide.stem}.html").exists(), guide.name
    tour = site / "tour" / "index.html"
    assert "id='playground'" in tour.read_text(encoding="utf-8")
    assert not (site / "tour" / "figures").exists(), "the embedded tour is one self-contained page"
    api = (site / "api" / "algebra.html").read_text(encoding="utf-8")
    assert "Generator" in api and "from_matrix" in api and "&gt;&gt;&gt;" in api  # a doctest, rendered as code
    assert "language-pycon" in api or "highlight" in api


@pytest.mark.slow
def test_the_api_reference_links_its_cross_references_and_shows_true_defaults(site):
    import re

    pages = {p.name: p.read_text(encoding="utf-8") for p in (site / "api").glob("*.html")}
    text = "".join(pages.values())
    assert ":class:`" not in text and ":func:`" not in text and ":meth:`" not in text, "a Sphinx role shown raw"
    assert re.search(r'<a[^>]+href="[^"]*#liepos\.Generator"', text), "a role became a link"
    enc = pages["attention.html"]
    row = re.search(r"<code>query_slots</code>.*?</tr>", enc, flags=re.S)
    assert row and "None" in row.group(0) and "required" not in row.group(0), "query_slots defaults to None"


@pytest.mark.slow
def test_every_page_opens_from_disk_with_no_failed_request_and_no_error(site):
    """Headless Chromium opens each page of the site from file:// with the network refused: nothing is
    fetched from a CDN, no request fails and no script raises."""
    sync_api = pytest.importorskip("playwright.sync_api")
    check_report = _scripts_module("check_report")
    binary = check_report.find_chromium()
    if binary is None:
        pytest.skip("no chromium (apt-get install chromium) for the browser test")
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    problems: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("pageerror", lambda e: problems.append(f"{page.url}: {e}"))
        page.on("console", lambda m: problems.append(f"{page.url}: {m.text}") if m.type == "error" else None)
        page.on("requestfailed", lambda r: problems.append(f"{page.url}: failed {r.url[:100]}"))
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith(("file:", "data:"))
                   else route.continue_())
        for html in pages:
            page.goto(html.as_uri(), wait_until="load")
            page.wait_for_timeout(50)
        # the search runs from disk too: the home page with ?q= lists results
        page.goto((site / "index.html").as_uri() + "?q=yarn")
        page.wait_for_function("document.querySelectorAll('#mkdocs-search-results article').length > 0")
        found = page.eval_on_selector_all("#mkdocs-search-results article h3 a", "as => as.map(a => a.href)")
        # the home page's set-up command is shown whole at a phone's width (it wraps, it is not cut off)
        page.set_viewport_size({"width": 390, "height": 800})
        page.goto((site / "index.html").as_uri())
        assert page.query_selector(".language-bash pre") is not None
        cut = page.evaluate("""() => [...document.querySelectorAll('.language-bash pre')].filter(
            p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 60))""")
        browser.close()
    assert len(pages) >= 20
    assert problems == []
    assert any("scaling.html#liepos.scaling.yarn" in f for f in found), found
    assert cut == [], "a code block of the home page is cut off at 390 px"


def test_every_guide_says_which_extra_its_examples_need():
    for guide in GUIDES:
        lines = guide.read_text(encoding="utf-8").splitlines()
        assert lines[2].startswith("Needs: "), f"{guide.name}: the line under the title names the extra"
    for name in ("huggingface.md", "diagnose.md"):  # their examples import transformers
        assert "`hf` extra" in (ROOT / "docs" / "guide" / name).read_text(encoding="utf-8").splitlines()[2]
