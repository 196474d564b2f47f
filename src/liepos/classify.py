"""Name every block of a generator by the row of the seeds' table it belongs to.

A generator ``X = P J P^{-1}`` (``J``: canonical real Jordan blocks (rate λ, frequency ω, size n))
gives ``A(u) = exp(uX) = P exp(uJ) P^{-1}``, so the behaviour of ``A(u)`` along the lag is the
behaviour of its blocks, whatever the basis P. Six rows exhaust the possibilities:

* ``growth``: λ > 0 (any ω, n): explodes; forbidden (refused unless asked for);
* ``nope``: λ = 0, ω = 0, n = 1: nothing; NoPE;
* ``decay``: λ < 0, ω = 0, n = 1: fades; decay (linear attention, SSMs);
* ``rotation``: λ = 0, ω ≠ 0, n = 1: spins, the circle; RoPE;
* ``damped_rotation``: λ < 0, ω ≠ 0, n = 1: spins + fades, the spiral; xPos, RetNet;
* ``polynomial``: λ ≤ 0, n ≥ 2 (any ω): grows polynomially, the slide; ALiBi (size 2 with slots).

Zero tests are exact for rational input (the sympy path of :func:`liepos._jordan.real_jordan`)
and use a tolerance for floating-point input.

>>> c = classify([[0, 1], [-1, 0]])      # ints: exact; X = P J P^{-1} with P = I
>>> c.counts['rotation'], c.blocks
(1, [(0.0, 1.0, 1)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from liepos._jordan import _decompose
from liepos.generator import Generator

__all__ = ["Classification", "classify", "NAMES"]

NAMES: tuple[str, ...] = (
    "growth", "nope", "decay", "rotation", "damped_rotation", "polynomial",
)

# name -> (eigenvalues, behaviour, picture, known as): the seeds' table
_ROWS: dict[str, tuple[str, str, str, str]] = {
    "growth": ("Re λ > 0", "explodes", "—", "— (forbidden)"),
    "nope": ("real, zero", "nothing", "—", "NoPE"),
    "decay": ("real, negative", "fades", "fade", "decay"),
    "rotation": ("imaginary, ±iω", "spins", "circle", "RoPE"),
    "damped_rotation": ("complex, Re λ < 0", "spins + fades", "spiral", "xPos/RetNet"),
    "polynomial": ("defective (n ≥ 2)", "grows polynomially (the slide)", "slide", "ALiBi"),
}

Block = tuple[float, float, int]


def _name(rate_sign: int, freq_nonzero: bool, n: int) -> str:
    if rate_sign > 0:
        return "growth"
    if n >= 2:
        return "polynomial"
    if freq_nonzero:
        return "rotation" if rate_sign == 0 else "damped_rotation"
    return "nope" if rate_sign == 0 else "decay"


@dataclass
class Classification:
    """The blocks of a generator ``X = P J P^{-1}``, each named by its row of the seeds' table.

    Attributes:
        counts: number of blocks per name, over exactly :data:`NAMES`, in that order.
        blocks: ``(rate, freq, size)`` of every block (``freq >= 0``; over all heads, head-major,
            for a generator with a heads axis).
        names: the name of each block, aligned with ``blocks``.
        dim: the dimension d of X (per head).
        exact: whether the zero tests were exact (rational input through sympy).
        tol: the tolerance of the zero tests (0.0 when exact).
        num_heads: the heads axis of a generator, or ``None``.
        num_slots: constant slots of an encoding (ALiBi's bias), 0 if none.
        source: ``"matrix"``, ``"generator"`` or ``"encoding"``.

    >>> c = classify(Generator([-0.5, 0.0], [0.0, 0.0], [1, 2]))
    >>> c.counts
    {'growth': 0, 'nope': 0, 'decay': 1, 'rotation': 0, 'damped_rotation': 0, 'polynomial': 1}
    >>> c.names, c.is_relative_safe, c.dominant
    (['decay', 'polynomial'], True, 'polynomial')
    """

    counts: dict[str, int]
    blocks: list[Block]
    names: list[str]
    dim: int
    exact: bool = False
    tol: float = 0.0
    num_heads: int | None = None
    num_slots: int = 0
    source: str = "matrix"
    widths: list[int] = field(default_factory=list, repr=False)

    # ------------------------------------------------------------------ derived
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def dims(self) -> dict[str, int]:
        """Number of dimensions per name (a complex block of size n spans 2n)."""
        out = dict.fromkeys(NAMES, 0)
        for name, width in zip(self.names, self.widths):
            out[name] += width
        return out

    @property
    def is_relative_safe(self) -> bool:
        """No growth block: every ``A(u)`` stays bounded up to polynomial factors for u ≥ 0."""
        return self.counts["growth"] == 0

    @property
    def dominant(self) -> str | None:
        """The name spanning the most dimensions (ties: table order), ``None`` for no blocks."""
        dims = self.dims
        best = max(NAMES, key=lambda k: (dims[k], -NAMES.index(k)))
        return best if dims[best] > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            "counts": dict(self.counts),
            "dims": self.dims,
            "blocks": [[float(r), float(w), int(n)] for r, w, n in self.blocks],
            "names": list(self.names),
            "dim": int(self.dim),
            "exact": bool(self.exact),
            "tol": float(self.tol),
            "num_heads": self.num_heads,
            "num_slots": int(self.num_slots),
            "source": self.source,
            "is_relative_safe": self.is_relative_safe,
            "dominant": self.dominant,
        }

    # ------------------------------------------------------------------ the table
    def _summary(self, name: str) -> str:
        sel = [b for b, k in zip(self.blocks, self.names) if k == name]
        if not sel:
            return "—"

        def rng(vals: list, sym: str) -> str:
            lo, hi = min(vals), max(vals)
            if lo == hi:
                return f"{sym} {lo:.4g}"
            return f"{sym} {lo:.4g} … {hi:.4g}"

        rates = [b[0] for b in sel]
        freqs = [b[1] for b in sel]
        sizes = [b[2] for b in sel]
        parts = []
        if name != "rotation":
            parts.append(rng(rates, "λ"))
        if name in ("rotation", "damped_rotation") or any(f != 0 for f in freqs):
            if name not in ("nope", "decay"):
                parts.append(rng(freqs, "ω"))
        if name in ("polynomial", "growth") and (name == "polynomial" or max(sizes) > 1):
            parts.append(rng(sizes, "n"))
        return "; ".join(parts)

    def __str__(self) -> str:
        mode = "exact" if self.exact else f"numeric, zero tol {self.tol:.2g}"
        heads = "" if self.num_heads is None else f" × {self.num_heads} heads"
        plural = "" if self.num_blocks == 1 else "s"
        title = (
            f"{self.source}: dim {self.dim}{heads}, {self.num_blocks} block{plural} ({mode}); "
            f"relative-safe: {'yes' if self.is_relative_safe else 'no'}"
        )
        header = ("name", "eigenvalues", "behaviour", "picture", "known as", "blocks", "dims",
                  "rates / freqs")
        dims = self.dims
        rows = [
            (name, *_ROWS[name], str(self.counts[name]), str(dims[name]), self._summary(name))
            for name in NAMES
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        right = {5, 6}  # numbers right-aligned

        def fmt(r: tuple[str, ...]) -> str:
            cells = [
                c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)
            ]
            return "  ".join(cells).rstrip()

        lines = [title, fmt(header), "  ".join("-" * w for w in widths)]
        lines += [fmt(r) for r in rows]
        if self.num_slots:
            lines.append(
                f"slots: {self.num_slots} constant slot{'s' if self.num_slots != 1 else ''} "
                f"appended to q and k (the additive bias of ALiBi rides on a polynomial block)"
            )
        if self.dominant is not None:
            lines.append(f"dominant: {self.dominant}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
def _build(blocks_signs, dim, **kw) -> Classification:
    blocks: list[Block] = []
    names: list[str] = []
    widths: list[int] = []
    for (rate, freq, n), (rs, fz) in blocks_signs:
        blocks.append((float(rate), float(freq), int(n)))
        names.append(_name(rs, fz, int(n)))
        widths.append(int(n) * (2 if fz else 1))
    counts = dict.fromkeys(NAMES, 0)
    for k in names:
        counts[k] += 1
    return Classification(counts=counts, blocks=blocks, names=names, dim=int(dim),
                          widths=widths, **kw)


def _from_generator(g: Generator, tol: float | None, **kw) -> Classification:
    nb = g.num_blocks
    rates = g.rates.detach().to(torch.float64).reshape(-1, nb).tolist()
    freqs = g.freqs.detach().to(torch.float64).reshape(-1, nb).tolist()
    if tol is None:
        scale = max([1.0] + [abs(v) for row in rates + freqs for v in row])
        tol = 64.0 * 2.0**-52 * scale
    out = []
    for rr, ww in zip(rates, freqs):
        for i in range(nb):
            lam, om, n = rr[i], ww[i], g.sizes[i]
            rs = 0 if abs(lam) <= tol else (1 if lam > 0 else -1)
            lam = 0.0 if rs == 0 else float(lam)
            fz = abs(om) > tol
            if g.complex[i] and not fz:  # a complex block with ω = 0 is two real blocks
                out += [((lam, 0.0, n), (rs, False))] * 2
            else:
                out.append(((lam, abs(float(om)) if fz else 0.0, n), (rs, fz)))
    return _build(out, g.dim, exact=False, tol=float(tol), num_heads=g.num_heads, **kw)


def classify(x: Any, *, tol: float | None = None) -> Classification:
    """Name the blocks of the generator ``X = P J P^{-1}`` by the rows of the seeds' table.

    Args:
        x: a real square matrix (anything :func:`liepos._jordan.real_jordan` takes: numpy,
            torch, nested lists of floats, ints, fractions or sympy rationals), a
            :class:`liepos.Generator` (its blocks; every head when it has a heads axis), or an
            encoding (any object with a ``.generator`` that is a Generator; its ``num_slots``,
            if any, is reported).
        tol: the zero tolerance: a rate or frequency within ``tol`` of 0 is 0. Default: for a
            matrix, the one of ``real_jordan`` (derived from ``‖X‖`` and float64 eps; exact zero
            tests for rational input); for a generator, ``64·eps·max(1, |λ|, |ω|)``.

    Returns:
        a :class:`Classification`; ``str()`` of it is the seeds' table for this generator.

    >>> import numpy as np
    >>> c = classify(np.array([[-0.2, 0.9], [-0.9, -0.2]]))
    >>> c.names
    ['damped_rotation']
    >>> classify([[0.0, 1.0], [0.0, 0.0]]).counts['polynomial']
    1
    """
    if tol is not None:
        tol = float(tol)
        if not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if isinstance(x, Generator):
        return _from_generator(x, tol, source="generator")
    gen = getattr(x, "generator", None) if not isinstance(x, torch.Tensor) else None
    if isinstance(gen, Generator):
        slots = getattr(x, "num_slots", 0)
        try:
            slots = int(slots() if callable(slots) else slots or 0)
        except (TypeError, ValueError):
            slots = 0
        return _from_generator(gen, tol, source="encoding", num_slots=max(slots, 0))
    blocks, P, info = _decompose(x, tol=tol)
    return _build(list(zip(blocks, info.signs)), P.shape[0], exact=info.exact,
                  tol=float(info.zero_tol), source="matrix")
