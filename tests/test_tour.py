"""`liepos tour --folder`: one run into a temporary folder, shared by every test of this module (the default
one-file page is tested in tests/test_playground.py)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from liepos.tour import page  # noqa: E402
from liepos.tour import sections as T  # noqa: E402


pytestmark = pytest.mark.slow  # the tour run as a user runs it: CI runs it, the everyday lane does not

ROOT = Path(__file__).resolve().parents[1]
DPI = 50  # half the default: the same page, lighter figures, a quicker test


@pytest.fixture(scope="module")
def tour_run(tmp_path_factory):
    """The command as a user runs it, stdout and stderr captured as a log file would hold them."""
    out = tmp_path_factory.mktemp("tour")
    proc = subprocess.run([sys.executable, "-c", "import sys; from liepos.cli import tour as t; import argparse\n"
                           "p = argparse.ArgumentParser(); t.configure(p); sys.exit(t.run(p.parse_args(sys.argv[1:])))",
                           "--folder", "--out", str(out), "--dpi", str(DPI)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


@pytest.fixture(scope="module")
def tour_dir(tour_run):
    return tour_run[0]


@pytest.fixture(scope="module")
def numbers(tour_dir):
    return json.loads((tour_dir / "numbers.json").read_text())


def svg_size(path: Path) -> tuple[float, float]:
    """The width and height (pt) of an SVG figure, after checking it parses and draws something."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", f"{path} is not an SVG"
    drawn = [e for e in root.iter() if e.tag.endswith(("path", "image", "use"))]
    texts = [e for e in root.iter() if e.tag.endswith("text")]
    assert len(drawn) > 10 and texts, f"{path} draws nothing"
    return float(root.get("width").removesuffix("pt")), float(root.get("height").removesuffix("pt"))


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.srcs.append(a.get("src", ""))
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])

    def handle_data(self, data):
        self.text.append(data)


def test_the_command_prints_an_absolute_path_and_how_to_open_it(tour_run):
    out, proc = tour_run
    index = (out / "index.html").resolve()
    assert f"wrote {index} " in proc.stdout
    assert f"open it in a browser: {index.as_uri()}" in proc.stdout


def test_progress_in_a_log_is_one_plain_line_per_step(tour_run):
    lines = tour_run[1].stderr.strip().splitlines()
    steps = len(page.SECTION_ORDER) + sum(len(v) for v in page.FIGURES.values()) + 1
    assert len(lines) == steps, lines
    assert all(re.fullmatch(r"liepos tour: \[\d+/\d+\] .+ \(\d+\.\d s\)", ln) for ln in lines), lines
    assert "\r" not in tour_run[1].stderr


def test_every_figure_is_a_valid_nonempty_svg(tour_dir, numbers):
    figs = numbers["figures"]
    assert set(figs) == {k for ks in page.FIGURES.values() for k in ks}
    for kind, f in figs.items():
        w, h = svg_size(tour_dir / f["file"])
        assert w >= 8 * 72 and h >= 4 * 72, (kind, w, h)  # every figure is at least 8 x 4 inches
    assert sorted(p.name for p in (tour_dir / "figures").iterdir()) == sorted(f"{k}.svg" for k in figs)


def test_every_image_and_link_of_the_page_exists(tour_dir, numbers):
    parser = _Refs()
    parser.feed((tour_dir / "index.html").read_text(encoding="utf-8"))
    assert len(parser.srcs) == len(numbers["figures"])
    for src in parser.srcs:
        assert not src.startswith(("http:", "https:", "/")), src
        svg_size(tour_dir / src)
    for href in parser.links:
        if not href.startswith("#"):
            assert (tour_dir / href).exists(), href
    html = (tour_dir / "index.html").read_text(encoding="utf-8")
    for key in page.SECTION_ORDER:
        assert f"id='{key}'" in html and page.TITLES[key] in html


def test_words_a_newcomer_knows(tour_dir):
    parser = _Refs()
    parser.feed((tour_dir / "index.html").read_text(encoding="utf-8"))
    text = " ".join(parser.text)
    assert "seeds" not in text.lower()
    assert "Encoding(" not in text and "Generator(" not in text, "a raw Python repr in the page"
    first_r1 = text.index("R1")
    assert "real block of size 1" in text[first_r1 - 300: first_r1 + 300], "R1 is explained where it first appears"
    assert "Glossary" in text


def test_the_footer_install_line_is_the_readme_set_up_command(tour_dir):
    readme = (ROOT / "README.md").read_text()
    setup = [b.strip() for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S) if "pip install" in b]
    assert page.INSTALL == setup[0]
    assert html.escape(page.INSTALL) in (tour_dir / "index.html").read_text(encoding="utf-8")


