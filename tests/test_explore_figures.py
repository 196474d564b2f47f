"""The explorer's figures can be read: no series hidden, plain ticks (no 1e-6 labels, no offsets), no two
series alike (ALiBi and Jordan-3 apart), the map coloured by a measurement per block, passkey by distance."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from liepos.explore import figures as F
from liepos.explore.evaluate import evaluate_passkey
from liepos.explore.sweep import _one, summarise
from liepos.explore.tasks import make_task
from liepos.explore.train import Dist, TrainConfig

DPI = 40
ENCODINGS = ["rope", "alibi", "jordan3", "learn:rope"]


def _results(task_name: str) -> dict:
    cfg = TrainConfig(task=task_name, d_model=16, layers=1, heads=2, steps=3, batch_size=4, train_len=16,
                      eval_lens=[16, 32, 64, 256], eval_tokens=256, warmup=1, gen_lr=0.05, eval_scaling=["yarn"],
                      snapshots=3)
    task = make_task(task_name)
    runs = []
    for enc in ENCODINGS:
        _, r = _one(cfg, task, enc, 0, Dist("cpu"), False, "")
        r["learned"] = True  # three steps learn nothing: every run counts here, to draw every series
        runs.append(r)
    return summarise(asdict(cfg), ENCODINGS, [0], task.describe(), runs)


@pytest.fixture(scope="module")
def lookup(one_thread_module):
    return _results("lookup")


@pytest.fixture(scope="module")
def passkey(one_thread_module):
    return _results("passkey")


@pytest.fixture(scope="module")
def one_thread_module():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _figures(lookup, passkey):
    return {"lengths": F.plot_lengths(lookup), "map": F.plot_map([lookup, passkey]),
            "trajectory": F.plot_trajectory(lookup), "passkey": F.plot_passkey(passkey),
            "passkey_lengths": F.plot_lengths(passkey)}


def _render(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
def test_no_series_is_hidden(lookup, passkey):
    figs = _figures(lookup, passkey)
    figs.pop("map")  # one scatter per panel, its points jittered apart: test_the_map_colours_blocks_...
    for kind, fig in figs.items():
        fig.set_dpi(DPI)
        full = _render(fig)
        fig.set_layout_engine("none")
        series = [a for ax in fig.axes if ax.get_label() != "<colorbar>"
                  for a in [*ax.lines, *[c for c in ax.collections if len(c.get_offsets())]]]
        assert series, kind
        for artist in series:
            artist.set_visible(False)
            hidden = (_render(fig) == full).all()
            artist.set_visible(True)
            assert not hidden, f"{kind}: {artist.get_label()} is fully hidden"


@pytest.mark.slow  # the everyday lane leaves it to CI (seconds to minutes on two cores)
def test_ticks_are_plain_and_distinct(lookup, passkey):
    """Every visible tick label is short and distinct on its axis, and no axis has an offset or 1e-6 text."""
    for kind, fig in _figures(lookup, passkey).items():
        fig.canvas.draw()
        for ax in fig.axes:
            if not ax.get_visible() or ax.get_label() == "<colorbar>":
                continue
            for side in (ax.xaxis, ax.yaxis):
                assert side.get_offset_text().get_text() == "", (kind, ax.get_title())
                spec = ax.get_subplotspec()
                if side is ax.yaxis and spec is not None and not spec.is_first_col() and kind.endswith("lengths"):
                    continue  # a shared y axis: its labels are on the first panel of the row
                lo, hi = sorted(ax.get_xlim() if side is ax.xaxis else ax.get_ylim())
                labels = [t.get_text() for t, v in zip(side.get_ticklabels(), side.get_ticklocs())
                          if lo <= v <= hi and t.get_text()]
                assert labels, (kind, ax.get_title())
                assert len(labels) == len(set(labels)), (kind, ax.get_title(), labels)
                assert all(len(t) <= 7 and "e-" not in t for t in labels), (kind, ax.get_title(), labels)


def test_alibi_and_jordan3_never_share_colour_and_marker(lookup):
    fig = F.plot_lengths(lookup)
    styles = {ln.get_label(): (ln.get_color(), ln.get_marker()) for ax in fig.axes for ln in ax.lines
              if not ln.get_label().startswith("_")}
    assert styles["alibi"] != styles["jordan3"]
    assert len(set(styles.values())) == len(styles)  # no two series alike anywhere in the figure
    polynomial = [ax for ax in fig.axes if ax.get_title() == "polynomial"]
    assert {ln.get_label() for ln in polynomial[0].lines} >= {"alibi", "jordan3"}  # one panel, apart


def test_the_map_colours_blocks_by_their_own_measured_share(lookup):
    fig = F.plot_map([lookup])
    panels = {ax.get_title().split("\n")[0]: ax for ax in fig.axes if ax.get_label() != "<colorbar>"}
    rope = panels["lookup: rope"].collections[0]
    colours = {tuple(c) for c in rope.get_facecolors()}
    assert len(colours) > 1  # a colour per block, not one per encoding
    pts = F.map_points(lookup)
    assert len(panels) == len(pts)  # faceted: a panel per encoding
    offsets = rope.get_offsets()
    assert len({tuple(o) for o in offsets}) == len(offsets)  # jittered: no two blocks on one point


def test_passkey_figure_has_every_distance_bucket(passkey):
    fig = F.plot_passkey(passkey)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-16", "16-32", "32-64", "64-128", "128-256"]
    assert set(ax.get_legend_handles_labels()[1]) >= {"rope", "alibi"}


def test_passkey_by_distance_pools_every_length(passkey):
    row = passkey["summary"]["rope"]
    total = sum(t[3] for t in row["by_distance"].values())
    runs = [r for r in passkey["runs"] if r["encoding"] == "rope"]
    assert total == sum(r["eval"][L]["tokens_scored"] for r in runs for L in ("16", "32", "64", "256"))
    assert evaluate_passkey is not None
