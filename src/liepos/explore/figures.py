"""The sweep's figures, each readable on its own: intervals drawn, one colour and marker per series, plain ticks.

* ``loss_vs_length.png`` (:func:`plot_lengths`): small multiples, one panel per row of the six the
  encodings belong to, a line per encoding (and scaling map): the paired loss change from the
  training length (passkey: the accuracy) with its 95 % band; no two series of the figure share a
  colour and a marker (ALiBi and Jordan-3 sit in one panel, apart).
* ``map.png`` (:func:`plot_map`): the spectrum plane (rate λ, frequency ω), a panel per encoding
  (and per task), a point per block of every layer and head, jittered, coloured by that block's
  measured share of the query–key magnitude (:mod:`liepos.explore.usage`).
* ``learned_spectrum.png`` (:func:`plot_trajectory`): every learned block's path on the plane over
  training, per start, hollow at the start and filled at the end, in the colour of the row it ends in.
* ``passkey.png`` (:func:`plot_passkey`): passkey accuracy by distance with intervals.

Ticks: symmetric-log axes get decade ticks written ``0``, ``10⁻³``, ``−10⁻²``; linear axes plain
numbers without an offset (no ``1e-6`` axis labels, no ``+1.9`` offsets).
"""

from __future__ import annotations

import math
from pathlib import Path

from liepos.classification import classify
from liepos.explore.spec import from_spec, is_schedule_row
from liepos.explore.stats import ci, headline

__all__ = [
    "LINTHRESH",
    "map_points",
    "plot_lengths",
    "plot_map",
    "plot_passkey",
    "plot_trajectory",
    "row_of",
    "series_styles",
    "write_figures",
]

LINTHRESH = 1e-4  # the symmetric-log axes are linear within ±1e-4 (a rate or frequency that small is ~0 here)
_PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442", "#999999",
            "#882255"]
_MARKERS = "osD^vP*Xh<>p"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    """Write ``fig`` to ``path`` and close it; with no path, hand the figure back (the tests read it)."""
    if path is None:
        return fig
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return None


def row_of(name: str, results: dict) -> str:
    """The row of the six an encoding belongs to: its dominant blocks' row (a learned generator: where
    its final blocks mostly ended; ALiBi: polynomial, its bias rides on the slot block)."""
    row = results["summary"][name]
    if row.get("dominant"):
        return row["dominant"]
    if is_schedule_row(row["base"]):  # a per-layer schedule: the position-carrying blocks of every layer
        from liepos.explore.model import ModelConfig, layer_specs

        cfg = results["config"]
        mc = ModelConfig(d_model=cfg["d_model"], layers=cfg["layers"], heads=cfg["heads"])
        counts: dict = {}
        for spec in layer_specs(row["base"], mc):
            for r, n in classify(spec.encoding.generator).counts.items():
                counts[r] = counts.get(r, 0) + n
        # NoPE layers carry no position: a hybrid (RNoPE-SWA) is the row of its other layers, NoPE only alone
        moving = {r: n for r, n in counts.items() if r != "nope" and n}
        return max(moving or counts, key=lambda r: (moving or counts)[r])
    c = classify(from_spec(row["base"].split("|")[0], 16, 2))  # the first head group's encoding
    counts = dict(c.counts)
    if c.num_slots:
        return "polynomial"
    return max(counts, key=lambda r: counts[r])


