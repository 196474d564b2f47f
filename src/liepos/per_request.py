"""One encoding per sequence of a batch: per-request context extension (multi-LoRA long context) in one call.

A serving batch may hold requests with different scalings — one request's LoRA was tuned with YaRN ×8,
another's with none. :class:`PerRequest` gives row ``b`` of the batch its own encoding ``encodings[b]``::

    PerRequest(encs).attention(q, k, v)[b] = lp.attention(q[b:b+1], k[b:b+1], v[b:b+1], encs[b])[0]

Rows whose encodings are equal (the same :attr:`~liepos.Encoding.version`) share one call of
:func:`liepos.attention`, so a batch of two scalings costs two calls, not one per row; per-row tensors
(batched positions, padding, documents, a batched ``attn_mask``) are split with the rows. A
:class:`PerRequestCache` keeps one :class:`~liepos.KVCache` per group, so prefill + decode equals the
full forward for every row. A length-dependent encoding (dynamic NTK) is resolved per group, at that
group's own length.

>>> import torch, liepos as lp
>>> encs = [lp.rope(8), lp.scaling.linear(lp.rope(8), factor=4.0)]
>>> q, k, v = (torch.randn(2, 1, 5, 8, dtype=torch.float64) for _ in range(3))
>>> out = PerRequest(encs).attention(q, k, v)
>>> bool(torch.allclose(out[1:], lp.attention(q[1:], k[1:], v[1:], encs[1])))
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from liepos._checks import describe
from liepos.attend import KVCache, attention
from liepos.encoding import Encoding

__all__ = ["PerRequest", "PerRequestCache"]

# keyword arguments of lp.attention that carry one row per batch element
_ROW_KWARGS = ("key_padding_mask", "document_ids", "key_document_ids")


class PerRequestCache:
    """One :class:`~liepos.KVCache` per group of rows of a :class:`PerRequest` (its :meth:`PerRequest.cache`)."""

    def __init__(self, groups: int) -> None:
        self.caches = [KVCache() for _ in range(groups)]

    def __len__(self) -> int:
        return len(self.caches[0])

    def reset(self) -> None:
        for c in self.caches:
            c.reset()


class PerRequest:
    """``encodings[b]`` for batch row ``b`` (module docstring: the identity and how rows are grouped)."""

    def __init__(self, encodings: Sequence[Encoding]) -> None:
        encodings = list(encodings)
        if not encodings or not all(isinstance(e, Encoding) for e in encodings):
            raise TypeError(f"`encodings` must be a non-empty sequence of liepos.Encoding, got {describe(encodings)}")
        self.encodings = encodings
        first: dict[Any, int] = {}
        rows: list[list[int]] = []
        for b, e in enumerate(encodings):
            key = (e.version, id(e.length_rule) if e.length_rule is not None else None)
            if key not in first:
                first[key] = len(rows)
                rows.append([])
            rows[first[key]].append(b)
        self.groups = [(torch.tensor(r), encodings[r[0]]) for r in rows]  # (rows of the group, its encoding)

    @property
    def batch(self) -> int:
        return len(self.encodings)

    def cache(self) -> PerRequestCache:
        """A fresh cache for this batch: one KVCache per group."""
        return PerRequestCache(len(self.groups))

    def _rows(self, x: Any, idx: torch.Tensor, batched_dim: int) -> Any:
        """``x`` restricted to the rows ``idx`` when it has a batch axis (``x.dim() == batched_dim``)."""
        if isinstance(x, torch.Tensor) and x.dim() == batched_dim and x.shape[0] == self.batch:
            return x.index_select(0, idx.to(x.device))
        return x

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: Any = None,
                  key_positions: Any = None, *, cache: PerRequestCache | None = None, **kwargs: Any) -> torch.Tensor:
        """:func:`liepos.attention` with row b's encoding, one call per group of equal encodings."""
        if q.shape[0] != self.batch:
            raise ValueError(f"q has batch {q.shape[0]} but the PerRequest holds {self.batch} encodings")
        if cache is not None and (not isinstance(cache, PerRequestCache) or len(cache.caches) != len(self.groups)):
            raise TypeError(f"`cache` must be this PerRequest's cache() (a PerRequestCache of {len(self.groups)} "
                            f"groups), got {describe(cache)}")
        # a refused call leaves every group's cache as it was (a later group may refuse after an earlier appended)
        saved = None if cache is None else [c.state() for c in cache.caches]
        try:
            return self._run(q, k, v, positions, key_positions, cache, kwargs)
        except Exception:
            if cache is not None and saved is not None:
                for c, state in zip(cache.caches, saved):
                    c.restore(state)
            raise

    def _run(self, q, k, v, positions, key_positions, cache, kwargs) -> torch.Tensor:
        out = None
        for g, (idx, enc) in enumerate(self.groups):
            dev = q.device
            sub = {n: self._rows(kwargs[n], idx, 2) for n in kwargs if n in _ROW_KWARGS}
            if "attn_mask" in kwargs:
                sub["attn_mask"] = self._rows(kwargs["attn_mask"], idx, 4)
            rest = {n: val for n, val in kwargs.items() if n not in sub}
            pdim = 2 if enc.num_axes is None else 3  # batched positions: (B, S) or (B, S, axes)
            y = attention(q.index_select(0, idx.to(dev)), k.index_select(0, idx.to(dev)), v.index_select(0, idx.to(dev)),
                          enc, self._rows(positions, idx, pdim), self._rows(key_positions, idx, pdim),
                          cache=None if cache is None else cache.caches[g], **sub, **rest)
            if out is None:
                out = y.new_empty(self.batch, *y.shape[1:])  # (B, H, Sq, Dv)
            out.index_copy_(0, idx.to(y.device), y)
        if out is None:
            raise ValueError("PerRequest holds no group of requests (its encodings are checked non-empty)")
        return out
