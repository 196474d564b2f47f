"""KVCache: keys and values with their times, so that prefill + decode equals the full forward.

Keys are stored as the caller gave them (before encoding) together with their times, so attention can
encode them relative to any origin and under the current generator (a length-dependent generator such
as dynamic NTK changes with the length: the cache never mixes keys encoded under another version).
Encoded keys (and values, under a ``value_encoding``) of the current version are kept beside them in
one :class:`EncodedKeys` store, so a decode step encodes one new key only: at absolute times for pure
rotations, at the store's origin for re-centred encodings.

Every tensor grows along its positions in a capacity buffer (:class:`Rows`): appending writes in place
and the buffer doubles when full, so a generation of ``n`` steps copies ``O(n)`` positions in all (not
the ``O(n²)`` of concatenating the whole cache every step); readers get views of the filled part. Under
autograd (a tensor that requires a gradient) a write concatenates instead, so no tensor an earlier step
saved for its backward is ever changed in place.

Every check runs in :meth:`KVCache.check` before anything is stored: a refused call (a wrong batch
size, dtype, head count or a time that goes back) leaves the cache as it was.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos._checks import all_finite

__all__ = ["KVCache", "EncodedKeys", "Rows", "GROW"]

GROW = 64  # a capacity buffer holds at least this many positions, and at least doubles when it grows


class Rows:
    """One tensor grown along ``dim`` (its positions): a capacity buffer written in place, the first ``n`` filled.

    ``write(n, new)`` puts ``new`` at positions ``n … n + S − 1`` and :meth:`view` hands out the filled
    part. A full buffer is reallocated to ``max(2 · capacity, n + S, GROW)`` positions, so ``m`` writes of
    one position reallocate ``O(log m)`` times. A buffer of batch one widens to ``new``'s batch (values
    that depend on the times only, shared by the rows until a write brings per-row ones). Under autograd
    (``new`` or the buffer requires a gradient) a write concatenates instead: nothing changes in place.
    """

    __slots__ = ("data", "dim")

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"`dim` must be a positive dim after the batch dim, got {dim}")
        self.data: torch.Tensor | None = None  # the capacity buffer, or None before the first write
        self.dim = dim

    def view(self, n: int) -> torch.Tensor | None:
        """The first ``n`` positions (a view of the buffer), None before the first write."""
        return None if self.data is None else self.data.narrow(self.dim, 0, n)

    def adopt(self, x: torch.Tensor | None) -> None:
        """Hold ``x`` as the buffer (no copy). Positions past the filled count are free for later writes, so
        adopt a tensor of exactly the filled size (the next write then reallocates) or a buffer this
        store wrote itself."""
        self.data = x

    def write(self, n: int, new: torch.Tensor) -> None:
        """Write ``new`` at positions ``n …`` (all earlier ones kept); raise if its other dims do not match."""
        d, buf = self.dim, self.data
        S = new.shape[d]
        if buf is None:
            if new.requires_grad and torch.is_grad_enabled():
                self.data = new  # autograd: held as given (nothing will be written into it)
                return
            shape = list(new.shape)
            shape[d] = max(S, GROW)
            self.data = buf = new.new_empty(shape)
        else:
            ns, bs = tuple(new.shape), tuple(buf.shape)
            if len(ns) != len(bs) or ns[1:d] != bs[1:d] or ns[d + 1:] != bs[d + 1:]:
                raise ValueError(f"rows of shape {ns} do not extend a buffer of shape {bs} along dim {d}")
            if (new.requires_grad or buf.requires_grad) and torch.is_grad_enabled():
                # autograd: nothing changes in place (an earlier step may have saved the buffer for its backward)
                self.data = new if n == 0 else torch.cat((buf.narrow(d, 0, n), new), dim=d)
                return
            if n + S > bs[d] or bs[0] < ns[0] or (buf.is_inference() and not torch.is_inference_mode_enabled()):
                # full, a batch to widen, or a buffer made under inference_mode written outside it: a new one
                shape = list(ns)
                shape[0], shape[d] = max(bs[0], ns[0]), max(2 * bs[d], n + S, GROW) if n + S > bs[d] else bs[d]
                out = new.new_empty(shape)
                if n:
                    out.narrow(d, 0, n).copy_(buf.narrow(d, 0, n))  # a batch of one broadcast to the new rows
                self.data = buf = out
        buf.narrow(d, n, S).copy_(new)


class EncodedKeys:
    """Keys kept encoded at an origin ``o``: stored as ``A(o − s) k = G(s − o) k``, so a query encoded at
    ``t − o`` (``F(t − o) q``) meets them as ``qᵀ A(t − s) k``::

        (F(t − o) q)ᵀ (G(s − o) k) = qᵀ A(t − s) k          (F(u)ᵀ G(w) = A(u − w))

    The score does not depend on ``o``, so a decode step encodes only its query and its new keys at the
    store's origin and appends them (:meth:`append`). ``origin`` is None for keys encoded at their absolute
    times (pure rotations: ``o = 0``), a float shared by the rows, or a tensor ``(B,)`` (one per row).
    ``span`` is the origin's budget: the largest ``|t − o|`` of a query or a new key for which ``F(t − o)``
    and ``G(s − o)`` stay finite and exact (:meth:`within`). When a time leaves it the caller encodes
    every key afresh from the raw keys at a new origin (:meth:`reencode`: no transport, so no drift).
    ``version`` stamps what the encoded values depend on (the encoding's parameters, dtype, heads, …):
    a store of another version is re-encoded, never mixed.

    The store holds named parts of ``n`` positions each, ``(B, H, n, d)`` (encoded keys ``"k"``, values,
    slot values, per-key factors: whatever its user encodes per key), grown in place (:class:`Rows`);
    :meth:`get` hands out views of the filled part.
    """

    def __init__(self, version: Any = None, origin: Any = None, span: float = math.inf) -> None:
        self._version, self._origin, self._span = version, origin, span
        self._n = 0
        self._parts: dict[str, Rows] = {}

    @property
    def version(self) -> Any:
        """What the encoded values depend on (None: nothing encoded yet)."""
        return self._version

    @property
    def origin(self) -> Any:
        """The origin ``o`` the keys are encoded at: None (absolute times), a float, or ``(B,)`` per row."""
        return self._origin

    @property
    def span(self) -> float:
        """The origin's budget: the largest ``|t − o|`` of a query or new key."""
        return self._span

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: str) -> bool:
        return name in self._parts

    def get(self, name: str) -> torch.Tensor | None:
        """Part ``name`` at the ``n`` stored positions ``(B, H, n, d)`` (a view), None if the store has none."""
        rows = self._parts.get(name)
        return None if rows is None else rows.view(self._n)

    def part(self, name: str) -> torch.Tensor:
        """Part ``name`` at the ``n`` stored positions ``(B, H, n, d)`` (a view); raise if the store has none."""
        x = self.get(name)
        if x is None:
            raise KeyError(f"the encoded-key store holds no part {name!r} (it holds {sorted(self._parts)})")
        return x

    def append(self, count: int | None = None, /, **parts: torch.Tensor) -> None:
        """Append ``S`` positions: each part ``(B, H, S, d)`` encoded at the store's origin (``count`` = S
        when no part is given: positions whose encoding the store does not keep). Once the store holds
        parts, every append brings the same ones."""
        S = count
        for x in parts.values():
            if S is None:
                S = x.shape[2]
            elif x.shape[2] != S:
                S = None
                break
        if S is None:
            raise ValueError(f"parts of {sorted({x.shape[2] for x in parts.values()})} positions and count={count!r}"
                             " do not give one number of positions to append")
        n, held = self._n, self._parts
        if n and parts.keys() != held.keys():
            raise ValueError(f"the store holds the parts {sorted(held)}, an append brings {sorted(parts)}")
        for name, x in parts.items():
            rows = held.get(name)
            if rows is None:
                rows = held[name] = Rows(2)
            rows.write(n, x)
        self._n = n + S

    def reencode(self, version: Any, origin: Any = None, span: float = math.inf, count: int = 0, /,
                 **parts: torch.Tensor) -> None:
        """Replace every key: ``parts`` ``(B, H, n, d)`` are all ``n`` keys encoded afresh (from the raw keys)
        at ``origin`` under ``version`` (no part, ``count`` 0: an empty store of that version). The tensors
        are held as they are (no copy); the next append reallocates."""
        sizes = {x.shape[-2] for x in parts.values()} or {count}
        if len(sizes) != 1 or (parts and count and sizes != {count}):
            raise ValueError(f"parts of {sorted(sizes)} positions and count={count} are not one set of keys")
        self._version, self._origin, self._span = version, origin, span
        self._parts = {}
        for name, x in parts.items():
            self._parts[name] = Rows(2)
            self._parts[name].adopt(x)
        self._n = sizes.pop()

    def clear(self) -> None:
        """Forget every encoded key and the origin (the next use encodes afresh)."""
        self.reencode(None, None)

    def within(self, times: torch.Tensor) -> bool:
        """Whether every time ``(B, S)`` lies within ``span`` of its row's origin (``|t − o| ≤ span``)."""
        if times.numel() == 0:
            return True
        o = self.origin.unsqueeze(-1) if isinstance(self.origin, torch.Tensor) else (self.origin or 0.0)
        return float((times - o).detach().abs().max()) <= self.span

    def within_range(self, lo: float, hi: float) -> bool:
        """Whether times from ``lo`` to ``hi`` lie within ``span`` of a float origin."""
        return max(hi - self.origin, self.origin - lo) <= self.span

    def state(self) -> tuple:
        """What :meth:`restore` needs to undo every later append or re-encode (buffers are never
        overwritten below the stored count, and a re-encode replaces them)."""
        return self._version, self._origin, self._span, self._n, {k: r.data for k, r in self._parts.items()}

    def restore(self, state: tuple) -> None:
        """Put the store back as it was at :meth:`state`."""
        self._version, self._origin, self._span, self._n, data = state
        self._parts = {}
        for name, x in data.items():
            self._parts[name] = Rows(2)
            self._parts[name].adopt(x)


