"""Context extension at evaluation: ``--eval-scaling NAME[:FACTOR]`` as a map applied past the training length.

The factor is ``eval length / train length`` unless given, so "RoPE + YaRN at 16×" is
``lp.scaling.yarn(enc, factor=16, original_max_position_embeddings=train_len)`` at 16× the training length.
"""

from __future__ import annotations

import inspect
import math

import liepos as lp
from liepos.encoding import Encoding
from liepos.explore.model import Transform

__all__ = ["parse_scaling", "scaling_transform"]


def parse_scaling(text: str) -> tuple[str, float | None]:
    """``'yarn'`` → ``('yarn', None)`` (factor = eval length / train length); ``'yarn:4'`` → ``('yarn', 4.0)``."""
    name, _, factor = text.strip().lower().partition(":")
    if name not in lp.scaling.SCALINGS:
        raise ValueError(f"unknown scaling {name!r}; known: {', '.join(sorted(lp.scaling.SCALINGS))}")
    if not factor:
        return name, None
    try:
        f = float(factor)
    except ValueError:
        raise ValueError(f"scaling factor must be a number, got {factor!r} in {text!r}") from None
    if not (f >= 1 and math.isfinite(f)):
        raise ValueError(f"scaling factor must be a finite number >= 1, got {f:g} in {text!r}")
    return name, f


def scaling_transform(text: str, train_len: int) -> Transform:
    """``(enc, length) -> enc``: the map ``text`` applied past ``train_len`` to encodings with rotation blocks.

    The factor is ``length / train_len`` unless ``text`` gives one; ``original_max_position_embeddings``
    is ``train_len``. Encodings without a rotation block, and lengths up to ``train_len``, pass unchanged.
    """
    name, fixed = parse_scaling(text)
    fn = lp.scaling.SCALINGS[name]
    extra = {"original_max_position_embeddings": train_len} if "original_max_position_embeddings" in \
        inspect.signature(fn).parameters else {}

    def apply(enc: Encoding, length: int) -> Encoding:
        if length <= train_len or not any(enc.generator.complex):
            return enc
        out = lp.scaling.scale(enc, name, factor=fixed or length / train_len, **extra)
        return out.at_length(length)

    return apply
