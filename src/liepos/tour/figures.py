"""The tour's figures, one function per picture.

Each ``draw_<kind>(data)`` takes the plain data of a section of :mod:`liepos.tour.sections` and
returns a matplotlib ``Figure`` (Agg canvas, no pyplot state). matplotlib is the optional
``liepos[plot]`` extra: it is imported inside the functions (:func:`require_matplotlib`), never by
the core package. The six rows have one colour each, everywhere: :data:`ROW_COLORS`.

Every figure is held to two rules, checked by ``tests/test_figures.py``: no series is fully hidden
(each drawn series changes pixels), and no text falls outside the figure.

>>> from liepos.tour.figures import KINDS, ROW_COLORS
>>> from liepos.tour.sections import ROWS, SECTIONS
>>> tuple(ROW_COLORS) == ROWS and all(section in SECTIONS for section, _, _ in KINDS.values())
True
"""

from __future__ import annotations

import inspect
import math
import textwrap
from pathlib import Path
from typing import Any

from liepos.classification import ROW_COLORS  # one colour per row of the six, defined once with the rows
import liepos.tour.sections as S
from liepos.tour.kinds import KIND_TITLES

__all__ = ["ROW_COLORS", "KINDS", "FORMATS", "require_matplotlib", "section_params", "figure", "save"]

# series that are not rows (bases, maps, heads, pipelines): Paul Tol's muted scheme, dark enough on white
SERIES_COLORS = ("#332288", "#117733", "#882255", "#44AA99", "#999933", "#AA4499", "#88CCEE", "#DDCC77")
_DIVERGING = "RdBu_r"  # data of both signs, centred on 0
_SEQUENTIAL = "viridis"  # data of one sign
# file formats `save` writes, by suffix
FORMATS = {".png": "png", ".svg": "svg"}
# exact zeros drawn on a log axis sit at this floor, with a hollow marker
_LOG_FLOOR = 1e-18


