"""Every figure says what it claims: no series fully hidden, no text outside the figure, the rows' colours.

Rendered with matplotlib in-process (Agg). A series is *hidden* when the image without it is the same,
pixel for pixel: each drawn line, marker set and image must change pixels."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from liepos.tour import figures as F  # noqa: E402
from liepos.tour import sections as S  # noqa: E402
from helpers import fast_lane  # noqa: E402

DPI = 40  # enough pixels for any visible series to change some of them


@pytest.fixture(scope="module")
def data():
    return {section: S.SECTIONS[section][1]() for section in {s for s, _, _ in F.KINDS.values()}}


def _render(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


def _series(fig) -> list:
    """Every data series of the figure's panels: lines in data coordinates, marker sets, images."""
    out = []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        out += [ln for ln in ax.lines if ln.get_transform().contains_branch(ax.transData) and len(ln.get_xdata())]
        out += [c for c in ax.collections if len(c.get_offsets())]
        out += list(ax.images)
    return out


@pytest.mark.parametrize("kind", fast_lane(*F.KINDS))
def test_no_series_is_hidden(data, kind):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = F.KINDS[kind][1](data[F.KINDS[kind][0]])
    FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    full = _render(fig)
    fig.set_layout_engine("none")  # keep the laid-out positions: only the series changes below
    series = _series(fig)
    assert series, kind
    for artist in series:
        artist.set_visible(False)
        without = _render(fig)
        artist.set_visible(True)
        label = artist.get_label() if not str(artist.get_label()).startswith("_") else type(artist).__name__
        assert (without != full).any(), f"{kind}: a series is fully hidden ({label} in '{artist.axes.get_title()}')"


@pytest.mark.parametrize("kind", fast_lane(*F.KINDS))
def test_no_text_is_clipped(data, kind):
    """The tight bounding box of everything drawn (every panel, label, title, legend) lies inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = F.KINDS[kind][1](data[F.KINDS[kind][0]])
    FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    parts = [("the figure", fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans))]
    parts += [(f"panel {ax.get_title()!r}", ax.get_tightbbox(renderer)) for ax in fig.axes]
    parts += [(f"legend {lg.get_title().get_text()!r}", lg.get_window_extent(renderer)) for lg in fig.legends]
    for what, bb in parts:
        assert bb.x0 >= -1 and bb.y0 >= -1 and bb.x1 <= W + 1 and bb.y1 <= H + 1, (
            f"{kind}: {what} reaches outside the figure: {bb.bounds} in {W:.0f}x{H:.0f}")


def test_row_colours_are_defined_once_for_the_six_rows():
    import liepos.classification

    assert tuple(F.ROW_COLORS) == S.ROWS
    assert len(set(F.ROW_COLORS.values())) == 6
    assert getattr(liepos.classification, "ROW_COLORS", F.ROW_COLORS) == F.ROW_COLORS  # one table, once merged


def test_six_rows_use_their_colours(data):
    for kind in ("trajectories", "fate"):
        fig = F.KINDS[kind][1](data["rows"])
        colours = {to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()}
        colours |= {to_hex(c) for ax in fig.axes for coll in ax.collections for c in coll.get_edgecolors()}
        for row in S.ROWS:
            assert F.ROW_COLORS[row].lower() in colours, (kind, row)
    titles = [(ax.get_title(), to_hex(ax.title.get_color())) for ax in F.draw_trajectories(data["rows"]).axes]
    for row, (title, colour) in zip(data["rows"]["rows"], titles):
        assert S.ROW_LABELS[row] in title and colour == F.ROW_COLORS[row].lower()


def test_spectrum_draws_the_growth_example_of_the_six_rows(data):
    points = data["spectrum"]["entries"]["growth (example)"]["points"]
    assert sorted(p["rate"] for p in points) == [0.08, 0.15]  # diag(0.15, 0.08), the text's example
    assert {p["row"] for p in points} == {"growth"}


def test_spectrum_marker_area_grows_with_the_block_size(data):
    fig = F.draw_spectrum(data["spectrum"])
    sizes = {float(s) for c in fig.axes[0].collections for s in c.get_sizes()}
    assert F._block_area(3) >= 5 * F._block_area(1) and F._block_area(3) in sizes and F._block_area(1) in sizes


def test_fate_window_shows_growth_overtaking_the_slide(data):
    rows = data["rows"]["rows"]
    u = F._crossing(rows["growth"]["norm"], rows["polynomial"]["norm"], data["rows"]["lags"])
    assert u is not None and u < data["rows"]["lags"][-1] - 5  # the crossing lies well inside the window


def test_every_panel_is_labelled(data):
    for kind, (section, draw, _) in F.KINDS.items():
        fig = draw(data[section])
        assert fig.get_suptitle(), kind
        plots = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison]
        for ax in plots:
            assert ax.get_xlabel() and (ax.get_ylabel() or ax.get_shared_y_axes().get_siblings(ax) != [ax]), (kind, ax.get_title())
        legends = [ax.get_legend() for ax in plots] + list(fig.legends)
        lines = [a for ax in plots for a in ax.lines if isinstance(a, Line2D)]
        if len(lines) > 3:
            assert any(lg is not None for lg in legends), f"{kind} draws several series without a legend"

