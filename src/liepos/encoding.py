"""Encoding: a generator applied to queries and keys, ``q ↦ F(t) q``, ``k ↦ G(s) k``, for one or several axes.

With ``F(t) = A(t)ᵀ`` and ``G(s) = A(−s)`` every encoded score is relative::

    (F(t) q)ᵀ (G(s) k) = qᵀ A(t − s) k

and re-centring at any origin ``o`` (``F(t − o)``, ``G(s − o)``) leaves every score unchanged;
that is how decaying, polynomial and slot blocks stay finite at any absolute time. A generator with
several position axes (``axes=m``) takes positions ``(…, seq, m)`` and ``A(u) = exp(Σ_a u_a X_a)``.

Following the positions from :meth:`Encoding.query` down: :func:`as_positions` checks them,
:func:`liepos.tables.check_range` checks the tables will fit the dtype, :func:`liepos.tables.build_tables`
makes the float64 tables (cached per window of integer positions in :data:`liepos._fast.CACHE`), and
:mod:`liepos._fast` (or the readable :func:`liepos.apply.apply_tables`) applies them. The reference
path (``query_reference``/``key_reference``) multiplies by the dense matrices of :meth:`Generator.exp`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, cast

import torch

import liepos._graph as _graph
from liepos._checks import check_choice, check_int, check_real, check_real_tensor, check_tensor, describe
from liepos._fast import (CACHE, FastTables, apply_fast, arange_start, clear_small, empty_out, fast_tables,
                          table_window, term_growth)
from liepos.apply import LOW_PRECISION, apply_dense, apply_in_basis, apply_tables, work_dtype
from liepos.generator import Generator
from liepos._replay import LANES, SPAN_TABLE_BYTES, keep, lane_key, new_lane
from liepos.tables import LAYOUTS, Plan, Tables, build_tables, check_range, check_span, make_plan

__all__ = ["Encoding", "as_positions"]

# a window of cached tables may take at most this fraction of the cache's byte bound; a larger one is
# built for the requested positions only and never cached, so the cache really holds at most its bound
_WINDOW_SHARE = 4


def as_positions(
    positions: Any, seq: int, batch: int | None, name: str = "positions", axes: int | None = None
) -> torch.Tensor:
    """Validate positions ``(seq,)`` / ``(batch, seq)`` (``axes=None``) or ``(seq, axes)`` /
    ``(batch, seq, axes)`` and return them as float64; ``None`` gives ``0 … seq−1`` (on every axis).

    Integer and real positions are both allowed; non-finite values (and 10⁴⁰⁰) are refused. (The
    messages name ``name`` without backquotes, as callers' tests match them.)
    """
    if positions is None:
        t = torch.arange(seq, dtype=torch.float64)
        return t if axes is None else t.unsqueeze(-1).expand(seq, axes)  # (seq,) -> (seq, axes)
    if not isinstance(positions, torch.Tensor):
        try:
            natural = torch.as_tensor(positions)  # Python ints stay int64 (checked for exactness below)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            natural = None
        if natural is not None and natural.dtype == torch.int64:
            positions = natural
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions, dtype=torch.float64)
        except OverflowError as err:
            raise ValueError(f"{name} must be finite, got a value beyond float64: {describe(positions)}") from err
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor of times, got {describe(positions)}") from err
    if positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be real (integer or floating), got dtype {positions.dtype}")
    one = axes is None
    if positions.dim() not in ((1, 2) if one else (2, 3)) or (not one and positions.shape[-1] != axes):
        want = "(seq,) or (batch, seq)" if one else f"(seq, {axes}) or (batch, seq, {axes})"
        raise ValueError(f"{name} must have shape {want}, got shape {tuple(positions.shape)}")
    length = positions.shape[-1 if one else -2]
    if length != seq:
        raise ValueError(
            f"{name} has length {length} but the sequence has {seq} tokens (shape {tuple(positions.shape)})"
        )
    batched = positions.dim() == (2 if one else 3)
    if batched and batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(f"{name} has batch size {positions.shape[0]} but the tensor has batch size {batch}")
    out = positions.to(torch.float64) if not positions.requires_grad else positions.double()
    if torch.compiler.is_compiling() or out.is_meta:  # no data-dependent checks in a graph or without data
        return out
    if not positions.dtype.is_floating_point:
        _check_exact_integers(positions, out, name)
    if not bool(torch.isfinite(out.detach()).all()):
        bad = out.detach()[~torch.isfinite(out.detach())][:5].tolist()
        raise ValueError(f"{name} must be finite, got {bad}")
    return out


# every integer of magnitude up to 2^53 is a float64; past it, adjacent integers would share a time
_EXACT_INT = 2**53


def _check_exact_integers(positions: torch.Tensor, out: torch.Tensor, name: str) -> None:
    """Refuse integer times that float64 cannot hold exactly (|t| > 2^53 and not a float64): times are
    float64 (the conventions), and rounding them silently would give adjacent tokens the same time."""
    far = positions.abs() > _EXACT_INT
    if not bool(far.any()):
        return
    rounded = far & (out.to(torch.int64) != positions.to(torch.int64))
    if bool(rounded.any()):
        bad = positions[rounded][:3].tolist()
        raise ValueError(
            f"{name} must be exactly representable in float64 (integers up to 2^53 are), got {bad}: "
            f"subtract an origin in integer arithmetic first (scores depend only on t - s)"
        )


def _slots(name: str, value: Any) -> torch.Tensor:
    t = check_real_tensor(name, value, ndim=(1, 2))  # (slots,) or (heads, slots); NaN/inf refused
    if t.shape[-1] == 0:
        raise ValueError(f"`{name}` must hold at least one slot, got shape {tuple(t.shape)}")
    return t


class Encoding:
    """A positional encoding: a generator, a storage layout, constant slots and a logit scale.

    Args:
        generator: the :class:`Generator` X (its last ``num_slots`` canonical dims are slots); with
            ``axes=m`` positions are ``(…, seq, m)``.
        layout: ``"interleaved"`` (canonical order; planes are dims (2k, 2k+1)) or ``"half"``
            (the x-components of all rotation planes, then their y-components, then the real
            dims: planes (k, k + d/2) for RoPE, Hugging Face / GPT-NeoX).
        query_slots, key_slots: constants appended to every query and key, shape ``(slots,)`` or
            ``(heads, slots)``; both or neither.
        query_scale: ``None``, or a positive factor per content dim ``(content_dim,)``, applied to the
            query before F(t): a temperature on some dims only (transformers multiplies only the
            rotated dims of a partially rotary head by ``attention_factor²``). The score is then
            ``qᵀ D A(t − s) k`` with ``D = diag(query_scale)``: still a function of t − s.
        logit_scale: multiplier on qᵀk (context-extension temperatures such as YaRN's
            ``attention_factor²``), applied by :func:`liepos.attention`.
        name: a label for reports.
        length_rule: for length-dependent generators, ``length -> Encoding`` (see :meth:`at_length`).
            Such an encoding refuses :meth:`query`/:meth:`key` until its length is known.
        length: the sequence length a length-dependent encoding was resolved for (set by :meth:`at_length`).

    The defining identity (checked in the tests for every block type, both layouts, with slots)::

        enc.query(q, t)ᵀ enc.key(k, s) = [D q; q_slots]ᵀ A(t − s) [k; k_slots]     (D = diag(query_scale), else I)

    >>> import torch, liepos as lp
    >>> enc = lp.rope(4)
    >>> q, k = torch.randn(1, 1, 1, 4, dtype=torch.float64), torch.randn(1, 1, 1, 4, dtype=torch.float64)
    >>> s1 = (enc.query(q, [5]) * enc.key(k, [2])).sum()
    >>> s2 = (enc.query(q, [105]) * enc.key(k, [102])).sum()
    >>> bool(torch.allclose(s1, s2))
    True
    """

    def __init__(
        self,
        generator: Generator,
        layout: str = "interleaved",
        *,
        query_slots: Any = None,
        key_slots: Any = None,
        logit_scale: float = 1.0,
        query_scale: Any = None,
        name: str | None = None,
        length_rule: Callable[[int], Encoding] | None = None,
        length: int | None = None,
    ) -> None:
        if not isinstance(generator, Generator):
            raise TypeError(f"`generator` must be a liepos.Generator, got {describe(generator)}")
        with torch.no_grad():
            if not generator.allow_growth and bool((generator.rates > 0).any()):
                raise ValueError("`generator` has positive rates (growth) but was not built with allow_growth=True")
        self.generator = generator
        self.layout = check_choice("layout", layout, LAYOUTS)
        if (query_slots is None) != (key_slots is None):
            raise ValueError("`query_slots` and `key_slots` must be given together")
        self.query_slots = None if query_slots is None else _slots("query_slots", query_slots)
        self.key_slots = None if key_slots is None else _slots("key_slots", key_slots)
        self.num_slots = 0 if query_slots is None else self._check_slots()
        self.num_heads = self._heads()
        self.logit_scale = check_real("logit_scale", logit_scale, positive=True)
        self.query_scale = self._query_scale(query_scale)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be a string or None, got {describe(name)}")
        self.name = name
        if length_rule is not None and not callable(length_rule):
            raise TypeError(f"`length_rule` must be callable (length -> Encoding), got {describe(length_rule)}")
        self.length_rule = length_rule
        self.length = None if length is None else check_int("length", length, min=1)
        self._plan: Plan | None = None
        self._slot_part: tuple[Generator, Plan] | None = None

    def _check_slots(self) -> int:
        qs, ks = self.query_slots, self.key_slots
        if qs is None or ks is None:
            raise ValueError("`query_slots` and `key_slots` must be given together")
        n = int(qs.shape[-1])
        if ks.shape[-1] != n:
            raise ValueError(f"`query_slots` has {n} slots but `key_slots` has {ks.shape[-1]}")
        g = self.generator
        if n >= g.dim:
            raise ValueError(f"{n} slots leave no content dims in a {g.dim}-dim generator")
        boundary = g.dim - n  # no block may straddle the content/slot boundary
        for off, w in zip(g.offsets, g.widths):
            if off < boundary < off + w:
                raise ValueError(
                    f"a generator block spans dims {off}..{off + w - 1}, across the content/slot boundary at {boundary}"
                )
        return n

    def _heads(self) -> int | None:
        heads: set[int] = set() if self.generator.num_heads is None else {self.generator.num_heads}
        for s in (self.query_slots, self.key_slots):
            if s is not None and s.dim() == 2:
                heads.add(int(s.shape[0]))
        if len(heads) > 1:
            raise ValueError(f"the generator and the slots disagree on the number of heads: {sorted(heads)}")
        return heads.pop() if heads else None

    # ------------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Width of encoded queries and keys (content + slots)."""
        return self.generator.dim

    @property
    def content_dim(self) -> int:
        """Width of the queries and keys the caller passes in (the head dim)."""
        return self.generator.dim - self.num_slots

    @property
    def num_axes(self) -> int | None:
        """Number of position axes (positions ``(…, seq, axes)``), or ``None`` for positions ``(…, seq)``."""
        return self.generator.num_axes

    @property
    def is_relative_everywhere(self) -> bool:
        """True when scores stay bounded for both signs of the lag (pure rotation, NoPE, no slots)."""
        return self.generator.is_orthogonal and self.num_slots == 0

    @property
    def needs_recentring(self) -> bool:
        """True when F and G grow with absolute time (decay, growth, Jordan blocks or slots)."""
        return not self.is_relative_everywhere

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = make_plan(self.generator, self.layout, self.num_slots)
        return self._plan

    @property
    def version(self) -> tuple:
        """A hashable key of everything that determines the encoded values.

        Read at every call (table caches are keyed by it), so it is kept until a tensor it depends on
        changes: in place (torch's version counter: an optimizer step) or by a new storage
        (``p.data = …``, which keeps the counter; then the generator's own memos are dropped too).
        """
        stamp = self._stamp()
        memo = self.__dict__.get("_version_memo")
        if memo is not None and memo[0] == stamp:
            return memo[1]
        if memo is not None and memo[0][0] == stamp[0]:  # the same generator, other values: recompute its memos
            self.generator.forget_memos()
        slots = None
        if self.query_slots is not None:
            flat = lambda t: tuple(t.reshape(-1).tolist())  # noqa: E731 - ([heads,] slots) -> (values,)
            slots = (flat(self.query_slots), flat(self.key_slots))
        qs = None if self.query_scale is None else tuple(self.query_scale.tolist())
        version = (self.generator.key(), self.layout, slots, self.logit_scale, qs)
        self.__dict__["_version_memo"] = (stamp, version)
        return version

    def _stamp(self) -> tuple:
        """What :attr:`version` depends on, cheaply: identities, storages and version counters of the tensors."""
        g = self.generator
        ts = (g.rates, g.freqs, g.nus, g.basis, self.query_slots, self.key_slots, self.query_scale)
        return (id(g), self.layout, self.logit_scale) + tuple(
            None if t is None else (id(t), t.data_ptr(), t._version) for t in ts)

    def __getstate__(self) -> dict:
        """Pickled, copied and deep-copied without the kept table rows, their growths and recorded calls (``_spans``,
        ``_growths``, ``_lanes``): views of cached tables and copies of times, rebuilt on first use, which a saved model
        must not carry."""
        state = self.__dict__.copy()
        for kept in ("_lanes", "_spans", "_growths"):
            state.pop(kept, None)
        return state

    def replace(self, **changes: Any) -> Encoding:
        """A copy with the given constructor fields replaced (``generator``, ``layout``, …)."""
        fields = dict(
            generator=self.generator, layout=self.layout, query_slots=self.query_slots, key_slots=self.key_slots,
            logit_scale=self.logit_scale, query_scale=self.query_scale, name=self.name,
            length_rule=self.length_rule, length=self.length,
        )
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Encoding.replace got unknown fields {sorted(unknown)}")
        fields.update(changes)
        return Encoding(fields.pop("generator"), **fields)

    def at_length(self, length: int) -> Encoding:
        """The encoding used for sequences of ``length`` positions (``max position + 1``).

        A length-independent encoding returns itself; a length-dependent one (dynamic NTK, LongRoPE)
        returns its rule's encoding for ``length``, which then accepts positions up to ``length − 1``.
        """
        if self.length_rule is None:
            return self
        L = check_int("length", length, min=1)
        out = self.length_rule(L)
        # a per-dim temperature does not depend on the length (transformers' attention_factor is fixed)
        keep = {} if self.query_scale is None or out.query_scale is not None else {"query_scale": self.query_scale}
        return out.replace(length=L, **keep)

    def __repr__(self) -> str:
        """The structure in words, the heads, and ``values=#…``: a digest of every value that decides the
        encoded outputs (rates, frequencies, ν, basis, slots such as ALiBi's per-head slopes, scales,
        length and length rule), so two encodings that encode differently never print the same."""
        name = f"{self.name!r}, " if self.name else ""
        slots = f", slots={self.num_slots}" if self.num_slots else ""
        if self.num_heads is not None and self.generator.num_heads is None:  # heads carried by the slots (ALiBi)
            slots += f", heads={self.num_heads}"
        scale = f", logit_scale={self.logit_scale:g}" if self.logit_scale != 1.0 else ""
        if self.query_scale is not None:
            vals = sorted(set(self.query_scale.tolist()))
            scale += f", query_scale={{{', '.join(f'{v:g}' for v in vals)}}}"
        digest = _digest(self)
        values = "" if digest is None else f", values=#{digest}"
        return f"Encoding({name}{self.generator!r}, layout={self.layout!r}{slots}{scale}{values})"

    def _query_scale(self, value: Any) -> torch.Tensor | None:
        """``query_scale``: ``None``, or ``(content_dim,)`` positive finite factors (all ones is ``None``)."""
        if value is None:
            return None
        d = check_real_tensor("query_scale", value, ndim=1, positive=True)
        if d.shape[0] != self.content_dim:
            raise ValueError(f"`query_scale` must have {self.content_dim} entries (the content dims), got {d.shape[0]}")
        return None if bool((d == 1).all()) else d.detach().clone()

    def _scaled(self, q: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """``D q``: the per-dim temperature on the query's content dims (``query_scale``), if any."""
        if self.query_scale is None:
            return q
        D = self.query_scale.to(device=q.device, dtype=q.dtype)  # (content_dim,), broadcast over (B, H, S)
        return q.mul_(D) if inplace else q * D

    # ------------------------------------------------------------------ checks
    def _check(self, x: Any, name: str, full: bool = False) -> None:
        check_tensor(name, x, ndim=4, floating=True)
        want = self.dim if full else self.content_dim
        if x.shape[-1] != want:
            raise ValueError(
                f"`{name}` has last dim {x.shape[-1]} but the encoding expects {want}"
                + ("" if full or not self.num_slots else f" (content dims; {self.num_slots} slots are appended)")
            )
        H = self.num_heads
        if H is not None and x.shape[1] != H:
            raise ValueError(f"`{name}` has {x.shape[1]} heads but the encoding has per-head parameters for {H} heads")

    def _check_length(self, pos: torch.Tensor, name: str) -> None:
        """A length-dependent encoding is used only at a known length, never silently unscaled."""
        if self.length_rule is None or torch.compiler.is_compiling() or not pos.numel():
            return
        need = int(math.floor(float(pos.detach().max()))) + 1
        if self.length is None or need > self.length:
            have = "no known length" if self.length is None else f"length {self.length}"
            raise ValueError(
                f"{self!r} is length-dependent (its frequencies depend on the sequence length) and has {have}, "
                f"but `{name}` reach {need - 1}: call enc.at_length({need}) first (or use liepos.attention, "
                f"which does)"
            )

    def _relative(self, positions: Any, x: torch.Tensor, origin: Any, name: str, defer: bool = True) -> torch.Tensor:
        if defer and not torch.compiler.is_compiling() and x.is_meta and _graph.deferrable(positions, origin):
            # a stand-in that reads as the converted tensor (every other attribute is convert()'s)
            deferred = _graph.Positions(positions, origin, lambda: self._relative(positions, x, origin, name, False))
            return cast(torch.Tensor, deferred)
        if defer and torch.compiler.is_compiling() and _graph.deferrable(positions, origin) and self._graph_structure(
            x, positions
        ):  # the opaque op converts and checks them on real data: no conversion kernel in the graph
            deferred = _graph.Positions(positions, origin, lambda: self._relative(positions, x, origin, name, False))
            return cast(torch.Tensor, deferred)  # the stand-in of the converted tensor, as above
        pos = as_positions(positions, x.shape[-2], x.shape[0], name, self.num_axes)
        self._check_length(pos, name)
        if origin is not None:
            o = check_real_tensor("origin", origin, dtype=torch.float64).to(pos.device)
            per_batch = 1 if self.num_axes is None else 2  # origin (batch,) or (batch, axes)
            if o.dim() == per_batch and pos.dim() == per_batch + 1:
                o = o.unsqueeze(-1 if self.num_axes is None else -2)  # (batch, 1[, axes])
            try:
                pos = pos - o  # broadcasts a scalar, (batch,) or the positions' own shape
            except RuntimeError:
                raise ValueError(
                    f"`origin` of shape {tuple(o.shape)} does not fit `{name}` of shape {tuple(pos.shape)}: "
                    f"pass a scalar, one origin per batch element, or one per position"
                ) from None
            one = self.num_axes is None
            if pos.dim() > (2 if one else 3) or pos.shape[-1 if one else -2] != x.shape[-2] or (
                not one and pos.shape[-1] != self.num_axes
            ):
                raise ValueError(f"`origin` of shape {tuple(o.shape)} does not fit `{name}` (shape {tuple(pos.shape)} after it)")
        return pos.to(x.device)

    # ------------------------------------------------------------------ application
    def tables(self, positions: torch.Tensor, side: str) -> Tables:
        """Float64 tables of F (``side="query"``) or G (``side="key"``) at already re-centred positions."""
        if torch.compiler.is_compiling():
            # traced: build the plan without reading or caching it on self (no guard on that state)
            plan = make_plan(self.generator, self.layout, self.num_slots)
        else:
            plan = self.plan
        return build_tables(self.generator, plan, positions, side)

    def _with_slots(self, x: torch.Tensor, slots: torch.Tensor | None) -> torch.Tensor:
        if slots is None:
            return x
        B, H, S, _ = x.shape
        s = slots.to(device=x.device, dtype=work_dtype(x.dtype))
        s = s.reshape(1, -1, 1, self.num_slots).expand(B, H, S, self.num_slots)  # (H|1, slots) -> (B, H, S, slots)
        return torch.cat((x.to(s.dtype), s), dim=-1).to(x.dtype if x.dtype not in LOW_PRECISION else s.dtype)

    def _apply(
        self, x: torch.Tensor, pos: torch.Tensor, side: str, slots: bool = False, inplace: bool = False,
        fade: bool = False,
    ) -> torch.Tensor:
        """F or G of ``x``; with ``slots`` ``x`` holds the content dims and the side's slots are appended.

        The fast path (:mod:`liepos._fast`: one pass per block kind, cached tables, a backward that
        saves only the tables) runs whenever the tables need no gradient and nothing is being traced;
        under ``torch.compile`` that same fast path is one opaque custom op of :mod:`liepos._graph`
        (with its transpose as the backward), so the graph traces none of it; otherwise (tables
        that need a gradient) the readable path :func:`liepos.apply.apply_tables` gives the same values.
        """
        if not torch.compiler.is_compiling() and x.is_meta:  # meta initialisation: shapes, dtypes, strides only
            return _graph.meta(self, x, bool(slots), inplace)
        check_range(self.generator, pos, side, x.dtype, fade=fade)
        if torch.compiler.is_compiling() and self._graph_structure(x, pos):
            # the whole fast path as one opaque op (liepos._graph): nothing of it traced
            return _graph.apply(self, x, pos, side, bool(slots), inplace)
        if self._fast_usable(x, pos):
            work = work_dtype(x.dtype)
            ft = self._fast_tables(pos, side, work, slots)
            # slots stay float32 for half-precision inputs (as _with_slots does): ALiBi's slot values
            # need more than bfloat16's 8 bits
            out_dtype = work if (slots and self.num_slots and x.dtype in LOW_PRECISION) else x.dtype
            return apply_fast(x, ft, inplace=inplace, out_dtype=out_dtype)
        if inplace:
            raise ValueError("inplace=True needs the fast path (canonical basis, tables without gradient, eager)")
        if slots:
            x = self._with_slots(x, self.query_slots if side == "query" else self.key_slots)
        t = self.tables(pos, side)
        if self.generator.basis is not None:
            # a fixed change of basis around the canonical tables: O(d²) per token, no per-position matrix
            return apply_in_basis(x, self.generator.basis, self.plan.inv, t, side)
        return apply_tables(x, t)

    def _fast_usable(self, x: torch.Tensor, pos: torch.Tensor | None) -> bool:
        """The fast path applies: canonical basis, a plane partner it can stride, no gradient into the tables, eager
        (``pos`` None: times that need no gradient)."""
        g = self.generator
        if g.basis is not None or torch.compiler.is_compiling() or self.plan.partner == "gather":
            return False
        return not ((pos is not None and pos.requires_grad) or x.is_complex() or self._learned())

    def _learned(self) -> bool:
        """Whether an input of the tables or of the slot values (rates, frequencies, ν, slots) needs a gradient."""
        g = self.generator
        params = (g.rates, g.freqs, g.nus, self.query_slots, self.key_slots)
        return any(t is not None and t.requires_grad for t in params)

    def _graph_structure(self, x: torch.Tensor, pos: torch.Tensor | _graph.Positions | None) -> bool:
        """Under ``torch.compile``: whether the application is the opaque op of :mod:`liepos._graph`
        (the eager fast path), else the traced readable path (learnable generator or slots, positions needing
        grad, a basis, a gather partner, complex x), which differentiates through the tables."""
        g = self.generator
        given = pos.positions if isinstance(pos, _graph.Positions) else pos  # as given (None: 0 … seq − 1)
        if g.basis is not None or (given is not None and given.requires_grad) or x.is_complex() or self._learned():
            return False
        return _graph.usable(_graph.graph_id(self))

    def _fast_tables(self, pos: torch.Tensor, side: str, work: torch.dtype, with_slots: bool) -> FastTables:
        """Fast tables at ``pos``: rows of a cached window for an integer range, else built for ``pos``."""
        p0 = arange_start(pos) if self.num_axes is None else None
        if p0 is None:
            return self._build_fast(pos, side, work, with_slots)
        return self._range_tables(p0, pos.shape[-1], side, work, with_slots, pos.device)

    def _range_tables(self, p0: int, S: int, side: str, work: torch.dtype, with_slots: bool,
                      device: torch.device) -> FastTables:
        """Fast tables at the integer times ``p0 … p0 + S − 1``: rows of a cached window (:func:`table_window`),
        or built for those times alone when the window is too big to cache."""
        base, end = table_window(p0, S)
        rows = (end - base) * (self.num_heads or 1)
        estimate = rows * (2 * self.dim + int(self.plan.dst.numel())) * torch.finfo(work).bits // 8
        if estimate * _WINDOW_SHARE > CACHE.max_bytes:  # too big to cache: exactly what was asked
            return self._build_fast(torch.arange(p0, p0 + S, dtype=torch.float64, device=device), side, work,
                                    with_slots)
        key = (device, work, self.version, side, with_slots, base, end)
        window = lambda: self._build_fast(  # noqa: E731
            torch.arange(base, end, dtype=torch.float64, device=device), side, work, with_slots
        )
        return CACHE.get(key, window).rows(p0 - base, p0 - base + S)

    def _build_fast(self, pos: torch.Tensor, side: str, work: torch.dtype, with_slots: bool) -> FastTables:
        t = self.tables(pos, side)
        sv = self._slot_values(pos, side, work) if with_slots and self.num_slots else None
        ft = fast_tables(t, self.content_dim if with_slots else self.dim, work)
        if ft is None:  # a structure with no fast form (the callers gate on _fast_usable)
            raise ValueError(f"{self!r} has no fast form (its plane partners are neither adjacent pairs nor halves)")
        if sv is not None:
            ft.slot_vals = sv
            ft.width = self.dim
            ft.identity = False
        return ft

    def _slot_values(self, pos: torch.Tensor, side: str, work: torch.dtype) -> torch.Tensor:
        """Encoded slot values ``(…, S, slots)``: the slot blocks' transform of the constant slots."""
        g, n = self.generator, self.num_slots
        if self._slot_part is None:
            first = next(i for i, off in enumerate(g.offsets) if off >= g.dim - n)
            sub = Generator(g.rates[..., first:], g.freqs[..., first:], g.sizes[first:], complex=g.complex[first:],
                            allow_growth=True, axes=g.num_axes, nus=None if g.nus is None else g.nus[..., first:])
            self._slot_part = (sub, make_plan(sub, "interleaved"))
        sub, plan = self._slot_part
        t = build_tables(sub, plan, pos, side)
        slots = self.query_slots if side == "query" else self.key_slots
        if slots is None:
            raise ValueError(f"{self!r} has no slots to encode")
        c = slots.to(device=pos.device, dtype=torch.float64)
        c = c.reshape(1, -1, 1, n)  # (H|1, n) -> (1, H|1, 1, n)
        B = pos.shape[0] if pos.dim() == (2 if self.num_axes is None else 3) else 1
        S = pos.shape[-1 if self.num_axes is None else -2]
        y = apply_tables(c.expand(B, c.shape[1], S, n), t)  # float64, (B, H|1, S, n)
        return y.to(work) if pos.dim() == (2 if self.num_axes is None else 3) else y[0].to(work)

    def query(self, q: torch.Tensor, positions: Any = None, *, origin: Any = None, inplace: bool = False) -> torch.Tensor:
        """``F(t − o) [q; query_slots]`` for queries (batch, heads, seq, content_dim).

        ``inplace=True`` overwrites ``q`` (no slots; autograd-safe: the backward needs only the tables).
        """
        if not inplace and origin is None:  # a repeat of a recorded call: its kernel at once (:mod:`liepos._replay`)
            y = self._replayed(q, positions, "query")
            if y is not None:
                return y
        self._check(q, "q")
        p0 = None if inplace or origin is not None else self._range_start(positions, q)
        if p0 is not None:  # 0 … S − 1 or an integer range: no tensor of times to convert and scan
            return self._span(q, p0, "query", positions=positions, record=True)
        pos = self._relative(positions, q, origin, "positions")
        return self._apply(self._scaled(q, inplace), pos, "query", slots=True, inplace=inplace)

    def _query_after(self, q: torch.Tensor, positions: Any) -> torch.Tensor:
        """``F(t) [q; query_slots]`` at times ``t ≥ 0`` of queries whose keys all lie at or before 0.

        For an off-diagonal tile of :mod:`liepos.recentre` (its origin between its keys and its
        queries): a query factor that underflows is kept (``check_range(..., fade=True)``), since every
        score it takes part in, ``F(t)ᵀ G(s) = A(t − s)`` with ``s ≤ 0 ≤ t``, is at most that factor.
        """
        self._check(q, "q")
        pos = self._relative(positions, q, None, "positions")
        return self._apply(self._scaled(q), pos, "query", slots=True, fade=True)

    def _range_start(self, positions: Any, x: torch.Tensor) -> int | None:
        """``p0`` when ``positions`` are the times ``p0, p0 + 1, …, p0 + S − 1`` of ``x``'s ``S`` tokens given in a
        form that needs no conversion: None (``p0 = 0``) or an int64 tensor ``(S,)`` / ``(1, S)`` (as
        ``torch.arange`` makes them); else None, and the caller takes the general path (which validates and
        converts anything else, and refuses what it must)."""
        if self.num_axes is not None or torch.compiler.is_compiling() or x.is_meta:
            return None
        S = x.shape[-2]
        if positions is None:
            return 0
        if (not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or positions.requires_grad
                or positions.dim() not in (1, 2) or positions.shape[-1] != S):
            return None
        return arange_start(positions)  # (S,) or (1, S), an integer range, or None

    def _span(self, x: torch.Tensor, p0: int, side: str, fade: bool = False,
              into: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
              clear: float = 0.0, positions: Any = None, record: bool = False) -> torch.Tensor:
        """:meth:`query` (``fade``: :meth:`_query_after`) or :meth:`key` of ``x`` at the integer times
        ``p0 … p0 + S − 1`` (``S = x.shape[-2]``), for a caller whose times are such a range by construction and
        whose ``x`` it has checked already (the tiles of :mod:`liepos.causal_tiling` and :mod:`liepos.faded_keys`,
        a dozen calls per attention call): the range is checked from its two ends (:func:`check_span`) and the
        tables are rows of a cached window, with no tensor of times built or scanned. The same values as
        ``query(x, torch.arange(p0, p0 + S))``; anything else (several axes, a traced or meta call, learned
        parameters, a length it does not know) goes through :meth:`query` / :meth:`key` themselves. ``into``: a
        provider of the output (given its shape and dtype; a buffer the caller reuses from tile to tile) when
        nothing needs a gradient. ``clear`` (no gradient): every output entry below it in magnitude is +0
        (:func:`liepos._fast.clear_small`), in the encoding's own pass where that is one native kernel call.
        ``record`` (:meth:`query` and :meth:`key`, which pass the ``positions`` they were given): keep what this call
        decided for a repeat of it (:meth:`_record`)."""
        S = x.shape[-2]
        if clear and torch.is_grad_enabled() and x.requires_grad:
            raise ValueError(f"_span: clear={clear!r} needs no gradient (a cleared entry would take none)")
        if not self._span_takes_tables(x, p0):
            pos = torch.arange(p0, p0 + S, dtype=torch.float64, device=x.device)
            if side == "key":
                y = self.key(x, pos)
            else:
                y = self._query_after(x, pos) if fade else self.query(x, pos)
            return clear_small(y, clear) if clear and S else y  # a fresh copy: y may be x itself
        ft = self._span_tables(p0, S, side, x.dtype, fade, x.device)
        if side == "query":
            x = self._scaled(x)
        work = work_dtype(x.dtype)
        out_dtype = work if (self.num_slots and x.dtype in LOW_PRECISION) else x.dtype  # as _apply's slots
        grad = torch.is_grad_enabled() and x.requires_grad
        # into's buffer laid out in x's memory order, as a fresh output would be (a tile's rows keep the heads' order)
        out = None if into is None or grad or ft.identity else empty_out(x, ft.width, out_dtype, into)
        if record and into is None and not clear and not fade:
            self._record(x, p0, positions, side, ft, out_dtype)
        return apply_fast(x, ft, out_dtype=out_dtype, into=out, clear=clear)

    def _span_takes_tables(self, x: torch.Tensor, p0: int) -> bool:
        """Whether :meth:`_span` of ``x`` at ``p0 … p0 + S − 1`` applies :meth:`_span_tables` (else the general
        :meth:`query` / :meth:`key`): one axis, eager, real data, the fast form, a length it knows."""
        S = x.shape[-2]
        return not (S == 0 or self.num_axes is not None or torch.compiler.is_compiling() or x.is_meta
                    or not self._fast_usable(x, None)
                    or (self.length_rule is not None and (self.length is None or p0 + S > self.length)))

    def _kept(self, store: str, key: tuple, make: Callable[[], Any],
              keep_if: Callable[[Any], bool] | None = None) -> Any:
        """``make()`` kept in ``self.__dict__[store]`` under ``key`` while the encoding's stamp holds (where ``keep_if``
        of it, if given, is true), at most :data:`~liepos._replay.LANES` × 4 entries, the oldest let go first."""
        stamp = self._stamp()
        kept = self.__dict__.setdefault(store, {})
        hit = kept.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = make()
        if keep_if is None or keep_if(value):
            keep(kept, key, (stamp, value), 4 * LANES)
        return value

    def _span_tables(self, p0: int, S: int, side: str, dtype: torch.dtype, fade: bool,
                     device: torch.device) -> FastTables:
        """:meth:`_span`'s range check (:func:`check_span`) and table rows (:meth:`_range_tables`) at ``p0 … p0 + S − 1``,
        kept per ``(side, p0, S, fade, dtype, device)`` while the encoding's stamp holds (:meth:`_kept`: the tiles of an
        attention call ask the same dozen ranges call after call; each lookup is a few steps of Python that a pass
        over a large tensor leaves cold), those of at most :data:`~liepos._replay.SPAN_TABLE_BYTES`."""
        def make() -> FastTables:
            check_span(self.generator, float(p0), float(p0 + S - 1), side, dtype, fade=fade)
            return self._range_tables(p0, S, side, work_dtype(dtype), True, device)

        return self._kept("_spans", (side, p0, S, fade, dtype, device), make,
                          lambda ft: ft.nbytes() <= SPAN_TABLE_BYTES)

    def _span_growth(self, x: torch.Tensor, p0: int, side: str, fade: bool = False) -> float | None:
        """``g`` with ``‖y‖_∞ ≤ g ‖x‖_∞`` (before y's rounding) for :meth:`_span`'s ``y`` of ``x`` at ``p0 …
        p0 + S − 1``: :func:`~liepos._fast.term_growth` of its tables, kept beside them (in a store of its own, so
        that growths never crowd the tables out); None where :meth:`_span` does not apply those tables alone (it
        takes the general path, or scales the query, or appends slots) or they are not shifted terms."""
        if self.query_scale is not None or self.num_slots or not self._span_takes_tables(x, p0):
            return None
        S = x.shape[-2]
        return self._kept("_growths", (side, p0, S, fade, x.dtype, x.device),
                          lambda: term_growth(self._span_tables(p0, S, side, x.dtype, fade, x.device)))

    def _replayed(self, x: Any, positions: Any, side: str) -> torch.Tensor | None:
        """:meth:`query` (``side="query"``) or :meth:`key` of ``x`` at ``positions`` from the lane its first call
        recorded (:mod:`liepos._replay`), or None: no lane, or anything it was recorded under changed."""
        lanes = self.__dict__.get("_lanes")
        key = None if not lanes else lane_key(x, side)
        lane = None if key is None or lanes is None else lanes.get(key)
        if lane is None or not lane.admits(x, positions) or self._stamp() != lane.stamp or self._learned():
            return None
        return lane.run(x)

    def _record(self, x: torch.Tensor, p0: int, positions: Any, side: str, ft: FastTables,
                out_dtype: torch.dtype) -> None:
        """Keep the lane of :meth:`_span`'s call for its repeats: one axis, no query scale, no length rule."""
        if self.num_axes is not None or self.query_scale is not None or self.length_rule is not None:
            return
        key = lane_key(x, side)
        lane = None if key is None else new_lane(x, p0, positions, ft, out_dtype, self._stamp())
        if key is not None and lane is not None:
            keep(self.__dict__.setdefault("_lanes", {}), key, lane)

    def _content(self, x: torch.Tensor, positions: Any, side: str) -> torch.Tensor:
        """The content dims of :meth:`query` / :meth:`key` alone, ``(…, content_dim)``: no slot columns.

        For a caller that adds the slots' bias to the scores itself (:mod:`liepos.recentre`, ALiBi's
        per-key bias as the flash kernel's additive mask): ``query(q, t)[..., :content_dim]``, without
        writing the slot columns. ``x`` holds the content dims; on the query side ``query_scale`` applies.
        Identity content returns ``x`` itself (the caller only reads it).
        """
        self._check(x, "q" if side == "query" else "k")
        pos = self._relative(positions, x, None, "positions")
        if side == "query":
            x = self._scaled(x)
        if not self.num_slots or not self._fast_usable(x, pos) or torch.compiler.is_compiling():
            return self._apply(x, pos, side, slots=True)[..., : self.content_dim]
        check_range(self.generator, pos, side, x.dtype)
        ft = self._fast_tables(pos, side, work_dtype(x.dtype), True)
        ft = dataclasses.replace(ft, width=self.content_dim, slot_vals=None)  # the content runs, no slots
        if ft.coupling is None and all(r.kind == "copy" for r in ft.runs):
            return x  # NoPE content (ALiBi's): the identity, nothing to write
        return apply_fast(x, ft)

    def key(self, k: torch.Tensor, positions: Any = None, *, origin: Any = None, inplace: bool = False) -> torch.Tensor:
        """``G(s − o) [k; key_slots]`` for keys (batch, heads, seq, content_dim); ``inplace`` as in :meth:`query`."""
        if not inplace and origin is None:
            y = self._replayed(k, positions, "key")
            if y is not None:
                return y
        self._check(k, "k")
        p0 = None if inplace or origin is not None else self._range_start(positions, k)
        if p0 is not None:
            return self._span(k, p0, "key", positions=positions, record=True)
        pos = self._relative(positions, k, origin, "positions")
        return self._apply(k, pos, "key", slots=True, inplace=inplace)

    def transport(self, x: torch.Tensor, delta: Any) -> torch.Tensor:
        """``A(Δ) x`` on already encoded keys: moves keys encoded at origin ``o`` to ``o + Δ``.

        ``key(k, s, origin=o + Δ) == transport(key(k, s, origin=o), Δ)``, since
        ``G(s − o − Δ) = A(Δ) G(s − o)``. ``delta`` is one value (``(axes,)`` with several axes) or one
        per key, ``(seq,)`` (``(seq, axes)``).
        """
        self._check(x, "x", full=True)
        d = check_real_tensor("delta", delta, dtype=torch.float64).to(x.device)
        if d.dim() == (0 if self.num_axes is None else 1):
            d = d.expand(x.shape[-2], *d.shape)  # one shift for every key: (seq[, axes])
        # A(Δ) = G(−Δ)
        return self._apply(x, as_positions(-d, x.shape[-2], x.shape[0], "delta", self.num_axes), "key")

    # ------------------------------------------------------------------ dense reference path
    def query_reference(self, q: torch.Tensor, positions: Any = None, *, origin: Any = None) -> torch.Tensor:
        """Reference path: the dense matrix ``exp((t − o) X)ᵀ`` per position, times ``[q; slots]``."""
        self._check(q, "q")
        pos = self._relative(positions, q, origin, "positions")
        return apply_dense(self._with_slots(self._scaled(q), self.query_slots), self.generator, self.plan, pos, "query")

    def key_reference(self, k: torch.Tensor, positions: Any = None, *, origin: Any = None) -> torch.Tensor:
        """Reference path: the dense matrix ``exp(−(s − o) X)`` per position, times ``[k; slots]``."""
        self._check(k, "k")
        pos = self._relative(positions, k, origin, "positions")
        return apply_dense(self._with_slots(k, self.key_slots), self.generator, self.plan, pos, "key")


def _digest(enc: Encoding) -> str | None:
    """Eight hex digits of a hash of everything that decides ``enc``'s encoded values (``None`` when a
    tensor has no data to read: on the meta device, or a fake tensor of a trace). The values are read
    with torch's dispatch modes off, so a repr inside a trace (an error message) reads the real ones."""
    import hashlib

    from torch.utils._python_dispatch import _disable_current_modes

    g = enc.generator
    parts: list[object] = [g.sizes, g.complex, g.num_axes, g.allow_growth, enc.layout, repr(enc.logit_scale),
                           enc.name, enc.length]
    try:
        with _disable_current_modes():
            for t in (g.rates, g.freqs, g.nus, g.basis, enc.query_slots, enc.key_slots, enc.query_scale):
                parts.append(None if t is None else (tuple(t.shape), t.detach().to("cpu", torch.float64).flatten().tolist()))
            parts.append(_rule_words(enc.length_rule))
    except Exception:  # noqa: BLE001  (a repr never raises: a tensor without data has no digest)
        return None
    return hashlib.blake2b(repr(parts).encode(), digest_size=4).hexdigest()


def _rule_words(rule: Any) -> object:
    """A length rule as plain data for :func:`_digest`: its source encoding's digest and its map (a
    ``functools.partial``: the function's name and arguments), else the rule's type name."""
    if rule is None:
        return None
    source, at = getattr(rule, "source", None), getattr(rule, "at", None)
    words: list[object] = [type(rule).__qualname__]
    if isinstance(source, Encoding):
        words.append(_digest(source))
    fn = getattr(at, "func", at)
    words.append(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}")
    for a in (*getattr(at, "args", ()), *sorted(getattr(at, "keywords", {}).items())):
        words.append(repr(a.tolist()) if isinstance(a, torch.Tensor) else repr(a))
    return words
