"""A learned generator for the explorer: every block's rate, frequency and Jordan coupling train with the model.

It starts at a catalogue encoding (``learn:rope``, ``learn:decay``, ``learn:jordan3`` …), keeps that
block structure (sizes, which blocks rotate) and frees the parameters, mapped onto the family by
construction so no optimiser step can leave it:

* rate ``λ = −exp(a) < 0`` (decay side; the growth row is never entered), per head and block;
* frequency ``ω = exp(b) > 0`` for rotating blocks, per head and block;
* coupling ``c = C^tanh(e) ∈ (1/C, C)`` per Jordan block of size n ≥ 2 (``C`` = :data:`COUPLING_RANGE`):
  the block is ``λI + cN``, written as the canonical block in the diagonal basis ``P = diag(c^{−j})``,
  because ``P (λI + N) P^{-1} = λI + cN`` — similar to the canonical block, so still in the family.

>>> import torch, liepos as lp
>>> g = LearnedGenerator(lp.CATALOGUE["jordan"].build(3, size=3), 1)
>>> with torch.no_grad():
...     _ = g.raw_coupling.fill_(0.5)
...     X = g().generator.matrix()[0]  # head 0: λI + cN
>>> c = COUPLING_RANGE ** math.tanh(0.5)
>>> bool(torch.allclose(X.diagonal(1), torch.full((2,), c, dtype=X.dtype)))
True
"""

from __future__ import annotations

import math

import torch
from torch import nn

from liepos.classification import classify
from liepos.encoding import Encoding
from liepos.generator import Generator

__all__ = ["COUPLING_RANGE", "INITS", "MIN_MAGNITUDE", "RANDOM_RANGE", "LearnedGenerator", "row_counts", "snapshot"]

# a Jordan coupling stays within (1/100, 100): the basis diag(c^{-j}) of a size-5 block then has a
# condition number below 100⁴ = 1e8, well inside what Generator accepts (1e12)
COUPLING_RANGE = 100.0
# a zero rate or frequency of the starting point (NoPE dims, RoPE's λ = 0) starts at this magnitude,
# as the log-parametrisation cannot hold an exact zero: e^{-1e-6·u} stays within 1e-3 of 1 up to u = 1000
MIN_MAGNITUDE = 1e-6


# ``init`` of a learned generator: its start's values, every rate and frequency at MIN_MAGNITUDE
# (NoPE in the start's block structure), or log-uniform random in RANDOM_RANGE
INITS = ("start", "nope", "random")
RANDOM_RANGE = {"rate": (1e-4, 1e-1), "freq": (1e-3, 1.0)}


