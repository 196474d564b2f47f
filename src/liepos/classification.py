"""Name every block of a generator by the row of the theory's table of six rows it belongs to.

A generator ``X = P J P^{-1}`` (``J``: canonical real Jordan blocks (rate λ, frequency ω, size n))
gives ``A(u) = exp(uX) = P exp(uJ) P^{-1}``, so the behaviour of ``A(u)`` along the lag is the
behaviour of its blocks, whatever the basis P. Six rows exhaust the possibilities; they are
defined once, in :data:`ROWS` (name, block condition, the theory's words, a colour for figures):

>>> [(r.name, r.block) for r in ROWS][:2]
[('growth', 'λ > 0 (any ω, n)'), ('nope', 'λ = 0, ω = 0, n = 1')]

Zero tests are exact for cheap rational input (the sympy path of
:func:`liepos._jordan.real_jordan`) and use a tolerance relative to the scale of X otherwise
(:func:`classify`).

>>> c = classify([[0, 1], [-1, 0]])      # ints: exact; X = P J P^{-1} with P = I
>>> c.counts['rotation'], c.blocks
(1, [(0.0, 1.0, 1)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from liepos._jordan import real_jordan
from liepos.generator import Generator

__all__ = ["Row", "ROWS", "NAMES", "ROW_COLORS", "row_of", "Classification", "classify",
           "DEFAULT_TOL", "GENERATOR_TOL"]


@dataclass(frozen=True)
class Row:
    """One row of the theory's table of six rows: a kind of canonical block (rate λ, frequency ω, size n).

    Attributes:
        name: the name classify gives the block (a key of ``Classification.counts``).
        block: the condition on (λ, ω, n), as text.
        eigenvalues, behaviour, picture, known_as: the theory's words for the row.
        color: the row's colour in figures (Okabe–Ito, colour-blind safe).
    """

    name: str
    block: str
    eigenvalues: str
    behaviour: str
    picture: str
    known_as: str
    color: str


# The theory's six rows, in the order of their table; every figure, table and count uses these.
ROWS: tuple[Row, ...] = (
    Row("growth", "λ > 0 (any ω, n)", "Re λ > 0", "explodes", "—", "— (forbidden)", "#D55E00"),
    Row("nope", "λ = 0, ω = 0, n = 1", "real, zero", "nothing", "—", "NoPE", "#7F7F7F"),
    Row("decay", "λ < 0, ω = 0, n = 1", "real, negative", "fades", "fade", "decay", "#0072B2"),
    Row("rotation", "λ = 0, ω ≠ 0, n = 1", "imaginary, ±iω", "spins", "circle", "RoPE", "#009E73"),
    Row("damped_rotation", "λ < 0, ω ≠ 0, n = 1", "complex, Re λ < 0", "spins + fades", "spiral",
        "xPos/RetNet", "#CC79A7"),
    Row("polynomial", "λ ≤ 0, n ≥ 2 (any ω)", "defective (n ≥ 2)", "grows polynomially (the slide)",
        "slide", "ALiBi", "#E69F00"),
)
NAMES: tuple[str, ...] = tuple(r.name for r in ROWS)
ROW_COLORS: dict[str, str] = {r.name: r.color for r in ROWS}
_ROW = {r.name: r for r in ROWS}

_EPS = float(np.finfo(np.float64).eps)
# A matrix is taken as known to about 8 digits: its entries may carry noise of sqrt(eps)·‖X‖ (a
# 3×3 Jordan block plus 1e-9 noise is still one polynomial block; an n-fold eigenvalue perturbed
# by δ spreads by δ^(1/n), which the clustering of real_jordan allows for).
DEFAULT_TOL = math.sqrt(_EPS)
# A Generator's blocks are given, not computed: only rounding (64 ulps of the scale) is zero.
GENERATOR_TOL = 64.0 * _EPS

Block = tuple[float, float, int]


def row_of(rate_sign: int, freq_nonzero: bool, size: int) -> str:
    """The name of the row a block belongs to, from the sign of its rate, whether its frequency is
    non-zero, and its size (the conditions of :data:`ROWS`).

    >>> one_per_row = [(1, False, 1), (0, False, 1), (-1, False, 1), (0, True, 1), (-1, True, 1), (0, True, 2)]
    >>> [row_of(*b) for b in one_per_row] == list(NAMES)
    True
    """
    if rate_sign > 0:
        return "growth"
    if size >= 2:
        return "polynomial"
    if freq_nonzero:
        return "rotation" if rate_sign == 0 else "damped_rotation"
    return "nope" if rate_sign == 0 else "decay"


@dataclass
class Classification:
    """The blocks of a generator ``X = P J P^{-1}``, each named by its row of the theory's table of six rows.

    Attributes:
        counts: number of blocks per name, over exactly :data:`NAMES`, in that order.
        blocks: ``(rate, freq, size)`` of every block (``freq >= 0``; over all heads, head-major,
            for a generator with a heads axis).
        names: the name of each block, aligned with ``blocks``.
        dim: the dimension d of X (per head).
        exact: whether the zero tests were exact (rational input through sympy).
        tol: the relative tolerance of the zero tests (see :func:`classify`; 0.0 when exact).
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
        mode = "exact" if self.exact else f"numeric, tol {self.tol:.2g} of the scale"
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
            (name, _ROW[name].eigenvalues, _ROW[name].behaviour, _ROW[name].picture,
             _ROW[name].known_as, str(self.counts[name]), str(dims[name]), self._summary(name))
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
        names.append(row_of(rs, fz, int(n)))
        widths.append(int(n) * (2 if fz else 1))
    counts = dict.fromkeys(NAMES, 0)
    for k in names:
        counts[k] += 1
    return Classification(counts=counts, blocks=blocks, names=names, dim=int(dim),
                          widths=widths, **kw)


