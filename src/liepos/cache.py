"""KVCache: keys and values with their times, so that prefill + decode equals the full forward.

Keys are stored as the caller gave them (before encoding) together with their times, so attention can
encode them relative to any origin and under the current generator (a length-dependent generator such
as dynamic NTK changes with the length: the cache never mixes keys encoded under another version).
Encoded keys (and values, under a ``value_encoding``) of the current version are kept beside them, so
a decode step encodes one new key only: at absolute times for pure rotations, at the cache's origin
for re-centred encodings.

Every check runs in :meth:`KVCache.check` before anything is stored: a refused call (a wrong batch
size, dtype, head count or a time that goes back) leaves the cache as it was.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos._checks import all_finite

__all__ = ["KVCache"]


class KVCache:
    """A key/value cache that keeps the *time* of every key.

    Times must not decrease: a key older than one already cached is an error.

    Prefill plus decode through the cache equals one call over the whole sequence (the identity the
    tests check for every block type):

    >>> import torch, liepos as lp
    >>> q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    >>> cache, enc = lp.KVCache(), lp.xpos(8)
    >>> from liepos.attention import attention
    >>> pre = attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache)
    >>> step = attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], enc, cache=cache)
    >>> bool(torch.allclose(torch.cat((pre, step), 2), attention(q, k, v, enc)))
    True
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (B, Hk, S, D) raw keys
        self.v: torch.Tensor | None = None  # (B, Hk, S, Dv) raw values
        self.times: torch.Tensor | None = None  # (B, S) or (B, S, axes) float64
        self.keep: torch.Tensor | None = None  # (B, S) bool: False for padding
        self.docs: torch.Tensor | None = None  # (B, S) long document ids
        self.finite = True  # every cached key and value is finite
        self._enc: dict[str, torch.Tensor] = {}  # "k" / "v": encoded under _enc_version at _origin
        self._enc_version: Any = None
        self._origin: torch.Tensor | None = None  # (B,) origin of the encoded keys (re-centred encodings)

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def reset(self) -> None:
        """Forget every key."""
        self.__init__()

    @property
    def batch(self) -> int | None:
        """The batch size of the cached keys (``None`` while empty)."""
        return None if self.k is None else int(self.k.shape[0])

    def check(self, k: torch.Tensor, v: torch.Tensor, times: torch.Tensor, keep: torch.Tensor,
              docs: torch.Tensor | None) -> None:
        """Raise (changing nothing) unless keys ``(B, H, S, D)``, values, times ``(B, S)`` can be appended."""
        if self.k is None:
            return
        if (self.docs is None) != (docs is None):
            raise ValueError("document ids must be given on every call to a KVCache or on none")
        if k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1] or v.shape[-1] != self.v.shape[-1]:
            raise ValueError(
                f"`k` of shape {tuple(k.shape)} and `v` of shape {tuple(v.shape)} do not match the cached keys "
                f"{tuple(self.k.shape)} and values {tuple(self.v.shape)} (batch, heads and dims must stay)"
            )
        if k.dtype != self.k.dtype or v.dtype != self.v.dtype or k.device != self.k.device:
            raise TypeError(
                f"`k` and `v` must keep the cached dtype {self.k.dtype} on {self.k.device}, got {k.dtype} on {k.device}"
            )
        if times.dim() != self.times.dim():
            raise ValueError("key positions must keep one shape (with or without an axes dim) across calls")
        if times.dim() == 3 or times.shape[1] == 0 or self.times.shape[1] == 0:
            return  # several axes (B, S, axes): no total order of times; the cache keeps token order
        last = torch.where(self.keep, self.times, torch.full_like(self.times, -math.inf)).amax(-1)
        first = torch.where(keep, times, torch.full_like(times, math.inf)).amin(-1)
        if bool((first < last).any()):
            b = int(torch.nonzero(first < last)[0, 0])
            raise ValueError(
                f"key_positions go back in time: batch {b} appends a key at time {float(first[b])} "
                f"after a cached key at time {float(last[b])}; a KVCache needs non-decreasing times"
            )

    def append(self, k: torch.Tensor, v: torch.Tensor, times: torch.Tensor, keep: torch.Tensor,
               docs: torch.Tensor | None) -> None:
        """Append keys ``(B, H, S, D)``, values and their times ``(B, S)``; times must not go back."""
        self.check(k, v, times, keep, docs)
        finite = all_finite(k, v)
        if self.k is None:
            self.k, self.v, self.times, self.keep, self.docs = k, v, times, keep, docs
            self.finite = finite
            return
        self.k = torch.cat((self.k, k), dim=-2)
        self.v = torch.cat((self.v, v), dim=-2)
        self.times = torch.cat((self.times, times), dim=1)
        self.keep = torch.cat((self.keep, keep), dim=-1)
        if docs is not None:
            self.docs = torch.cat((self.docs, docs), dim=-1)
        self.finite = self.finite and finite

    def last_times(self) -> torch.Tensor:
        """``(B, 1)`` the latest cached time of each row (several axes: the largest coordinate)."""
        if self.times.dim() == 3:
            return self.times.amax((-2, -1))[:, None]
        return self.times.amax(-1, keepdim=True)
