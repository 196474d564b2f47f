"""Context extension at evaluation: ``--eval-scaling NAME[:FACTOR][:KEY=VALUE…]``, a map applied past the training length.

Every map of :data:`liepos.scaling.SCALINGS` applies. The factor is ``eval length / train length``
unless given, so "RoPE + YaRN at 16×" is
``lp.scaling.yarn(enc, factor=16, original_max_position_embeddings=train_len)`` at 16× the training
length; ``original_max_position_embeddings`` is the training length wherever a map takes it.
Parameters a map requires and the explorer cannot know get a stated default (:data:`DEFAULTS`),
overridable as ``KEY=VALUE``:

* ``longrope``: its per-plane factors come from a search on the model being extended, which these
  models never had; the default is ``short_factor = 1`` and ``long_factor = factor`` on every plane
  (position interpolation past the training length, with LongRoPE's attention factor
  ``√(1 + ln s / ln L0)``). ``longrope:long=4`` sets every long factor to 4.
* ``proportional``: ``partial_rotary_factor = 0.25`` (the fastest quarter of the planes keeps
  rotating, the rest become NoPE planes), every kept frequency divided by the factor;
  ``proportional:p=0.5`` keeps half.
* ``factors`` (one factor per eigenvalue): the same ``factor`` on every plane (position interpolation);
  ``factors:f=4`` sets every plane's factor to 4.
* ``clipped`` takes no factor: CoPE's taper sized from the training length (``original_max_position_embeddings``).
"""

from __future__ import annotations

import inspect
import math

from liepos import scaling
from liepos.encoding import Encoding
from liepos.explore.model import Transform

__all__ = ["DEFAULTS", "OPTIONS", "parse_scaling", "scaling_transform"]

# the value a required parameter takes when not given (longrope's factor lists are per plane: see _params)
DEFAULTS = {"proportional": {"partial_rotary_factor": 0.25}, "longrope": {}}
# short names of the options one can set, per map
OPTIONS = {"proportional": {"p": "partial_rotary_factor"}, "longrope": {"short": "short_factor", "long": "long_factor"},
           "factors": {"f": "factors"},
           "yarn": {"beta_fast": "beta_fast", "beta_slow": "beta_slow"},
           "llama3": {"low": "low_freq_factor", "high": "high_freq_factor"}}


def _number(text: str, what: str, spec: str, low: float) -> float:
    try:
        f = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r} in {spec!r}") from None
    if not (f >= low and math.isfinite(f)):
        raise ValueError(f"{what} must be a finite number >= {low:g}, got {f:g} in {spec!r}")
    return f


def parse_scaling(text: str) -> tuple[str, float | None, dict]:
    """``'yarn'`` → ``('yarn', None, {})`` (factor = eval length / train length); ``'yarn:4'`` →
    ``('yarn', 4.0, {})``; ``'proportional:p=0.5'`` → ``('proportional', None, {'partial_rotary_factor': 0.5})``."""
    name, *fields = [f.strip() for f in text.strip().lower().split(":")]
    if name not in scaling.SCALINGS:
        raise ValueError(f"unknown scaling {name!r}; known: {', '.join(sorted(scaling.SCALINGS))}")
    factor, opts = None, {}
    for f in fields:
        key, eq, val = f.partition("=")
        if not eq:
            if factor is not None:
                raise ValueError(f"scaling {text!r} gives the factor twice")
            factor = _number(f, "scaling factor", text, 1.0)
            continue
        known = OPTIONS.get(name, {})
        if key not in known:
            raise ValueError(f"scaling {name!r} has no option {key!r} in {text!r}; its options: {sorted(known) or 'none'}")
        opts[known[key]] = _number(val, key, text, 0.0)
    return name, factor, opts


def _params(name: str, fn, enc: Encoding, factor: float, train_len: int, opts: dict) -> dict:
    """The keyword arguments of ``SCALINGS[name]`` for ``enc`` at ``factor``."""
    sig = inspect.signature(fn).parameters
    params: dict = dict(DEFAULTS.get(name, {})) | ({"factor": factor} if "factor" in sig else {})
    if "original_max_position_embeddings" in sig:
        params["original_max_position_embeddings"] = train_len
    if name == "longrope":  # one factor per rotation plane
        planes = int(scaling.rotation_freqs(enc).shape[-1])  # (*heads, planes)
        params["short_factor"] = [opts.get("short_factor", 1.0)] * planes
        params["long_factor"] = [opts.get("long_factor", factor)] * planes
        opts = {k: v for k, v in opts.items() if k not in ("short_factor", "long_factor")}
    if name == "factors":  # one factor per eigenvalue (rotation plane)
        planes = int(scaling.rotation_freqs(enc).shape[-1])  # (*heads, planes)
        params["factors"] = [opts.get("factors", factor)] * planes
        opts = {k: v for k, v in opts.items() if k != "factors"}
    return params | opts


def scaling_transform(text: str, train_len: int) -> Transform:
    """``(enc, length) -> enc``: the map ``text`` applied past ``train_len`` to encodings with rotation blocks.

    The factor is ``length / train_len`` unless ``text`` gives one; ``original_max_position_embeddings``
    is ``train_len``. Encodings without a rotation block, and lengths up to ``train_len``, pass unchanged.
    """
    name, fixed, opts = parse_scaling(text)
    fn = scaling.SCALINGS[name]

    def apply(enc: Encoding, length: int) -> Encoding:
        if length <= train_len or not any(enc.generator.complex):
            return enc
        factor = fixed or length / train_len
        out = scaling.scale(enc, name, **_params(name, fn, enc, factor, train_len, opts))
        return out.at_length(length)

    return apply