def _from_generator(g: Generator, tol: float, **kw) -> Classification:
    """Classify from the canonical parameters, one entry per (head, block).

    With several position axes (``g.num_axes``) a block has a rate and a frequency per axis; it is
    classified jointly: it grows when some axis rate is > 0, fades when every axis rate is ≤ 0 and one
    is < 0, and rotates when some axis frequency is ≠ 0. Its reported rate is the axis rate of largest
    magnitude (the largest positive one when it grows), its frequency the Euclidean norm of the axis
    frequencies."""
    nb, na = g.num_blocks, g.num_axes or 1
    rates = g.rates.detach().to(torch.float64).reshape(-1, na, nb)  # (heads or 1, axes or 1, blocks)
    freqs = g.freqs.detach().to(torch.float64).reshape(-1, na, nb)  # (heads or 1, axes or 1, blocks)
    # the scale of X: its largest rate or frequency, and 1 when a Jordan chain puts ones in X
    scale = max(float(rates.abs().max()), float(freqs.abs().max()), 1.0 if max(g.sizes) > 1 else 0.0)
    zero = tol * scale
    out = []
    for rr, ww in zip(rates.tolist(), freqs.tolist()):  # per head: (axes, blocks) lists
        for i in range(nb):
            lams, oms, n = [r[i] for r in rr], [w[i] for w in ww], g.sizes[i]
            grows = [v for v in lams if v > zero]
            rs = 1 if grows else (-1 if any(v < -zero for v in lams) else 0)
            lam = max(grows) if grows else (min(lams) if rs else 0.0)
            om = math.sqrt(sum(v * v for v in oms))
            fz = om > zero
            if g.complex[i] and not fz:  # a complex block with ω = 0 is two real blocks
                out += [((float(lam), 0.0, n), (rs, False))] * 2
            else:
                out.append(((float(lam), om if fz else 0.0, n), (rs, fz)))
    return _build(out, g.dim, exact=False, tol=float(tol), num_heads=g.num_heads, **kw)


