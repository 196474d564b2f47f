"""``liepos tour``: the theory walked on live numbers, as one HTML page.

* :mod:`liepos.tour.sections`: each section's numbers, computed by liepos (plain data, no matplotlib);
* :mod:`liepos.tour.playground`: the playground's presets and the liepos values it checks itself against
  (the page evaluates the reader's own X live, in its script);
* :mod:`liepos.tour.kinds`: the figures' names and titles (light, for the help);
* :mod:`liepos.tour.figures`: one matplotlib figure per picture (the ``plot`` extra);
* :mod:`liepos.tour.page`: the HTML page (its CSS and scripts are package data in ``assets/``).

The command lines are :mod:`liepos.cli.tour` and :mod:`liepos.cli.plot`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tour"]


def __getattr__(name: str) -> Any:  # the page (and torch) load on first use, not with the package
    if name == "tour":
        from liepos.tour.page import tour

        return tour
    raise AttributeError(f"module 'liepos.tour' has no attribute {name!r}")
