"""The playground: the reader's own generator X, evaluated live in the page from the closed forms.

X is a direct sum of blocks, each written ``(rate λ, frequency ω, size n, coupling c)``: the canonical
block J (rate λ, frequency ω, size n) with its nilpotent part scaled by c, ``X = D J D⁻¹`` with
``D = diag(1, c⁻¹, c⁻², …)`` (each power repeated over a rotation's plane), so c is the superdiagonal of
X (c = 1: the canonical block). Its group is, block by block, with ``m = j − i ≥ 0``,

    A(u)[i, j] = e^{λu} (cu)^m / m! · R(ωu)    (R the 2×2 rotation of the plane; 1 for a real block)

which the page's script (``assets/playground.js``) evaluates in float64 for whatever X the reader
types — no precomputed grid. This module gives the page what it cannot compute itself and the tests
what they compare against: the presets, the liepos values of A(u) for each preset (the page prints
its own distance to them), and YaRN's frequency ratios from :func:`liepos.scaling.yarn`.

>>> import torch
>>> blocks = [(-0.1, 0.5, 2, 2.0), (0.0, 0.0, 2, 1.0)]
>>> X = generator(blocks).matrix()
>>> bool(torch.allclose(exp_blocks(blocks, 1.7), torch.linalg.matrix_exp(1.7 * X), atol=1e-12))  # A(u) = exp(uX)
True
>>> float(X[0, 2]), float(X[4, 5])          # the couplings: X's superdiagonal
(2.0, 1.0)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from liepos.classification import classify
from liepos.generator import Generator

__all__ = ["Block", "PRESETS", "CHECK_U", "YARN", "block_text", "parse_blocks", "generator", "exp_blocks",
           "rows_of", "yarn_reference", "playground"]

f64 = torch.float64
Block = tuple[float, float, int, float]  # (rate, freq, size, coupling)

# preset -> its blocks; each one-block preset lands on the row its name says, the sums show several at once
PRESETS: dict[str, list[Block]] = {
    "RoPE (two planes)": [(0.0, 0.5, 1, 1.0), (0.0, 0.125, 1, 1.0)],
    "NoPE": [(0.0, 0.0, 1, 1.0)],
    "decay": [(-0.1, 0.0, 1, 1.0)],
    "xPos": [(-0.03, 0.5, 1, 1.0)],
    "RetNet": [(-0.1, 0.25, 1, 1.0)],
    "ALiBi's slide": [(0.0, 0.0, 2, 1.0)],
    "Jordan-3, decaying": [(-0.1, 0.0, 3, 1.0)],
    "growth": [(0.1, 0.0, 1, 1.0)],
    "RoPE + slide": [(0.0, 0.5, 1, 1.0), (0.0, 0.0, 2, 0.5)],
    "spiral + Jordan pair": [(-0.05, 0.3, 2, 2.0), (-0.2, 0.0, 1, 1.0)],
}
CHECK_U = 1.7  # the lag at which the page compares its A(u) with liepos's, for every preset
# the scaling panel's default: the setting liepos.scaling.yarn is evaluated at for the page's check
YARN = {"dim": 128, "base": 10000.0, "factor": 8.0, "original": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def block_text(blocks: list[Block]) -> str:
    """The blocks as the page's X field writes them: ``(λ, ω, n, c) + (λ, ω, n, c)``."""
    return " + ".join(f"({r:g}, {w:g}, {n}, {c:g})" for r, w, n, c in blocks)


def parse_blocks(text: str) -> list[Block]:
    """The inverse of :func:`block_text` (the coupling may be left out: 1). ValueError names a bad block.

    >>> parse_blocks("(-0.1, 0.5, 2) + (0, 0, 2, 0.5)")
    [(-0.1, 0.5, 2, 1.0), (0.0, 0.0, 2, 0.5)]
    """
    blocks = []
    for piece in text.split("+"):
        parts = [p for p in piece.strip().strip("()").split(",")]
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"a block must be (rate, frequency, size[, coupling]), got {piece.strip()!r}") from None
        if len(nums) not in (3, 4) or nums[2] != int(nums[2]) or nums[2] < 1:
            raise ValueError(f"a block must be (rate, frequency, size >= 1[, coupling]), got {piece.strip()!r}")
        blocks.append((nums[0], nums[1], int(nums[2]), nums[3] if len(nums) == 4 else 1.0))
    return blocks


def generator(blocks: list[Block]) -> Generator:
    """X of ``blocks`` as a liepos Generator: the canonical blocks and the basis D of the couplings."""
    diag = []
    for _, freq, size, c in blocks:
        if c == 0 and size > 1:
            raise ValueError(f"a coupling must be non-zero for a block of size {size}, got {c}")
        diag += [c ** -j for j in range(size) for _ in range(2 if freq != 0 else 1)]
    growth = any(r > 0 for r, _, _, _ in blocks)
    return Generator([b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks],
                     basis=torch.diag(torch.tensor(diag, dtype=f64)), allow_growth=growth)


def exp_blocks(blocks: list[Block], u: float) -> torch.Tensor:
    """``A(u) = exp(uX)`` computed by liepos (:meth:`Generator.exp`), float64, shape (d, d)."""
    return generator(blocks).exp(torch.tensor([float(u)], dtype=f64))[0].to(f64)


def rows_of(blocks: list[Block]) -> list[str]:
    """The row :func:`liepos.classify` names for each block, in order."""
    return list(classify(generator(blocks)).names)


def yarn_reference() -> dict[str, Any]:
    """YaRN at :data:`YARN` by :func:`liepos.scaling.yarn`: each plane's ω'/ω and the logit scale."""
    from liepos import scaling
    from liepos.catalogue import rope

    y = YARN
    enc = rope(int(y["dim"]), base=y["base"])
    long = scaling.yarn(enc, factor=y["factor"], original_max_position_embeddings=int(y["original"]),
                        beta_fast=y["beta_fast"], beta_slow=y["beta_slow"])
    ratio = (long.generator.freqs / enc.generator.freqs).tolist()  # (planes,)
    return dict(y, ratio=ratio, logit_scale=float(long.logit_scale))


def playground() -> dict[str, Any]:
    """What the page's playground embeds: presets, their rows and liepos's A(CHECK_U), the YaRN check."""
    presets = {}
    for name, blocks in PRESETS.items():
        A = exp_blocks(blocks, CHECK_U)
        assert all(math.isfinite(v) for v in A.reshape(-1).tolist())
        presets[name] = {"text": block_text(blocks), "rows": rows_of(blocks), "A": A.tolist()}
    return {"presets": presets, "check_u": CHECK_U, "yarn": yarn_reference()}
