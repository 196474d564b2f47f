"""`liepos tour`: one run into a temporary folder, shared by every test of this module."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from liepos import _theory as T  # noqa: E402
from liepos import report  # noqa: E402
from liepos.cli import build_parser, main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tour")
    start = time.perf_counter()
    rc = main(["tour", "--out", str(out), "--quiet"])
    elapsed = time.perf_counter() - start
    assert rc == 0, "the tour reported identities over their bounds"
    return out, elapsed


@pytest.fixture(scope="module")
def numbers(tour_dir):
    return json.loads((tour_dir[0] / "numbers.json").read_text())


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.srcs.append(a.get("src", ""))
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


def test_tour_finishes_quickly(tour_dir):
    _, elapsed = tour_dir
    assert elapsed < 60.0, f"the tour took {elapsed:.1f} s (budget 60 s on 2 cores)"


def test_every_figure_is_a_valid_nonempty_png(tour_dir, numbers):
    import matplotlib.image as mpimg

    out, _ = tour_dir
    figs = numbers["figures"]
    assert set(figs) == {k for ks in report.FIGURES.values() for k in ks}
    for kind, f in figs.items():
        path = out / f["file"]
        assert path.exists(), kind
        w, h = png_size(path)
        assert w >= 400 and h >= 300, (kind, w, h)
        assert path.stat().st_size > 10_000, kind
        img = mpimg.imread(path)
        assert img.std() > 0.01, f"{kind} is blank"
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(f"{k}.png" for k in figs)


def test_every_image_referenced_by_the_html_exists(tour_dir, numbers):
    out, _ = tour_dir
    parser = _Imgs()
    parser.feed((out / "index.html").read_text(encoding="utf-8"))
    assert len(parser.srcs) == len(numbers["figures"])
    for src in parser.srcs:
        assert not src.startswith(("http:", "https:", "/")), src
        path = out / src
        assert path.exists() and path.stat().st_size > 0, src
        png_size(path)
    for href in parser.links:
        if not href.startswith("#"):
            assert (out / href).exists(), href
    # every section has its heading and anchor
    html = (out / "index.html").read_text(encoding="utf-8")
    for key, (title, _) in T.SECTIONS.items():
        assert f"id='{key}'" in html and title in html


def test_numbers_json_holds_identity_errors_under_bounds(numbers):
    errors = numbers["errors"]
    assert numbers["failed"] == []
    group = {k: v for k, v in errors.items() if k.startswith("group/rows/")}
    for row in T.ROWS:
        for ident in ("A(0) = I", "A(u)A(v) = A(u+v)", "F(t)^T G(s) = A(t-s)"):
            e = group[f"group/rows/{row}/{ident}"]
            assert e["value"] <= e["bound"] <= 1e-12, (row, ident, e)
    for k, e in errors.items():
        if e["bound"] is not None:
            assert e["ok"] and e["value"] <= e["bound"], (k, e)
    assert numbers["sections"]["group"]["random_X"]["errors"]["closed-form exp(uX) = matrix_exp(uX)"]["ok"]
    assert numbers["sections"]["lookup"]["diagonal_spread"]["absolute (sinusoidal added)"]["value"] > 0.1


def test_numbers_json_has_every_figures_data(numbers):
    s = numbers["sections"]
    assert set(s) == set(T.SECTIONS)
    assert set(s["rows"]["rows"]) == set(T.ROWS)
    for row in s["rows"]["rows"].values():
        assert len(row["trajectory"]) == len(s["rows"]["lags"])
    we = s["clocks"]["worked_example"]
    assert round(we["pairs"][0]["score"], 3) == 5.543 and we["pairs"][0]["gap"] == 3
    assert round(we["pairs"][-1]["score"], 3) != 5.543
    prec = s["precision"]
    assert max(prec["positions"]) == 2**31 - 1
    assert prec["float32_max_error"] > 1e-3  # the float32 pipeline visibly breaks
    assert len(s["spectrum"]["entries"]) >= 7


def test_scaling_and_classification_are_used(numbers):
    s = numbers["sections"]
    assert set(s["scaling"]["after"]) == {"linear", "ntk", "yarn", "llama3"}
    w = s["scaling"]["before"]
    for name, after in s["scaling"]["after"].items():
        assert len(after) == len(w) and after != w, name  # every map changes the spectrum
    assert s["scaling"]["logit_scale"]["yarn"] > 1.0 and s["scaling"]["logit_scale"]["linear"] == 1.0
    for name, row in s["rows"]["rows"].items():
        counts = row["classification"]["counts"]
        assert counts[name] >= 1 and sum(counts.values()) == counts[name], (name, counts)


def test_inline_images_are_data_uris(tour_dir):
    out, _ = tour_dir
    tag = report._img("figures/spectrum.png", out, True, "spectrum")
    assert "src='data:image/png;base64," in tag


def test_help_lists_examples_for_every_subcommand():
    text = build_parser().format_help()
    for sub in ("classify", "catalogue", "tour", "plot", "bench"):
        assert f"liepos {sub}" in text, sub


def test_core_never_imports_matplotlib():
    code = (
        "import sys, liepos, liepos._theory, liepos.plot, liepos.report; liepos._theory.spectrum(); "
        "assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if 'matplotlib' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_renders_in_headless_chromium(tour_dir, tmp_path):
    """The browser check of scripts/check_report.py; skipped where no chromium is installed."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_report
    finally:
        sys.path.pop(0)
    if check_report.find_chromium() is None:
        pytest.skip("no chromium (apt-get install chromium) for the browser check")
    out, _ = tour_dir
    problems = check_report.check(out / "index.html", tmp_path / "shot.png", check_report.find_chromium(), 1280, 3000)
    assert problems == []
