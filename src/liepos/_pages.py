"""The pages of a fresh output: a large one asks Linux for transparent huge pages before its first touch.

A fresh tensor's first touch faults once per page and the kernel zeroes the page (4 KiB): for an output of tens of
MiB written once (an encoding's q or k of a long sequence) those faults cost more than the writing. Advised as
transparent huge pages (``madvise(MADV_HUGEPAGE)`` over its 2 MiB-aligned interior, honoured where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``), it faults once per 2 MiB. A hint:
the values are those of any fresh tensor, and where it is not honoured nothing changes.
"""

from __future__ import annotations

import functools
import platform
from typing import Any

import torch

__all__ = ["HUGE_ABOVE_BYTES", "HUGE_PAGE", "huge"]

# a fresh output of this many bytes or more is advised (`benchmarks/apply.py` counts the faults: at (1, 32, 4096, 128),
# 64 MiB a tensor, the half layout took 0.65-0.79 of a clone's time against 1.12-1.17 on 4 KiB pages on a Xeon with
# AMX); at 8 MiB (the attention shape) the two read alike within that shape's noise, so smaller outputs keep 4 KiB pages
HUGE_ABOVE_BYTES, HUGE_PAGE = 32 << 20, 2 << 20
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=1)
def _madvise() -> Any:
    """libc's ``madvise`` on Linux, else None."""
    if platform.system() != "Linux":
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


def huge(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a fresh CPU tensor, not yet written) with its 2 MiB-aligned interior advised as transparent huge pages
    when it holds at least :data:`HUGE_ABOVE_BYTES`; a hint the kernel may ignore (any failure is ignored too):
    the values are those of any fresh tensor. Traced or fake tensors (``torch.compile``, meta) are returned as they are."""
    if torch.compiler.is_compiling() or type(t) is not torch.Tensor or t.device.type != "cpu":
        return t
    n = t.numel() * t.element_size()
    if n < HUGE_ABOVE_BYTES or (fn := _madvise()) is None:
        return t
    p = t.data_ptr()
    a, e = (p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), (p + n) & ~(HUGE_PAGE - 1)
    if e > a:
        fn(a, e - a, _MADV_HUGEPAGE)
    return t
