"""``liepos explore``: train small decoders across the design space, test at longer lengths.

The pieces, in the order data flows: :mod:`~liepos.explore.spec` (spec strings → encodings, through
:data:`liepos.CATALOGUE`), :mod:`~liepos.explore.learned` (learned generators),
:mod:`~liepos.explore.tasks`, :mod:`~liepos.explore.model` (the decoder),
:mod:`~liepos.explore.train` (one run, DDP-exact), :mod:`~liepos.explore.sweep` (every run,
resumable) and :mod:`~liepos.explore.report` (tables, figures). The command line is
:mod:`liepos.cli.explore`.

>>> from liepos.explore import from_spec
>>> from_spec("rope", 8).name
'rope'
"""

from __future__ import annotations

from liepos.explore.spec import from_spec, parse_spec, split_heads

__all__ = ["from_spec", "parse_spec", "split_heads"]