class LearnedGenerator(nn.Module):
    """``LearnedGenerator(start, num_heads, init="start")``; ``forward() -> Encoding`` whose tables carry gradients.

    ``init="nope"`` keeps ``start``'s blocks but sets every rate and frequency to
    :data:`MIN_MAGNITUDE` (within 1e-3 of NoPE up to 1,000 tokens); ``"random"`` draws each from
    a log-uniform law over :data:`RANDOM_RANGE` (torch's global generator: the model's seed)."""

    def __init__(self, start: Encoding, num_heads: int, init: str = "start") -> None:
        super().__init__()
        g = start.generator
        if start.num_slots:
            raise ValueError(f"cannot learn {start.name!r}: its constant slots (ALiBi) have no rate or frequency")
        if g.allow_growth or g.basis is not None:
            raise ValueError(f"cannot learn {start.name!r}: a learned generator starts on the decay side, "
                             f"in the canonical basis (rates λ = −exp(a) ≤ 0)")
        self.sizes, self.complex, self.name, self.layout = g.sizes, g.complex, start.name, start.layout
        nb = len(g.sizes)
        rates = g.rates.detach().to(torch.float64).expand(num_heads, nb)  # (H, blocks)
        freqs = g.freqs.detach().to(torch.float64).expand(num_heads, nb)  # (H, blocks)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.init = init
        a = torch.log((-rates).clamp_min(MIN_MAGNITUDE))  # (H, blocks)
        self.rotating = [i for i, c in enumerate(g.complex) if c]
        self.coupled = [i for i, n in enumerate(g.sizes) if n > 1]
        # no empty parameters (DDP would wait for their gradients): None where no block rotates / couples
        w = torch.log(freqs[:, self.rotating].abs().clamp_min(MIN_MAGNITUDE))  # (H, rotating blocks)
        if init == "nope":
            a, w = torch.full_like(a, math.log(MIN_MAGNITUDE)), torch.full_like(w, math.log(MIN_MAGNITUDE))
        elif init == "random":
            def draw(like: torch.Tensor, low: float, high: float) -> torch.Tensor:
                u = torch.rand(like.shape, dtype=torch.float64)
                return math.log(low) + u * (math.log(high) - math.log(low))

            a, w = draw(a, *RANDOM_RANGE["rate"]), draw(w, *RANDOM_RANGE["freq"])
        self.raw_rate = nn.Parameter(a.clone())
        self.raw_freq = nn.Parameter(w) if self.rotating else None
        self.raw_coupling = nn.Parameter(torch.zeros(len(self.coupled), dtype=torch.float64)) if self.coupled else None

    def rates(self) -> torch.Tensor:
        """``λ = −exp(a)``, shape ``(heads, blocks)``."""
        return -torch.exp(self.raw_rate)

    def freqs(self) -> torch.Tensor:
        """``ω``, shape ``(heads, blocks)``: ``exp(b)`` on rotating blocks, 0 on real ones."""
        w = torch.zeros_like(self.raw_rate)
        if self.raw_freq is None:  # no rotating block (__init__ sets raw_freq exactly when self.rotating)
            return w
        dev = w.device
        return w.index_put((torch.arange(w.shape[0], device=dev)[:, None],
                            torch.tensor(self.rotating, dtype=torch.long, device=dev)),
                           torch.exp(self.raw_freq))

    def couplings(self) -> torch.Tensor:
        """``c ∈ (1/C, C)`` per Jordan block of size ≥ 2 (in block order)."""
        if self.raw_coupling is None:
            return torch.zeros(0, dtype=torch.float64, device=self.raw_rate.device)
        return COUPLING_RANGE ** torch.tanh(self.raw_coupling)

    def basis(self) -> torch.Tensor | None:
        """``P = diag(c^{−j})`` over each coupled block's sub-blocks (identity elsewhere), or ``None``."""
        d = self.basis_diagonal()
        return None if d is None else torch.diag(d)

    def basis_diagonal(self) -> torch.Tensor | None:
        """The diagonal of :meth:`basis`, in canonical order, or ``None`` when no block is coupled."""
        if not self.coupled:
            return None
        c = iter(self.couplings())
        scales = []
        for n, cplx in zip(self.sizes, self.complex):
            w = 2 if cplx else 1
            if n == 1:
                scales.append(torch.ones(w, dtype=torch.float64, device=self.raw_rate.device))
                continue
            cb = next(c)
            # j for each of the n·w dims
            powers = torch.arange(n, dtype=torch.float64, device=self.raw_rate.device).repeat_interleave(w)
            scales.append(cb ** (-powers))
        return torch.cat(scales)

    def forward(self) -> Encoding:
        """The learned encoding ``X = P J P^{-1}`` (its basis ``P`` carries the couplings)."""
        gen = Generator(self.rates(), self.freqs(), self.sizes, complex=self.complex, basis=self.basis())
        return Encoding(gen, layout=self.layout, name=f"learn:{self.name}")

    def canonical(self) -> Encoding:
        """The encoding of the canonical blocks ``J`` alone (``P`` left out: see :meth:`basis_diagonal`)."""
        gen = Generator(self.rates(), self.freqs(), self.sizes, complex=self.complex)
        return Encoding(gen, layout=self.layout, name=f"learn:{self.name}")


def row_counts(blocks, tol: float = 0.0) -> dict[str, int]:
    """The six rows' counts of blocks ``(λ, ω, n)``, a rate or frequency with ``|·| < tol`` counting as 0.

    ``tol`` is absolute (``lp.classify``'s own is relative to the largest rate or frequency, which
    would call a NoPE start of 1e-6 everywhere a damped rotation).

    >>> row_counts([(-1e-6, 1e-6, 1), (-0.1, 0.0, 1), (0.0, 0.5, 1), (-1e-6, 0.0, 3)], tol=1e-4)["nope"]
    1
    """
    counts = dict.fromkeys(classify([[0.0]]).counts, 0)
    if not blocks:
        return counts
    lam = [0.0 if abs(b[0]) < tol else float(b[0]) for b in blocks]
    om = [0.0 if abs(b[1]) < tol else float(b[1]) for b in blocks]
    g = Generator(lam, om, [int(b[2]) for b in blocks], complex=[w != 0.0 for w in om])
    for name, n in classify(g).counts.items():
        counts[name] += n
    return counts


def snapshot(module: LearnedGenerator, tol: float | None = None) -> dict:
    """The current blocks ``(rate, freq, size)`` per head, the couplings and the six rows' counts.

    ``counts`` come from :func:`row_counts` of every head's blocks, a rate or frequency within
    ``tol`` of 0 counting as 0 (absolute)."""
    with torch.no_grad():
        rates, freqs = module.rates(), module.freqs()
        blocks = [[(float(rates[h, i]), float(freqs[h, i]), int(n)) for i, n in enumerate(module.sizes)]
                  for h in range(rates.shape[0])]
        return {"blocks": blocks, "couplings": [float(c) for c in module.couplings()],
                "counts": row_counts([b for head in blocks for b in head], tol or 0.0)}
