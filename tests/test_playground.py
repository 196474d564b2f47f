"""The playground computes: the page's own float64 exp(uX) for a typed X equals liepos's, in headless Chromium.

The browser tests open the one-file page (`liepos tour`'s default) from disk with every request outside the
file refused, so they also show the page works offline and alone."""

from __future__ import annotations

import math
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos.tables import storage_order
from liepos.tour import playground as PG


pytestmark = pytest.mark.slow  # the page through a browser: CI runs it, the everyday lane does not

ROOT = Path(__file__).resolve().parents[1]
f64 = torch.float64
# the one-block presets -> the row of the six that liepos.classify must give them
PRESET_ROWS = {"NoPE": "nope", "decay": "decay", "xPos": "damped_rotation", "RetNet": "damped_rotation",
               "ALiBi's slide": "polynomial", "Jordan-3, decaying": "polynomial", "growth": "growth"}
TWO_BLOCKS = [(-0.1, 0.5, 2, 2.0), (0.0, 0.0, 2, 0.5)]  # a coupled spiral pair plus ALiBi's slide, coupling 0.5
WIDTHS = (390, 1280)  # a phone and a laptop


# ---------------------------------------------------------------------- the Python side
@pytest.mark.parametrize("name", list(PRESET_ROWS))
def test_every_one_block_preset_lands_on_its_row(name):
    assert PG.rows_of(PG.PRESETS[name]) == [PRESET_ROWS[name]]


blocks_st = st.lists(st.tuples(st.sampled_from([-0.3, -0.05, 0.0, 0.04]), st.sampled_from([0.0, 0.25, 1.0]),
                               st.integers(1, 3), st.sampled_from([0.5, 1.0, 2.0])), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None)
@given(blocks=blocks_st, u=st.floats(-3.0, 3.0))
def test_exp_blocks_is_the_matrix_exponential_of_x(blocks, u):
    X = PG.generator(blocks).matrix().to(f64)
    assert torch.allclose(PG.exp_blocks(blocks, u), torch.linalg.matrix_exp(u * X), atol=1e-11, rtol=1e-11)
    assert PG.parse_blocks(PG.block_text(blocks)) == [tuple(map(float, b[:2])) + (b[2], float(b[3])) for b in blocks]


def test_a_bad_block_is_refused_by_name():
    with pytest.raises(ValueError, match="'\\(1, 2\\)'"):
        PG.parse_blocks("(0, 0.5, 1) + (1, 2)")


# ---------------------------------------------------------------------- the page
def _chromium() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_report
    finally:
        sys.path.pop(0)
    binary = check_report.find_chromium()
    if binary is None:
        pytest.skip("no chromium (apt-get install chromium) for the browser test")
    return binary


