"""``liepos tour``: walk the whole theory on live numbers and write it as one HTML page."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from liepos.cli._common import UsageError, int_at_least, need_extra, out_dir

__all__ = ["HELP", "EXAMPLES", "configure", "run", "MAX_DPI", "dpi"]

HELP = "walk the whole theory on live numbers and write a shareable HTML page"
EXAMPLES = ["liepos tour", "liepos tour --out my-tour --open", "liepos tour --inline --out shareable"]
MAX_DPI = 600  # past this a figure of the tour is tens of megapixels: refused rather than slow


def dpi(text: str) -> int:
    """An argparse ``type`` for a figure resolution: an integer in 1 … :data:`MAX_DPI`."""
    value = int_at_least(1)(text)
    if value > MAX_DPI:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_DPI}, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="liepos-tour", metavar="DIR", help="output folder (default: liepos-tour)")
    parser.add_argument("--open", action="store_true", help="open the page in a web browser when done")
    parser.add_argument("--inline", action="store_true",
                        help="write index.html alone: figures embedded, no figures/ and no numbers.json")
    parser.add_argument("--dpi", type=dpi, default=100, help=f"figure resolution, 1 to {MAX_DPI} (default 100)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _browser() -> webbrowser.BaseBrowser | None:
    """The browser ``webbrowser`` would use, or ``None`` when there is none to open."""
    try:
        return webbrowser.get()
    except webbrowser.Error:
        return None


def run(args: argparse.Namespace) -> int:
    need_extra("matplotlib", "plot")
    browser = _browser() if args.open else None
    if args.open and browser is None:
        raise UsageError("--open: no web browser found (set $BROWSER, or open the page yourself); nothing was run")
    out = out_dir("--out", args.out)  # a file or an unwritable folder is refused before any work
    from liepos.tour.page import tour

    result = tour(out, inline=args.inline, dpi=args.dpi, quiet=args.quiet)
    index = result.index
    extra = "one file, figures embedded" if args.inline else "figures/ and numbers.json beside it"
    print(f"wrote {index} ({extra}) in {result.seconds:.1f} s")
    print(f"open it in a browser: {index.as_uri()}")
    if result.failed:
        print(f"liepos tour: measured identities over their bounds: {', '.join(result.failed)}", file=sys.stderr)
    if browser is not None and not browser.open(index.as_uri()):
        print(f"liepos tour: the browser did not open; open {index.as_uri()} yourself", file=sys.stderr)
    return 1 if result.failed else 0
