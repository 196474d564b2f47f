"""Moved: the tour's figures are :mod:`liepos.tour.figures`, the command line :mod:`liepos.cli.plot`.

This module keeps the old import path working for the command dispatcher until it names
``liepos.cli.plot`` (then it goes)."""

from liepos.cli.plot import configure as configure
from liepos.cli.plot import run as run
from liepos.tour.figures import KINDS as KINDS
from liepos.tour.figures import ROW_COLORS as ROW_COLORS
from liepos.tour.figures import figure as figure
from liepos.tour.figures import save as save

__all__ = ["configure", "run", "KINDS", "ROW_COLORS", "figure", "save"]
