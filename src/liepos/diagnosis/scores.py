"""Diagnosis of a black-box *score function*: which property of the family fails, with the evidence.

Some published encodings never factor into a query map and a key map: the score of a pair is built
from both at once (piecewise lags, content-dependent phases, positions counted by content). For those
the black box is the score itself, ``score(q (Sq, d), k (Sk, d), t (Sq,), s (Sk,)) -> (Sq, Sk)`` (the
logits before the softmax; log-weights for a method without one). The family's score is
``qᵀ A(t − s) k`` with ``A(u) = exp(uX)``, so three properties are tested, in this order, and the
first that fails is the verdict:

1. **bilinear and context-free** — ``score(q, k) = qᵀ M(t, s) k`` with ``M(t, s)_ij = score(e_i, e_j)``
   (one pair per call), and a pair's score does not change when other keys are present; else
   :data:`CONTENT_DEPENDENT` (past this test ``M`` is read in one call, all pairs at once);
2. **translation invariant** — ``M(t + c, s + c) = M(t, s)``; else ``not_translation_invariant``;
3. **a homomorphism** — with ``A(u) = M(u, 0)``: ``A(u + 1) = A(u) A(1)`` for every probed lag ``u ≥ 0``;
   else ``group_law``, with the first lag where it breaks (a relative but *piecewise* function of t − s).

A score that passes all three is the integer points of a one-parameter group (``in_family``).

>>> import torch, liepos as lp
>>> enc = lp.rope(4)
>>> rope = lambda q, k, t, s: enc.query(q[None, None], t)[0, 0] @ enc.key(k[None, None], s)[0, 0].T
>>> diagnose_scores(rope, 4).in_family
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from liepos._checks import check_int, check_real
from liepos.diagnosis.report import GROUP_LAW, NOT_TRANSLATION_INVARIANT, Finding

__all__ = ["CONTENT_DEPENDENT", "ScoreFunction", "Verdict", "diagnose_scores"]

CONTENT_DEPENDENT = "content_dependent"

ScoreFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# the translations and the lags probed (causal: t ≥ s), and how far the context test's extra keys reach
_SHIFTS = (1.0, 3.0, 7.0, 50.0)
_LAGS = 48
_EXTRA_KEYS = 3


@dataclass
class Verdict:
    """What :func:`diagnose_scores` found: the first failing property (or none) with its evidence."""

    label: str
    in_family: bool
    relative: bool
    violations: list[Finding] = field(default_factory=list)

    def names(self) -> list[str]:
        return [f.name for f in self.violations]

    def __str__(self) -> str:
        if self.in_family:
            return f"{self.label}: in the family (bilinear, translation invariant, A(u + 1) = A(u) A(1))"
        return f"{self.label}: outside the family — " + "; ".join(str(f) for f in self.violations)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), 1e-300)


class _Probe:
    def __init__(self, score: ScoreFunction, dim: int) -> None:
        self.score, self.dim = score, dim
        self.eye = torch.eye(dim, dtype=torch.float64)

    def pair(self, q: torch.Tensor, k: torch.Tensor, t: float, s: float) -> float:
        one = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
        return float(self.score(q[None], k[None], one(t), one(s)).reshape(()))

    def M(self, t: float, s: float) -> np.ndarray:
        """``M(t, s)_ij = score(e_i, e_j, t, s)``, one pair per call: the bridge matrix of a bilinear score."""
        return np.array([[self.pair(self.eye[i], self.eye[j], t, s) for j in range(self.dim)] for i in range(self.dim)])

    def M_batched(self, t: float, s: float) -> np.ndarray:
        """The same matrix in one call (every e_i against every e_j at once): valid once the score is context-free."""
        d = self.dim
        return self.score(self.eye, self.eye, torch.full((d,), t, dtype=torch.float64),
                          torch.full((d,), s, dtype=torch.float64)).detach().numpy()


def _content(p: _Probe, rng: torch.Generator, tol: float) -> Finding | None:
    """Bilinear in (q, k) at a few (t, s), and free of the other keys; else the finding with its evidence."""
    worst = 0.0
    evidence: tuple[float, float, float, float] | None = None
    for t, s in ((5.0, 2.0), (9.0, 9.0), (30.0, 1.0)):
        M = p.M(t, s)
        for _ in range(2):
            q = torch.randn(p.dim, generator=rng, dtype=torch.float64) * 2
            k = torch.randn(p.dim, generator=rng, dtype=torch.float64) * 2
            got, want = p.pair(q, k, t, s), float(q.numpy() @ M @ k.numpy())
            err = abs(got - want) / max(abs(got), abs(want), 1e-300)
            if err > worst:
                worst, evidence = err, (t, s, got, want)
    if worst > tol and evidence is not None:  # worst > 0: evidence was recorded
        et, es, got, want = evidence
        return Finding(CONTENT_DEPENDENT, f"the score is not bilinear in (q, k): at t={et:g}, s={es:g} a random pair "
                       f"scores {got:.6g} but qᵀM(t, s)k = {want:.6g} (the phase, position or weight depends on "
                       f"the content)", worst)
    q = torch.randn(1, p.dim, generator=rng, dtype=torch.float64)
    k = torch.randn(1 + _EXTRA_KEYS, p.dim, generator=rng, dtype=torch.float64)
    ks = torch.arange(1 + _EXTRA_KEYS, dtype=torch.float64)  # the probed key at 0, others between it and tq
    tq = torch.tensor([float(_EXTRA_KEYS + 1)], dtype=torch.float64)
    alone = float(p.score(q, k[:1], tq, ks[:1])[0, 0])
    among = float(p.score(q, k, tq, ks)[0, 0])
    err = abs(alone - among) / max(abs(alone), abs(among), 1e-300)
    if err > tol:
        return Finding(CONTENT_DEPENDENT, f"a pair's score depends on the other keys: {alone + 0.0:.6g} alone, "
                       f"{among + 0.0:.6g} with {_EXTRA_KEYS} keys between (positions, weights or a temperature "
                       f"counted over the keys)", err)
    return None


def _translation(p: _Probe, tol: float) -> Finding | None:
    worst = 0.0
    where: tuple[float, float, float] | None = None
    for t, s in ((4.0, 1.0), (11.0, 3.0), (20.0, 20.0), (37.0, 2.0)):
        base = p.M_batched(t, s)
        for c in _SHIFTS:
            err = _rel(p.M_batched(t + c, s + c), base)
            if err > worst:
                worst, where = err, (t, s, c)
    if worst > tol and where is not None:  # worst > 0: where was recorded
        t, s, c = where
        return Finding(NOT_TRANSLATION_INVARIANT, f"M(t + c, s + c) ≠ M(t, s): at t={t:g}, s={s:g}, c={c:g} "
                       f"(the score depends on the absolute positions, not on t − s alone)", worst)
    return None


def _group_law(p: _Probe, lags: int, tol: float) -> Finding | None:
    A = [p.M_batched(float(u), 0.0) for u in range(lags + 1)]
    for u in range(lags):
        err = _rel(A[u + 1], A[u] @ A[1])
        if err > tol:
            return Finding(GROUP_LAW, f"relative, but not a one-parameter group: A(u + 1) = A(u) A(1) holds for "
                           f"u < {u} and fails at u = {u} (piecewise in t − s)", err)
    return None


def diagnose_scores(score: ScoreFunction, dim: int, *, label: str | None = None, tol: float = 1e-6,
                    lags: int = _LAGS, seed: int = 0) -> Verdict:
    """Probe a score function and name the first property of the family it fails (module docstring).

    ``lags``: the lags ``0 … lags`` of the group-law test (a piecewise method must break inside them).
    """
    dim = check_int("dim", dim, min=1)
    tol = check_real("tol", tol, positive=True)
    lags = check_int("lags", lags, min=2)
    label = label or getattr(score, "__qualname__", None) or type(score).__name__
    p, rng = _Probe(score, dim), torch.Generator().manual_seed(check_int("seed", seed, min=0))
    found = _content(p, rng, tol)
    if found is not None:
        return Verdict(label, False, False, [found])
    found = _translation(p, tol)
    if found is not None:
        return Verdict(label, False, False, [found])
    found = _group_law(p, lags, tol)
    return Verdict(label, found is None, True, [] if found is None else [found])