@pytest.fixture(scope="module")
def one_file_page(tmp_path_factory):
    pytest.importorskip("matplotlib")
    from liepos.tour.page import tour

    out = tmp_path_factory.mktemp("one") / "liepos-tour.html"
    written = tour(out, dpi=20, quiet=True)
    assert written.failed == [] and written.index == out
    return out


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    binary = _chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, page_file: Path, width: int):
    """The page at ``width`` px, every request outside the file refused; (page, page errors, failed requests)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    failed: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: failed.append(r.url[:80]))
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith(("file:", "data:"))
               else route.continue_())
    page.goto(page_file.as_uri())
    page.wait_for_function("document.getElementById('img-check') !== null")
    return page, errors, failed


def test_the_page_is_one_file_with_no_relative_src_or_href(one_file_page):
    class Refs(HTMLParser):
        refs: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]

    assert sorted(p.name for p in one_file_page.parent.iterdir()) == [one_file_page.name]
    text = one_file_page.read_text(encoding="utf-8")
    parser = Refs()
    parser.feed(text)
    figures = [r for r in parser.refs if r.startswith("data:image/svg+xml;base64,")]
    assert len(figures) >= 10, "every figure inline as SVG"
    for ref in parser.refs:  # every figure embedded, every link within the page
        assert ref.startswith(("data:image/svg+xml;base64,", "#")), ref[:80]
    assert "url(" not in text.split("<script id='numbers'")[0].replace("data:image", ""), "no stylesheet reference"
    assert "<script id='numbers' type='application/json'>" in text, "the numbers are in the page"
    assert len(one_file_page.read_bytes()) < 3_000_000, "the one-file page should stay lean"


@pytest.mark.parametrize("width", WIDTHS)
def test_no_horizontal_scroll_at_a_phone_and_a_laptop_width(one_file_page, browser, width):
    page, errors, failed = _open(browser, one_file_page, width)
    scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    broken = page.get_attribute("#img-check", "data-broken")
    # no number is broken across lines: the text of every number cell sits on one line
    wrapped = page.evaluate("""() => [...document.querySelectorAll('td.n')].filter(td => {
        const r = document.createRange(); r.selectNodeContents(td);
        return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size > 1;
      }).map(td => td.textContent).slice(0, 5)""")
    svg_width = page.evaluate("document.getElementById('pg-traj').viewBox.baseVal.width")
    page.close()
    assert errors == [] and failed == [] and broken == "0"
    assert scroll == client == width
    assert wrapped == []
    assert svg_width <= width, "the playground's plots are drawn at the width they get"


def _matrix(page) -> list[list[float]]:
    return page.eval_on_selector("#pg-A", """t => [...t.querySelectorAll('tr')].slice(1).map(
        r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.v)))""")


def test_typing_a_two_block_x_gives_liepos_numbers_to_1e_12(one_file_page, browser):
    page, errors, failed = _open(browser, one_file_page, 1280)
    page.fill("#pg-x", PG.block_text(TWO_BLOCKS))  # typed: the input event redraws
    page.fill("#pg-u", "2.3")
    A = torch.tensor(_matrix(page), dtype=f64)
    rows = page.eval_on_selector_all("#pg-rows li", "ls => ls.map(l => l.dataset.row)")
    page.check("input[name='pg-layout'][value='half']")
    half = torch.tensor(_matrix(page), dtype=f64)
    page.fill("#pg-x", "(0, 0.5, 1) + (1, 2)")
    error = page.text_content("#pg-x-error")
    page.close()
    assert errors == [] and failed == []
    want = PG.exp_blocks(TWO_BLOCKS, 2.3)
    assert A.shape == want.shape == (6, 6)
    assert (A - want).abs().max() <= 1e-12 * max(1.0, float(want.abs().max()))
    assert rows == PG.rows_of(TWO_BLOCKS) == ["polynomial", "polynomial"]
    # the half layout permutes rows and columns by liepos's one layout permutation
    perm = storage_order([0, 2], 6, 6, "half")  # the spiral pair's two planes start at dims 0 and 2
    stored = torch.empty_like(want)
    for i in range(6):
        for j in range(6):
            stored[perm[i], perm[j]] = want[i, j]
    assert (half - stored).abs().max() <= 1e-12 * max(1.0, float(want.abs().max()))
    assert "(1, 2)" in error


def _vec(d: int, seed: int) -> torch.Tensor:
    """The page's fixed vectors: a Park–Miller sequence, minus one half, normalised."""
    x, out = seed, []
    for _ in range(d):
        x = x * 16807 % 2147483647
        out.append(x / 2147483647 - 0.5)
    v = torch.tensor(out, dtype=f64)
    return v / v.norm()


def test_shifting_both_positions_by_keyboard_keeps_the_score_liepos_gives(one_file_page, browser):
    page, errors, _ = _open(browser, one_file_page, 390)
    page.fill("#pg-x", PG.block_text(TWO_BLOCKS))
    out = page.locator("#pg-shift-out")
    a0 = float(out.get_attribute("data-a"))
    page.focus("#pg-shift")
    for _ in range(7):
        page.keyboard.press("ArrowRight")  # shift both positions by 7, from the keyboard
    shift = page.input_value("#pg-shift")
    a, b = float(out.get_attribute("data-a")), float(out.get_attribute("data-b"))
    t, s = float(page.input_value("#pg-t")), float(page.input_value("#pg-s"))
    labelled = page.evaluate("""() => [...document.querySelectorAll('#pg input, #pg select')].filter(
        e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id || e.name)""")
    page.close()
    assert errors == [] and shift == "7" and a == a0
    enc = lp.Encoding(PG.generator(TWO_BLOCKS))
    q, k = _vec(6, 777).reshape(1, 1, 1, 6), _vec(6, 4242).reshape(1, 1, 1, 6)
    want = float((enc.query(q, [t]) * enc.key(k, [s])).sum())  # F(t)ᵀG(s) = A(t − s), through liepos
    assert abs(a - want) <= 1e-12 * max(1.0, abs(want))
    assert abs(b - want) <= 1e-12 * max(1.0, abs(want)), "the shifted pair scores as the unshifted one"
    assert labelled == [], "every control has a label"


