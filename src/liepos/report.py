"""Moved: the tour's page is :mod:`liepos.tour.page`, its command line :mod:`liepos.cli.tour`.

This module keeps the old import path working for the command dispatcher until it names
``liepos.cli.tour`` (then it goes)."""

from liepos.cli.tour import configure as configure
from liepos.cli.tour import run as run
from liepos.tour.page import tour as tour

__all__ = ["configure", "run", "tour"]
