"""``liepos plot KIND``: draw one figure of the tour alone, as PNG or SVG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from liepos.cli._common import UsageError, int_at_least, need_extra, out_file, real_in
from liepos.cli.tour import MAX_DPI, dpi

__all__ = ["HELP", "EXAMPLES", "configure", "run"]

HELP = "draw one figure of the tour alone (PNG or SVG)"
EXAMPLES = ["liepos plot spectrum --out spectrum.png", "liepos plot trajectories --out rows.svg",
            "liepos plot scaling --factor 4 --base 10000 --out scaling.png --json scaling.json"]
# --flag -> the section parameter it sets; a figure whose section lacks it refuses the flag
_PARAMS = {"base": "base", "factor": "factor", "dim": "dim"}
MAX_DIM = 1024  # a head dim past any model's; the sections' cost grows with it


def _kinds() -> dict[str, tuple[str, str]]:
    from liepos.tour.kinds import KIND_TITLES  # names and titles only: no torch, no matplotlib

    return KIND_TITLES


def configure(parser: argparse.ArgumentParser) -> None:
    kinds = _kinds()
    parser.add_argument("kind", metavar="KIND", choices=sorted(kinds), help="one of: " + ", ".join(kinds))
    parser.add_argument("--out", required=True, metavar="FILE", help="the figure to write: FILE.png or FILE.svg")
    parser.add_argument("--dpi", type=dpi, default=110, help=f"resolution, 1 to {MAX_DPI} (default 110)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figure's data as JSON")
    parser.add_argument("--base", type=real_in(1.0, open_low=True), default=None, help="RoPE base > 1 (clocks, scaling, precision)")
    parser.add_argument("--factor", type=real_in(1.0), default=None, help="context-extension factor >= 1 (scaling)")
    parser.add_argument("--dim", type=int_at_least(2), default=None,
                        help="head dim (attention, lookup, clocks, scaling, precision)")
    lines = "\n".join(f"  {k:<13} {desc}" for k, (_, desc) in kinds.items())
    parser.epilog = ("kinds:\n" + lines + "\n\nexamples:\n" + "\n".join(f"  liepos plot {k} --out {k}.png" for k in kinds)
                     + "\n  " + EXAMPLES[-1])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _flags(kind: str) -> dict[str, str]:
    """--flag -> section parameter, for the flags figure ``kind`` takes (clocks takes one base as ``bases``)."""
    from liepos.tour.figures import section_params

    accepted = section_params(kind)
    out = {flag: param for flag, param in _PARAMS.items() if param in accepted}
    if "bases" in accepted:
        out["base"] = "bases"
    return out


def _section_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as parameters of the figure's section; a flag the figure does not take is refused."""
    flags = _flags(args.kind)
    given = {flag: getattr(args, flag) for flag in _PARAMS if getattr(args, flag) is not None}
    refused = [f"--{flag}" for flag in given if flag not in flags]
    if refused:
        takes = ", ".join(f"--{f}" for f in flags) or "none of --base, --factor, --dim"
        raise UsageError(f"{' '.join(refused)} is not a parameter of the {args.kind!r} figure (it takes {takes})")
    if "dim" in given and (given["dim"] % 2 or given["dim"] > MAX_DIM):
        raise UsageError(f"--dim must be even (RoPE turns planes, pairs of coordinates) and <= {MAX_DIM}, got {given['dim']}")
    return {flags[f]: ((v,) if flags[f] == "bases" else v) for f, v in given.items()}


def run(args: argparse.Namespace) -> int:
    need_extra("matplotlib", "plot")
    import liepos.tour.figures as F
    import liepos.tour.sections as S
    from liepos.tour.sections import json_safe

    if Path(args.out).is_dir():  # say what it is before what its name lacks
        raise UsageError(f"--out {args.out!r} is a folder, not a file: give FILE.png or FILE.svg")
    path = out_file("--out", args.out, tuple(F.FORMATS))
    js = out_file("--json", args.json, (".json",)) if args.json else None
    params = _section_args(args)
    data = S.SECTIONS[F.KINDS[args.kind][0]][1](**params)
    F.save(F.KINDS[args.kind][1](data), path, args.dpi)
    if js is not None:
        js.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False))
    print(f"wrote {path}" + (f" and {js}" if js else ""))
    return 0
