"""The sweep's reports: ``table.md`` (every figure of the learned runs beside its bootstrap 95 % interval,
the runs that did not learn apart), ``results.json`` and the figures (:mod:`liepos.explore.figures`).

Cells read ``estimate [low, high]``: the mean over the learned seeds and the held-out documents, and
its 95 % interval from resampling both (:mod:`liepos.explore.stats`). ``Δ`` is the paired change
from the training length (the same tokens, :mod:`liepos.explore.evaluate`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from liepos.explore.learned import row_counts
from liepos.explore.stats import ci, headline
from liepos.explore.train import NEGLIGIBLE

__all__ = [
    "FAR",
    "ci",
    "delta_table",
    "headline_table",
    "learned_table",
    "not_learned_table",
    "passkey_table",
    "table",
    "write_reports",
]

FAR = 16  # the headline compares the loss at FAR × the training length with the loss at the training length


def _name(name: str) -> str:
    return name.replace("|", "\\|")  # a head-group spec's '|' is not a column


def _learned(row: dict) -> str:
    return f"{row['learned']}/{row['seeds']}" + ("" if row["learned"] == row["seeds"] else " ✗")


def table(results: dict, metric: str = "loss") -> str:
    """Markdown: a row per encoding (and scaling map): seeds learned, ``metric`` with its interval per length."""
    cfg = results["config"]
    lens, T = cfg["eval_lens"], cfg["train_len"]
    rows = ["| encoding | learned | " + " | ".join(f"{L}{'*' if L == T else ''}" for L in lens) + " |",
            "|" + "---|" * (len(lens) + 2)]
    for name, row in results["summary"].items():
        cells = [ci((row["lengths"].get(str(L)) or {}).get(metric)) for L in lens]
        rows.append(f"| {_name(name)} | {_learned(row)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def delta_table(results: dict, metric: str = "delta") -> str:
    """Markdown: the paired change from the training length at every longer length, with its interval."""
    cfg = results["config"]
    T = cfg["train_len"]
    lens = [L for L in cfg["eval_lens"] if L > T]
    rows = ["| encoding | learned | " + " | ".join(f"Δ {T}→{L}" for L in lens) + " |", "|" + "---|" * (len(lens) + 2)]
    for name, row in results["summary"].items():
        cells = [ci((row["lengths"].get(str(L)) or {}).get(metric), signed=True) for L in lens]
        rows.append(f"| {_name(name)} | {_learned(row)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def headline_table(results: dict) -> str:
    """Markdown: loss at the training length and at the headline length, their paired Δ, accuracy there."""
    cfg = results["config"]
    T, H = cfg["train_len"], headline(cfg)
    rows = [f"| encoding | learned | loss at {T} | loss at {H} | Δ {T}→{H} | acc at {T} | acc at {H} |",
            "|---|---|---|---|---|---|---|"]
    for name, row in results["summary"].items():
        near, far = row["lengths"].get(str(T)) or {}, row["lengths"].get(str(H)) or {}
        rows.append(f"| {_name(name)} | {_learned(row)} | {ci(near.get('loss'))} | {ci(far.get('loss'))} | "
                    f"{ci(far.get('delta'), signed=True)} | {ci(near.get('acc'))} | {ci(far.get('acc'))} |")
    return "\n".join(rows)


def not_learned_table(results: dict) -> str:
    """Markdown: every run that did not learn in distribution (never averaged into the tables above)."""
    H = headline(results["config"])
    rows = [f"| encoding | seed | loss at train length | acc at train length | loss at {H} |", "|---|---|---|---|---|"]
    for name, row in results["summary"].items():
        if row["scaling"]:
            continue
        for seed, r in row["not_learned"].items():
            far = r["far"]
            far = "—" if far is None else (f"{far:.3f}" if math.isfinite(far) else "diverged")
            rows.append(f"| {_name(name)} | {seed} | {r['in_distribution']['loss']:.3f} | "
                        f"{r['in_distribution']['acc']:.3f} | {far} |")
    return "\n".join(rows) if len(rows) > 2 else "every run learned"


def passkey_table(results: dict) -> str:
    """Markdown: passkey accuracy by the distance from query to key (pooled over the lengths), with intervals."""
    labels: list[str] = []
    for row in results["summary"].values():
        for lab in row.get("by_distance", {}):
            if lab not in labels:
                labels.append(lab)
    if not labels:
        return ""
    rows = ["| encoding | learned | " + " | ".join(f"d {lab}" for lab in labels) + " |", "|" + "---|" * (len(labels) + 2)]
    for name, row in results["summary"].items():
        bd = row.get("by_distance", {})
        rows.append(f"| {_name(name)} | {_learned(row)} | " + " | ".join(ci(bd.get(lab), digits=2) for lab in labels) + " |")
    return "\n".join(rows)


def _moved(traj: list[dict], tol: float) -> tuple[float, float, dict, dict]:
    """Largest |Δ ln|λ|| and |Δ ln ω| of any block from the first to the last snapshot; the counts then and now."""
    def flat(snap):
        return [b for g in snap["generators"] for head in g["blocks"] for b in head]

    a, b = flat(traj[0]), flat(traj[-1])
    dl = max((abs(math.log(abs(y[0]) or 1e-300) - math.log(abs(x[0]) or 1e-300)) for x, y in zip(a, b)), default=0.0)
    dw = max((abs(math.log(y[1]) - math.log(x[1])) for x, y in zip(a, b) if x[1] > 0 and y[1] > 0), default=0.0)

    def counts(snap):  # recomputed from the blocks with an absolute tolerance (row_counts)
        return {k: v for k, v in row_counts(flat(snap), tol).items() if v}

    return dl, dw, counts(traj[0]), counts(traj[-1])


def learned_table(results: dict) -> str:
    """Markdown: per learned-generator run, how far its blocks moved and the six rows' counts before → after."""
    rows = ["| encoding | seed | learned | max abs Δ ln abs λ | max abs Δ ln ω | rows at the start | rows at the end |",
            "|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        lg = r.get("learned_generator")
        if not lg:
            continue
        dl, dw, c0, c1 = _moved(lg["trajectory"], NEGLIGIBLE / max(results["config"]["eval_lens"]))
        rows.append(f"| {_name(r['encoding'])} | {r['seed']} | {'yes' if r['learned'] else 'no'} | {dl:.2f} | {dw:.2f} "
                    f"| {_counts_text(c0)} | {_counts_text(c1)} |")
    return "\n".join(rows) if len(rows) > 2 else ""



def _counts_text(counts: dict) -> str:
    """``{"damped_rotation": 3, …}`` -> ``"damped rotation 3, …"`` in name order."""
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(counts.items()))

