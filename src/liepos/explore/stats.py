"""Bootstrap intervals over documents and seeds (numpy, a fixed seed): every Δ of the study with its 95 % interval.

A cell of the study is a mean over seeds ``s`` of a token-weighted mean over documents ``d``::

    m = mean_s  Σ_d a[s, d] / Σ_d n[d]

(``a`` a sum of token losses per document, or the paired difference of two lengths' sums; ``n``
the tokens counted, the same for every seed since the documents are). The interval resamples the
seeds and the documents independently, with replacement (a two-way bootstrap: both are random
draws), :data:`REPS` times from ``numpy.random.default_rng(SEED)``, and takes the 2.5 and 97.5
percentiles. With one seed only the documents are resampled.

>>> import numpy as np
>>> a = np.zeros((3, 10)); n = np.ones(10)
>>> interval(a, n)  # a difference that is 0 in every document and seed
(0.0, 0.0, 0.0)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LEVEL", "REPS", "SEED", "binomial_interval", "ci", "headline", "interval"]

REPS = 2000
SEED = 0
LEVEL = 0.95


def interval(a, n, reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """``(estimate, low, high)``: ``mean_s Σ_d a[s, d] / Σ_d n[d]`` and its bootstrap 95 % interval.

    ``a`` is ``(seeds, documents)``, ``n`` is ``(documents,)``. NaN in ``a`` (a diverged length) gives NaN."""
    a = np.asarray(a, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if a.ndim != 2 or n.shape != (a.shape[1],):
        raise ValueError(f"a must be (seeds, documents) and n (documents,), got {a.shape} and {n.shape}")
    if a.size == 0 or not np.isfinite(a).all():
        nan = float("nan")
        return nan, nan, nan
    S, D = a.shape
    est = float((a.sum(1) / n.sum()).mean())
    rng = np.random.default_rng(seed)
    docs = rng.integers(D, size=(reps, D))  # (reps, D)
    seeds = rng.integers(S, size=(reps, S)) if S > 1 else np.zeros((reps, 1), dtype=np.int64)  # (reps, S)
    per_seed = a[:, docs].sum(-1) / n[docs].sum(-1)  # (S, reps): each seed on the resampled documents
    boot = np.take_along_axis(per_seed.T, seeds, axis=1).mean(1)  # (reps,)
    lo, hi = np.percentile(boot, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return est, float(lo), float(hi)


def binomial_interval(correct, count, reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """Accuracy ``mean_s c_s / n_s`` over seeds and its interval: seeds resampled, then each seed's
    count redrawn ``Binomial(n_s, c_s / n_s)`` (the probes are independent draws)."""
    c = np.asarray(correct, dtype=np.float64)
    n = np.asarray(count, dtype=np.float64)
    keep = n > 0
    c, n = c[keep], n[keep]
    if c.size == 0:
        nan = float("nan")
        return nan, nan, nan
    est = float((c / n).mean())
    rng = np.random.default_rng(seed)
    S = len(c)
    pick = rng.integers(S, size=(reps, S))  # (reps, S)
    draws = rng.binomial(n[pick].astype(np.int64), (c / n)[pick]) / n[pick]  # (reps, S)
    lo, hi = np.percentile(draws.mean(1), [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return est, float(lo), float(hi)


def ci(t, signed: bool = False, digits: int = 3) -> str:
    """``'2.051 [2.031, 2.072]'`` for ``(estimate, low, high)``; ``—`` for nothing, ``diverged`` for NaN."""
    if t is None:
        return "—"
    est, lo, hi = t[:3]
    if not math.isfinite(est):
        return "diverged"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    if lo == est == hi:
        return f.format(est)
    return f"{f.format(est)} [{f.format(lo)}, {f.format(hi)}]"


def headline(cfg: dict) -> int:
    """The length the study's headline compares with the training length: 16× it if evaluated, else the longest."""
    far = 16 * cfg["train_len"]
    return far if far in cfg["eval_lens"] else max(cfg["eval_lens"])
