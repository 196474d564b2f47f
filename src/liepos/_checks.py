"""Every argument check of liepos, in one place.

The rule (docs/guide/conventions.md, from equinox): an argument is checked when the object is built, never when a
property is read; a wrong *type* raises ``TypeError``, a wrong *value* raises ``ValueError``, and every
message reads "`name` must be …, got …" with the value the caller passed.

>>> check_int("head_dim", 64, min=1, even=True)
64
>>> check_int("head_dim", "8")
Traceback (most recent call last):
    ...
TypeError: `head_dim` must be an integer, got '8' (str)
>>> check_real("scale", float("nan"), positive=True)
Traceback (most recent call last):
    ...
ValueError: `scale` must be a finite real number, got nan
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "DOUBLE_BACKWARD",
    "DoubleBackwardError",
    "all_finite",
    "check_bool",
    "check_choice",
    "check_int",
    "check_ints",
    "check_real",
    "check_real_tensor",
    "check_tensor",
    "describe",
]


class DoubleBackwardError(NotImplementedError):
    """A second derivative (``create_graph=True``) through a computation liepos differentiates only once."""


DOUBLE_BACKWARD = (
    "liepos: a second derivative (create_graph=True) through lp.attention's fused kernel is not supported: it "
    "serves re-centred encodings (decay, xPos, RetNet, ALiBi, Jordan blocks), sinks and per-key biases, and the "
    "flash kernel's backward has no derivative of its own. Twice differentiable: enc.query / enc.key (every "
    "encoding), lp.attention_reference, and lp.attention of rotations and NoPE without sinks under "
    "torch.nn.attention.sdpa_kernel(SDPBackend.MATH)"
)


def describe(value: Any, limit: int = 80) -> str:
    """The value as a message shows it: its repr (cut at ``limit`` characters) and, for non-numbers, its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if isinstance(value, (bool, int, float)) and not isinstance(value, bool):
        return text
    return f"{text} ({type(value).__name__})"


def _is_integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Integral):
        return True
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
        return not value.dtype.is_complex and value.dtype != torch.bool
    return False


def check_int(
    name: str,
    value: Any,
    *,
    min: int | None = None,  # noqa: A002 - reads as the message does
    max: int | None = None,  # noqa: A002
    even: bool = False,
    multiple_of: int | None = None,
) -> int:
    """``value`` as a Python int: TypeError unless it is an integer (bool, float and str are refused),
    ValueError unless ``min <= value <= max`` (and even / a multiple of ``multiple_of`` when asked)."""
    if not _is_integral(value):
        raise TypeError(f"`{name}` must be an integer, got {describe(value)}")
    v = int(value)
    if min is not None and v < min:
        raise ValueError(f"`{name}` must be >= {min}, got {v}")
    if max is not None and v > max:
        raise ValueError(f"`{name}` must be <= {max}, got {v}")
    if even and v % 2:
        raise ValueError(f"`{name}` must be even, got {v}")
    if multiple_of is not None and v % multiple_of:
        raise ValueError(f"`{name}` must be a multiple of {multiple_of}, got {v}")
    return v


def check_ints(name: str, values: Any, *, min: int | None = None, length: int | None = None) -> list[int]:  # noqa: A002
    """A sequence of integers (each checked as :func:`check_int`, so ``[1.7]`` is refused, never rounded)."""
    if (isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, Iterable))
            or isinstance(values, torch.Tensor) and values.ndim != 1):
        raise TypeError(f"`{name}` must be a sequence of integers, got {describe(values)}")
    items = list(values.tolist() if isinstance(values, torch.Tensor) else values)
    out = [check_int(f"{name}[{i}]", v, min=min) for i, v in enumerate(items)]
    if length is not None and len(out) != length:
        raise ValueError(f"`{name}` must have {length} entries, got {len(out)}: {out}")
    return out