def _num_slots(x: Any) -> int:
    slots = getattr(x, "num_slots", 0)
    try:
        return max(int(slots() if callable(slots) else slots or 0), 0)
    except (TypeError, ValueError):
        return 0


def classify(x: Any, *, tol: float | None = None, exact: bool | None = None) -> Classification:
    """Name the blocks of the generator ``X = P J P^{-1}`` by the rows of the theory's table of six rows.

    What ``tol`` means: a **relative** tolerance, the size of what counts as zero measured against
    the scale of X, so ``classify(c·X, tol=τ)`` names the same blocks for every ``c > 0``.

    * a matrix: X is taken as known to within ``tol·‖X‖_F`` (its backward error, ``noise`` of
      :func:`liepos._jordan.real_jordan`). Eigenvalues whose uncertainty discs (``10·κ·tol·‖X‖``,
      κ the eigenvalue's condition number) touch are one eigenvalue, so an n-fold defective
      eigenvalue split by noise of size ``tol`` (it spreads by ``tol^(1/n)·‖X‖``) is recognised as
      one Jordan block; a rate is 0 when within about ``10·tol·‖X‖`` of 0 (divided by the
      eigenvalue's reciprocal condition number). Default :data:`DEFAULT_TOL` = sqrt(eps) ≈ 1.5e-8:
      X is known to about 8 digits (a 3×3 Jordan block plus 1e-9 noise is ``polynomial``).
      Rational entries (ints, fractions) are decided exactly (sympy) where that is cheap (d ≤ 8
      with rational eigenvalues, d ≤ 4 with simple square roots), as is every matrix with
      ``exact=True``.
    * a Generator or encoding: its blocks are given; a rate or frequency is 0 when within
      ``tol·scale`` of 0, ``scale`` the largest ``|λ|``, ``|ω|`` (and 1 when a block has n ≥ 2).
      Default :data:`GENERATOR_TOL` = 64·eps.

    Args:
        x: a real square matrix (anything :func:`liepos._jordan.real_jordan` takes: numpy, torch of
            any floating dtype, nested lists of floats, ints, fractions or sympy rationals), a
            :class:`liepos.Generator` (its blocks; every head when it has a heads axis), or an
            encoding (any object with a ``.generator`` that is a Generator; its ``num_slots``, if
            any, is reported).
        tol: the relative zero tolerance above (a finite number ≥ 0).
        exact: for a matrix, ``True`` forces the exact sympy path, ``False`` the numeric one.

    Returns:
        a :class:`Classification`; ``str()`` of it is the theory's table of six rows for this generator.

    >>> import numpy as np
    >>> c = classify(np.array([[-0.2, 0.9], [-0.9, -0.2]]))
    >>> c.names, classify(1e200 * np.array([[-0.2, 0.9], [-0.9, -0.2]])).names   # scale-free
    (['damped_rotation'], ['damped_rotation'])
    >>> J = np.diag([1.0, 1.0], 1) + 1e-9 * np.random.default_rng(0).standard_normal((3, 3))
    >>> classify(J).names, classify(J, tol=1e-15).counts['polynomial']  # 1e-9 < sqrt(eps): one block
    (['polynomial'], 0)
    """
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, (int, float)):
            raise TypeError(f"tol must be a real number, got {type(tol).__name__} {tol!r}")
        tol = float(tol)
        if not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    gen = x if isinstance(x, Generator) else (
        None if isinstance(x, torch.Tensor) else getattr(x, "generator", None))
    if isinstance(gen, Generator):
        source = "generator" if gen is x else "encoding"
        return _from_generator(gen, GENERATOR_TOL if tol is None else tol, source=source,
                               num_slots=_num_slots(x) if gen is not x else 0)
    rel = DEFAULT_TOL if tol is None else tol
    form = real_jordan(x, noise=rel, exact=exact)
    return _build(list(zip(form.blocks, form.signs)), form.basis.shape[0], exact=form.exact,
                  tol=0.0 if form.exact else rel, source="matrix")
