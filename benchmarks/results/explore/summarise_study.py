"""Tables and figures of the study from its run files, for the encodings whose every seed finished.

    python benchmarks/results/explore/summarise_study.py [OUT]

Each phase folder of ``run_study.sh`` gets ``table.md``, ``results.json`` and its figures again (with
the current report code); an encoding with a seed still missing is left out and named. ``OUT/map.png``
is the map of every phase's plain encodings.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from liepos.explore.figures import plot_map
from liepos.explore.report import write_reports
from liepos.explore.sweep import summarise


def phase(folder: Path) -> dict | None:
    files = sorted((folder / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    runs = [json.loads(p.read_text()) for p in files]
    if not runs:
        return None
    cfg, info = runs[0]["config"], runs[0]["task"]
    args = shlex.split(runs[-1]["provenance"]["arguments"])  # the latest command: its seeds and encodings
    seeds = sorted(int(v) for v in args[args.index("--seed") + 1].split(",")) if "--seed" in args else \
        sorted({r["seed"] for r in runs})
    extra = sorted({r["seed"] for r in runs} - set(seeds))
    if extra:
        print(f"{folder.name}: runs of seeds {extra} (an earlier command) left out")
    runs = [r for r in runs if r["seed"] in seeds]
    order = list(dict.fromkeys(r["encoding"] for r in runs))
    done = [e for e in order if {r["seed"] for r in runs if r["encoding"] == e} == set(seeds)]
    missing = [e for e in order if e not in done]
    if missing:
        print(f"{folder.name}: left out (a seed missing): {', '.join(missing)}")
    listed = args[args.index("--encodings") + 1].split(",") if "--encodings" in args else []
    done.sort(key=lambda e: listed.index(e) if e in listed else len(listed))  # the command's order
    for r in runs:
        r.pop("train_loss", None)
    res = summarise(cfg, done, seeds, info, [r for r in runs if r["encoding"] in done])
    write_reports(res, folder, log=lambda *a: None)
    print(f"{folder.name}: {len(done)} encodings x {len(seeds)} seeds -> {folder / 'table.md'}")
    return res


def main(out: Path) -> None:
    results = {}
    for folder in sorted(p for p in out.iterdir() if (p / "runs").is_dir()):
        res = phase(folder)
        if res is not None:
            results[folder.name] = res
    main_tasks = [results[k] for k in ("passkey", "lookup", "lm", "kjv") if k in results]
    if main_tasks:
        plot_map(main_tasks, out / "map.png")
        print(f"wrote {out / 'map.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/explore/study"))
