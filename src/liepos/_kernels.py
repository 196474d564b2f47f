"""One-pass elementwise kernels compiled by Inductor, with the plain torch ops as their fallback.

The half layout rotates planes (k, k + P)::

    y₀ = c ⊙ x₀ − s ⊙ x₁        y₁ = s ⊙ x₀ + c ⊙ x₁        (x₀ = x[..., :P], x₁ = x[..., P:2P])

As torch ops that is four passes (two ``mul`` and two ``addcmul_``). Written as one expression,
``cat((x₀c − x₁s, x₀s + x₁c))``, ``torch.compile`` (Inductor) emits one loop over ``(…, P)`` with two
vector loads of x, two of the tables and two stores straight into the two halves of the output: one
read of x, one write of y — a vectorised C++ loop on the CPU, a Triton kernel on a GPU. Half-precision
x is upcast in registers and the low-precision output written directly (no float32 scratch pass); the
tables are float32 (or float64 for float64 inputs), as in the torch-op path, so the values are those of
the torch-op rotation (:func:`liepos._fast._rot`) up to the rounding of a fused multiply-add.

In place (``into`` is ``x``, or a slice of a wider output) the rotation runs in slabs of the leading
axes of about :data:`SLAB_BYTES` (L3-resident): the compiled kernel writes a fresh slab and a ``copy_``
puts it where it belongs, so x is read once and written once from memory (Inductor cannot write into
the input it reads at another index without a full-size temporary).

Compiled once per *variant* (kernel, dtypes, device, which axes have size 1) with dynamic shapes, so a
new sequence length, batch or head count never recompiles; lazily at first use, under a lock. Each
variant gets its own code object, hence its own dynamo cache and recompile limit.

The fallback (:func:`liepos._fast._rot`, the slab-wise torch ops) runs when

* ``LIEPOS_KERNELS=0`` (also ``false``/``off``/``no``) is set — logged once at INFO;
* the device is neither CPU nor CUDA, or ``torch._dynamo``/``torch._inductor`` cannot be imported;
* compiling a variant fails (no C++ compiler, no Triton, …) — warned once with the reason, and that
  variant is never tried again;
* the input is small (under :data:`MIN_ELEMS` elements: a compiled call costs ~30 µs of guards and
  wrappers, more than the torch ops on a decode step) or not contiguous in a layout the kernel takes.

Either way the result is the same rotation up to float rounding (tests compare both against each other
and the float64 dense reference).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import types
import warnings
from collections.abc import Callable

import torch

__all__ = ["ENV", "MIN_ELEMS", "SLAB_BYTES", "enabled", "off", "rotate_halves", "status"]

ENV = "LIEPOS_KERNELS"
# below this many elements of x the torch ops win: a compiled call costs ~30 µs of guards and wrappers
# (measured: 31 µs compiled vs 16 µs eager for one (1, 1, 1, 128) row on the 2-core CPU)
MIN_ELEMS = 1 << 16
# slab of the in-place rotation (bytes of x), L3-resident: on the 2-core EPYC (2 MiB L2 per core, 32 MiB
# L3) at (1, 32, 4096, 128) float32 in place, one exploratory run gave 2.9 / 2.1 / 1.3 / 2.0× a warm copy
# for 1 / 2 / 4 / 8 MiB slabs, another (heavier load) 2.3 / 1.9 / 2.3 / 2.4×: the best is not sharp
SLAB_BYTES = 4 << 20
_DEVICES = ("cpu", "cuda")
_OFF = ("0", "false", "off", "no")

log = logging.getLogger("liepos")
_lock = threading.RLock()
_compiled: dict[tuple, Callable] = {}
_failed: dict[tuple, str] = {}
_said: set[str] = set()
_local = threading.local()


@contextlib.contextmanager
def off():
    """Within the block (this thread only) the torch ops run instead of the kernels: benchmarks and
    tests compare the two."""
    before = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = before


def _say_once(what: str, message: str, warn: bool) -> None:
    with _lock:
        if what in _said:
            return
        _said.add(what)
    if warn:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        log.info(message)


def enabled(device: torch.device) -> bool:
    """Whether compiled kernels may run on ``device`` (:func:`off`, the environment variable, device, imports)."""
    if getattr(_local, "off", False):
        return False
    if os.environ.get(ENV, "1").strip().lower() in _OFF:
        _say_once("env", f"liepos: {ENV}={os.environ[ENV]!r}: compiled kernels off, using the torch ops", False)
        return False
    if device.type not in _DEVICES:
        _say_once(f"device:{device.type}", f"liepos: no compiled kernels on {device.type}: using the torch ops", False)
        return False
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor  # noqa: F401
    except Exception as err:  # any import failure means: no Inductor here
        _say_once("import", f"liepos: torch._dynamo/_inductor unavailable ({err!r}): using the torch ops", True)
        return False
    return True


def status() -> dict:
    """The compiled variants and the failed ones (with their reasons), for reports and tests."""
    with _lock:
        return {"compiled": sorted(map(repr, _compiled)), "failed": dict(_failed)}


# ---------------------------------------------------------------------- the kernels (traced by dynamo)
def _halves_expr(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``cat((c x₀ − s x₁, s x₀ + c x₁))`` computed in the tables' dtype, returned in x's dtype."""
    P = c.shape[-1]
    x0, x1 = x[..., :P].to(c.dtype), x[..., P : 2 * P].to(c.dtype)
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), -1).to(x.dtype)


