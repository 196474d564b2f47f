"""Progress for long work: a tqdm bar on a terminal, plain lines in a log file, nothing when quiet.

One helper for every long-running command (the tour, explore, benchmarks). On a terminal it shows a
tqdm bar on stderr (when tqdm is installed); when stderr is not a terminal (a log file, CI) it prints
one plain line per step — ``[3/10] figures (2.1 s)`` — so a log stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress", "progress"]


class Progress:
    """``update(n)``, ``describe(text)`` (what runs next), ``postfix(text)`` (a running figure), ``close()``."""

    def __init__(self, total: int, desc: str = "", *, enabled: bool = True, stream: Any = None) -> None:
        self.total, self.desc, self.enabled = int(total), desc, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.n, self.t0, self.post, self.label = 0, time.perf_counter(), "", ""
        self._bar = None
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total, desc=desc or None, file=self.stream, dynamic_ncols=True, leave=False)

    def describe(self, text: str) -> None:
        self.label = text
        if self._bar is not None:
            self._bar.set_description(text)

    def postfix(self, text: str) -> None:
        self.post = text
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled:
            head = f"{self.desc}: " if self.desc else ""
            what = f" {self.label}" if self.label else ""
            post = f" {self.post}" if self.post else ""
            print(f"{head}[{self.n}/{self.total}]{what}{post} ({time.perf_counter() - self.t0:.1f} s)",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(total: int, desc: str = "", *, enabled: bool = True, stream: Any = None) -> Progress:
    """A :class:`Progress` over ``total`` steps (see the module docstring for what it prints where)."""
    return Progress(total, desc, enabled=enabled, stream=stream)
