"""Figures of the tour, one function per picture, and the ``liepos plot KIND`` command.

Each ``draw_<kind>(data)`` takes the plain data of a section of :mod:`liepos._theory` and returns
a matplotlib ``Figure`` (Agg canvas, no pyplot state). matplotlib is the optional ``liepos[plot]``
extra: it is imported inside the functions, never by the core package.

The six rows of the seeds' table have one colour each, everywhere: :data:`ROW_COLORS`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any

from liepos import _theory as T

__all__ = ["ROW_COLORS", "KINDS", "figure", "save", "configure", "run"]

# one colour per row of the seeds' table (Okabe–Ito, colour-blind safe)
ROW_COLORS: dict[str, str] = {
    "growth": "#D55E00",  # vermillion: explodes
    "nope": "#7F7F7F",  # grey: holds
    "decay": "#0072B2",  # blue: fade
    "rotation": "#009E73",  # green: circle
    "damped_rotation": "#CC79A7",  # pink: spiral
    "polynomial": "#E69F00",  # orange: slide
}
_DIVERGING = "RdBu_r"


def _mpl():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError("liepos plots need matplotlib: pip install 'liepos[plot]'") from err
    return matplotlib, Figure


def _new(w: float, h: float, title: str | None = None):
    matplotlib, Figure = _mpl()
    fig = Figure(figsize=(w, h), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=13, fontweight="bold")
    return fig


def _heat(fig, ax, M, title: str, sym: bool = True, cmap: str = _DIVERGING, cbar: str = "value", xlabel="key time s", ylabel="query time t"):
    import numpy as np

    A = np.array(M, dtype=float)
    finite = A[np.isfinite(A)]
    lim = float(np.abs(finite).max()) if finite.size else 1.0
    lim = lim or 1.0
    kw = dict(vmin=-lim, vmax=lim) if sym else {}
    cm = __import__("matplotlib").colormaps[cmap].with_extremes(bad="#DDDDDD")
    im = ax.imshow(np.ma.masked_invalid(A), cmap=cm, origin="upper", interpolation="nearest", **kw)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, shrink=0.8, label=cbar)
    return im


def _fmt_err(x: float) -> str:
    return "0 (exact)" if x == 0 else f"{x:.1e}"


# ---------------------------------------------------------------------- the figures
def draw_attention(d: dict[str, Any]):
    """Raw scores, RoPE-encoded scores, causal softmax weights."""
    import numpy as np

    fig = _new(13, 4.0, "Where position enters: one attention head, before and after RoPE")
    axes = fig.subplots(1, 3)
    _heat(fig, axes[0], d["raw_scores"], "content only: qₜ·kₛ/√d\n(no position: a bag of tokens)", cbar="score")
    _heat(fig, axes[1], d["scores"], "RoPE-encoded: (F(t)qₜ)·(G(s)kₛ)/√d\n= qₜᵀA(t−s)kₛ/√d", cbar="score")
    W = np.array(d["weights"], dtype=float)
    W[np.array(d["mask"]) == 0] = np.nan
    _heat(fig, axes[2], W, "causal mask + softmax: attention weights\n(grey: future keys, masked)", sym=False, cmap="viridis", cbar="weight")
    return fig


def draw_group(d: dict[str, Any]):
    """Measured errors of the group identities, per generator, on a log axis with their bounds."""
    fig = _new(11, 5.6, "The group: A(0) = I, A(u)A(v) = A(u+v), F(t)ᵀG(s) = A(t−s), measured")
    ax = fig.subplots()
    rows = list(d["rows"].items()) + [("random dense X (from_matrix)", d["random_X"]["errors"])]
    idents = sorted({k for _, r in rows for k in r})
    markers = "osD^vP"
    floor = 1e-18
    for j, ident in enumerate(idents):
        xs, ys = [], []
        for i, (name, r) in enumerate(rows):
            if ident in r:
                xs.append(max(r[ident]["value"], floor))
                ys.append(i + (j - len(idents) / 2) * 0.1)
        ax.scatter(xs, ys, marker=markers[j % len(markers)], s=40, label=ident, zorder=3)
    for b in sorted({e["bound"] for _, r in rows for e in r.values()}):
        ax.axvline(b, color="#B22222", ls="--", lw=0.8)
        ax.text(b, 0.99, f" bound {b:.0e} ", color="#B22222", fontsize=8, rotation=90, va="top", ha="right",
                transform=ax.get_xaxis_transform())
    ax.axvline(2.2e-16, color="#555555", ls=":", lw=0.8)
    ax.text(2.2e-16, 0.99, " float64 ε ", fontsize=8, color="#555555", rotation=90, va="top", ha="right",
            transform=ax.get_xaxis_transform())
    names = [n for n, _ in rows]
    ax.set_yticks(range(len(rows)), [T.ROW_LABELS.get(n, n) for n in names])
    for lbl, n in zip(ax.get_yticklabels(), names):
        if n in ROW_COLORS:
            lbl.set_color(ROW_COLORS[n])
    ax.set_xscale("log")
    ax.set_xlim(floor / 3, 1e-8)
    ax.set_ylim(-1, len(rows))
    ax.invert_yaxis()
    ax.set_xlabel("measured error (max |difference|, relative);  0 is drawn at 1e-18")
    ax.set_ylabel("generator")
    ax.legend(loc="lower right", fontsize=8, title="identity")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def draw_trajectories(d: dict[str, Any]):
    """The path of a fixed vector under A(u) as the lag u grows, one panel per row."""
    import numpy as np

    fig = _new(13, 8.2, f"The six rows: A(u)·v for v = {tuple(d['vector'])}, lag u = 0 … {d['lags'][-1]:g}")
    axes = fig.subplots(2, 3).ravel()
    lags = np.array(d["lags"])
    for ax, (name, r) in zip(axes, d["rows"].items()):
        P = np.array(r["trajectory"])
        c = ROW_COLORS[name]
        ax.plot(P[:, 0], P[:, 1], color=c, lw=2.2, label="A(u)v")
        whole = np.isclose(lags, np.round(lags)) & (lags <= lags[-1])
        ax.scatter(P[whole, 0], P[whole, 1], s=12, color=c, alpha=0.6, zorder=3)
        ax.scatter([P[0, 0]], [P[0, 1]], s=70, marker="o", facecolor="white", edgecolor="black", zorder=4, label="u = 0 (v)")
        if len(P) > 3 and not np.allclose(P[-1], P[0]):
            ax.annotate("", xy=P[-1], xytext=P[-3], arrowprops=dict(arrowstyle="-|>", color=c, lw=2, mutation_scale=18))
        ax.axhline(0, color="#999999", lw=0.6)
        ax.axvline(0, color="#999999", lw=0.6)
        X = r["X"]
        xs = "X = [[{:g}, {:g}], [{:g}, {:g}]]".format(X[0][0], X[0][1], X[1][0], X[1][1])
        cl = ", ".join(f"{k}={v}" for k, v in r["classification"]["counts"].items() if v)
        ax.set_title(f"{r['label']}: {r['picture']}\n{xs}", fontsize=10, color=c)
        ax.text(0.02, 0.02, cl, transform=ax.transAxes, fontsize=8, color="#333333")
        ax.set_xlabel("coordinate 1")
        ax.set_ylabel("coordinate 2")
        if name == "nope":
            ax.set_xlim(-1.1, 1.1)
            ax.set_ylim(-1.1, 1.1)
            ax.text(P[0, 0], P[0, 1] - 0.18, "A(u)v = v for every u", ha="center", fontsize=8, color=c)
        else:
            ax.margins(0.12)
        if name in ("rotation", "damped_rotation"):
            ax.set_aspect("equal", adjustable="datalim")
        ax.legend(loc="best", fontsize=7)
        ax.grid(True, alpha=0.25)
    return fig


def draw_fate(d: dict[str, Any]):
    """|A(u)v| against the lag for the six rows: fate is the real part."""
    fig = _new(8, 4.8, "Fate: |A(u)·v| against the lag u (log scale)")
    ax = fig.subplots()
    for name, r in d["rows"].items():
        ax.plot(d["lags"], r["norm"], color=ROW_COLORS[name], lw=2, label=f"{r['label']} ({r['picture']})",
                ls="--" if name == "nope" else "-")
    ax.set_yscale("log")
    ax.set_xlabel("lag u = t − s")
    ax.set_ylabel("|A(u) v|")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def draw_lookup(d: dict[str, Any]):
    """A(t−s) and scores over (t, s): constant diagonals; an absolute encoding breaks them."""
    fig = _new(16, 4.3, f"The lookup table: {d['cells']} cells, {d['distinct_A']} distinct A(t−s) — the diagonals repeat")
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

    fig = _new(15, 4.6, "A bank of clocks: RoPE's frequencies, the long-term decay, the seeds' worked example")
    axes = fig.subplots(1, 3)
    cmap = __import__("matplotlib").colormaps["viridis"]
    nb = len(d["bases"])
    for i, (b, w) in enumerate(d["freqs"].items()):
        col = cmap(i / max(1, nb - 1) * 0.85)
        axes[0].plot(range(len(w)), w, "o-", ms=3, color=col, label=f"base {b}")
        axes[1].plot(d["gaps"], d["score_vs_gap"][b], color=col, lw=1.2, label=f"base {b}")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("plane k")
    axes[0].set_ylabel("frequency ω_k = base^(−2k/d)  [rad / token]")
    axes[0].set_title(f"frequencies, d = {d['dim']}: fast planes to slow planes", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[0].grid(True, alpha=0.3, which="both")
    axes[1].set_xscale("symlog", linthresh=1)
    axes[1].set_xlabel("gap t − s (tokens, log scale)")
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
    axes[2].set_xlabel("gap u = t − s")
    axes[2].set_ylabel("score")
    axes[2].set_title("the seeds' worked example: d = 16, base 10000", fontsize=10)
    axes[2].legend(fontsize=8, loc="lower left")
    axes[2].grid(True, alpha=0.3)
    return fig


def draw_spectrum(d: dict[str, Any]):
    """The spectrum plane: rate λ (fate) against frequency ω (rhythm) of every catalogue block."""
    fig = _new(11, 6.2, "Fate and rhythm: eigenvalues λ ± iω of every catalogue entry")
    ax = fig.subplots()
    markers = "osD^vP*Xh"
    lin_x, lin_y = 1e-4, 1e-4
    seen_rows = set()
    for i, (name, e) in enumerate(d["entries"].items()):
        for p in e["points"]:
            row = p["row"]
            ax.scatter(p["rate"], p["freq"], marker=markers[i % len(markers)], s=30 + 25 * (p["size"] - 1),
                       facecolor=ROW_COLORS[row], edgecolor="black", linewidth=0.5, alpha=0.9, zorder=3)
            seen_rows.add(row)
        ax.scatter([], [], marker=markers[i % len(markers)], facecolor="white", edgecolor="black", label=name)
    ax.set_xscale("symlog", linthresh=lin_x)
    ax.set_yscale("symlog", linthresh=lin_y)
    ax.axvspan(0, 1, color=ROW_COLORS["growth"], alpha=0.08)
    ax.axvspan(-1, 0, color=ROW_COLORS["decay"], alpha=0.05)
    ax.axvline(0, color="black", lw=0.8)
    ax.text(2e-4, 1.5, "fate: explodes\n(λ > 0)", color=ROW_COLORS["growth"], fontsize=9)
    ax.text(-0.5, 1.5, "fate: fades (λ < 0)", color=ROW_COLORS["decay"], fontsize=9)
    ax.text(0, 1.7, "holds (λ = 0)", fontsize=8, ha="center", va="bottom",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    ax.set_xlim(-1, 1)
    ax.set_ylim(-2e-5, 4)
    ax.set_xlabel("rate λ = real part (fate)   [symlog]")
    ax.set_ylabel("frequency ω = imaginary part (rhythm)   [symlog]")
    leg1 = ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.7), fontsize=8, title="entry (marker)")
    ax.add_artist(leg1)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=ROW_COLORS[r], edgecolor="black", label=T.ROW_LABELS[r]) for r in T.ROWS]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.2), fontsize=8, title="row (colour)")
    ax.set_title("one point per block (λ, |ω|); larger marker: Jordan block of size ≥ 2 (polynomial); "
                 "NoPE and ALiBi's slide sit at the origin", fontsize=9, color="#444444")
    ax.grid(True, alpha=0.25)
    return fig


def draw_scaling(d: dict[str, Any]):
    """Context extension as maps on the spectrum."""
    import numpy as np

    fig = _new(13, 4.8, f"Context extension ×{d['factor']:g}: maps on RoPE's frequencies")
    axes = fig.subplots(1, 2)
    w = np.array(d["before"])
    wl = np.array(d["wavelength"])
    styles = {"linear": ("#0072B2", "-"), "ntk": ("#D55E00", "--"), "yarn": ("#009E73", "-."), "llama3": ("#CC79A7", ":")}
    axes[0].plot(w, w, color="#999999", lw=1, label="identity ω' = ω")
    for name, after in d["after"].items():
        if after is None:
            continue
        c, ls = styles.get(name, ("black", "-"))
        a = np.array(after)
        axes[0].plot(w, a, color=c, ls=ls, lw=2, label=f"{name} (logit ×{d['logit_scale'][name]:.3g})")
        axes[1].plot(wl, a / w, color=c, ls=ls, lw=2, label=name)
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("ω before (rad / token)")
    axes[0].set_ylabel("ω' after")
    axes[0].set_title(f"the map ω ↦ ω' (rope d = {d['dim']}, base {d['base']:g})", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[0].grid(True, alpha=0.3, which="both")
    axes[1].axvline(d["original_max_position_embeddings"], color="black", lw=0.8, ls="--")
    axes[1].text(d["original_max_position_embeddings"], 0.5, " original context", fontsize=8)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log", base=2)
    f = float(d["factor"])
    ticks = [2.0 ** -i for i in range(int(math.log2(f)) + 1)]
    axes[1].set_yticks(ticks, ["1" if t == 1 else f"1/{1 / t:g}" for t in ticks])
    axes[1].minorticks_off()
    axes[1].set_ylim(1 / f / 1.25, 1.25)
    axes[1].set_xlabel("wavelength 2π/ω (tokens)")
    axes[1].set_ylabel("ω' / ω")
    axes[1].set_title("which clocks slow down: fast planes kept, slow planes ÷ factor", fontsize=10)
    axes[1].legend(fontsize=8)
    axes[1].grid(True, alpha=0.3, which="both")
    return fig


def draw_precision(d: dict[str, Any]):
    """cos/sin error against position: liepos against a float32 pipeline, log scale."""
    import numpy as np

    fig = _new(10, 5.4, "Precision: |cos, sin error| against position, reference mpmath (40 digits)")
    ax = fig.subplots()
    if not d.get("available", True):
        ax.text(0.5, 0.5, d.get("note", "unavailable"), ha="center", va="center", wrap=True)
        ax.set_axis_off()
        return fig
    pos = np.array(d["positions"])
    cmap = __import__("matplotlib").colormaps["plasma"]
    n = len(d["planes"])
    floor = 1e-12
    for i, (k, p) in enumerate(d["planes"].items()):
        c = cmap(i / max(1, n - 1) * 0.85)
        ax.plot(pos, np.maximum(p["float32"], floor), color=c, ls="--", marker="x", ms=4, lw=1.2,
                label=f"float32 pipeline, plane {k} (ω = {p['freq']:.2g})")
        ax.plot(pos, np.maximum(p["liepos"], floor), color=c, ls="-", marker="o", ms=3, lw=1.8,
                label=f"liepos, plane {k}")
    ax.axhline(2**-24, color="black", lw=0.8, ls=":")
    ax.text(pos[0], 2**-24 * 1.5, "float32 ulp(1) = 6e-8", fontsize=8)
    ax.axvline(8192, color="#888888", lw=0.8)
    ax.text(8192, 3, " 8k", fontsize=8, color="#555555")
    ax.axvline(131072, color="#888888", lw=0.8)
    ax.text(131072, 3, " 128k", fontsize=8, color="#555555")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, 10)
    ax.set_xlabel("position t (up to 2³¹ − 1)")
    ax.set_ylabel("max(|cos − cos_ref|, |sin − sin_ref|)")
    ax.set_title(f"RoPE d = {d['dim']}, base {d['base']:g}; both results stored in float32", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.grid(True, alpha=0.3, which="both")
    return fig


def draw_alibi(d: dict[str, Any]):
    """The slide: the nilpotent block and slots, and the bias they produce per head."""
    import numpy as np

    fig = _new(15, 4.6, "ALiBi is a slide: N = [[0, 1], [0, 0]], query slots (1, 0), key slots (0, −m_h)")
    axes = fig.subplots(1, 3)
    B = d["bias"]
    _heat(fig, axes[0], np.tril(np.array(B[0])) + np.triu(np.full_like(np.array(B[0]), np.nan), 1),
          f"bias of head 0 (m = {d['slopes'][0]:g}), causal half\n(1, 0)·exp((t−s)N)·(0, −m)ᵀ", cbar="bias")
    h = len(B) - 1
    _heat(fig, axes[1], np.tril(np.array(B[h])) + np.triu(np.full_like(np.array(B[h]), np.nan), 1),
          f"bias of head {h} (m = {d['slopes'][h]:g})", cbar="bias")
    n = d["n"]
    lags = np.arange(n)
    cmap = __import__("matplotlib").colormaps["autumn"]
    for i, m in enumerate(d["slopes"]):
        axes[2].plot(lags, [B[i][t][0] for t in range(n)], color=cmap(i / len(d["slopes"])), marker="o", ms=3,
                     label=f"head {i}: m = {m:g}")
    axes[2].set_xlabel("lag t − s")
    axes[2].set_ylabel("bias added to qᵀk")
    axes[2].set_title("bias against lag: a straight line per head, −m_h (t − s)", fontsize=10)
    axes[2].legend(fontsize=7, ncol=2)
    axes[2].grid(True, alpha=0.3)
    return fig


# kind -> (section of liepos._theory, draw function, one-line description)
KINDS: dict[str, tuple[str, Any, str]] = {
    "attention": ("attention", draw_attention, "raw scores, RoPE-encoded scores and the causal mask of one head"),
    "group": ("group", draw_group, "measured errors of A(0)=I, A(u)A(v)=A(u+v), F(t)^T G(s)=A(t-s)"),
    "trajectories": ("rows", draw_trajectories, "the six rows: a fixed vector under A(u) as the lag grows"),
    "fate": ("rows", draw_fate, "|A(u)v| against the lag for the six rows"),
    "lookup": ("lookup", draw_lookup, "A(t-s) and scores over (t, s): constant diagonals, broken by absolute"),
    "clocks": ("clocks", draw_clocks, "RoPE frequencies per base, score against gap, the worked example"),
    "spectrum": ("spectrum", draw_spectrum, "rate against frequency of every catalogue entry"),
    "scaling": ("scaling", draw_scaling, "frequencies before/after linear, NTK, YaRN, llama3"),
    "precision": ("precision", draw_precision, "cos/sin error against position: liepos vs a float32 pipeline"),
    "alibi": ("alibi", draw_alibi, "ALiBi's nilpotent block, slots and the bias they produce"),
}


def figure(kind: str, data: dict[str, Any] | None = None, **params: Any):
    """The Figure of ``kind``, computing its section's data (with ``params``) unless given."""
    if kind not in KINDS:
        raise ValueError(f"unknown plot kind {kind!r}; known: {sorted(KINDS)}")
    section, draw, _ = KINDS[kind]
    if data is None:
        fn = T.SECTIONS[section][1]
        accepted = inspect.signature(fn).parameters
        data = fn(**{k: v for k, v in params.items() if k in accepted and v is not None})
    return draw(data)


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a Figure as PNG (Agg) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", facecolor="white")
    return path


