"""Encoding spec strings, one grammar resolved through the catalogue's registry :data:`liepos.CATALOGUE`.

::

    spec   := group ('|' group)*          per-head groups: contiguous, (nearly) equal head counts
    group  := part ('+' part)*            a direct sum: the parts share the head dim
    part   := name (':' option)*          a catalogue entry, ``jordanN``, or ``learn`` (see below)
    option := value | key '=' value       a bare value sets the entry's main option (table below)

A part ``name:…`` is ``lp.CATALOGUE[name].build(dim, num_heads, **options)``: ``decay:0.01`` is
``rate=0.01`` (one rate for every dim), ``growth:0.02`` the growth row at rate 0.02 (explicitly
allowed), ``jordan4`` / ``jordan:4`` / ``jordan:size=4:rate=-0.1`` a bank of Jordan blocks,
``rope:500000`` a base, ``xpos:scale=256`` xPos' ``scale_base``. ``learn``, ``learn:rope``,
``learn:decay``, ``learn:jordan3`` … are learned generators (:mod:`liepos.explore.learned`) that
start at that part (``learn`` alone: ``rope+decay+jordan2``); ``learn:nope`` and ``learn:random``
keep RoPE's planes with every rate and frequency near 0 (NoPE) or drawn at random.

``a+b`` splits the head dim between the parts (equal shares; a part with rotation blocks gets an
even one) and joins their generators with :func:`liepos.direct_sum`, so
``exp(u(X_a ⊕ X_b)) = exp(uX_a) ⊕ exp(uX_b)``. A part with constant slots (ALiBi) keeps its content
dims in place and moves its slot block last (slots must be the trailing dims); one per sum.

>>> enc = from_spec("rope+decay", 16, 2)
>>> import torch
>>> a, b = from_spec("rope", 8), from_spec("decay", 8)
>>> bool(torch.allclose(enc.generator.exp(3.0), torch.block_diag(a.generator.exp(3.0), b.generator.exp(3.0))))
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from liepos.catalogue import CATALOGUE
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum

if TYPE_CHECKING:
    from liepos.explore.learned import LearnedGenerator

__all__ = [
    "MAIN_OPTION",
    "Part",
    "SCHEDULE",
    "SpecEncoding",
    "decoder_entries",
    "from_spec",
    "is_schedule_row",
    "number_or_text",
    "one_axis",
    "parse_part",
    "parse_spec",
    "split_heads",
]

# the option a bare value sets, per catalogue entry (``decay:0.01`` is ``rate=0.01``)
MAIN_OPTION = {"decay": "rate", "growth": "rate", "jordan": "size", "rope": "base", "retnet": "base",
               "xpos": "scale_base"}
_ALIASES = {"scale": "scale_base"}  # ``xpos:scale=…``
_SHORT = re.compile(r"^([a-z_]+?)(\d+)$")  # ``jordan3`` is ``jordan:size=3``
# a head dim every catalogue entry builds at (divisible by 2…6): used to ask whether a part has rotation blocks
_PROBE_DIM = 60
LEARN = "learn"
SCHEDULE = "schedule"  # ``schedule:<name>…`` names a per-layer schedule row (liepos.explore.schedule_rows)
_FREE_STARTS = ("nope", "random")  # learn:nope, learn:random: RoPE's block structure, other start values


def is_schedule_row(text: object) -> bool:
    """Whether ``text`` names a per-layer schedule row (``schedule:<name>…``), not a spec."""
    return isinstance(text, str) and text.strip().lower().startswith(SCHEDULE + ":")


def one_axis(enc: object) -> bool:
    """Whether ``enc`` is an encoding of one position axis (the decoder's token index); several-axes
    encodings (axial RoPE, M-RoPE) have ``num_axes`` set."""
    return isinstance(enc, Encoding) and enc.num_axes is None


def decoder_entries() -> list[str]:
    """The registry's entries that build a one-axis encoding: every name the decoder can run alone."""
    return [name for name, entry in CATALOGUE.items() if one_axis(entry.build(_PROBE_DIM, 1))]


@dataclass(frozen=True)
class Part:
    """One summand: a catalogue ``name`` with ``options``, learned (``learn``) or fixed."""

    name: str
    options: tuple[tuple[str, object], ...] = ()
    learn: bool = False
    init: str = "start"  # a learned part's start: the part's values, "nope" or "random" (its blocks' structure)

    @property
    def text(self) -> str:
        if self.learn and self.init != "start":
            return f"{LEARN}:{self.init}"
        opts = "".join(f":{k}={v}" for k, v in self.options)
        return f"{LEARN}:{self.name}{opts}" if self.learn else f"{self.name}{opts}"

    def build(self, dim: int, num_heads: int) -> Encoding:
        """The fixed encoding of this part (for ``learn``: its starting point)."""
        entry = CATALOGUE[self.name]
        try:
            enc = entry.build(dim, num_heads, **dict(self.options))
        except TypeError as err:
            raise ValueError(f"bad option for {self.name!r} in {self.text!r}: {err}; its options: {entry.options}") from None
        except ValueError as err:
            raise ValueError(f"{self.text!r}: {err}") from None
        if not one_axis(enc) or enc.generator.num_heads not in (None, num_heads):
            raise ValueError(f"{self.text!r} does not build a one-axis encoding for {num_heads} heads; "
                             f"the decoder's positions are token indices (one axis)")
        return enc


def number_or_text(text: str) -> object:
    """``'3'`` -> 3, ``'0.5'`` -> 0.5, anything else as given."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _options(name: str, fields: list[str], spec: str) -> tuple[tuple[str, object], ...]:
    opts: dict[str, object] = {}
    for f in fields:
        key, eq, val = f.partition("=")
        if not eq:
            if name not in MAIN_OPTION:
                raise ValueError(f"{name!r} takes no bare value (got {f!r} in {spec!r}); write key=value")
            key, val = MAIN_OPTION[name], f
        key = _ALIASES.get(key.strip(), key.strip())
        if key in opts or not val.strip():
            raise ValueError(f"option {key!r} is given twice or empty in {spec!r}")
        opts[key] = number_or_text(val.strip())
    return tuple(opts.items())


def parse_part(text: str) -> Part:
    """``'decay:0.01'`` → ``Part('decay', (('rate', 0.01),))``; ``'learn:jordan3'`` → a learned Jordan bank.

    >>> parse_part("xpos:scale=256")
    Part(name='xpos', options=(('scale_base', 256),), learn=False, init='start')
    >>> parse_part("learn:jordan3").text
    'learn:jordan:size=3'
    """
    fields = [f.strip() for f in text.strip().lower().split(":")]
    learn = fields[0] == LEARN
    if learn:
        fields = fields[1:] or ["rope+decay+jordan2"]
    head = fields[0]
    if learn and "+" in head:  # the default start of ``learn``
        return Part(head, (), True)
    if learn and head in _FREE_STARTS:  # RoPE's planes at NoPE or at random rates and frequencies
        if len(fields) > 1:
            raise ValueError(f"learn:{head} takes no options (got {text!r})")
        return Part("rope", (), True, head)
    m = _SHORT.match(head)
    if m and m.group(1) in MAIN_OPTION and head not in CATALOGUE:
        head, fields = m.group(1), [head, m.group(2), *fields[1:]]
    if head not in CATALOGUE:
        raise ValueError(
            f"unknown encoding {head!r} in {text!r}; known: {', '.join(sorted(CATALOGUE))}, jordanN, "
            f"learn[:part]; sums a+b (e.g. 'rope+decay'), '|' between per-head groups (e.g. 'rope|alibi')"
        )
    return Part(head, _options(head, fields[1:], text), learn)


def parse_spec(spec: str) -> list[Part]:
    """Split one group ``a+b+…`` into its parts (lower case, spaces ignored)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"encoding spec must be a non-empty string, got {spec!r}")
    if is_schedule_row(spec):
        raise ValueError(f"{spec!r} is a per-layer schedule row: it lays out the whole decoder (every layer's "
                         f"encoding, window and temperature), not one head group's encoding")
    if "|" in spec:
        raise ValueError(f"spec {spec!r} has per-head groups ('|'); split them with split_heads first")
    if spec.strip().lower().startswith(LEARN + ":") and "+" in spec.split(":", 1)[1]:
        raise ValueError(f"{spec!r}: a learned part starts at one part (learn:rope, learn:decay, …), not a sum")
    return [parse_part(p) for p in spec.split("+")]