def require_matplotlib():
    """matplotlib's ``Figure`` class with the Agg backend, or ImportError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError("liepos figures need matplotlib: pip install -e \".[plot]\"") from err
    return Figure


def _new(w: float, h: float, title: str | None = None):
    fig = require_matplotlib()(figsize=(w, h), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=13, fontweight="bold")
    return fig


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


def _heat(fig, ax, M, title: str, *, cbar: str = "value", xlabel="key time s", ylabel="query time t"):
    """A heatmap with its colourbar beside it, as tall as the panel.

    Data of both signs get a diverging map centred on 0; data of one sign a sequential map over its
    own range (so no half of the colourbar goes unused). NaN cells are grey."""
    import numpy as np

    A = np.array(M, dtype=float)
    finite = A[np.isfinite(A)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if lo < 0 < hi:
        lim = max(-lo, hi)
        cmap, kw = _DIVERGING, dict(vmin=-lim, vmax=lim)
    else:
        cmap, kw = _SEQUENTIAL, dict(vmin=lo, vmax=hi if hi > lo else lo + 1.0)
    im = ax.imshow(np.ma.masked_invalid(A), cmap=_cmap(cmap).with_extremes(bad="#DDDDDD"), origin="upper",
                   interpolation="nearest", **kw)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    cax = ax.inset_axes([1.04, 0.0, 0.05, 1.0])  # in the panel's own box: exactly its height
    fig.colorbar(im, cax=cax, label=cbar)
    return im


def _fmt_err(x: float) -> str:
    return "0 (exact)" if x == 0 else f"{x:.1e}"


# ---------------------------------------------------------------------- the figures
def draw_attention(d: dict[str, Any]):
    """Raw scores, RoPE-encoded scores, causal softmax weights."""
    import numpy as np

    fig = _new(14, 4.6, "Where position enters: one attention head, before and after RoPE")
    axes = fig.subplots(1, 3)
    _heat(fig, axes[0], d["raw_scores"], "content only: qₜ·kₛ/√d\n(no position: a bag of tokens)", cbar="score")
    _heat(fig, axes[1], d["scores"], "RoPE-encoded: (F(t)qₜ)·(G(s)kₛ)/√d\n= qₜᵀA(t−s)kₛ/√d", cbar="score")
    W = np.array(d["weights"], dtype=float)
    W[np.array(d["mask"]) == 0] = np.nan
    _heat(fig, axes[2], W, "causal mask + softmax: attention weights\n(grey: future keys, masked)", cbar="weight")
    return fig


def draw_group(d: dict[str, Any]):
    """Measured errors of the group identities: one panel per identity, one point per generator, its bound."""
    from matplotlib.lines import Line2D

    rows = list(d["rows"].items()) + [("random dense X (from_matrix)", d["random_X"]["errors"])]
    idents = list(dict.fromkeys(k for _, r in rows for k in r))
    fig = _new(15, 5.4, "The group: A(0) = I, A(u)A(v) = A(u+v), F(t)ᵀG(s) = A(t−s), measured")
    axes = fig.subplots(1, len(idents), sharey=True)
    names = [n for n, _ in rows]
    for ax, ident in zip(axes, idents):
        found = [(i, name, r[ident]) for i, (name, r) in enumerate(rows) if ident in r]
        bound = found[0][2]["bound"]
        edges = [ROW_COLORS.get(name, "black") for _, name, _ in found]
        ax.scatter([max(e["value"], _LOG_FLOOR) for _, _, e in found], [i for i, _, _ in found], marker="o", s=45,
                   zorder=3, edgecolors=edges, linewidths=1.4,
                   facecolors=["white" if e["value"] == 0 else c for (_, _, e), c in zip(found, edges)])
        ax.axvline(bound, color="#B22222", ls="--", lw=1.0)
        ax.axvline(2.2e-16, color="#555555", ls=":", lw=1.0)
        ax.set_xscale("log")
        ax.set_xlim(_LOG_FLOOR / 10, 1e-8)
        ax.set_title(textwrap.fill(ident, 24) + f"\nbound {bound:.0e}", fontsize=9)
        ax.set_xlabel("measured error")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_ylim(-0.7, len(rows) - 0.3)
    axes[0].invert_yaxis()
    axes[0].set_yticks(range(len(rows)), [S.ROW_LABELS.get(n, n) for n in names])
    for lbl, n in zip(axes[0].get_yticklabels(), names):
        lbl.set_color(ROW_COLORS.get(n, "black"))
    axes[0].set_ylabel("generator")
    handles = [
        Line2D([], [], color="#B22222", ls="--", label="the bound of this panel's check"),
        Line2D([], [], color="#555555", ls=":", label="float64 ε = 2.2e-16"),
        Line2D([], [], ls="", marker="o", color="black", label="measured error (max |difference|, relative)"),
        Line2D([], [], ls="", marker="o", markerfacecolor="white", color="black", label="exactly 0, drawn at 1e-18"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9)
    return fig


def draw_trajectories(d: dict[str, Any]):
    """The path of a fixed vector under A(u) as the lag u grows, one panel per row."""
    import numpy as np
    from matplotlib.lines import Line2D

    fig = _new(13, 8.8, f"The six rows: A(u)·v for v = {tuple(d['vector'])}, lag u = 0 … {d['lags'][-1]:g}")
    axes = fig.subplots(2, 3).ravel()  # (6,) panels, row-major
    lags = np.array(d["lags"])
    whole = np.isclose(lags, np.round(lags))
    for ax, (name, r) in zip(axes, d["rows"].items()):
        P = np.array(r["trajectory"])  # (lags, 2)
        c = ROW_COLORS[name]
        if not np.allclose(P, P[0]):  # a path that stands still is its start point alone (NoPE)
            ax.plot(P[:, 0], P[:, 1], color=c, lw=2.2)
            ax.scatter(P[whole, 0], P[whole, 1], s=12, color=c, alpha=0.7, zorder=3)
        ax.scatter([P[0, 0]], [P[0, 1]], s=70, marker="o", facecolor="white", edgecolor=c, linewidth=2, zorder=4)
        if not np.allclose(P[-1], P[-3]):
            ax.annotate("", xy=P[-1], xytext=P[-3], arrowprops=dict(arrowstyle="-|>", color=c, lw=2, mutation_scale=18))
        ax.axhline(0, color="#999999", lw=0.6)
        ax.axvline(0, color="#999999", lw=0.6)
        X = r["X"]
        xs = "X = [[{:g}, {:g}], [{:g}, {:g}]]".format(X[0][0], X[0][1], X[1][0], X[1][1])
        ax.set_title(f"{r['label']}: {r['picture']}\n{xs}", fontsize=10, color=c)
        ax.set_xlabel("coordinate 1")
        ax.set_ylabel("coordinate 2")
        if name == "nope":
            ax.set_xlim(-1.1, 1.1)
            ax.set_ylim(-1.1, 1.1)
            ax.text(P[0, 0], P[0, 1] - 0.2, "A(u)v = v for every u", ha="center", fontsize=8, color=c)
        else:
            ax.margins(0.12)
        if name in ("rotation", "damped_rotation"):
            ax.set_aspect("equal", adjustable="datalim")
        ax.grid(True, alpha=0.25)
    handles = [
        Line2D([], [], color="black", lw=2.2, label="A(u)v as u grows (colour: the row)"),
        Line2D([], [], ls="", marker="o", ms=4, color="black", alpha=0.7, label="dots: whole lags u = 1, 2, 3, …"),
        Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="white", color="black", label="start: u = 0, the vector v (NoPE stays there)"),
        Line2D([], [], ls="", marker=">", ms=8, color="black", label="arrow: the direction of growing u"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9)
    return fig


def _crossing(a: list[float], b: list[float], lags: list[float]) -> float | None:
    """The first lag past 1 where ``a`` overtakes ``b``."""
    for u, x, y in zip(lags, a, b):
        if u > 1 and x > y:
            return u
    return None


def draw_fate(d: dict[str, Any]):
    """|A(u)v| against the lag for the six rows, log scale: fate is the real part."""
    fig = _new(9, 5.2, "Fate: |A(u)·v| against the lag u")
    ax = fig.subplots()
    rows = d["rows"]
    for name, r in rows.items():
        # NoPE and RoPE both hold |A(u)v| = 1: NoPE is a wide pale band under RoPE's line
        wide = name == "nope"
        ax.plot(d["lags"], r["norm"], color=ROW_COLORS[name], lw=7 if wide else 2, alpha=0.45 if wide else 1.0,
                zorder=1 if wide else 2, label=f"{r['label']} ({r['picture']})" + (": |A(u)v| = 1, under RoPE" if wide else ""))
    u = _crossing(rows["growth"]["norm"], rows["polynomial"]["norm"], d["lags"])
    if u is not None:
        ax.axvline(u, color="#555555", lw=0.8, ls=":")
        ax.annotate(f"growth (exponential) overtakes\nthe slide (linear) at u ≈ {u:.0f}", xy=(u, 20), xytext=(u - 17, 150),
                    fontsize=8, arrowprops=dict(arrowstyle="->", color="#555555"))
    ax.set_yscale("log")
    ax.set_xlabel("lag u = t − s (tokens)")
    ax.set_ylabel("|A(u) v|  (log scale; |v| = 1)")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(True, alpha=0.3)
    return fig


def draw_lookup(d: dict[str, Any]):
    """A(t−s) and scores over (t, s): constant diagonals; an absolute encoding breaks them."""
    fig = _new(17, 4.6, f"The lookup table: {d['cells']} cells, {d['distinct_A']} distinct A(t−s) — the diagonals repeat")
    axes = fig.subplots(1, 4)
    sp = d["diagonal_spread"]
    _heat(fig, axes[0], d["A_entry"], f"A(t−s)[0,0] = cos(0.5 (t−s))\ndiagonal spread {_fmt_err(sp['A(t-s)[0,0]']['value'])}", cbar="entry")
    _heat(fig, axes[1], d["rope_scores"], f"RoPE scores, same q and k at every t, s\ndiagonal spread {_fmt_err(sp['RoPE scores']['value'])}", cbar="score")
    _heat(fig, axes[2], d["alibi_scores"], f"ALiBi scores (causal half)\ndiagonal spread {_fmt_err(sp['ALiBi scores (causal)']['value'])}", cbar="score")
    _heat(fig, axes[3], d["absolute_scores"], f"absolute: (q+pₜ)·(k+pₛ), sinusoidal pₜ\ndiagonal spread {sp['absolute (sinusoidal added)']['value']:.2f}: broken", cbar="score")
    return fig


def draw_clocks(d: dict[str, Any]):
    """RoPE's bank of clocks: frequencies per base, score against gap, the worked example."""
    import numpy as np

    fig = _new(16, 4.9, "A bank of clocks: RoPE's frequencies, the long-term decay, the worked example of d = 16")
    axes = fig.subplots(1, 3)
    for i, (b, w) in enumerate(d["freqs"].items()):
        col = SERIES_COLORS[i % len(SERIES_COLORS)]
        axes[0].plot(range(len(w)), w, "o-", ms=3, color=col, label=f"base {b}")
        axes[1].plot(d["gaps"], d["score_vs_gap"][b], color=col, lw=1.4, label=f"base {b}")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("plane k")
    axes[0].set_ylabel("frequency ω_k = base^(−2k/d)  [rad / token]")
    axes[0].set_title(f"frequencies, d = {d['dim']}: fast planes to slow planes", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[0].grid(True, alpha=0.3, which="both")
    axes[1].set_xscale("symlog", linthresh=1)
    axes[1].set_xlabel("gap t − s (tokens; linear below 1, log above)")
    axes[1].set_ylabel("score / planes = mean_k cos(ω_k (t−s))")
    axes[1].set_title("score against gap: the long-term decay\n(q = k = (1, 0) in every plane)", fontsize=10)
    axes[1].legend(fontsize=8)
    axes[1].grid(True, alpha=0.3)
    we = d["worked_example"]
    w16 = np.array([p["freq"] for p in we["planes"]])
    g = np.linspace(0, 40, 801)
    axes[2].plot(g, np.cos(np.outer(g, w16)).sum(-1), color=ROW_COLORS["rotation"], lw=1.8, label="Σ_k cos(ω_k u), d = 16")
    axes[2].scatter([r["gap"] for r in we["pairs"]], [r["score"] for r in we["pairs"]], color="black", zorder=3,
                    label="liepos: query(t)·key(s)")
    p0 = we["pairs"][0]
    axes[2].annotate(f"gap 3: {p0['score']:.3f}\n(t, s) = (5, 2), (13, 10),\n(103, 100), (10⁶+3, 10⁶)",
                     xy=(3, p0["score"]), xytext=(10, 6.8), fontsize=8, arrowprops=dict(arrowstyle="->"))
    last = we["pairs"][-1]
    axes[2].annotate(f"gap {last['gap']}: {last['score']:.3f}", xy=(last["gap"], last["score"]), xytext=(14, 3.0),
                     fontsize=8, arrowprops=dict(arrowstyle="->"))
    axes[2].set_xlabel("gap u = t − s (tokens)")
    axes[2].set_ylabel("score q·A(u)k")
    axes[2].set_title("the worked example: d = 16, base 10000, every plane (1, 0)", fontsize=10)
    axes[2].legend(fontsize=8, loc="lower left")
    axes[2].grid(True, alpha=0.3)
    return fig


# spectrum: marker area of a block of size n (a Jordan block of size 3 is drawn ~6× the area of size 1)
def _block_area(size: int) -> float:
    return 40.0 * size ** 1.6


_LANE_POINTS = 8.0  # vertical spacing, in points, of the lanes on the ω = 0 axis


def draw_spectrum(d: dict[str, Any]):
    """The spectrum plane: rate λ (fate) against frequency ω (rhythm) of every catalogue block.

    Points on the ω = 0 axis are drawn in one lane per entry, a few points apart vertically, so that
    entries sharing a rate (NoPE and ALiBi at the origin, jordan and decay at λ = −0.5) stay visible."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import offset_copy

    fig = _new(12, 6.6, "Fate and rhythm: eigenvalues λ ± iω of every catalogue entry")
    ax = fig.subplots()
    markers = "osD^vP*Xhp"
    entries = list(d["entries"].items())
    on_axis = [name for name, e in entries if any(p["freq"] == 0 for p in e["points"])]
    for i, (name, e) in enumerate(entries):
        lane = on_axis.index(name) - (len(on_axis) - 1) / 2 if name in on_axis else 0.0
        for axis in (True, False):  # the points on ω = 0 (in the entry's lane), then the others
            pts = sorted((p for p in e["points"] if (p["freq"] == 0) == axis), key=lambda p: -p["size"])  # large first, below
            if not pts:
                continue
            tr = offset_copy(ax.transData, fig=fig, x=0.0, y=-lane * _LANE_POINTS if axis else 0.0, units="points")
            ax.scatter([p["rate"] for p in pts], [p["freq"] for p in pts], marker=markers[i % len(markers)],
                       s=[_block_area(p["size"]) for p in pts], facecolors=[ROW_COLORS[p["row"]] for p in pts],
                       edgecolors="black", linewidths=0.6, zorder=3, transform=tr)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.axvspan(0, 1, color=ROW_COLORS["growth"], alpha=0.08)
    ax.axvspan(-1, 0, color=ROW_COLORS["decay"], alpha=0.05)
    ax.axvline(0, color="black", lw=0.8)
    ax.text(2e-4, 1.5, "fate: explodes (λ > 0)", color=ROW_COLORS["growth"], fontsize=9)
    ax.text(-0.5, 1.5, "fate: fades (λ < 0)", color=ROW_COLORS["decay"], fontsize=9)
    ax.text(0, 2.2, "holds (λ = 0)", fontsize=8, ha="center", va="bottom",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    ax.annotate("at the origin, one lane each:\nNoPE, ALiBi (a size-2 slide\nand its slots), jordan's spare plane",
                xy=(0, 0), xytext=(1.5e-4, 1.2e-4), fontsize=8, arrowprops=dict(arrowstyle="->", color="#555555"))
    ax.set_xlim(-1, 1)
    ax.set_ylim(-1.5e-4, 5)
    ax.set_xlabel("rate λ = real part (fate), 1 / token   [symlog: linear within ±1e-4]")
    ax.set_ylabel("frequency ω = imaginary part (rhythm), rad / token   [symlog]")
    entry_handles = [Line2D([], [], ls="", marker=markers[i % len(markers)], markerfacecolor="white",
                            markeredgecolor="black", label=name) for i, (name, _) in enumerate(entries)]
    leg1 = ax.legend(handles=entry_handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="entry (marker)")
    ax.add_artist(leg1)
    handles: list[Artist] = [Patch(facecolor=ROW_COLORS[r], edgecolor="black", label=S.ROW_LABELS[r]) for r in S.ROWS]
    handles += [Line2D([], [], ls="", marker="o", ms=math.sqrt(_block_area(n)), markerfacecolor="white",
                       markeredgecolor="black", label=f"block size {n}") for n in (1, 2, 3)]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(1.01, 0.0), fontsize=8, title="row (colour), size (area)",
              labelspacing=1.0)
    ax.set_title("one point per distinct block (λ, |ω|); marker area grows with the block size (Jordan blocks);\n"
                 "on ω = 0 each entry has its own lane, a few points apart, so equal points stay visible",
                 fontsize=9, color="#444444")
    ax.grid(True, alpha=0.25)
    return fig


def draw_scaling(d: dict[str, Any]):
    """Context extension as maps on the spectrum."""
    import numpy as np

    fig = _new(14, 5.2, f"Context extension ×{d['factor']:g}: maps on RoPE's frequencies")
    axes = fig.subplots(1, 2)
    w = np.array(d["before"])
    wl = np.array(d["wavelength"])
    # linear is a wide pale band: yarn and llama3 equal it at low ω, so their thinner marked lines ride on it
    styles = {
        "linear": dict(color="#0072B2", ls="-", lw=7, alpha=0.35),
        "ntk": dict(color="#D55E00", ls="--", lw=2),
        "yarn": dict(color="#009E73", ls="-", lw=1.6, marker="o", ms=4, markevery=(0, 4)),
        "llama3": dict(color="#882255", ls=":", lw=2, marker="x", ms=6, markevery=(2, 4)),
    }
    axes[0].plot(w, w, color="#999999", lw=1, label="identity ω' = ω")
    for name, after in d["after"].items():
        st = styles.get(name, dict(color="black"))
        a = np.array(after)
        axes[0].plot(w, a, **st, label=f"{name} (logit ×{d['logit_scale'][name]:.3g})")
        axes[1].plot(wl, a / w, **st, label=name)
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("ω before (rad / token)")
    axes[0].set_ylabel("ω' after (rad / token)")
    axes[0].set_title(f"the map ω ↦ ω' (rope d = {d['dim']}, base {d['base']:g});\nat low ω yarn and llama3 equal linear: ω / {d['factor']:g}", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[0].grid(True, alpha=0.3, which="both")
    axes[1].axvline(d["original_max_position_embeddings"], color="black", lw=0.8, ls="--")
    axes[1].text(d["original_max_position_embeddings"] * 1.1, 0.75, "original\ncontext", fontsize=8)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log", base=2)
    f = float(d["factor"])
    ticks = [2.0 ** -i for i in range(int(math.log2(f)) + 1)]
    axes[1].set_yticks(ticks, ["1" if t == 1 else f"1/{1 / t:g}" for t in ticks])
    axes[1].minorticks_off()
    axes[1].set_ylim(1 / f / 1.25, 1.25)
    axes[1].set_xlabel("wavelength 2π/ω (tokens)")
    axes[1].set_ylabel("ω' / ω (how much each clock slows)")
    axes[1].set_title("which clocks slow down: fast planes kept, slow planes ÷ factor", fontsize=10)
    axes[1].legend(fontsize=8)
    axes[1].grid(True, alpha=0.3, which="both")
    return fig


def draw_precision(d: dict[str, Any]):
    """cos/sin error against position: a float32 pipeline and liepos side by side, log scale."""
    import numpy as np

    fig = _new(14, 5.4, "Precision: |cos, sin error| against position, reference mpmath"
               + (f" ({d['digits']} digits)" if "digits" in d else ""))
    axes = fig.subplots(1, 2, sharey=True)
    if not d.get("available", True):
        for ax in axes:
            ax.text(0.5, 0.5, d.get("note", "unavailable"), ha="center", va="center", wrap=True)
            ax.set_axis_off()
        return fig
    pos = np.array(d["positions"])
    floor = 1e-12
    markers = "o^sD"
    for ax, key, what in ((axes[0], "float32", "a float32 pipeline (Hugging Face's)"), (axes[1], "liepos", "liepos")):
        for i, (k, p) in enumerate(d["planes"].items()):
            ax.plot(pos, np.maximum(p[key], floor), color=SERIES_COLORS[i % len(SERIES_COLORS)], marker=markers[i % 4],
                    ms=4, lw=1.4, mfc="none", label=f"plane {k} (ω = {p['freq']:.2g})")
        ax.axhline(2**-24, color="black", lw=0.8, ls=":", label="float32 ulp(1) = 6e-8")
        for ctx, name in ((8192, "8k"), (131072, "128k")):
            ax.axvline(ctx, color="#888888", lw=0.8, ls="--")
            ax.text(ctx * 1.15, 1e-11, f"{name} tokens", fontsize=8, color="#555555", rotation=90, va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, 10)
        ax.set_xlabel("position t (tokens, up to 2³¹ − 1)")
        ax.set_title(f"{what}: RoPE d = {d['dim']}, base {d['base']:g}, stored in float32", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].set_ylabel("max(|cos − cos_ref|, |sin − sin_ref|)")
    return fig


def draw_alibi(d: dict[str, Any]):
    """The slide: the bias the slots produce per head, against Press et al.'s explicit −m_h (t − s)."""
    import numpy as np

    fig = _new(16, 4.9, "ALiBi is a slide: N = [[0, 1], [0, 0]], query slots (1, 0), key slots (0, −m_h)")
    axes = fig.subplots(1, 3)
    B = d["bias"]
    upper = np.triu(np.full_like(np.array(B[0]), np.nan), 1)  # (t, s): NaN above the diagonal, the future
    _heat(fig, axes[0], np.tril(np.array(B[0])) + upper,
          f"bias of head 0 (m = {d['slopes'][0]:g}), causal half\n(1, 0)·exp((t−s)N)·(0, −m)ᵀ", cbar="bias")
    h = len(B) - 1
    _heat(fig, axes[1], np.tril(np.array(B[h])) + upper, f"bias of head {h} (m = {d['slopes'][h]:g})", cbar="bias")
    n = d["n"]
    lags = np.arange(n)
    markers = "os^Dv<>P"
    for i, m in enumerate(d["slopes"]):
        c = SERIES_COLORS[i % len(SERIES_COLORS)]
        axes[2].plot(lags, [B[i][t][0] for t in range(n)], ls="", color=c, marker=markers[i % len(markers)], ms=5,
                     mfc="none", label=f"head {i}: m = {m:g}")
        axes[2].plot(lags, -m * lags, color=c, lw=0.9, alpha=0.8)
    axes[2].plot([], [], color="black", lw=0.9, label="lines: Press et al.'s −m·(t − s)")
    axes[2].set_yscale("symlog", linthresh=0.01)
    axes[2].set_xlabel("lag t − s (tokens)")
    axes[2].set_ylabel("bias added to qᵀk  [symlog]")
    axes[2].set_title("markers: liepos's slots; lines: the explicit bias", fontsize=10)
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    axes[2].grid(True, alpha=0.3)
    return fig


# kind -> (section of liepos.tour.sections, draw function, one-line description)
_DRAW = {
    "attention": draw_attention, "group": draw_group, "trajectories": draw_trajectories, "fate": draw_fate,
    "lookup": draw_lookup, "clocks": draw_clocks, "spectrum": draw_spectrum, "scaling": draw_scaling,
    "precision": draw_precision, "alibi": draw_alibi,
}
# kind -> (section, drawing, title); the names and titles are liepos.tour.kinds' (light, for the help)
KINDS: dict[str, tuple[str, Any, str]] = {k: (sec, _DRAW[k], title) for k, (sec, title) in KIND_TITLES.items()}


def section_params(kind: str) -> set[str]:
    """The parameters of the section function behind figure ``kind``."""
    return set(inspect.signature(S.SECTIONS[KINDS[kind][0]][1]).parameters)


def figure(kind: str, data: dict[str, Any] | None = None, **params: Any):
    """The Figure of ``kind``, computing its section's data (with ``params``) unless given.

    A parameter the section does not take is an error, never silently dropped."""
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {sorted(KINDS)}, got {kind!r}")
    section, draw, _ = KINDS[kind]
    if data is None:
        unknown = sorted(set(params) - section_params(kind))
        if unknown:
            raise ValueError(f"figure {kind!r} takes no parameter {', '.join(unknown)}; it takes {sorted(section_params(kind))}")
        data = S.SECTIONS[section][1](**params)
    return draw(data)


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a Figure as PNG or SVG (chosen by the suffix, see :data:`FORMATS`) and return the path."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"`path` must end in {' or '.join(FORMATS)}, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format=fmt, facecolor="white")
    return path