# ---------------------------------------------------------------------- command line
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", metavar="KIND", choices=sorted(KINDS),
                        help="one of: " + ", ".join(KINDS))
    parser.add_argument("--out", required=True, metavar="FILE", help="PNG file to write")
    parser.add_argument("--dpi", type=int, default=110, help="resolution (default 110)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figure's data as JSON")
    parser.add_argument("--base", type=float, default=None, help="RoPE base (clocks, scaling, precision)")
    parser.add_argument("--factor", type=float, default=None, help="context-extension factor (scaling)")
    parser.add_argument("--dim", type=int, default=None, help="head dim (attention, lookup, clocks, scaling, precision)")
    kinds = "\n".join(f"  {k:<13} {desc}" for k, (_, _, desc) in KINDS.items())
    parser.epilog = (
        "kinds:\n" + kinds + "\n\nexamples:\n"
        + "\n".join(f"  liepos plot {k} --out {k}.png" for k in KINDS)
        + "\n  liepos plot scaling --factor 4 --base 10000 --out scaling.png --json scaling.json"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    try:
        _mpl()
    except ImportError as err:
        print(f"liepos plot: {err}", file=sys.stderr)
        return 2
    section, draw, _ = KINDS[args.kind]
    fn = T.SECTIONS[section][1]
    params = {"base": args.base, "factor": args.factor, "dim": args.dim}
    accepted = inspect.signature(fn).parameters
    if args.kind == "clocks" and args.base is not None:
        params["bases"] = (args.base,)
    ignored = [k for k, v in params.items() if v is not None and k not in accepted and k != "base"]
    if ignored:
        print(f"liepos plot {args.kind}: ignoring --{' --'.join(ignored)} (not a parameter of this figure)", file=sys.stderr)
    try:
        data = fn(**{k: v for k, v in params.items() if k in accepted and v is not None})
    except (ValueError, TypeError) as err:
        print(f"liepos plot {args.kind}: {err}", file=sys.stderr)
        return 2
    path = save(draw(data), args.out, args.dpi)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=_jsonable))
    print(f"wrote {path}")
    return 0


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)
