"""Encoding spec strings: ``rope``, ``alibi``, ``xpos``, ``nope``, ``decay``, ``jordanN``, ``retnet``, ``a+b``.

``a+b`` splits the head dim between the parts (each part gets an equal share, rotation parts an
even one) and joins their generators with :func:`liepos.direct_sum`, so ``rope+decay`` is half
rotation planes, half fading dims: ``exp(u(X_a ⊕ X_b)) = exp(uX_a) ⊕ exp(uX_b)``.

ALiBi is NoPE content dims plus two constant slots; in a sum its content share stays NoPE and its
slot block goes last (slots must be the trailing dims), so ``rope+alibi`` is half RoPE planes, half
plain dims, plus the ALiBi bias. At most one ``alibi`` per sum.

ALiBi slopes are Press et al.'s; :func:`liepos.attention` adds the slots' bias ``−m_h (t − s)``
after the ``1/√d`` scaling of ``q·k``, as they do.

>>> enc = from_spec("rope+decay", 16, 2)
>>> enc.content_dim, enc.name
(16, 'rope+decay')
"""

from __future__ import annotations

import re


import liepos as lp
from liepos.catalogue import _jordan_bank, default_decay_rates
from liepos.encoding import Encoding

__all__ = ["from_spec", "parse_spec", "SPEC_NAMES", "split_heads"]

SPEC_NAMES = ("rope", "alibi", "xpos", "nope", "decay", "jordanN", "retnet")
_EVEN = {"rope", "xpos", "retnet"}
_JORDAN = re.compile(r"^jordan(\d+)$")


def parse_spec(spec: str) -> list[str]:
    """Split ``a+b+…`` into validated part names (lower case, spaces ignored)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"encoding spec must be a non-empty string, got {spec!r}")
    parts = [p.strip().lower() for p in spec.split("+")]
    for p in parts:
        if p in ("rope", "alibi", "xpos", "nope", "decay", "retnet"):
            continue
        m = _JORDAN.match(p)
        if m and int(m.group(1)) >= 1:
            continue
        raise ValueError(
            f"unknown encoding {p!r} in spec {spec!r}; known: {', '.join(SPEC_NAMES)} and sums a+b "
            f"(e.g. 'rope+decay'), with '|' between per-head groups (e.g. 'rope|alibi')"
        )
    if parts.count("alibi") > 1:
        raise ValueError(f"spec {spec!r} has more than one 'alibi': only one slot block fits in a sum")
    return parts


def _press_alibi(num_heads: int, head_dim: int) -> Encoding:
    """Press et al.'s ALiBi: ``lp.attention`` adds the slots' bias ``−m_h (t − s)`` unscaled."""
    return lp.alibi(num_heads, head_dim)


def _single(name: str, dim: int, num_heads: int) -> Encoding:
    if name == "rope":
        return lp.rope(dim)
    if name == "xpos":
        return lp.xpos(dim)
    if name == "nope":
        return lp.nope(dim)
    if name == "decay":
        return lp.decay(default_decay_rates(dim))
    if name == "retnet":
        return lp.retnet(num_heads, dim)
    if name == "alibi":
        return _press_alibi(num_heads, dim)
    size = int(_JORDAN.match(name).group(1))  # type: ignore[union-attr]
    if size > dim:
        raise ValueError(f"jordan{size} needs at least {size} dims but its share of the head dim is {dim}")
    return _jordan_bank(dim, num_heads, size=size)


def _shares(parts: list[str], head_dim: int) -> list[int]:
    """Equal shares of the head dim; rotation parts get an even share, the remainder goes last."""
    n = len(parts)
    base = head_dim // n
    shares = []
    for p in parts:
        s = base - (base % 2) if p in _EVEN else base
        if s < 1:
            raise ValueError(f"head_dim {head_dim} is too small to split between {n} parts {parts}")
        shares.append(s)
    rest = head_dim - sum(shares)
    # give the remainder to the last part that can take it (odd leftovers to a non-rotation part)
    for i in reversed(range(n)):
        if parts[i] not in _EVEN or rest % 2 == 0:
            shares[i] += rest
            rest = 0
            break
    if rest:
        raise ValueError(
            f"cannot split head_dim {head_dim} between {parts}: rotation parts need even shares and "
            f"no other part takes the odd remainder"
        )
    return shares


def from_spec(spec: str | Encoding, head_dim: int, num_heads: int = 1) -> Encoding:
    """Build the :class:`~liepos.Encoding` named by ``spec`` for ``num_heads`` heads of ``head_dim``.

    An :class:`Encoding` passes through unchanged. ``a+b`` is the direct sum of the parts on equal
    shares of the head dim (see the module docstring for ALiBi's slots).

    >>> from_spec("jordan3", 8).generator.sizes
    (3, 3, 1, 1)
    >>> from_spec("alibi+alibi", 8, 2)
    Traceback (most recent call last):
    ...
    ValueError: spec 'alibi+alibi' has more than one 'alibi': only one slot block fits in a sum
    """
    if isinstance(spec, Encoding):
        return spec
    if "|" in str(spec):
        raise ValueError(f"spec {spec!r} has per-head groups ('|'); build each group with from_spec separately")
    parts = parse_spec(spec)
    name = "+".join(parts)
    if len(parts) == 1:
        enc = _single(parts[0], head_dim, num_heads)
        return enc.replace(name=name)
    shares = _shares(parts, head_dim)
    gens = []
    slots = None
    for p, dim in zip(parts, shares):
        enc = _single(p, dim, num_heads)
        if p == "alibi":
            # content dims (NoPE) stay in place; the slot block and its constants move to the end
            gens.append(lp.nope(dim).generator)
            slots = (enc.query_slots, enc.key_slots, enc.generator)
        else:
            gens.append(enc.generator)
    if slots is not None:
        qs, ks, g = slots
        # the alibi generator is nope(dim) ⊕ N₂: its last block is the 2×2 slide
        gens.append(lp.Generator(g.rates[..., -1:], g.freqs[..., -1:], [2]))
        return Encoding(lp.direct_sum(*gens), query_slots=qs, key_slots=ks, name=name)
    return Encoding(lp.direct_sum(*gens), name=name)


def split_heads(spec: str, num_heads: int) -> list[tuple[int, int, str]]:
    """``'rope|alibi'`` → contiguous head groups ``[(0, h/2, 'rope'), (h/2, h, 'alibi')]``.

    >>> split_heads("rope|alibi", 4)
    [(0, 2, 'rope'), (2, 4, 'alibi')]
    """
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