def _has_rotation(part: Part) -> bool:
    if part.learn and "+" in part.name:
        return True
    return any(part.build(_PROBE_DIM, 1).generator.complex)


def _shares(parts: list[Part], head_dim: int) -> list[int]:
    """Equal shares of the head dim; rotation parts get an even share, the remainder goes last."""
    n = len(parts)
    base = head_dim // n
    even = [_has_rotation(p) for p in parts]
    shares = [base - (base % 2) if e else base for e in even]
    if min(shares) < 1:
        raise ValueError(f"head_dim {head_dim} is too small to split between {n} parts")
    rest = head_dim - sum(shares)
    for i in reversed(range(n)):  # the remainder to the last part that can take it
        if not even[i] or rest % 2 == 0:
            shares[i] += rest
            return shares
    raise ValueError(f"cannot split head_dim {head_dim} between {n} parts: rotation parts need even shares")


def join(parts: list[Encoding], name: str) -> Encoding:
    """The direct sum of ``parts``; a part with slots keeps its content dims and moves its slot block last."""
    if len(parts) == 1:
        return parts[0].replace(name=name)
    gens, slots = [], None
    for enc in parts:
        if enc.num_slots:
            g = enc.generator
            # content dims first: everything but the trailing slot block (the last block of the generator)
            gens.append(Generator(g.rates[..., :-1], g.freqs[..., :-1], g.sizes[:-1], complex=g.complex[:-1]))
            slots = (enc.query_slots, enc.key_slots, Generator(g.rates[..., -1:], g.freqs[..., -1:], g.sizes[-1:]))
        else:
            gens.append(enc.generator)
    if slots is None:
        return Encoding(direct_sum(*gens), name=name)
    qs, ks, g = slots
    return Encoding(direct_sum(*gens, g), query_slots=qs, key_slots=ks, name=name)