def test_the_trajectory_drawn_is_liepos_a_u_v(one_file_page, browser):
    page, errors, _ = _open(browser, one_file_page, 1280)
    page.fill("#pg-x", PG.block_text(TWO_BLOCKS))
    info = page.eval_on_selector("#pg-traj polyline.series",
                                 "e => [e.getAttribute('points'), Object.assign({}, e.dataset)]")
    span = float(page.input_value("#pg-lags"))
    page.close()
    points, m = info[0], {k: float(v) for k, v in info[1].items() if k != "log"}
    got = []
    for pair in points.split():
        px, py = map(float, pair.split(","))
        got.append((m["xmin"] + (px - m["left"]) / (m["right"] - m["left"]) * (m["xmax"] - m["xmin"]),
                    m["ymin"] + (m["bottom"] - py) / (m["bottom"] - m["top"]) * (m["ymax"] - m["ymin"])))
    us = torch.linspace(0, span, len(got), dtype=f64)
    v = _vec(6, 12345)
    want = torch.stack([PG.exp_blocks(TWO_BLOCKS, float(u)) @ v for u in us])[:, :2]  # (L, 2)
    px_size = (m["xmax"] - m["xmin"]) / (m["right"] - m["left"])
    assert errors == []
    assert (torch.tensor(got, dtype=f64) - want).abs().max() <= px_size * 0.01  # drawn to 1/100 px


def test_the_scaling_panel_is_liepos_yarn_with_the_temperature_apart(one_file_page, browser):
    import json

    page, errors, _ = _open(browser, one_file_page, 1280)
    ratio = json.loads(page.get_attribute("#pg-scale", "data-ratio"))
    scale = float(page.get_attribute("#pg-temp", "data-logit-scale"))
    bands = page.eval_on_selector_all("#pg-scale rect.band", "rs => rs.map(r => r.dataset.name)")
    page.close()
    ref = PG.yarn_reference()
    assert errors == [] and bands == ["kept", "ramp", "interpolated"]
    assert max(abs(a - b) for a, b in zip(ratio, ref["ratio"], strict=True)) <= 1e-12
    assert math.isclose(scale, ref["logit_scale"], rel_tol=1e-12)


def test_the_page_checks_itself_against_liepos_for_every_preset(one_file_page, browser):
    page, errors, _ = _open(browser, one_file_page, 1280)
    worst = float(page.get_attribute("#pg-check", "data-worst"))
    names = page.eval_on_selector_all("#pg-preset option", "os => os.map(o => o.value).filter(Boolean)")
    rows, collisions = {}, []
    for name in names:
        page.select_option("#pg-preset", name)
        rows[name] = page.eval_on_selector_all("#pg-rows li", "ls => ls.map(l => l.dataset.row)")
        # no two tick labels of a plot overlap (the growth preset's used to run together)
        collisions += page.evaluate("""name => [...document.querySelectorAll('#pg svg')].flatMap(svg => {
            const boxes = [...svg.querySelectorAll('text.tick')].map(t => [t.getBBox(), t.textContent]);
            const out = [];
            for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
              const [a, ta] = boxes[i], [b, tb] = boxes[j];
              if (a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height)
                out.push(name + ' ' + svg.id + ': ' + ta + ' / ' + tb);
            }
            return out; })""", name)
    page.close()
    assert errors == [] and worst <= 1e-12
    assert collisions == []
    assert rows == {name: PG.rows_of(blocks) for name, blocks in PG.PRESETS.items()}  # as lp.classify names them


def test_check_report_passes_on_the_page(one_file_page, tmp_path):
    """scripts/check_report.py's check: every image loads, the playground draws, a screenshot is written."""
    binary = _chromium()
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_report
    finally:
        sys.path.pop(0)
    assert check_report.check(one_file_page, tmp_path / "shot.png", binary, 1280, 3000) == []
