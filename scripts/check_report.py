#!/usr/bin/env python3
"""Render the ``liepos tour`` page in headless Chromium, screenshot it, fail if an image does not load or the
playground does not draw.

Usage::

    python scripts/check_report.py                      # runs `liepos tour` into a temp folder first
    python scripts/check_report.py liepos-tour.html     # checks an existing report (a file, or a --folder folder)
    python scripts/check_report.py --screenshot tour.png --width 1280 --height 9000

Needs Debian's ``chromium`` package (``apt-get install chromium``) or ``$CHROMIUM`` pointing at a
Chromium/Chrome binary. Two headless runs:

1. ``--dump-dom`` after the page's ``load`` event: the report's own inline script appends
   ``<div id="img-check" data-total=N data-broken=K>``; K must be 0 and N the number of figures.
2. ``--screenshot``: a PNG of the rendered page (non-empty, valid PNG signature).

Exit status: 0 all images loaded, 1 a check failed, 2 Chromium missing or the report absent.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--allow-file-access-from-files",
]


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(binary: str, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="liepos-chromium-") as profile:
        cmd = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check(index: Path, screenshot: Path, binary: str, width: int, height: int) -> list[str]:
    """Problems found (empty when the report renders with every image)."""
    problems: list[str] = []
    url = index.resolve().as_uri()
    expected = len(re.findall(r"<img\b", index.read_text(encoding="utf-8")))
    dom = chromium(binary, "--virtual-time-budget=15000", "--run-all-compositor-stages-before-draw", "--dump-dom", url)
    m = re.search(r'<div id="img-check"[^>]*data-total="(\d+)"[^>]*data-broken="(\d+)"[^>]*data-broken-src="([^"]*)"', dom.stdout)
    if dom.returncode != 0:
        problems.append(f"chromium --dump-dom exited {dom.returncode}: {dom.stderr.strip()[-500:]}")
    if not m:
        problems.append("the page's image check did not run (no #img-check element in the rendered DOM)")
    elif not re.search(r'<svg id="pg-traj"[^>]*>.*?<polyline class="series" points="[\d., -]{20,}"', dom.stdout, flags=re.S):
        problems.append("the playground did not draw its trajectory (no polyline in #pg-traj)")
    if m:
        total, broken, srcs = int(m.group(1)), int(m.group(2)), m.group(3)
        print(f"images: {total} in the page, {broken} failed to load")
        if broken:
            problems.append(f"{broken} image(s) failed to load: {srcs}")
        if total != expected or total == 0:
            problems.append(f"the rendered page has {total} images, the HTML has {expected}")
    shot = chromium(binary, f"--window-size={width},{height}", "--virtual-time-budget=15000",
                    f"--screenshot={screenshot.resolve()}", url)
    if shot.returncode != 0:
        problems.append(f"chromium --screenshot exited {shot.returncode}: {shot.stderr.strip()[-500:]}")
    if not screenshot.exists() or screenshot.stat().st_size < 10_000 or screenshot.read_bytes()[:8] != PNG:
        problems.append(f"no usable screenshot at {screenshot}")
    else:
        print(f"screenshot: {screenshot} ({screenshot.stat().st_size // 1024} KiB, {width}x{height})")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", nargs="?", help="report folder or index.html (default: run `liepos tour` into a temp folder)")
    ap.add_argument("--screenshot", default=None, help="PNG to write (default: REPORT/screenshot.png)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=12000)
    args = ap.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print("check_report: no chromium found (apt-get install chromium, or set $CHROMIUM)", file=sys.stderr)
        return 2
    if args.report is None:
        folder = Path(tempfile.mkdtemp(prefix="liepos-tour-"))
        print(f"running liepos tour into {folder}")
        rc = subprocess.run([sys.executable, "-m", "liepos.cli", "tour", "--out", str(folder / "index.html"),
                             "--quiet"]).returncode
        if rc != 0:
            print(f"check_report: liepos tour exited {rc}", file=sys.stderr)
            return 1
        index = folder / "index.html"
    else:
        p = Path(args.report)
        index = p / "index.html" if p.is_dir() else p
    if not index.exists():
        print(f"check_report: {index} does not exist", file=sys.stderr)
        return 2
    screenshot = Path(args.screenshot) if args.screenshot else index.parent / "screenshot.png"
    problems = check(index, screenshot, binary, args.width, args.height)
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if not problems:
        print(f"OK: {index} renders in {Path(binary).name} with every image loaded")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