def test_numbers_json_holds_identity_errors_under_bounds(numbers):
    errors = numbers["errors"]
    assert numbers["failed"] == []
    for row in T.ROWS:
        for ident in ("A(0) = I", "A(u)A(v) = A(u+v)", "F(t)^T G(s) = A(t-s)"):
            e = errors[f"group/rows/{row}/{ident}"]
            assert e["value"] <= e["bound"] <= 1e-12, (row, ident, e)
    for k, e in errors.items():
        if e["bound"] is not None:
            assert e["ok"] and e["value"] <= e["bound"], (k, e)
    assert numbers["sections"]["lookup"]["diagonal_spread"]["absolute (sinusoidal added)"]["value"] > 0.1


def test_numbers_json_has_every_figures_data(numbers):
    s = numbers["sections"]
    assert set(s) == set(page.SECTION_ORDER)
    assert set(s["rows"]["rows"]) == set(T.ROWS)
    for row in s["rows"]["rows"].values():
        assert len(row["trajectory"]) == len(s["rows"]["lags"])
    we = s["clocks"]["worked_example"]
    assert round(we["pairs"][0]["score"], 3) == T.WORKED_EXAMPLE_SCORE and we["pairs"][0]["gap"] == 3
    assert round(we["pairs"][-1]["score"], 3) != T.WORKED_EXAMPLE_SCORE
    assert max(s["precision"]["positions"]) == 2**31 - 1
    assert s["precision"]["float32_max_error"] > 1e-3  # the float32 pipeline visibly breaks


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
        assert row["example"]["classification"]["counts"][name] >= 1, "the shipped example is of the card's row"


def test_trajectories_have_the_shapes_of_the_six_rows():
    rows = T.six_rows()["rows"]
    norms = {k: r["norm"] for k, r in rows.items()}
    assert all(abs(n - 1.0) < 1e-12 for n in norms["rotation"])  # the circle
    assert all(abs(n - 1.0) < 1e-12 for n in norms["nope"])  # still
    assert norms["decay"][-1] < 0.2 and norms["damped_rotation"][-1] < 0.25  # fade, spiral
    assert norms["growth"][-1] > 10  # explosion
    slide = rows["polynomial"]["trajectory"]
    assert all(abs(p[1] - slide[0][1]) < 1e-12 for p in slide)  # the slide keeps its second coordinate


def test_core_never_imports_matplotlib():
    code = ("import sys, liepos, liepos.tour, liepos.tour.figures, liepos.cli.tour, liepos.cli.plot; "
            "liepos.tour.sections.spectrum(); "
            "assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if 'matplotlib' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_command_writes_one_file_by_default_and_a_folder_on_request(tmp_path, monkeypatch, capsys):
    """The paths `liepos tour` hands to the page writer (the writing itself is the fixture's run above)."""
    import argparse

    import liepos.cli.tour as cli
    import liepos.tour.page as P

    calls = []

    def fake(out, *, folder, dpi, quiet):
        calls.append((Path(out), folder))
        index = Path(out) / "index.html" if folder else Path(out)
        return P.Written(index, [], 0.0)

    monkeypatch.setattr(P, "tour", fake)
    monkeypatch.chdir(tmp_path)
    for argv in ([], ["--folder"], ["--out", "x/page.html"]):
        p = argparse.ArgumentParser()
        cli.configure(p)
        assert cli.run(p.parse_args(argv)) == 0
    assert calls == [(tmp_path / "liepos-tour.html", False), (tmp_path / "liepos-tour", True),
                     (tmp_path / "x" / "page.html", False)]
    out = capsys.readouterr().out
    assert "one self-contained file" in out
    p = argparse.ArgumentParser()
    cli.configure(p)
    with pytest.raises(cli.UsageError, match="must end in .html"):
        cli.run(p.parse_args(["--out", "page.txt"]))


def test_an_encoding_repr_is_compact_and_names_its_heads():
    import liepos as lp

    text = repr(lp.rope(128))
    assert re.fullmatch(r"Encoding\('rope', Generator\(dim=128, blocks=\[64×C1\]\), layout='interleaved', "
                        r"values=#[0-9a-f]{8}\)", text), text
    hf = lp.from_hf({"head_dim": 128, "rope_theta": 10000.0})
    assert repr(hf).count("C1") == 1 and "64×C1" in repr(hf)
    alibi = lp.build("alibi", 8, 4)
    assert "heads=4" in repr(alibi) and repr(alibi) != repr(lp.build("alibi", 8, 2))
    assert "heads=2" in repr(lp.build("retnet", 8, 2)) and repr(lp.build("retnet", 8, 2)).count("heads") == 1
    g = lp.Generator([-0.1, -0.1, 0.0], [0.0, 0.0, 0.5], [1, 1, 2])
    assert repr(g) == "Generator(dim=6, blocks=[2×R1,C2])"


def test_the_precision_section_leaves_mpmaths_precision_as_it_was():
    """A library call changes no global state: the mpmath reference works at its own precision and
    restores the caller's."""
    mpmath = pytest.importorskip("mpmath")
    from liepos.tour.sections import precision

    before = mpmath.mp.dps
    mpmath.mp.dps = 17
    try:
        out = precision(dim=8, n_positions=4, digits=40)
        assert out["available"] and mpmath.mp.dps == 17
    finally:
        mpmath.mp.dps = before
