"""Encoding: a generator applied to queries and keys, ``q ↦ F(t) q``, ``k ↦ G(s) k``.

With ``F(t) = A(t)ᵀ`` and ``G(s) = A(−s)`` every encoded score is relative::

    (F(t) q)ᵀ (G(s) k) = qᵀ A(t − s) k

and re-centring at any origin ``o`` (``F(t − o)``, ``G(s − o)``) leaves every score unchanged;
that is how decaying, polynomial and slot blocks stay finite at any absolute time.

The fast path works in O(dim) per token from position tables (:mod:`liepos.tables`); the
reference path (``query_reference``/``key_reference``) multiplies by the dense matrices of
:meth:`Generator.exp` and exists for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from liepos.generator import Generator
from liepos.tables import Plan, Tables, build_tables, make_plan

__all__ = ["Encoding", "apply_in_basis", "apply_tables", "as_positions"]

LAYOUTS = ("interleaved", "half")
_LOW = (torch.float16, torch.bfloat16)


def as_positions(positions: Any, seq: int, batch: int | None, name: str = "positions") -> torch.Tensor:
    """Validate positions of shape ``(seq,)`` or ``(batch, seq)`` and return them as float64.

    Integer and real positions are both allowed; non-finite values are refused.
    """
    if positions is None:
        return torch.arange(seq, dtype=torch.float64)
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor of times, got {type(positions).__name__}") from err
    if positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be real (integer or floating), got dtype {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise ValueError(
            f"{name} must have shape (seq,) or (batch, seq), got shape {tuple(positions.shape)}"
        )
    if positions.shape[-1] != seq:
        raise ValueError(
            f"{name} has length {positions.shape[-1]} but the sequence has {seq} tokens "
            f"(shape {tuple(positions.shape)})"
        )
    if positions.dim() == 2 and batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} has batch size {positions.shape[0]} but the tensor has batch size {batch}"
        )
    out = positions.to(torch.float64) if not positions.requires_grad else positions.double()
    if torch.compiler.is_compiling():  # no data-dependent checks inside a graph (fullgraph=True)
        return out
    if not bool(torch.isfinite(out.detach()).all()):
        bad = out.detach()[~torch.isfinite(out.detach())][:5].tolist()
        raise ValueError(f"{name} must be finite, got {bad}")
    return out


def _partner(x: torch.Tensor, t: Tables) -> torch.Tensor:
    if t.partner == "pairs":
        # (..., d) -> (..., d/2, 2) -> swap the two components of each plane
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    if t.partner == "halves":
        P = t.planes
        return torch.cat((x[..., P : 2 * P], x[..., :P], x[..., 2 * P :]), dim=-1)
    return x.index_select(-1, t.partner_index)


def apply_tables(x: torch.Tensor, t: Tables) -> torch.Tensor:
    """``y = couple(a ⊙ x + b ⊙ partner(x))``: the readable eager form of the fast path.

    ``x``: (batch, heads, seq, dim); tables broadcast against it. Half-precision inputs are
    computed in float32 and cast back once.
    """
    if t.a is None and t.b is None and t.coef is None:
        return x
    out_dtype = x.dtype
    work = torch.float32 if x.dtype in _LOW else x.dtype
    t = t.to(work, x.device)
    xw = x.to(work)
    z = xw if t.a is None else xw * t.a
    if t.b is not None:
        z = z + _partner(xw, t) * t.b
    if t.coef is not None:
        # y[dst] += c · z[src] (sparse lower/upper triangular part of the Jordan blocks)
        z = z.index_add(-1, t.dst, t.coef * z.index_select(-1, t.src))
    return z.to(out_dtype)


def apply_in_basis(x: torch.Tensor, basis: torch.Tensor, inv: torch.Tensor, t: Tables, side: str) -> torch.Tensor:
    """F or G of ``x`` for ``X = P J P^{-1}`` from the tables ``t`` of the canonical J, in O(d²) per token.

    In storage order (``Q = Π P Πᵀ``): ``F(t) = Q^{-T} F_J(t) Qᵀ`` and ``G(s) = Q G_J(s) Q^{-1}``;
    differentiable in P (the dense reference path builds a d×d matrix per position instead).
    """
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    Q = basis.index_select(0, inv.to(basis.device)).index_select(1, inv.to(basis.device)).to(device=x.device, dtype=work)
    Qi = torch.linalg.inv(Q)
    xw = x.to(work)
    if side == "query":
        return (apply_tables(xw @ Q, t) @ Qi).to(x.dtype)
    return (apply_tables(xw @ Qi.transpose(-1, -2), t) @ Q.transpose(-1, -2)).to(x.dtype)


class Encoding:
    """A positional encoding: a generator, a storage layout, constant slots and a logit scale.

    Args:
        generator: the :class:`Generator` X (its last ``num_slots`` canonical dims are slots).
        layout: ``"interleaved"`` (canonical order; planes are dims (2k, 2k+1)) or ``"half"``
            (the x-components of all rotation planes, then their y-components, then the real
            dims: planes (k, k + d/2) for RoPE, Hugging Face / GPT-NeoX).
        query_slots, key_slots: constants appended to every query and key, shape ``(slots,)`` or
            ``(heads, slots)``; both or neither.
        logit_scale: multiplier on qᵀk (context-extension temperatures such as YaRN's
            ``attention_factor²``), applied by :func:`liepos.attention`.
        name: a label for reports.
        length_rule: for length-dependent generators, ``length -> Encoding`` (see :meth:`at_length`).

    The defining identity (checked in the tests for every block type, both layouts, with slots)::

        enc.query(q, t)ᵀ enc.key(k, s) = [q; q_slots]ᵀ A(t − s) [k; k_slots]

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
        name: str | None = None,
        length_rule: Callable[[int], Encoding] | None = None,
    ) -> None:
        if not isinstance(generator, Generator):
            raise TypeError(f"generator must be a liepos.Generator, got {type(generator).__name__}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if (query_slots is None) != (key_slots is None):
            raise ValueError("query_slots and key_slots must be given together")
        n_slots = 0
        if query_slots is not None:
            query_slots = torch.as_tensor(query_slots, dtype=torch.float64)
            key_slots = torch.as_tensor(key_slots, dtype=torch.float64)
            if query_slots.dim() not in (1, 2) or key_slots.dim() not in (1, 2):
                raise ValueError(
                    f"slots must have shape (slots,) or (heads, slots), got query_slots "
                    f"{tuple(query_slots.shape)} and key_slots {tuple(key_slots.shape)}"
                )
            if query_slots.shape[-1] != key_slots.shape[-1]:
                raise ValueError(
                    f"query_slots has {query_slots.shape[-1]} slots but key_slots has {key_slots.shape[-1]}"
                )
            n_slots = int(query_slots.shape[-1])
            if n_slots >= generator.dim:
                raise ValueError(f"{n_slots} slots leave no content dims in a {generator.dim}-dim generator")
            # no block may straddle the content/slot boundary
            boundary = generator.dim - n_slots
            for off, w in zip(generator.offsets, generator.widths):
                if off < boundary < off + w:
                    raise ValueError(
                        f"a generator block spans dims {off}..{off + w - 1}, across the content/slot "
                        f"boundary at {boundary}"
                    )
        try:
            logit_scale = float(logit_scale)
        except (TypeError, ValueError) as err:
            raise TypeError(f"logit_scale must be a real number, got {logit_scale!r}") from err
        if not (logit_scale > 0 and logit_scale < float("inf")):
            raise ValueError(f"logit_scale must be positive and finite, got {logit_scale}")
        self.generator = generator
        self.layout = layout
        self.query_slots = query_slots
        self.key_slots = key_slots
        self.num_slots = n_slots
        self.logit_scale = logit_scale
        self.name = name
        self.length_rule = length_rule
        self._plan: Plan | None = None

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
    def num_heads(self) -> int | None:
        """Heads of the per-head parameters (generator or slots), or ``None`` if shared."""
        heads = {self.generator.num_heads}
        for s in (self.query_slots, self.key_slots):
            if s is not None and s.dim() == 2:
                heads.add(int(s.shape[0]))
        heads.discard(None)
        if len(heads) > 1:
            raise ValueError(f"the generator and the slots disagree on the number of heads: {sorted(heads)}")
        return heads.pop() if heads else None

    @property
    def is_relative_everywhere(self) -> bool:
        """True when scores stay bounded for both signs of the lag (pure rotation, NoPE, no slots)."""
        return self.generator.is_orthogonal and self.num_slots == 0

    @property
    def needs_recentring(self) -> bool:
        """True when F and G grow with absolute time (decay, growth, Jordan blocks or slots)."""
        return not self.is_relative_everywhere

    @property
    def _source(self) -> Any:
        """The generator the constructor took (subclasses with several axes keep theirs)."""
        return self.generator

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            structure = getattr(self._source, "structure", self._source)
            self._plan = make_plan(structure, self.layout, self.num_slots)
        return self._plan

    @property
    def version(self) -> tuple:
        """A hashable key of everything that determines the encoded values."""
        slots = None
        if self.query_slots is not None:
            slots = (tuple(self.query_slots.reshape(-1).tolist()), tuple(self.key_slots.reshape(-1).tolist()))
        return (self._source.key(), self.layout, slots, self.logit_scale)

    def replace(self, **changes: Any) -> Encoding:
        """A copy with the given constructor fields replaced (``generator``, ``layout``, …)."""
        fields = dict(
            generator=self._source, layout=self.layout, query_slots=self.query_slots,
            key_slots=self.key_slots, logit_scale=self.logit_scale, name=self.name,
            length_rule=self.length_rule,
        )
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"{type(self).__name__}.replace got unknown fields {sorted(unknown)}")
        fields.update(changes)
        g = fields.pop("generator")
        return type(self)(g, **fields)

    def at_length(self, length: int) -> Encoding:
        """The encoding used for sequences of ``length`` positions (length-dependent generators)."""
        if self.length_rule is None:
            return self
        return self.length_rule(int(length))

    def __repr__(self) -> str:
        name = f"{self.name!r}, " if self.name else ""
        slots = f", slots={self.num_slots}" if self.num_slots else ""
        scale = f", logit_scale={self.logit_scale:g}" if self.logit_scale != 1.0 else ""
        return f"Encoding({name}{self.generator!r}, layout={self.layout!r}{slots}{scale})"

    # ------------------------------------------------------------------ application
    def _check(self, x: torch.Tensor, name: str, full: bool = False) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, seq, dim), got {tuple(x.shape)}")
        want = self.dim if full else self.content_dim
        if x.shape[-1] != want:
            raise ValueError(
                f"{name} has last dim {x.shape[-1]} but the encoding expects {want}"
                + ("" if full or not self.num_slots else f" (content dims; {self.num_slots} slots are appended)")
            )
        H = self.num_heads
        if H is not None and x.shape[1] != H:
            raise ValueError(
                f"{name} has {x.shape[1]} heads but the encoding has per-head parameters for {H} heads"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")

    def _with_slots(self, x: torch.Tensor, slots: torch.Tensor | None) -> torch.Tensor:
        if slots is None:
            return x
        B, H, S, _ = x.shape
        s = slots.to(device=x.device, dtype=torch.float32 if x.dtype in _LOW else x.dtype)
        s = s.reshape(1, -1, 1, self.num_slots).expand(B, H, S, self.num_slots)  # (B, H, S, slots)
        return torch.cat((x.to(s.dtype), s), dim=-1).to(x.dtype if x.dtype not in _LOW else s.dtype)

    def _relative(self, positions: Any, x: torch.Tensor, origin: Any, name: str) -> torch.Tensor:
        pos = as_positions(positions, x.shape[-2], x.shape[0], name)
        if origin is not None:
            o = torch.as_tensor(origin, dtype=torch.float64, device=pos.device)
            if not bool(torch.isfinite(o).all()):
                raise ValueError(f"origin must be finite, got {o.tolist()}")
            if o.dim() == 1 and pos.dim() == 2:
                o = o.unsqueeze(-1)  # a per-batch origin
            pos = pos - o
        return pos.to(x.device)

    def tables(self, positions: torch.Tensor, side: str) -> Tables:
        """Float64 tables of F (``side="query"``) or G (``side="key"``) at already re-centred positions."""
        if torch.compiler.is_compiling():
            # traced: build the plan without reading or caching it on self (no guard on that state)
            plan = make_plan(self.generator, self.layout, self.num_slots)
        else:
            plan = self.plan
        return build_tables(self.generator, plan, positions, side)

    def _apply(
        self, x: torch.Tensor, pos: torch.Tensor, side: str, slots: bool = False, inplace: bool = False
    ) -> torch.Tensor:
        """F or G of ``x``; with ``slots`` ``x`` holds the content dims and the side's slots are appended.

        The fast path (:mod:`liepos._fast`: one pass per block kind, cached tables, a backward that
        saves only the tables) runs whenever the tables need no gradient and nothing is being traced;
        otherwise the readable path :func:`apply_tables` (autograd through the tables, or a graph that
        ``torch.compile`` fuses) gives the same values.
        """
        if self.generator.basis is None:
            from liepos import _fast

            y = _fast.encode_fast(self, x, pos, side, slots, inplace=inplace)
            if y is not None:
                return y
        if inplace:
            raise ValueError("inplace=True needs the fast path (canonical basis, tables without gradient, eager)")
        if slots:
            x = self._with_slots(x, self.query_slots if side == "query" else self.key_slots)
        t = self.tables(pos, side)
        if not torch.compiler.is_compiling():
            self._check_finite(t, x.dtype, pos, side)
        if self.generator.basis is not None:
            # a fixed change of basis around the canonical tables: O(d²) per token, no per-position matrix
            return apply_in_basis(x, self.generator.basis, self.plan.inv, t, side)
        return apply_tables(x, t)

    def _check_finite(self, t: Tables, dtype: torch.dtype, pos: torch.Tensor, side: str) -> None:
        lim = torch.finfo(torch.float32 if dtype in _LOW else dtype).max
        for name, tab in (("scale", t.a), ("coupling", t.coef)):
            if tab is not None:
                m = float(tab.detach().abs().max()) if tab.numel() else 0.0
                if not m < lim:
                    raise OverflowError(
                        f"the {side} {name} table overflows {dtype} (max {m:.3g}) at positions up to "
                        f"{float(pos.detach().abs().max()):.6g}: re-centre with origin= (scores do not "
                        f"change) or use liepos.attention, which re-centres per query block"
                    )

    def query(
        self, q: torch.Tensor, positions: Any = None, *, origin: Any = None, inplace: bool = False
    ) -> torch.Tensor:
        """``F(t − o) [q; query_slots]`` for queries (batch, heads, seq, content_dim).

        ``inplace=True`` overwrites ``q`` (no slots; autograd-safe: the backward needs only the tables).
        """
        self._check(q, "q")
        pos = self._relative(positions, q, origin, "positions")
        return self._apply(q, pos, "query", slots=True, inplace=inplace)

    def key(
        self, k: torch.Tensor, positions: Any = None, *, origin: Any = None, inplace: bool = False
    ) -> torch.Tensor:
        """``G(s − o) [k; key_slots]`` for keys (batch, heads, seq, content_dim); ``inplace`` as in :meth:`query`."""
        self._check(k, "k")
        pos = self._relative(positions, k, origin, "positions")
        return self._apply(k, pos, "key", slots=True, inplace=inplace)

    def transport(self, x: torch.Tensor, delta: Any) -> torch.Tensor:
        """``A(Δ) x`` on already encoded keys: moves keys encoded at origin ``o`` to ``o + Δ``.

        ``key(k, s, origin=o + Δ) == transport(key(k, s, origin=o), Δ)``, since
        ``G(s − o − Δ) = A(Δ) G(s − o)``. ``delta`` is a scalar or one value per key ``(seq,)``.
        """
        self._check(x, "x", full=True)
        d = torch.as_tensor(delta, dtype=torch.float64, device=x.device)
        if d.dim() == 0:
            d = d.expand(x.shape[-2])
        # A(Δ) = G(−Δ)
        return self._apply(x, as_positions(-d, x.shape[-2], x.shape[0], "delta"), "key")

    # ------------------------------------------------------------------ dense reference path
    def _dense(self, pos: torch.Tensor, side: str) -> torch.Tensor:
        """Dense F or G per position in storage order, shape (…, seq, d, d) broadcastable to x."""
        g = self.generator
        u = pos if side == "query" else -pos
        A = g.exp(u)  # (*pos, *heads, d, d)
        if side == "query":
            A = A.transpose(-1, -2)
        if g.num_heads is not None:
            # (S, H, d, d) -> (H, S, d, d); (B, S, H, d, d) -> (B, H, S, d, d)
            A = A.movedim(-3, -4)
        elif pos.dim() == 2:
            A = A.unsqueeze(1)  # (B, 1, S, d, d)
        # storage[perm[c]] = canonical[c]: permute rows and columns
        inv = self.plan.inv.to(A.device)
        return A.index_select(-1, inv).index_select(-2, inv)

    def _apply_dense(self, x: torch.Tensor, pos: torch.Tensor, side: str) -> torch.Tensor:
        M = self._dense(pos, side)
        work = torch.float64 if M.dtype == torch.float64 else M.dtype
        return (M.to(work) @ x.to(work).unsqueeze(-1)).squeeze(-1).to(x.dtype)

    def query_reference(self, q: torch.Tensor, positions: Any = None, *, origin: Any = None) -> torch.Tensor:
        """Reference path: the dense matrix ``exp((t − o) X)ᵀ`` per position, times ``[q; slots]``."""
        self._check(q, "q")
        pos = self._relative(positions, q, origin, "positions")
        return self._apply_dense(self._with_slots(q, self.query_slots), pos, "query")

    def key_reference(self, k: torch.Tensor, positions: Any = None, *, origin: Any = None) -> torch.Tensor:
        """Reference path: the dense matrix ``exp(−(s − o) X)`` per position, times ``[k; slots]``."""
        self._check(k, "k")
        pos = self._relative(positions, k, origin, "positions")
        return self._apply_dense(self._with_slots(k, self.key_slots), pos, "key")

