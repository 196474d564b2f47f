"""The state of an attention layer :func:`~liepos.interop.patch_model` patched: its encoding, the
forward's positions every layer reads, and how the family hands the layer q and k."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos._fast import FastTables, apply_fast
from liepos.encoding import Encoding
from liepos.interop.families import Family
from liepos.interop.hf_decode import checked_step_matrix
from liepos.interop.hf_packed import check_row, restarted
from liepos.tables import check_range

__all__ = ["Positions", "Length", "Layer", "Tag", "LOW"]

LOW = (torch.float16, torch.bfloat16)  # computed in float32, as liepos' apply does
_SERIALS = itertools.count()


@dataclass(eq=False)
class Tag:
    """What one rotary call made: its ``cos`` and ``sin``, the ``position_ids`` it read, its layer type."""

    cos: torch.Tensor
    sin: torch.Tensor
    ids: torch.Tensor
    label: Any
    serial: int = field(default_factory=lambda: next(_SERIALS))  # a table key no other tag shares


@dataclass
class Positions:
    """The ``position_ids`` the model's rotary module saw last, shared by all layers of one model,
    and what every layer with the same encoding reads at them (built once per forward, not once
    per layer): fast tables, sliced from the cached windows of :data:`liepos._fast.CACHE` for
    consecutive positions, so a decode step builds nothing; one step's transforms as matrices."""

    ids: torch.Tensor | None = None
    tables: dict[Any, Any] = field(default_factory=dict)
    lengths: list[Length] = field(default_factory=list)  # the length-dependent ropes, one per layer type
    # a family whose rotary modules also run inside the attention (inner_rotary): the recent rotary calls,
    # the model's (one per rope label) apart from the inner ones, so that a deep model's inner calls never
    # push out the model's own
    tagged: bool = False
    outer: deque[Tag] = field(default_factory=lambda: deque(maxlen=8))
    inner: deque[Tag] = field(default_factory=lambda: deque(maxlen=8))

    def tag(self, out: Any, ids: Any, label: Any, inner: bool) -> None:
        """Remember the ``(cos, sin)`` a rotary call returned, with the positions it read."""
        if isinstance(out, tuple) and len(out) == 2 and isinstance(ids, torch.Tensor):
            (self.inner if inner else self.outer).append(Tag(out[0], out[1], ids, label))

    def tag_of(self, cos: Any) -> Tag | None:
        """The remembered rotary call that returned this very ``cos`` tensor (None: no patched rotary made it)."""
        for tags in (self.inner, self.outer):
            for t in reversed(tags):
                if t.cos is cos:
                    return t
        return None

    def record(self, ids: torch.Tensor | None, rotary: Any = None) -> None:
        self.ids = ids
        self.tables.clear()
        if ids is not None and ids.numel():
            for length in self.lengths:
                length.update(ids, rotary)

    def fast(self, enc: Encoding, pos: torch.Tensor, side: str, key: Any, x: torch.Tensor) -> FastTables | None:
        """Fast tables of ``enc`` at ``pos`` ``(1|B, S)`` for inputs like ``x``; None: no fast form."""
        if key in self.tables:
            return self.tables[key]
        ft = None
        if enc._fast_usable(x, pos):
            check_range(enc.generator, pos, side, x.dtype)
            ft = enc._fast_tables(pos, side, torch.float32 if x.dtype in LOW else x.dtype, False)
        self.tables[key] = ft
        return ft

    def matrix(self, key: Any, enc: Encoding, pos: torch.Tensor, side: str, x: torch.Tensor) -> torch.Tensor | None:
        """``Mᵀ`` ``(1, H|1, d, d)`` at the one position ``pos``, once per forward (None: no fast form):
        row i is the transform of e_i, so ``x @ Mᵀ`` is the transform of every row of ``x`` in one matmul —
        the same one or two products per output dim as the pass per block kind, the rest exact zeros (a
        non-finite entry spreads over its token's row, a token whose scores are not finite either way).
        Rows of a cached window of them (:func:`liepos.interop.hf_decode.step_matrix`) where it can."""
        m = self.tables.get(("matrix",) + key)
        if m is None:
            m = checked_step_matrix(enc, x, pos, side, lambda: self.fast(enc, pos, side, key, x))
            if m is None:
                return None
            self.tables[("matrix",) + key] = m
        return m