class SpecEncoding(nn.Module):
    """One head group's encoding as a module: ``forward() -> Encoding``.

    Fixed parts are built once; learned parts are :class:`~liepos.explore.learned.LearnedGenerator`
    submodules (so their parameters train with the model and DDP synchronises them).
    :meth:`canonical` gives the same encoding as canonical blocks plus the diagonal basis
    ``P = diag(p)`` of the learned couplings, applied as ``q·p`` and ``k/p``:
    ``qᵀ P exp(uJ) P^{-1} k = (Pq)ᵀ exp(uJ) (P^{-1}k)`` for diagonal ``P`` (the cheap way to attend).
    """

    def __init__(self, spec: str, head_dim: int, num_heads: int) -> None:
        from liepos.explore.learned import LearnedGenerator

        super().__init__()
        parts = parse_spec(spec)
        self.name = "".join(spec.lower().split())
        if sum(1 for p in parts if not p.learn and p.build(_PROBE_DIM, 1).num_slots) > 1:
            raise ValueError(f"spec {spec!r} has more than one part with slots (alibi): one slot block fits in a sum")
        shares = [head_dim] if len(parts) == 1 else _shares(parts, head_dim)
        self.head_dim = head_dim
        self.learned = nn.ModuleList()
        self._parts: list[Encoding | int] = []  # a fixed encoding, or the index of a learned module
        for p, dim in zip(parts, shares):
            if p.learn:
                start = from_spec(p.name, dim, num_heads) if "+" in p.name else p.build(dim, num_heads)
                self._parts.append(len(self.learned))
                self.learned.append(LearnedGenerator(start, num_heads, init=p.init))
            else:
                self._parts.append(p.build(dim, num_heads))
        self._static = None if len(self.learned) else join(list(self._parts), self.name)  # type: ignore[arg-type]

    def forward(self) -> Encoding:
        enc, diag = self._joined()
        return enc if diag is None else enc.replace(generator=enc.generator.with_basis(torch.diag(diag)))

    def canonical(self) -> tuple[Encoding, torch.Tensor | None]:
        """``(encoding of the canonical blocks, p in storage order over the head dim, or None)``."""
        enc, diag = self._joined()
        if diag is None:
            return enc, None
        storage = torch.empty_like(diag)
        storage[enc.plan.perm.to(diag.device)] = diag  # storage index perm[c] holds canonical c
        return enc, storage[: self.head_dim]  # the slot dims (trailing) are never coupled

    def _joined(self) -> tuple[Encoding, torch.Tensor | None]:
        """The joined canonical encoding and the basis diagonal in canonical order (None: identity)."""
        if self._static is not None:
            return self._static, None
        encs, diags = [], []
        for p in self._parts:
            if isinstance(p, int):
                gen = cast("LearnedGenerator", self.learned[p])  # __init__ puts only LearnedGenerators there
                enc, d = gen.canonical(), gen.basis_diagonal()
            else:
                enc, d = p, None
            encs.append(enc)
            diags.append(d)
        enc = join(encs, self.name)
        if all(d is None for d in diags):
            return enc, None
        dev = next(d for d in diags if d is not None).device  # the learned parameters' device

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=torch.float64, device=dev)

        diag = [ones(e.generator.dim - e.num_slots) if d is None else d for e, d in zip(encs, diags)]
        slot_dims = enc.generator.dim - sum(len(d) for d in diag)  # the slot block, last in canonical order
        return enc, torch.cat([*diag, ones(slot_dims)])