def _variant(x: torch.Tensor, c: torch.Tensor) -> tuple:
    # size-1 axes are specialised by dynamo (0/1 specialisation): one variant per pattern, no recompiles
    return ("halves", x.device.type, x.dtype, c.dtype, tuple(n == 1 for n in x.shape), tuple(n == 1 for n in c.shape))


def _compile(key: tuple) -> Callable | None:
    """The compiled kernel of ``key`` (compiled at its first call, under the lock), or None if it failed."""
    with _lock:
        if key in _failed:
            return None
        fn = _compiled.get(key)
        if fn is not None:
            return fn
        # a fresh code object per variant: its own dynamo cache entries and recompile limit
        code = _halves_expr.__code__.replace(co_name=f"_halves_{len(_compiled)}")
        fresh = types.FunctionType(code, _halves_expr.__globals__, code.co_name)
        fn = torch.compile(fresh, dynamic=True, fullgraph=True)
        _compiled[key] = fn
        return fn


def _call(fn: Callable, key: tuple, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor | None:
    try:
        with torch.no_grad():
            return fn(x, c, s)
    except Exception as err:  # a compiler that is missing or fails: the torch ops give the same values
        with _lock:
            _failed[key] = repr(err)[:500]
            _compiled.pop(key, None)
        _say_once(f"fail:{key}", f"liepos: compiling the half-layout rotation {key} failed, using the torch ops: "
                  f"{repr(err)[:300]}", True)
        return None


def _slab_ranges(x: torch.Tensor) -> list[tuple[int, int, int, int, int, int]]:
    """Slabs ``(b, b+1, i0, i1, j0, j1)`` of a contiguous 4-D x: whole items of axis 1 when one fits in
    :data:`SLAB_BYTES`, else ranges of axis 2 within one item."""
    B, A1, A2, D = x.shape
    item = A2 * D * x.element_size()
    out = []
    if item <= SLAB_BYTES:
        step = max(1, SLAB_BYTES // max(1, item))
        for b in range(B):
            out += [(b, b + 1, i, min(A1, i + step), 0, A2) for i in range(0, A1, step)]
        return out
    step = max(1, SLAB_BYTES // max(1, D * x.element_size()))
    for b in range(B):
        for i in range(A1):
            out += [(b, b + 1, i, i + 1, j, min(A2, j + step)) for j in range(0, A2, step)]
    return out


def _part(t: torch.Tensor, b0: int, b1: int, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    """The slab of a 4-D tensor broadcast against x (a size-1 axis stays whole)."""
    t = t if t.shape[0] == 1 else t[b0:b1]
    t = t if t.shape[1] == 1 else t[:, i0:i1]
    return t if t.shape[2] == 1 else t[:, :, j0:j1]


def _contiguous_view(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor):
    """``(x, c, s, swapped)`` with x contiguous: as given, or BSHD (heads and positions swapped)."""
    if x.is_contiguous():
        return x, c, s, False
    xt = x.transpose(1, 2)
    if xt.is_contiguous():
        return xt, c.transpose(1, 2), s.transpose(1, 2), True
    return None


def rotate_halves(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, into: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The half-layout rotation of the 4-D ``x`` (width 2P) by the 4-D tables ``c``, ``s`` (…, P).

    ``into=None``: a fresh output in x's memory order; ``into`` (x itself, or a view of a wider output
    of x's shape): written there. Returns the result, or ``None`` when the compiled kernel does not
    apply (see the module docstring) and the caller must use the torch ops.
    """
    if x.numel() < MIN_ELEMS or not enabled(x.device):
        return None
    view = _contiguous_view(x, c, s)
    if view is None or (into is not None and into.dtype != x.dtype):
        return None
    xv, cv, sv, swapped = view
    cv, sv = cv.contiguous(), sv.contiguous()
    key = _variant(xv, cv)
    fn = _compile(key)
    if fn is None:
        return None
    if into is None:
        y = _call(fn, key, xv, cv, sv)
        return None if y is None else (y.transpose(1, 2) if swapped else y)
    ov = into.transpose(1, 2) if swapped else into
    for b0, b1, i0, i1, j0, j1 in _slab_ranges(xv):
        part = _call(fn, key, xv[b0:b1, i0:i1, j0:j1], *(_part(t, b0, b1, i0, i1, j0, j1) for t in (cv, sv)))
        if part is None:
            if b0 or i0 or j0:  # a later slab cannot fail after the first compiled: same variant
                raise RuntimeError("liepos: the compiled rotation failed part-way; this is a bug")
            return None
        ov[b0:b1, i0:i1, j0:j1].copy_(part)
    return into