def series_styles(names: list[str]) -> dict[str, tuple[str, str]]:
    """``name -> (colour, marker)``, no two names alike (10 colours × 12 markers)."""
    return {n: (_PALETTE[i % len(_PALETTE)], _MARKERS[(i // len(_PALETTE)) % len(_MARKERS)]) for i, n in enumerate(names)}


def _sup(n: int) -> str:
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def _symlog(ax, axis: str, values: list[float]) -> None:
    """A symmetric-log axis with decade ticks over the data, labelled ``0``, ``10⁻³``, ``−10⁻²``."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    getattr(ax, f"set_{axis}scale")("symlog", linthresh=LINTHRESH)
    finite = [abs(v) for v in values if math.isfinite(v) and abs(v) >= LINTHRESH]
    top = math.ceil(math.log10(max(finite))) if finite else -3
    low = math.floor(math.log10(LINTHRESH))
    decades = list(range(low, top + 1))
    step = max(1, math.ceil(len(decades) / 4))  # at most ~5 labelled decades per side
    decades = decades[::-1][::step][::-1]
    ticks = [0.0] + [10.0 ** k for k in decades]
    if any(v < -LINTHRESH for v in values):
        ticks += [-(10.0 ** k) for k in decades]
    side = ax.xaxis if axis == "x" else ax.yaxis
    side.set_major_locator(FixedLocator(sorted(ticks)))
    side.set_minor_locator(NullLocator())

    def fmt(v, _pos=None):
        if v == 0:
            return "0"
        k = round(math.log10(abs(v)))
        return ("−" if v < 0 else "") + ("1" if k == 0 else "10" + _sup(k))

    side.set_major_formatter(FuncFormatter(fmt))


def _plain(ax, axis: str = "y") -> None:
    """A linear axis with at most 6 plain ticks and no offset text."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    side = ax.yaxis if axis == "y" else ax.xaxis
    f = ScalarFormatter(useOffset=False)
    f.set_scientific(False)
    side.set_major_formatter(f)
    side.set_major_locator(MaxNLocator(6))


def _lengths_axis(ax, lens: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(lens))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())


def plot_lengths(results: dict, path: Path | None = None):
    """The paired loss change from the training length (passkey: accuracy) against evaluation length,
    small multiples by row, 95 % bands (the change is paired, so its band is narrower than the loss')."""
    from liepos.classification import ROW_COLORS

    plt = _pyplot()
    cfg = results["config"]
    lens = cfg["eval_lens"]
    metric = "acc" if cfg["task"] == "passkey" else "delta"
    names = list(results["summary"])
    styles = series_styles(names)
    rows: dict[str, list[str]] = {}
    for n in names:
        rows.setdefault(row_of(n, results), []).append(n)
    cols = min(3, len(rows))
    nr = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nr, cols, figsize=(5.0 * cols, 3.9 * nr), squeeze=False, sharey=True,
                             layout="constrained")
    for ax in axes.flat[len(rows):]:
        ax.set_visible(False)
    for ax, (row, members) in zip(axes.flat, rows.items()):
        for n in members:
            pts = [(L, results["summary"][n]["lengths"][str(L)][metric]) for L in lens
                   if str(L) in results["summary"][n]["lengths"]]
            pts = [(L, t) for L, t in pts if math.isfinite(t[0])]
            if not pts:
                continue
            c, m = styles[n]
            xs = [L for L, _ in pts]
            ax.fill_between(xs, [t[1] for _, t in pts], [t[2] for _, t in pts], color=c, alpha=0.15, lw=0)
            ax.plot(xs, [t[0] for _, t in pts], color=c, marker=m, ms=5, lw=1.5, label=n)
        ax.axvline(cfg["train_len"], color="grey", ls=":", lw=1)
        _lengths_axis(ax, lens)
        _plain(ax, "y")
        ax.set_title(row.replace("_", " "), color=ROW_COLORS[row], fontsize=10, fontweight="bold")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("accuracy at the queries" if metric == "acc" else
                      f"loss change from {cfg['train_len']} (nats/token, paired)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{cfg['task']}: trained at {cfg['train_len']} tokens; mean over learned seeds, band = 95 % "
                 f"interval (documents × seeds)", fontsize=10)
    return _save(fig, path)


def map_points(results: dict) -> list[tuple[str, list, list, tuple]]:
    """``(encoding, blocks (λ, ω, n), share of each block, Δ at the headline length)`` per plain encoding,
    from the first learned seed's ``block_usage`` (every layer and head; learned ones: trained blocks)."""
    H = headline(results["config"])
    out = []
    for name, row in results["summary"].items():
        if row["scaling"]:
            continue
        runs = [r for r in results["runs"] if r["encoding"] == name and r.get("block_usage")]
        runs = [r for r in runs if r["learned"]] or runs
        if not runs:
            continue
        blocks, share = [], []
        for g in runs[0]["block_usage"]:
            for head_blocks, head_share in zip(g["blocks"], g["share"]):
                blocks += [tuple(b) for b in head_blocks]
                share += head_share
        d = (row["lengths"].get(str(H)) or {}).get("delta")
        out.append((name, blocks, share, tuple(d) if d else (math.nan,) * 3))
    return out


def _jitter(values: list[float], rng, spread: float = 0.12) -> list[float]:
    """Multiplicative jitter (±12 % of the value), additive within the linear band: overlaps separate."""
    return [v * math.exp(rng.uniform(-spread, spread)) if abs(v) >= LINTHRESH else v + rng.uniform(-0.3, 0.3) * LINTHRESH
            for v in values]


def plot_map(results_list: list[dict], path: Path | None = None):
    """The spectrum plane, a panel per (task, encoding), every block coloured by its measured share."""
    import random

    import matplotlib

    plt = _pyplot()
    panels = [(res, p) for res in results_list for p in map_points(res)]
    cols = min(5, max(1, len(panels)))
    nr = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(nr, cols, figsize=(3.3 * cols, 3.1 * nr + 0.8), squeeze=False, layout="constrained")
    top = max([max(p[2]) for _, p in panels if p[2]] + [1e-9])
    norm = matplotlib.colors.Normalize(vmin=0.0, vmax=top)
    cmap = matplotlib.colormaps["viridis"]
    lam_all = [b[0] for _, p in panels for b in p[1]]
    om_all = [b[1] for _, p in panels for b in p[1]]
    rng = random.Random(0)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (res, (name, blocks, share, d)) in zip(axes.flat, panels):
        ax.scatter(_jitter([b[0] for b in blocks], rng), _jitter([b[1] for b in blocks], rng),
                   c=[cmap(norm(s)) for s in share], s=[12 + 10 * (b[2] - 1) for b in blocks],
                   edgecolors="black", linewidths=0.3, alpha=0.85)
        _symlog(ax, "x", lam_all)
        _symlog(ax, "y", om_all)
        ax.axvline(0, color="#999999", lw=0.6, zorder=0)
        ax.axvspan(LINTHRESH, 10, color="#D55E00", alpha=0.06, zorder=0)
        ax.set_title(f"{res['config']['task']}: {name}\nΔ {ci(d, signed=True, digits=2)}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("rate λ per token", fontsize=7)
        ax.set_ylabel("frequency ω (rad/token)", fontsize=7)
    sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=axes.ravel().tolist(), location="bottom", shrink=0.5,
                 label="block's share of |q_b|·|k_b| in its head (measured, trained model); λ > 0 shaded: growth")
    return _save(fig, path)


def _row_name(lam: float, om: float, n: int, tol: float) -> str:
    """The row of one block, a rate or frequency below ``tol`` (absolute) counting as 0."""
    from liepos.explore.learned import row_counts

    counts = row_counts([(lam, om, n)], tol)
    return max(counts, key=lambda r: counts[r])


def plot_trajectory(results: dict, path: Path | None = None):
    """Every learned block's path (λ, ω) over the snapshots, a panel per start; colour = the row it ends in."""
    from matplotlib.lines import Line2D

    from liepos.classification import ROW_COLORS
    from liepos.explore.train import NEGLIGIBLE

    plt = _pyplot()
    tol = NEGLIGIBLE / max(results["config"]["eval_lens"])
    specs = [e for e in results["encodings"] if any(r["encoding"] == e and r.get("learned_generator")
                                                    for r in results["runs"])]
    fig, axes = plt.subplots(1, len(specs), figsize=(5.0 * len(specs), 4.4), squeeze=False, layout="constrained")
    for ax, spec in zip(axes[0], specs):
        rows, lam_all, om_all = set(), [], []
        starts: dict[str, list] = {}
        ends: dict[str, list] = {}
        for r in (r for r in results["runs"] if r["encoding"] == spec and r.get("learned_generator")):
            traj = r["learned_generator"]["trajectory"]
            for gi, g in enumerate(traj[-1]["generators"]):
                for h, head in enumerate(g["blocks"]):
                    for i, (lam, om, n) in enumerate(head):
                        path_ = [tuple(s_["generators"][gi]["blocks"][h][i][:2]) for s_ in traj]
                        row = _row_name(lam, om, n, tol)
                        rows.add(row)
                        lam_all += [p[0] for p in path_]
                        om_all += [p[1] for p in path_]
                        if len(set(path_)) > 1:  # a block that moved: its path
                            ax.plot([p[0] for p in path_], [p[1] for p in path_], color=ROW_COLORS[row], lw=0.6,
                                    alpha=0.5)
                        starts.setdefault(row, []).append(path_[0])
                        ends.setdefault(row, []).append(path_[-1])
        for row, pts in starts.items():  # rings on top of the dots: a block that did not move shows both
            ax.scatter([p[0] for p in ends[row]], [p[1] for p in ends[row]], s=10, color=ROW_COLORS[row], zorder=2)
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=42, facecolors="none", edgecolors=ROW_COLORS[row],
                       lw=0.7, zorder=3)
        _symlog(ax, "x", lam_all)
        _symlog(ax, "y", om_all)
        ax.axvline(0, color="#999999", lw=0.6)
        ax.set_xlabel("rate λ per token")
        ax.set_ylabel("frequency ω, radians per token")
        ax.set_title(f"{spec}: start (hollow) → end (filled), every seed, layer, head", fontsize=9)
        handles = [Line2D([], [], ls="", marker="o", color=ROW_COLORS[k], label=k.replace("_", " "))
                   for k in ROW_COLORS if k in rows]
        ax.legend(handles=handles, fontsize=7, loc="best", title="row at the end", title_fontsize=7)
    return _save(fig, path)


def plot_passkey(results: dict, path: Path | None = None):
    """Passkey accuracy by distance bucket, a line per encoding with its 95 % interval."""
    plt = _pyplot()
    names = [n for n, r in results["summary"].items() if r.get("by_distance")]
    styles = series_styles(list(results["summary"]))
    labels: list[str] = []
    for n in names:
        labels += [lab for lab in results["summary"][n]["by_distance"] if lab not in labels]
    fig, ax = plt.subplots(figsize=(8.5, 4.6), layout="constrained")
    for n in names:
        bd = results["summary"][n]["by_distance"]
        xs = [i for i, lab in enumerate(labels) if lab in bd and math.isfinite(bd[lab][0])]
        t = [bd[labels[i]] for i in xs]
        c, m = styles[n]
        ax.errorbar(xs, [v[0] for v in t], yerr=[[v[0] - v[1] for v in t], [v[2] - v[0] for v in t]], color=c,
                    marker=m, capsize=3, lw=1.3, ms=5, label=n)
    ax.set_xticks(range(len(labels)), labels)
    _plain(ax, "y")
    ax.set_ylim(-0.02, 1.02)
    ax.axvline(0.5, color="grey", ls=":", lw=1)
    ax.set_xlabel(f"distance from query to key (tokens); trained at {results['config']['train_len']}: "
                  "left of the dotted line")
    ax.set_ylabel("passkey accuracy")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def write_figures(results: dict, out: Path) -> list[Path]:
    """Every figure of one sweep into ``out``; the paths written."""
    out = Path(out)
    written = [out / "loss_vs_length.png"]
    plot_lengths(results, written[0])
    if any(r.get("learned_generator") for r in results["runs"]):
        written.append(out / "learned_spectrum.png")
        plot_trajectory(results, written[-1])
    if any(r.get("block_usage") for r in results["runs"]):
        written.append(out / "map.png")
        plot_map([results], written[-1])
    if any(r.get("by_distance") for r in results["summary"].values()):
        written.append(out / "passkey.png")
        plot_passkey(results, written[-1])
    return written