def check_real(
    name: str,
    value: Any,
    *,
    finite: bool = True,
    positive: bool = False,
    nonnegative: bool = False,
    min: float | None = None,  # noqa: A002
    max: float | None = None,  # noqa: A002
) -> float:
    """``value`` as a Python float: TypeError unless it is a real number (bool, complex and str are
    refused), ValueError if it is NaN, infinite (unless ``finite=False``), or out of the stated range."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)):
        raise TypeError(f"`{name}` must be a real number, got {describe(value)}")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"`{name}` must be a real number, got {describe(value)}")
        value = value.item()
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise ValueError(f"`{name}` must be a finite real number, got {v}")
    if positive and not v > 0:
        raise ValueError(f"`{name}` must be > 0, got {v}")
    if nonnegative and not v >= 0:
        raise ValueError(f"`{name}` must be >= 0, got {v}")
    if min is not None and v < min:
        raise ValueError(f"`{name}` must be >= {min}, got {v}")
    if max is not None and v > max:
        raise ValueError(f"`{name}` must be <= {max}, got {v}")
    return v


def check_real_tensor(
    name: str,
    value: Any,
    *,
    ndim: int | tuple[int, ...] | None = None,
    finite: bool = True,
    positive: bool = False,
    nonnegative: bool = False,
    dtype: torch.dtype | None = torch.float64,
) -> torch.Tensor:
    """A real tensor from a tensor, array or (nested) sequence of real numbers.

    TypeError for complex, bool or non-numeric input (a complex rate never silently loses its imaginary
    part); ValueError for NaN/inf (unless ``finite=False``), for the wrong number of dims, or for values
    outside the stated sign. The result is cast to ``dtype`` (float64 by default; ``None`` keeps it) and
    keeps autograd history when a tensor was passed."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        if isinstance(value, (str, bytes)):
            raise TypeError(f"`{name}` must be real numbers, got {describe(value)}")
        try:  # through numpy: Python floats stay float64 (torch.as_tensor would round them to float32)
            t = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise TypeError(f"`{name}` must be real numbers, got {describe(value)}") from err
    if t.dtype.is_complex or t.dtype == torch.bool or not (t.dtype.is_floating_point or _is_int_dtype(t.dtype)):
        raise TypeError(f"`{name}` must be real numbers, got {describe(value)}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.ndim not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"`{name}` must have {want} dims, got shape {tuple(t.shape)}")
    if dtype is not None:
        t = t.to(dtype)
    if torch.compiler.is_compiling():  # no data-dependent checks inside a graph (fullgraph=True), as as_positions
        return t
    with torch.no_grad():
        tf = t if t.dtype.is_floating_point else t.double()
        if torch.isnan(tf).any() or (finite and torch.isinf(tf).any()):
            raise ValueError(f"`{name}` must be finite, got {_short(tf)}")
        if positive and not bool((tf > 0).all()):
            raise ValueError(f"`{name}` must be > 0, got {_short(tf)}")
        if nonnegative and not bool((tf >= 0).all()):
            raise ValueError(f"`{name}` must be >= 0, got {_short(tf)}")
    return t


def check_tensor(
    name: str,
    value: Any,
    *,
    ndim: int | tuple[int, ...] | None = None,
    floating: bool = False,
) -> torch.Tensor:
    """A torch.Tensor (TypeError otherwise), with ``ndim`` dims and a floating dtype when asked (ValueError)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {describe(value)}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.ndim not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"`{name}` must have {want} dims, got shape {tuple(value.shape)}")
    if floating and not value.dtype.is_floating_point:
        raise TypeError(f"`{name}` must have a floating dtype, got {value.dtype}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (ValueError naming them otherwise; TypeError if unhashable)."""
    options = tuple(choices)
    try:
        ok = value in options
    except TypeError as err:
        raise TypeError(f"`{name}` must be one of {', '.join(map(repr, options))}, got {describe(value)}") from err
    if not ok:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, options))}, got {describe(value)}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (TypeError otherwise: ``0``/``"no"`` are not silently read as False)."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False, got {describe(value)}")
    return value


def all_finite(*xs: torch.Tensor) -> bool:
    """Whether every element of every tensor is finite (neither NaN nor ±inf).

    One summing pass per tensor: a NaN or an infinity makes the sum non-finite, so a finite sum proves
    every element finite; only a sum that is not finite (a NaN, an inf, or finite values overflowing
    the sum) pays the elementwise check, which decides. ``isfinite(x).all()`` costs ~50× the sum.

    >>> import torch
    >>> all_finite(torch.ones(3), torch.full((2,), 3e38)), all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    """
    for x in xs:
        if x.numel() and not (x.is_floating_point() or x.is_complex()) or x.is_meta:
            continue  # a meta tensor has shapes and no values: nothing to find, the finite path's shapes
        # the sum's parts by math.isfinite, not abs(complex(...)): that one reads a stale errno on a NaN and raises
        # OverflowError after any earlier libm call that set ERANGE (detached: no graph, no no_grad block to enter)
        if x.numel() and not _finite_number(x.detach().sum().item()):
            if not bool(torch.isfinite(x.detach()).all()):
                return False
    return True


def _finite_number(v: float | complex) -> bool:
    """A real number's finiteness by math.isfinite, a complex one's by its two parts'."""
    return math.isfinite(v.real) and math.isfinite(v.imag) if isinstance(v, complex) else math.isfinite(v)


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _short(t: torch.Tensor, limit: int = 8) -> str:
    flat = t.detach().flatten()
    items = ", ".join(f"{v:g}" for v in flat[:limit].tolist())
    return f"[{items}{', ...' if flat.numel() > limit else ''}]"
