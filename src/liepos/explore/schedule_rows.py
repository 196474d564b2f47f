"""The explorer's per-layer schedule rows: ``schedule:<name>[:key=value…]``, sized for a small decoder.

A row ``schedule:<name>`` is :func:`liepos.build_schedule` ``(name, layers, head_dim, heads, **options)``
with the explorer's defaults (:data:`ROW_DEFAULTS`) under the row's own options: each layer gets its
generator, window (or chunk) and temperature (:mod:`liepos.schedule`). The production layouts are
sized for 32–80 layers and contexts of thousands (Command A: a NoPE layer every fourth, a window of
4,096); the explorer trains 1–2 layers at 32 or 64 tokens, so its defaults are

* ``every=2``: the layers alternate (layer 0 windowed RoPE, layer 1 global NoPE, as transformers' rule
  ``(i + 1) % every == 0`` is NoPE), and a model with fewer layers than ``every`` — the one-layer quick
  model — takes the pattern **across its heads** instead: head group ``g`` of every layer is layer ``g``
  of the ``every``-layer schedule (``heads`` must divide by ``every``);
* ``window=16`` (``chunk=16`` for llama4): half the quick training length 32, a quarter of the LM's 64,
  so the windowed RoPE heads see lags below 16 at training and at every evaluation length alike, and
  only the global NoPE heads can reach further;
* ``schedule:ssmax``: RoPE on every layer with Scalable-Softmax's ``s · log n`` (arXiv 2501.19399),
  ``s`` **learned per layer and head** as in the paper (``s = exp(a)``, started at ``s=0.43``, liepos'
  default; ``learn=0`` keeps it fixed).

>>> rows = schedule_layers("schedule:rnope_swa", layers=1, head_dim=8, heads=2)
>>> [(s.encoding.name, s.window) for s in rows[0]]  # one layer: the pattern across its two head groups
[('rope', 16), ('nope', None)]
>>> [(s.encoding.name, s.window) for s in schedule_layers("schedule:rnope_swa:window=8", 2, 8, 2)]
[('rope', 8), ('nope', None)]
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from liepos.explore.spec import SpecEncoding, is_schedule_row, number_or_text, split_heads
from liepos.schedule import SCHEDULES, LayerSpec, Schedule, build_schedule
from liepos.temperature import ScalableSoftmax, Temperature

__all__ = ["ROW_DEFAULTS", "LearnedScalableSoftmax", "check_row", "parse_schedule_row", "schedule_layers"]

# the explorer's defaults per layout, under the row's options (see the module docstring)
ROW_DEFAULTS: dict[str, dict[str, Any]] = {
    "rnope_swa": {"every": 2, "window": 16},
    "swan_gpt": {"every": 2, "window": 16},
    "llama4": {"every": 2, "chunk": 16},
    "smollm3": {"every": 2},
    "ssmax": {"learn": 1},
}
_LEARNS = ("ssmax",)  # the layouts whose temperature the explorer can learn (``learn=0|1``)


def parse_schedule_row(text: str) -> tuple[str, dict[str, Any]]:
    """``'schedule:rnope_swa:window=8'`` → ``('rnope_swa', {'every': 2, 'window': 8})``: the layout and its
    options, the explorer's defaults under the row's own; an unknown layout or a bare value is refused.

    >>> parse_schedule_row("schedule:ssmax:s=0.5")
    ('ssmax', {'learn': 1, 's': 0.5})
    """
    if not is_schedule_row(text):
        raise ValueError(f"a schedule row is 'schedule:<name>[:key=value…]', got {text!r}")
    name, *fields = [f.strip() for f in text.strip().lower().split(":")[1:]]
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r} in {text!r}; known: {', '.join(sorted(SCHEDULES))}")
    options = dict(ROW_DEFAULTS.get(name, {}))
    given: set[str] = set()
    for f in fields:
        key, sep, value = (x.strip() for x in f.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"{text!r}: a schedule option is key=value, got {f!r}")
        if key in given:
            raise ValueError(f"{text!r}: option {key!r} is given twice")
        given.add(key)
        options[key] = number_or_text(value)
    if "learn" in options and name not in _LEARNS:
        raise ValueError(f"{text!r}: only {', '.join(_LEARNS)} has a temperature to learn (learn=…)")
    if "learn" in options and options["learn"] not in (0, 1):
        raise ValueError(f"{text!r}: learn must be 0 or 1, got {options['learn']!r}")
    return name, options


class LearnedScalableSoftmax(nn.Module, Temperature):
    """Scalable-Softmax with ``s`` learned per head: ``τ_h = exp(a_h) · log n`` (``a`` a parameter).

    The log-parametrisation keeps ``s > 0`` whatever the optimiser does; the factor is
    :class:`~liepos.temperature.ScalableSoftmax` ``(exp(a))`` exactly, with its gradient.

    >>> T = LearnedScalableSoftmax(0.5, 2)
    >>> n = torch.tensor([[[1.0, 8.0]]])
    >>> bool(torch.equal(T.factor(torch.zeros(1, 2), n), ScalableSoftmax([0.5, 0.5]).factor(torch.zeros(1, 2), n)))
    True
    """

    uses_counts = True

    def __init__(self, s: float, heads: int) -> None:
        nn.Module.__init__(self)
        start = ScalableSoftmax(s).s  # the check: one positive number
        if start.dim():
            raise ValueError(f"a learned Scalable-Softmax starts at one s for every head, got s={start.tolist()}")
        self.raw_s = nn.Parameter(torch.full((heads,), math.log(float(start)), dtype=torch.float64))
        self.num_heads = heads

    def s(self) -> torch.Tensor:
        """``s = exp(a)``, shape ``(heads,)``."""
        return torch.exp(self.raw_s)

    def factor(self, t: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:
        return ScalableSoftmax(self.s()).factor(t, n)

    def extra_repr(self) -> str:
        return f"s={[round(float(v), 4) for v in self.s().detach()]}"


def _learned(spec: LayerSpec, heads: int) -> LayerSpec:
    """``spec`` with its Scalable-Softmax temperature (if any) replaced by a fresh learned one."""
    T = spec.temperature
    if not isinstance(T, ScalableSoftmax):
        return spec
    if T.s.dim():
        raise ValueError(f"learn=1 starts every head at one s, got s={T.s.tolist()}")
    return replace(spec, temperature=LearnedScalableSoftmax(float(T.s), heads))


def schedule_layers(text: str, layers: int, head_dim: int, heads: int) -> list[LayerSpec | tuple[LayerSpec, ...]]:
    """One item per layer: a :class:`~liepos.LayerSpec`, or (fewer layers than the pattern's ``every``) a
    tuple of them, one per contiguous head group. Learned temperatures are fresh modules per layer."""
    name, options = parse_schedule_row(text)
    learn = bool(options.pop("learn", 0))
    every = options.get("every")
    # a model shallower than the pattern lays it across the heads of each layer: `span` head groups
    span = every if isinstance(every, int) and 1 <= layers < every else None
    if span is not None and heads % span:
        raise ValueError(f"{text!r} on {layers} layer(s) lays its {every}-layer pattern across the heads: "
                         f"{heads} heads do not split into {every} groups; use --layers {every} or more, "
                         f"or a head count divisible by {every}")
    try:
        if span is not None:
            group = heads // span
            return [tuple(_learned(s, group) if learn else s for s in build_schedule(name, span, head_dim, group,
                                                                                     **options))
                    for _ in range(layers)]
        sched: Schedule = build_schedule(name, layers, head_dim, heads, **options)
    except TypeError as err:
        raise ValueError(f"bad option in {text!r}: {err}") from None
    return [_learned(s, heads) if learn else s for s in sched]


def check_row(row: str, head_dim: int, layers: int, num_heads: int) -> None:
    """Build explorer row ``row`` for a decoder of ``layers`` layers of ``num_heads`` heads of ``head_dim``, or
    raise the ValueError that names what is wrong: a spec (head groups of sums of parts,
    :mod:`liepos.explore.spec`) or a schedule row (``schedule:<name>[:key=value…]``).

    >>> check_row("schedule:rnope_swa", 16, 2, 4)
    >>> check_row("schedule:rnope", 16, 2, 4)
    Traceback (most recent call last):
    ...
    ValueError: unknown schedule 'rnope' in 'schedule:rnope'; known: llama4, rnope_swa, smollm3, ssmax, swan_gpt
    """
    if is_schedule_row(row):
        schedule_layers(row, layers, head_dim, num_heads)
        return
    for a, b, g in split_heads(row, num_heads):
        SpecEncoding(g, head_dim, b - a)