class KVCache:
    """A key/value cache that keeps the *time* of every key.

    Times must not decrease: a key older than one already cached is an error.

    Prefill plus decode through the cache equals one call over the whole sequence (the identity the
    tests check for every block type):

    >>> import torch, liepos as lp
    >>> q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    >>> cache, enc = lp.KVCache(), lp.xpos(8)
    >>> from liepos.attend import attention
    >>> pre = attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache=cache)
    >>> step = attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], enc, cache=cache)
    >>> bool(torch.allclose(torch.cat((pre, step), 2), attention(q, k, v, enc)))
    True

    ``k``, ``v``, ``times``, ``keep`` and ``docs`` are views of capacity buffers (read them, never write
    them); :attr:`encoded` is the :class:`EncodedKeys` store of the current encoding, which attention
    appends to and re-encodes through its methods.
    """

    def __init__(self) -> None:
        self._empty()

    def _empty(self) -> None:
        """No key: every buffer unallocated."""
        self._n = 0
        self._k, self._v = Rows(2), Rows(2)  # (B, Hk, S, D) raw keys, (B, Hk, S, Dv) raw values
        self._times = Rows(1)  # (B, S) or (B, S, axes) float64
        self._keep = Rows(1)  # (B, S) bool: False for padding
        self._docs = Rows(1)  # (B, S) long document ids
        self._finite = True  # every cached key and value is finite
        self._encoded = EncodedKeys()  # the keys (and values) encoded under one version at one origin

    def __len__(self) -> int:
        return self._n

    @property
    def finite(self) -> bool:
        """Whether every cached key and value is finite."""
        return self._finite

    @property
    def encoded(self) -> EncodedKeys:
        """The store of the keys (and values) encoded under the current version at one origin."""
        return self._encoded

    @property
    def k(self) -> torch.Tensor | None:
        """``(B, Hk, S, D)`` the raw keys (a view), None while empty."""
        return self._k.view(self._n)

    @property
    def v(self) -> torch.Tensor | None:
        """``(B, Hk, S, Dv)`` the raw values (a view), None while empty."""
        return self._v.view(self._n)

    @property
    def times(self) -> torch.Tensor | None:
        """``(B, S)`` (or ``(B, S, axes)``) float64 key times (a view), None while empty."""
        return self._times.view(self._n)

    @property
    def keep(self) -> torch.Tensor | None:
        """``(B, S)`` bool, False for padding (a view), None while empty."""
        return self._keep.view(self._n)

    @property
    def docs(self) -> torch.Tensor | None:
        """``(B, S)`` document ids (a view), None when none were given."""
        return self._docs.view(self._n)

    def held(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(k, v, times, keep, docs)`` as the properties give them, of a cache that holds keys (else raise)."""
        k, v, times, keep = self.k, self.v, self.times, self.keep
        if k is None or v is None or times is None or keep is None:
            raise ValueError("the KVCache is empty: it holds no keys, values or times")
        return k, v, times, keep, self.docs

    def reset(self) -> None:
        """Forget every key."""
        self._empty()

    @property
    def batch(self) -> int | None:
        """The batch size of the cached keys (``None`` while empty)."""
        return None if self.k is None else int(self.k.shape[0])

    def check(self, k: torch.Tensor, v: torch.Tensor, times: torch.Tensor, keep: torch.Tensor,
              docs: torch.Tensor | None) -> None:
        """Raise (changing nothing) unless keys ``(B, H, S, D)``, values, times ``(B, S)`` can be appended."""
        ck, cv, ct, ckeep = self.k, self.v, self.times, self.keep
        if ck is None or cv is None or ct is None or ckeep is None:  # empty (the four are written together)
            return
        if (self.docs is None) != (docs is None):
            raise ValueError("document ids must be given on every call to a KVCache or on none")
        if k.shape[:2] != ck.shape[:2] or k.shape[-1] != ck.shape[-1] or v.shape[-1] != cv.shape[-1]:
            raise ValueError(
                f"`k` of shape {tuple(k.shape)} and `v` of shape {tuple(v.shape)} do not match the cached keys "
                f"{tuple(ck.shape)} and values {tuple(cv.shape)} (batch, heads and dims must stay)"
            )
        if k.dtype != ck.dtype or v.dtype != cv.dtype or k.device != ck.device:
            raise TypeError(
                f"`k` and `v` must keep the cached dtype {ck.dtype} on {ck.device}, got {k.dtype} on {k.device}"
            )
        if times.dim() != ct.dim():
            raise ValueError("key positions must keep one shape (with or without an axes dim) across calls")
        if times.dim() == 3 or times.shape[1] == 0 or ct.shape[1] == 0:
            return  # several axes (B, S, axes): no total order of times; the cache keeps token order
        last = torch.where(ckeep, ct, torch.full_like(ct, -math.inf)).amax(-1)
        first = torch.where(keep, times, torch.full_like(times, math.inf)).amin(-1)
        if bool((first < last).any()):
            b = int(torch.nonzero(first < last)[0, 0])
            raise ValueError(
                f"key_positions go back in time: batch {b} appends a key at time {float(first[b])} "
                f"after a cached key at time {float(last[b])}; a KVCache needs non-decreasing times"
            )

    def append(self, k: torch.Tensor, v: torch.Tensor, times: torch.Tensor, keep: torch.Tensor,
               docs: torch.Tensor | None) -> None:
        """Append keys ``(B, H, S, D)``, values and their times ``(B, S)``; times must not go back.

        Written in place into the capacity buffers (amortised ``O(S)``); the encoded store is left to the
        attention call, which appends the new keys' encodings or re-encodes."""
        self.check(k, v, times, keep, docs)
        finite = all_finite(k, v)
        n = self._n
        self._k.write(n, k)
        self._v.write(n, v)
        self._times.write(n, times)
        self._keep.write(n, keep)
        if docs is not None:
            self._docs.write(n, docs)
        self._n = n + k.shape[-2]
        self._finite = finite if n == 0 else self._finite and finite

    def state(self) -> tuple:
        """What :meth:`restore` needs to undo every later append (and any change of the encoded store)."""
        bufs = tuple(r.data for r in (self._k, self._v, self._times, self._keep, self._docs))
        return self._n, bufs, self._finite, self._encoded.state()

    def restore(self, state: tuple) -> None:
        """Put the cache back as it was at :meth:`state` (a refused call of a group of several caches)."""
        self._n, bufs, self._finite, enc = state
        for r, x in zip((self._k, self._v, self._times, self._keep, self._docs), bufs):
            r.adopt(x)
        self._encoded.restore(enc)

    def last_times(self) -> torch.Tensor:
        """``(B, 1)`` the latest cached time of each row (several axes: the largest coordinate)."""
        times = self.times
        if times is None:
            raise ValueError("an empty KVCache has no latest time")
        if times.dim() == 3:
            return times.amax((-2, -1))[:, None]
        return times.amax(-1, keepdim=True)