def write_reports(results: dict, out: Path, log=print) -> None:
    from liepos.explore import figures

    out = Path(out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    cfg = results["config"]
    p = results["runs"][0]["parameters"] if results["runs"] else 0
    prov = results["runs"][0].get("provenance", {}) if results["runs"] else {}
    passkey = cfg["task"] == "passkey"
    text = [
        (f"# liepos explore: task {cfg['task']}, train length {cfg['train_len']} (* marks it), "
         f"{cfg['steps']} steps, batch {cfg['batch_size']}, d_model {cfg['d_model']}, {cfg['layers']} layers, "
         f"{cfg['heads']} heads ({p:,} parameters), seeds {results['seeds']}"),
        "", (f"Provenance (first run): `liepos explore {prov.get('arguments', '?')}`; liepos "
             f"{prov.get('liepos', '?')}, torch {prov.get('torch', '?')}, CPU {prov.get('cpu', '?')}, "
             f"{prov.get('threads', '?')} threads."),
        "", ("`learned`: seeds that learned the task at the training length (accuracy ≥ 0.9 for a synthetic "
             "task; for the LM, a loss below the byte-frequency entropy); only those enter the figures, the others "
             "are listed apart below. Cells: mean over the learned seeds [bootstrap 95 % interval over held-out "
             "documents and seeds]. `@map`: that context-extension map applied past the training length."),
        "", "## headline", "", headline_table(results),
    ]
    if passkey:
        text += ["", "## passkey accuracy by distance (query to its key, tokens; pooled over the lengths)", "",
                 passkey_table(results)]
    else:
        text += ["", "## paired loss change from the training length (nats/token, same tokens)", "", delta_table(results)]
    text += ["", "## eval loss (nats/token)", "", table(results, "loss"),
             "", "## eval accuracy", "", table(results, "acc"),
             "", "## runs that did not learn (not averaged in)", "", not_learned_table(results)]
    lt = learned_table(results)
    if lt:
        text += ["", "## learned generators: how far the blocks moved, the rows before and after", "", lt]
    (out / "table.md").write_text("\n".join(text) + "\n")
    log("\n".join(text[6:9]))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"wrote {out / 'table.md'}, {out / 'results.json'} (matplotlib missing: no figures)")
        return
    written = figures.write_figures(results, out)
    log("wrote " + ", ".join(str(w) for w in [out / "table.md", out / "results.json", *written]))
