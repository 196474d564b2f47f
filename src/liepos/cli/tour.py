"""``liepos tour``: walk the whole theory on live numbers and write it as one HTML page.

By default the page is one self-contained file (``liepos-tour.html``: figures inline, numbers inline),
to mail or copy alone; ``--folder`` writes ``index.html``, ``figures/`` and ``numbers.json`` instead."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from liepos.cli._common import UsageError, int_at_least, need_extra, out_dir, out_file

__all__ = ["HELP", "EXAMPLES", "configure", "run", "MAX_DPI", "dpi"]

HELP = "walk the whole theory on live numbers and write it as one self-contained HTML file"
EXAMPLES = ["liepos tour", "liepos tour --out my-tour.html --open", "liepos tour --folder --out liepos-tour"]
MAX_DPI = 600  # past this a figure of the tour is tens of megapixels: refused rather than slow


def dpi(text: str) -> int:
    """An argparse ``type`` for a figure resolution: an integer in 1 … :data:`MAX_DPI`."""
    value = int_at_least(1)(text)
    if value > MAX_DPI:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_DPI}, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="the page, one file (default: liepos-tour.html); with --folder, the folder "
                             "(default: liepos-tour)")
    parser.add_argument("--folder", action="store_true",
                        help="write a folder instead: index.html, figures/*.svg and numbers.json")
    parser.add_argument("--open", action="store_true", help="open the page in a web browser when done")
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
    # a file where a folder goes (or the reverse) and an unwritable place are refused before any work
    if args.folder:
        out = out_dir("--out", args.out or "liepos-tour")
    else:
        out = out_file("--out", args.out or "liepos-tour.html", (".html", ".htm"))
    from liepos.tour.page import tour

    result = tour(out, folder=args.folder, dpi=args.dpi, quiet=args.quiet)
    index = result.index
    extra = "figures/ and numbers.json beside it" if args.folder else "one self-contained file: send it as it is"
    print(f"wrote {index} ({extra}) in {result.seconds:.1f} s")
    print(f"open it in a browser: {index.as_uri()}")
    if result.failed:
        print(f"liepos tour: measured identities over their bounds: {', '.join(result.failed)}", file=sys.stderr)
    if browser is not None and not browser.open(index.as_uri()):
        print(f"liepos tour: the browser did not open; open {index.as_uri()} yourself", file=sys.stderr)
    return 1 if result.failed else 0