@dataclass
class Length:
    """The length a length-dependent rope of the config is computed at in each forward, as transformers'.

    transformers' rotary module (``dynamic_rope_update``) recomputes its frequencies before each
    forward and rotates that forward's q and k with them; the keys stay cached as they were
    rotated. ``dynamic``: at the module's ``max_seq_len_cached``, the longest
    ``max(position_ids) + 1`` seen so far, back to ``max_position_embeddings`` once a forward is
    shorter than that; it is read off the module after its forward, so every reset and every
    call outside liepos counts. ``longrope``: at this forward's ``max(position_ids) + 1`` (the
    long factors past ``original_max_position_embeddings``). Layers with such a rope run as fixed
    rotations at ``current`` and cache encoded keys, exactly like upstream.
    """

    rule: Encoding  # the encoding with its length_rule
    attributes: tuple[str, ...]  # the rotary module's length attribute, first found (dynamic); (): this forward's
    current: Encoding | None = None

    def update(self, ids: torch.Tensor, rotary: Any) -> None:
        need = int(ids.max()) + 1
        length = need
        if self.attributes:
            name = next((a for a in self.attributes if hasattr(rotary, a)), None)
            if name is None:
                raise RuntimeError(
                    f"dynamic NTK: the rotary module {type(rotary).__name__} has none of {list(self.attributes)}, so "
                    "the length transformers computes this forward's frequencies at is unknown"
                )
            length = int(getattr(rotary, name))
            if length < need:
                raise RuntimeError(
                    f"dynamic NTK: {type(rotary).__name__}.{name} = {length} is below this forward's "
                    f"max(position_ids) + 1 = {need}"
                )
        self.current = self.rule.at_length(length)


