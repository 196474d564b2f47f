"""The sweep's reports: ``table.md`` (in-distribution accuracy beside every extrapolation figure),
``results.json``, ``loss_vs_length.png`` (a line per encoding in its row's colour) and, with learned
generators, ``learned_spectrum.png`` (where their eigenvalues λ ± iω went on the spectrum plane).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import liepos as lp
from liepos.explore.spec import from_spec, split_heads

__all__ = ["table", "write_reports", "plot_lengths", "plot_learned", "plot_map", "row_of", "map_points", "FAR"]

FAR = 16  # "the map" compares the loss at FAR × the training length with the loss at the training length


def _cell(entry: dict | None, metric: str, many: bool) -> str:
    if entry is None:
        return "—"
    m, s = entry[metric], entry[metric + "_std"]
    if not math.isfinite(m):
        return f"diverged ({entry['diverged']}/{entry['seeds']})"
    return f"{m:.3f} ± {s:.3f}" if many else f"{m:.3f}"


def table(results: dict, metric: str = "loss") -> str:
    """Markdown: a row per encoding (and scaling map): seeds learned, in-distribution accuracy, ``metric`` per length."""
    cfg = results["config"]
    lens, T = cfg["eval_lens"], cfg["train_len"]
    many = len(results["seeds"]) > 1
    far = FAR * T in lens and str(T) in results["summary"][next(iter(results["summary"]))]["lengths"]
    head = ("| encoding | learned | acc at train length | "
            + " | ".join(f"{L}{'*' if L == T else ''}" for L in lens) + (f" | Δ {T}→{FAR * T} |" if far else " |"))
    rows = [head, "|" + "---|" * (len(lens) + 3 + far)]
    for name, row in results["summary"].items():
        mark = f"{row['learned']}/{row['seeds']}" + ("" if row["learned"] == row["seeds"] else " ✗ not learned")
        acc = f"{row['in_acc']:.3f} ± {row['in_acc_std']:.3f}" if many else f"{row['in_acc']:.3f}"
        cells = [_cell(row["lengths"].get(str(L)), metric, many) for L in lens]
        if far:
            d = _delta(row, T, metric)
            cells.append("diverged" if not math.isfinite(d) else f"{d:+.3f}")
        shown = name.replace("|", "\\|")  # a head-group spec's '|' is not a column
        rows.append(f"| {shown} | {mark} | {acc} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _delta(row: dict, train_len: int, metric: str = "loss") -> float:
    """``metric`` at FAR × the training length minus at the training length (NaN when it diverged)."""
    far, near = row["lengths"].get(str(FAR * train_len)), row["lengths"].get(str(train_len))
    if far is None or near is None:
        return float("nan")
    return far[metric] - near[metric]


def write_reports(results: dict, out: Path, log=print) -> None:
    out = Path(out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    cfg = results["config"]
    p = results["runs"][0]["parameters"] if results["runs"] else 0
    text = [
        f"# liepos explore: task {cfg['task']}, train length {cfg['train_len']} (* marks it), "
        f"{cfg['steps']} steps, batch {cfg['batch_size']}, d_model {cfg['d_model']}, {cfg['layers']} layers, "
        f"{cfg['heads']} heads ({p:,} parameters), seeds {results['seeds']}",
        "", "`learned`: seeds that learned the task at the training length (accuracy ≥ 0.9 for a synthetic "
        "task; for the LM, a loss below the byte-frequency entropy). `@map`: that context-extension map "
        "applied past the training length.",
        "", "## eval loss (nats/token, all positions)", "", table(results, "loss"),
        "", "## eval accuracy (all positions)", "", table(results, "acc"),
        "", "## eval loss, last quarter of each sequence (nats/token)", "", table(results, "loss_tail"), "",
    ]
    (out / "table.md").write_text("\n".join(text))
    log("\n".join(text[4:7]))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"wrote {out / 'table.md'}, {out / 'results.json'} (matplotlib missing: no figures)")
        return
    plot_lengths(results, out / "loss_vs_length.png")
    written = [out / "table.md", out / "results.json", out / "loss_vs_length.png"]
    if any(r.get("learned_generator") for r in results["runs"]):
        plot_learned(results, out / "learned_spectrum.png")
        written.append(out / "learned_spectrum.png")
    if FAR * cfg["train_len"] in cfg["eval_lens"]:
        plot_map([results], out / "map.png")
        written.append(out / "map.png")
    log("wrote " + ", ".join(str(w) for w in written))


def row_of(name: str, results: dict) -> str:
    """The row of the six whose colour an encoding is drawn in: its dominant blocks' row
    (for a learned generator, the one its final blocks mostly ended in)."""
    row = results["summary"][name]
    if row.get("dominant"):
        return row["dominant"]
    layers = _schedule_layers(row["base"], results["config"])
    if layers is not None:  # a per-layer schedule: the blocks of every layer
        counts: dict = {}
        for enc in layers:
            for r, n in lp.classify(enc.generator).counts.items():
                counts[r] = counts.get(r, 0) + n
        return max(counts, key=counts.get)
    c = lp.classify(from_spec(row["base"].split("|")[0], 16, 2))  # the first head group's encoding
    counts = dict(c.counts)
    if c.num_slots:  # ALiBi's bias rides on its polynomial slot block: that is its row
        return "polynomial"
    return max(counts, key=counts.get)


def _schedule_layers(base: str, cfg: dict) -> list | None:
    """Every layer's encoding of a ``"schedule:…"`` row (:mod:`liepos.schedule`), else ``None``."""
    if not base.startswith("schedule:"):
        return None
    from liepos.explore.model import ModelConfig, resolve_schedule

    mc = ModelConfig(d_model=cfg["d_model"], layers=cfg["layers"], heads=cfg["heads"])
    return [spec.encoding for spec in resolve_schedule(base, mc)]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lengths(results: dict, path: Path) -> None:
    """Loss against evaluation length, a line per row of the summary in its row's colour."""
    from liepos.classify import ROW_COLORS

    plt = _pyplot()
    cfg = results["config"]
    lens = cfg["eval_lens"]
    styles = ["-", "--", ":", "-."]
    markers = "osD^vP*X"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    seen: dict[str, int] = {}
    for name, row in results["summary"].items():
        colour_row = row_of(name, results)
        k = seen.get(colour_row, 0)
        seen[colour_row] = k + 1
        for ax, metric in ((axes[0], "loss"), (axes[1], "loss_tail")):
            pts = [(L, row["lengths"][str(L)]) for L in lens if str(L) in row["lengths"]]
            ax.errorbar([L for L, _ in pts], [e[metric] for _, e in pts], yerr=[e[metric + "_std"] for _, e in pts],
                        color=ROW_COLORS[colour_row], ls=styles[k % 4], marker=markers[k % len(markers)],
                        capsize=3, lw=1.6, ms=5, label=f"{name} ({colour_row.replace('_', ' ')})")
    for ax, label in ((axes[0], "eval loss, all positions (nats/token)"),
                      (axes[1], "eval loss, last quarter (nats/token)")):
        ax.axvline(cfg["train_len"], color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(label)
        ax.set_title(f"{cfg['task']}: trained at {cfg['train_len']} tokens, {cfg['steps']} steps")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _row_name(lam: float, om: float, n: int, tol: float) -> str:
    """The row of one block (rate, frequency, size), a rate or frequency within ``tol`` of 0 counting as 0."""
    g = lp.Generator([lam], [om], [n], complex=[om != 0.0])
    return lp.classify(g, tol=tol).names[0]


def plot_learned(results: dict, path: Path) -> None:
    """Every learned block's eigenvalue λ ± iω at the start (hollow) and the end (filled), per encoding,
    in the colour of the row it ends in (rates and frequencies below NEGLIGIBLE / longest length count as 0)."""
    from matplotlib.lines import Line2D

    from liepos.explore.train import NEGLIGIBLE
    from liepos.classify import ROW_COLORS

    plt = _pyplot()
    tol = NEGLIGIBLE / max(results["config"]["eval_lens"])
    specs = [e for e in results["encodings"] if any(r["encoding"] == e and r.get("learned_generator")
                                                    for r in results["runs"])]
    fig, axes = plt.subplots(1, len(specs), figsize=(5.2 * len(specs), 4.4), squeeze=False)
    for ax, spec in zip(axes[0], specs):
        rows = set()
        for r in (r for r in results["runs"] if r["encoding"] == spec and r.get("learned_generator")):
            traj = r["learned_generator"]["trajectory"]
            for snap, filled in ((traj[0], False), (traj[-1], True)):
                for g in snap["generators"]:
                    for head in g["blocks"]:
                        for lam, om, n in head:
                            row = _row_name(lam, om, n, tol)
                            rows.add(row)
                            c = ROW_COLORS[row]
                            ax.scatter([lam], [om], s=18 + 10 * n, facecolors=c if filled else "none",
                                       edgecolors=c, linewidths=0.8, alpha=0.8)
        ax.set_xscale("symlog", linthresh=1e-4)
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.axvline(0, color="#999999", lw=0.6)
        ax.set_xlabel("rate λ per token (symmetric log axis)")
        ax.set_ylabel("frequency ω, radians per token (symmetric log axis)")
        ax.set_title(f"{spec}: start (hollow) → trained (filled), every seed and layer", fontsize=9)
        handles = [Line2D([], [], ls="", marker="o", color=ROW_COLORS[k], label=k.replace("_", " "))
                   for k in ROW_COLORS if k in rows]
        ax.legend(handles=handles, fontsize=7, loc="upper left", title="row (trained)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def map_points(results: dict, scaled: tuple[str, ...] = ("rope",)) -> list[tuple[str, list, float]]:
    """``(row name, blocks (λ, ω, n) of every head, loss change train length → FAR×)`` per summary row.

    Fixed encodings: their blocks as built; the rows of a scaling map only for the encodings in
    ``scaled``, their blocks as the map sets them at FAR × the training length. Learned generators:
    the trained blocks of every layer, seed 0's run."""
    from liepos.explore.eval_scaling import scaling_transform

    cfg = results["config"]
    T, hd, H = cfg["train_len"], cfg["d_model"] // cfg["heads"], cfg["heads"]
    out = []
    for name, row in results["summary"].items():
        if row["scaling"] and row["base"] not in scaled:
            continue
        run = next(r for r in results["runs"] if r["encoding"] == row["base"])
        if run.get("learned_generator"):
            blocks = [tuple(b) for g in run["learned_generator"]["final"] for head in g["blocks"] for b in head]
        elif _schedule_layers(row["base"], cfg) is not None:
            blocks = []
            for enc in _schedule_layers(row["base"], cfg):
                if row["scaling"]:
                    enc = scaling_transform(row["scaling"], T)(enc, FAR * T)
                g = enc.generator
                blocks += [(float(r), float(f), n) for r, f, n in zip(g.rates.reshape(-1), g.freqs.reshape(-1), g.sizes)]
        else:
            blocks = []
            for a, b, spec in split_heads(row["base"], H):
                enc = from_spec(spec, hd, b - a)
                if row["scaling"]:
                    enc = scaling_transform(row["scaling"], T)(enc, FAR * T)
                g = enc.generator
                rates, freqs = g.rates.reshape(-1, g.num_blocks), g.freqs.reshape(-1, g.num_blocks)  # (heads, blocks)
                blocks += [(float(rates[h, i]), float(freqs[h, i]), n)
                           for h in range(rates.shape[0]) for i, n in enumerate(g.sizes)]
        out.append((name, blocks, _delta(row, T)))
    return out


def plot_map(results_list: list[dict], path: Path) -> None:
    """"The map": the spectrum plane (rate λ, frequency ω), a point per block of every encoding, coloured
    by its loss change from the training length to FAR × it (one panel per results, e.g. per task)."""
    import matplotlib

    plt = _pyplot()
    panels = [(r, map_points(r)) for r in results_list]
    deltas = [d for _, pts in panels for _, _, d in pts if math.isfinite(d)]
    norm = matplotlib.colors.Normalize(vmin=min(deltas + [0.0]), vmax=max(deltas + [0.0]) or 1.0)
    cmap = matplotlib.colormaps["viridis"]
    markers = "osD^vP*Xh<>p"
    # one panel per row of the figure: each legend sits right of its own panel
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.6, 5.2 * len(panels)), squeeze=False, layout="constrained")
    for ax, (res, pts) in zip(axes[:, 0], panels):
        for k, (name, blocks, d) in enumerate(pts):
            lam = [b[0] for b in blocks]
            om = [b[1] for b in blocks]
            size = [14 + 12 * (b[2] - 1) for b in blocks]
            kw = dict(marker=markers[k % len(markers)], s=size, linewidths=0.6, alpha=0.75)
            if math.isfinite(d):
                ax.scatter(lam, om, color=cmap(norm(d)), edgecolors="black", label=f"{name} ({d:+.2f})", **kw)
            else:
                ax.scatter(lam, om, facecolors="none", edgecolors="#D55E00", label=f"{name} (diverged)", **kw)
        ax.set_xscale("symlog", linthresh=1e-4)
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.axvline(0, color="#999999", lw=0.6, zorder=0)
        ax.axvspan(0, 1, color="#D55E00", alpha=0.06, zorder=0)
        cfg = res["config"]
        ax.set_title(f"{cfg['task']}: loss change from {cfg['train_len']} to {FAR * cfg['train_len']} tokens",
                     fontsize=10)
        ax.set_xlabel("rate λ per token (symmetric log axis; λ > 0 shaded: growth)")
        ax.set_ylabel("frequency ω, radians per token (symmetric log axis)")
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="encoding (Δ nats/token)",
                  title_fontsize=7)
    sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=axes[:, 0].tolist(), location="bottom", shrink=0.6,
                 label=f"loss change, training length → {FAR}× (nats/token)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