def from_spec(spec: str | Encoding, head_dim: int, num_heads: int = 1) -> Encoding:
    """The :class:`~liepos.Encoding` named by one group ``spec`` for ``num_heads`` heads of ``head_dim``.

    An :class:`Encoding` passes through unchanged (a learned part: its current value).

    >>> from_spec("jordan3", 8).generator.sizes
    (3, 3, 1, 1)
    >>> from_spec("alibi+alibi", 8, 2)
    Traceback (most recent call last):
    ...
    ValueError: spec 'alibi+alibi' has more than one part with slots (alibi): one slot block fits in a sum
    """
    if isinstance(spec, Encoding):
        return spec
    with torch.no_grad():
        return SpecEncoding(spec, head_dim, num_heads)()


def split_heads(spec: str, num_heads: int) -> list[tuple[int, int, str]]:
    """``'rope|alibi'`` → contiguous head groups ``[(0, h/2, 'rope'), (h/2, h, 'alibi')]``.

    >>> split_heads("rope|alibi", 4)
    [(0, 2, 'rope'), (2, 4, 'alibi')]
    """
    if is_schedule_row(spec):
        raise ValueError(f"{spec!r} is a per-layer schedule row, not head groups: check it with "
                         f"liepos.explore.schedule_rows.check_row")
    groups = [g.strip() for g in str(spec).split("|")]
    if len(groups) > num_heads:
        raise ValueError(f"spec {spec!r} has {len(groups)} head groups but the layer has {num_heads} heads")
    base, extra = divmod(num_heads, len(groups))
    out, h = [], 0
    for i, g in enumerate(groups):
        n = base + (1 if i < extra else 0)
        parse_spec(g)
        out.append((h, h + n, g))
        h += n
    return out