@dataclass
class Layer:
    """A patched attention module's state: its encoding and how the family hands it q and k."""

    encoding: Encoding
    family: Family
    gain: torch.Tensor | float  # multiplier of encoded q and k: transformers' temperature on rotated dims
    encoded: bool  # pure rotation: HF's cache holds encoded keys, the model's backend runs
    pad: int  # NoPE dims appended before encoding (families that pass only the rotated dims)
    positions: Positions
    call: dict[str, Any] = field(default_factory=dict)
    length: Length | None = None  # a config's dynamic / longrope rope: the encoding of each forward
    # a rotation's F and G are the same tables (only rates and Jordan couplings tell the sides apart)
    sided: bool = True
    # the registered attention implementation the layer's config names (None: the modeling file's hooks)
    implementation: str | None = None
    label: Any = None  # an inner_rotary family: the rope label of the layer's attention ("main", "compress")

    def __post_init__(self) -> None:
        self.sided = not self.encoding.generator.is_orthogonal

    def times(self, like: torch.Tensor) -> torch.Tensor:
        """Positions ``(1|B, S)`` or ``(1|B, S, axes)`` float64 of the current call."""
        pos = self.positions.ids
        S = like.shape[-2]
        cu = self.call.get("cu")
        if cu is not None:  # packed documents: each starts at time 0
            out = self.positions.tables.get(("packed", like.device))
            if out is None:
                base = torch.arange(S, device=like.device)[None] if pos is None else self._converted(pos, like.device)
                if base.dim() != 2 or base.shape[-1] != S:
                    raise NotImplementedError(
                        f"packed sequences take one position axis over the row's {S} tokens, got positions of shape "
                        f"{tuple(base.shape)}"
                    )
                check_row(cu, like.shape[0], S, self.call.get("seen", 0))
                out = self.positions.tables[("packed", like.device)] = restarted(base.to(torch.float64), cu)
            return out
        if pos is None:
            seen = self.call.get("seen", 0)
            pos = torch.arange(seen, seen + S, device=like.device)
        else:  # the forward's positions: converted once for every layer
            out = self.positions.tables.get(("times", like.device))
            if out is None:
                out = self.positions.tables[("times", like.device)] = self._converted(pos, like.device)
            return out
        return self._converted(pos, like.device)

    @staticmethod
    def _converted(pos: torch.Tensor, device: torch.device) -> torch.Tensor:
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        if pos.dim() == 3:  # M-RoPE: (axes, B, S) -> (B, S, axes)
            pos = pos.permute(1, 2, 0)
        return pos.to(device, torch.float64)

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.family.seq_first:
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, S, H, D) -> (B, H, S, D)
        if q.shape[-1] + self.pad != self.encoding.content_dim:
            raise ValueError(
                f"{self.family.model_type}: the attention rotates {q.shape[-1]} dims but the encoding has "
                f"{self.encoding.content_dim - self.pad} content dims"
            )
        pos = self.times(q)
        self.call["pos"] = pos
        if self.encoded:
            q, k = self._encode(q, pos, "query"), self._encode(k, pos, "key")
        elif not isinstance(self.gain, float) or self.gain != 1.0:
            q, k = self._scaled(q), self._scaled(k)  # the gain commutes with the rotation of each plane
        if self.family.seq_first:
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # back to (B, S, H, D)
        return q, k

    def rotate_tagged(self, x: torch.Tensor, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> torch.Tensor:
        """The rope call ``apply(x, cos, sin)`` of an ``inner_rotary`` family: ``x`` rotated at the positions of
        the rotary call that made ``cos`` (the attention's own, a compressor's window positions, an indexer's),
        back at the negated positions when ``sin`` is that call's sin negated (an output rotated back)."""
        name = self.family.model_type
        if self.encoded and self.sided:
            raise NotImplementedError(f"{name}: the rope is applied per tensor, which does not say query from key, "
                                      f"and {self.encoding!r} encodes them differently")
        if unsqueeze_dim != 1:
            raise NotImplementedError(f"{name}: a rope call with unsqueeze_dim={unsqueeze_dim!r}; liepos rotates "
                                      "(batch, heads, seq, dim) tensors here (unsqueeze_dim=1)")
        tag = self.positions.tag_of(cos)
        if tag is None:
            raise RuntimeError(f"{name}: a rope call whose cos no patched rotary module of the model returned, so its "
                               "positions are unknown")
        if sin is tag.sin:
            sign = 1.0
        elif isinstance(sin, torch.Tensor) and sin.shape == tag.sin.shape and torch.equal(sin, -tag.sin):
            sign = -1.0  # the rotation back
        else:
            raise RuntimeError(f"{name}: a rope call whose sin is neither the sin its rotary call returned with its "
                               "cos nor that sin negated")
        if self.label is not None and tag.label is not None and tag.label != self.label:
            raise RuntimeError(f"{name}: layer {self.label!r} rope called with the cos of the {tag.label!r} rope")
        if x.dim() != 4:
            raise ValueError(f"{name}: the rope call rotates a tensor of shape {tuple(x.shape)}, not (batch, heads, "
                             "seq, dim)")
        C, d = self.encoding.content_dim, x.shape[-1]
        planes = 2 * self.encoding.generator.complex.count(True)  # the rotated dims
        if 2 * cos.shape[-1] != planes:
            raise ValueError(f"{name}: the rope call's cos rotates {2 * cos.shape[-1]} dims, the encoding {planes}")
        pos = self._converted(tag.ids, x.device) * sign  # (1|B, S) float64
        if pos.shape[-1] != x.shape[-2]:
            raise ValueError(f"{name}: a rope call on {x.shape[-2]} tokens with the cos of {pos.shape[-1]} positions")
        key = ("tag", tag.serial, sign)
        if d == C:
            return self._encode(x, pos, "query", key)
        if not self.family.rope_last or d < planes:
            raise ValueError(f"{name}: the rope call rotates {d} dims per head, the encoding has {C}")
        # a head of another width (an indexer's): its last dims are the rope's, the NoPE dims before them stay
        if d > C:  # (…, d) = (…, d − C) NoPE ‖ (…, C) encoded
            return torch.cat((x[..., : d - C], self._encode(x[..., d - C:], pos, "query", key)), dim=-1)
        wide = torch.cat((x.new_zeros(*x.shape[:-1], C - d), x), dim=-1)  # (…, d) -> (…, C): zeros before
        return self._encode(wide, pos, "query", key)[..., C - d:]

    def _encode(self, x: torch.Tensor, pos: torch.Tensor, side: str, tag: tuple[Any, ...] = ()) -> torch.Tensor:
        if self.pad:
            x = torch.cat((x, x.new_zeros(*x.shape[:-1], self.pad)), dim=-1)  # (…, rot) -> (…, rot + pad)
        enc = self.encoding if self.length is None else self.length.current
        if enc is None:
            raise RuntimeError(f"{self.family.model_type}: the rotary module did not run before the attention, so "
                               "the length of this forward's dynamic rope is unknown")
        if self.positions.ids is None or pos.dim() != 2:  # no forward-wide positions: encode directly
            out = getattr(enc, side)(x, pos)
        else:
            side = side if self.sided else "query"  # a rotation: F and G are the same tables
            key = (id(enc), side, x.dtype, x.device, tuple(pos.shape)) + tag  # tag: positions of their own
            m = None
            if pos.numel() == 1 and x.dtype not in LOW and x.shape[-1] == enc.dim:  # a decode step: one matmul
                m = self.positions.matrix(key, enc, pos, side, x)
            if m is not None:
                out = x @ m
            elif (ft := self.positions.fast(enc, pos, side, key, x)) is None:
                out = enc._apply(x, pos, side)  # a basis, a gathered partner, learned parameters: the readable path
            else:
                out = apply_fast(x, ft)
        if self.pad:
            out = out[..., : out.shape[-1] - self.pad]
        return self._scaled(out)

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.gain, float):
            return x if self.gain == 1.0 else x * self.gain
        return x * self.gain.to(device=x.device, dtype=x.dtype)
