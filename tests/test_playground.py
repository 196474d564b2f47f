"""The playground: its numbers are liepos's, and the page draws them (a slider driven in headless Chromium).

The browser test opens the one-file page (`tour(..., inline=True)`) from disk, so it also shows the page
works offline: nothing but the file is loaded."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from liepos.classify import classify
from liepos.tour import playground as PG

ROOT = Path(__file__).resolve().parents[1]
f64 = torch.float64
# the preset's name -> the row of the six that liepos.classify must give it
PRESET_ROWS = {"NoPE": "nope", "decay": "decay", "RoPE": "rotation", "xPos": "damped_rotation",
               "RetNet": "damped_rotation", "ALiBi": "polynomial", "growth": "growth", "Jordan-3": "polynomial"}


def _lags() -> torch.Tensor:
    return torch.arange(0.0, max(PG.GRID["lags"]) + PG.LAG_STEP / 2, PG.LAG_STEP, dtype=f64)


def _reference(rate, freq, size, coupling):
    """A(u) v from torch.linalg.matrix_exp of the dense generator, independent of Generator.exp."""
    X, _ = PG.setting_matrices(rate, freq, size, coupling, _lags())
    A = torch.linalg.matrix_exp(_lags()[:, None, None] * X)  # (L, d, d)
    v = PG._vector(X.shape[0])
    return A, v


@pytest.mark.parametrize("name", list(PG.PRESETS))
def test_every_preset_lands_on_its_row(name):
    p = PG.PRESETS[name]
    s = PG.setting(p["rate"], p["freq"], p["size"], p["coupling"])
    assert {e["row"] for e in s["eig"]} == {PRESET_ROWS[name]}
    assert {e["size"] for e in s["eig"]} == {p["size"]}


@pytest.mark.parametrize("rate,freq,size,coupling", [(-0.1, 0.5, 1, 1.0), (0.0, 0.0, 2, 2.0), (-0.03, 0.25, 3, 0.5),
                                                     (0.1, 0.0, 3, 1.0)])
def test_setting_numbers_are_the_group_and_the_encoding(rate, freq, size, coupling):
    s = PG.setting(rate, freq, size, coupling)
    A, v = _reference(rate, freq, size, coupling)
    traj = A @ v  # (L, d)

    def close(got, want):
        want = torch.as_tensor(want, dtype=f64)
        assert torch.allclose(torch.tensor(got, dtype=f64), want, rtol=10 ** -(PG.DIGITS - 1), atol=1e-12)

    close(s["x"], traj[:, 0])
    close(s["y"], traj[:, 1])
    close(s["norm"], torch.linalg.matrix_norm(A, ord=2))
    close(s["score"], A @ v @ v)  # vᵀ A(u) v, as Encoding.query · Encoding.key gave it
    per_token = round(1 / PG.LAG_STEP)
    for t, row in enumerate(s["table"]):  # Toeplitz: entry (t, s) is the score at lag t − s
        assert len(row) == t + 1
        close(row, [s["score"][(t - j) * per_token] for j in range(t + 1)])
    assert classify(PG._generator(rate, freq, size)).names == [e["row"] for e in s["eig"]]


# ---------------------------------------------------------------------- in the browser
def _check_report():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_report
    finally:
        sys.path.pop(0)
    return check_report


def _chromium() -> str:
    binary = _check_report().find_chromium()
    if binary is None:
        pytest.skip("no chromium (apt-get install chromium) for the browser test")
    return binary


def _drawn(page, svg: str) -> tuple[list[float], list[float]]:
    """The data coordinates of the curve drawn in ``svg``, read back from its pixels and its mapping."""
    info = page.eval_on_selector(f"#{svg} polyline.series",
                                 "e => [e.getAttribute('points'), Object.assign({}, e.dataset)]")
    points, m = info[0], {k: float(v) if v not in ("", "y") else v for k, v in info[1].items()}
    xs, ys = [], []
    for pair in points.split():
        px, py = map(float, pair.split(","))
        xs.append(m["xmin"] + (px - m["left"]) / (m["right"] - m["left"]) * (m["xmax"] - m["xmin"]))
        y = m["ymin"] + (m["bottom"] - py) / (m["bottom"] - m["top"]) * (m["ymax"] - m["ymin"])
        ys.append(10 ** y if m["log"] == "y" else y)
    return xs, ys


@pytest.fixture(scope="module")
def one_file_page(tmp_path_factory):
    pytest.importorskip("matplotlib")
    from liepos.tour.page import tour

    out = tmp_path_factory.mktemp("inline")
    written = tour(out, inline=True, dpi=20, quiet=True)
    assert written.failed == []
    return written.index


def _embedded(page_file: Path) -> dict:
    import json
    import re

    text = page_file.read_text(encoding="utf-8")
    m = re.search(r"<script id='pg-data' type='application/json'>(.*?)</script>", text, flags=re.S)
    return json.loads(m.group(1))  # JSON reads the page's escaped <\/ as </


def test_the_page_embeds_every_setting_once(one_file_page):
    d = _embedded(one_file_page)
    g = PG.GRID
    expected = len(g["rate"]) * len(g["freq"]) * (1 + (len(g["size"]) - 1) * len(g["coupling"]))
    assert len(d["settings"]) == expected
    for p in PG.PRESETS.values():
        key = PG.setting_key(p["rate"], p["freq"], p["size"], p["coupling"])
        assert d["settings"][key] == PG.setting(p["rate"], p["freq"], p["size"], p["coupling"])


def test_inline_writes_only_the_html(one_file_page):
    from html.parser import HTMLParser

    assert sorted(p.name for p in one_file_page.parent.iterdir()) == ["index.html"]

    class Refs(HTMLParser):
        refs: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]

    parser = Refs()
    parser.feed(one_file_page.read_text(encoding="utf-8"))
    assert parser.refs, "no images or links at all"
    for ref in parser.refs:  # every image embedded, every link within the page
        assert ref.startswith(("data:image/png;base64,", "#")), ref[:80]
    assert len(one_file_page.read_bytes()) < 2_500_000, "the one-file page should stay lean"


def test_a_slider_redraws_the_trajectory_with_liepos_numbers(one_file_page):
    sync_api = pytest.importorskip("playwright.sync_api")
    binary = _chromium()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        errors: list[str] = []
        page = browser.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith(("file:", "data:"))
                   else route.continue_())  # offline: nothing outside the file may load
        page.goto(one_file_page.as_uri())
        before = _drawn(page, "pg-traj")
        # RoPE is the preset on load; move the frequency slider to ω = 1 and the rate slider to λ = -0.1
        page.fill("#pg-freq", str(PG.GRID["freq"].index(1.0)))
        page.fill("#pg-rate", str(PG.GRID["rate"].index(-0.1)))
        x, y = _drawn(page, "pg-traj")
        nx, ny = _drawn(page, "pg-norm")
        rows = page.eval_on_selector_all("#pg-spectrum circle.eig", "es => es.map(e => e.dataset.row)")
        page.select_option("#pg-preset", "ALiBi")
        alibi_row = page.text_content("#pg-row")
        browser.close()
    assert errors == []
    assert (x, y) != before, "moving the sliders did not redraw the trajectory"
    A, v = _reference(-0.1, 1.0, 1, 1.0)
    traj = A @ v  # (L, d)
    lim = float(traj[:, :2].abs().max())
    assert len(x) == len(traj)
    for got, want in ((x, traj[:, 0]), (y, traj[:, 1])):
        err = max(abs(g - float(w)) for g, w in zip(got, want))
        assert err < 2e-3 * lim, err  # 3 significant digits and 0.01 px
    norm = torch.linalg.matrix_norm(A, ord=2)
    assert max(abs(math.log10(g) - math.log10(float(w))) for g, w in zip(ny, norm)) < 1e-2
    assert nx[-1] == pytest.approx(max(PG.GRID["lags"]))
    assert set(rows) == {"damped_rotation"}
    assert "ALiBi" in alibi_row


def test_the_page_renders_in_headless_chromium(one_file_page, tmp_path):
    """scripts/check_report.py's check: every image loads, the playground draws, a screenshot is written."""
    problems = _check_report().check(one_file_page, tmp_path / "shot.png", _chromium(), 1280, 3000)
    assert problems == []
