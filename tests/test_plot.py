"""Figures: each kind alone, readable (labels, titles, legends), one colour per row, and `liepos plot`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402

from liepos import _theory as T  # noqa: E402
from liepos import plot as P  # noqa: E402
from liepos.cli import main  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
# figures that draw several series and so need a legend
WITH_LEGEND = {"group", "trajectories", "fate", "clocks", "spectrum", "scaling", "precision", "alibi"}


@pytest.fixture(scope="module")
def figures():
    return {kind: P.figure(kind) for kind in P.KINDS}


def test_row_colours_are_defined_once_for_the_six_rows():
    assert tuple(P.ROW_COLORS) == T.ROWS
    assert len(set(P.ROW_COLORS.values())) == 6


@pytest.mark.parametrize("kind", list(P.KINDS))
def test_every_figure_is_readable(figures, kind):
    fig = figures[kind]
    assert fig._suptitle is not None and fig._suptitle.get_text()
    plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison]
    assert plots, kind
    for ax in plots:
        assert ax.get_xlabel() and ax.get_ylabel(), (kind, ax.get_title())
        assert ax.get_title() or len(plots) == 1, kind
    if kind in WITH_LEGEND:
        assert any(ax.get_legend() is not None for ax in plots), kind


@pytest.mark.parametrize("kind", list(P.KINDS))
def test_every_figure_saves_as_png(figures, kind, tmp_path):
    path = P.save(figures[kind], tmp_path / f"{kind}.png", dpi=60)
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 5_000


def test_six_rows_use_their_colours(figures):
    data = T.six_rows()
    for fig_kind in ("trajectories", "fate"):
        fig = figures[fig_kind]
        colours = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()}
        for row in T.ROWS:
            assert P.ROW_COLORS[row].lower() in colours, (fig_kind, row)
    # each trajectory panel is titled with its row's label in its row's colour
    titles = [(ax.get_title(), to_hex(ax.title.get_color())) for ax in figures["trajectories"].axes]
    for row, (title, colour) in zip(data["rows"], titles):
        assert T.ROW_LABELS[row] in title and colour == P.ROW_COLORS[row].lower()


def test_trajectories_have_the_seeds_shapes():
    rows = T.six_rows()["rows"]
    norms = {k: r["norm"] for k, r in rows.items()}
    assert all(abs(n - 1.0) < 1e-12 for n in norms["rotation"])  # the circle
    assert all(abs(n - 1.0) < 1e-12 for n in norms["nope"])  # still
    assert norms["decay"][-1] < 0.2 and norms["damped_rotation"][-1] < 0.25  # fade, spiral
    assert norms["growth"][-1] > 10  # explosion
    slide = rows["polynomial"]["trajectory"]
    assert all(abs(p[1] - slide[0][1]) < 1e-12 for p in slide)  # the slide keeps its second coordinate


def test_liepos_plot_command(tmp_path, capsys):
    out = tmp_path / "spectrum.png"
    js = tmp_path / "spectrum.json"
    assert main(["plot", "spectrum", "--out", str(out), "--json", str(js), "--dpi", "60"]) == 0
    assert out.read_bytes()[:8] == PNG
    data = json.loads(js.read_text())
    assert "rope" in data["entries"]
    assert main(["plot", "clocks", "--base", "1000", "--out", str(tmp_path / "c.png"), "--dpi", "60"]) == 0
    assert main(["plot", "scaling", "--factor", "4", "--out", str(tmp_path / "s.png"), "--dpi", "60"]) == 0
    with pytest.raises(SystemExit):
        main(["plot", "no-such-figure", "--out", str(tmp_path / "x.png")])


def test_plot_help_lists_every_kind(capsys):
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    text = capsys.readouterr().out
    for kind in P.KINDS:
        assert f"liepos plot {kind}" in text


def test_unknown_kind_in_python_api():
    with pytest.raises(ValueError, match="unknown plot kind"):
        P.figure("nope-not-a-kind")
