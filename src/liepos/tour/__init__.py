"""``liepos tour``: the theory walked on live numbers, as one HTML page.

* :mod:`liepos.tour.sections`: each section's numbers, computed by liepos (plain data, no matplotlib);
* :mod:`liepos.tour.playground`: every slider setting of the playground, computed ahead of time;
* :mod:`liepos.tour.figures`: one matplotlib figure per picture (the ``plot`` extra);
* :mod:`liepos.tour.page`: the HTML page (its CSS and scripts are package data in ``assets/``).

The command lines are :mod:`liepos.cli.tour` and :mod:`liepos.cli.plot`.
"""

from liepos.tour.page import tour as tour

__all__ = ["tour"]
