"""Published encodings outside the family, each as a reference score function, and why each is outside.

Every entry of :data:`OUTSIDE` builds ``score(q (Sq, d), k (Sk, d), t (Sq,), s (Sk,)) -> (Sq, Sk)`` from
its paper's formulas (reimplemented here: none of these ships a package liepos could call), with small
fixed parameters so that :func:`liepos.diagnosis.scores.diagnose_scores` finds the failing property
inside its probes. Ids are namespaced where names clash: ``cope_contextual`` (Golovneva et al.) is not
the catalogue's ``cope_clipped`` (clipped RoPE, in the family), and ``string_hkunlp`` (shifted RoPE) is
not Google's STRING (Schenck et al., RoPE in a learned orthogonal basis: in the family, the catalogue's
``string_google`` and :class:`liepos.LearnableGenerator` with ``basis="orthogonal"``).

>>> from liepos.diagnosis.scores import diagnose_scores
>>> m = OUTSIDE["rerope"]
>>> diagnose_scores(m.build(8), 8).names() == [m.fails]
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from liepos._checks import check_int
from liepos.diagnosis.report import GROUP_LAW, NOT_TRANSLATION_INVARIANT
from liepos.diagnosis.scores import CONTENT_DEPENDENT, ScoreFunction

__all__ = ["OUTSIDE", "OutsideMethod", "string_hkunlp", "self_extend", "rerope", "carope", "cope_contextual",
           "tapa", "stick_breaking", "fope", "fope_encoders"]

# a small RoPE base, so that every plane turns visibly within the probed lags
_BASE = 100.0


def _freqs(dim: int, base: float = _BASE) -> torch.Tensor:
    dim = check_int("dim", dim, min=2, even=True)
    return base ** (-2.0 * torch.arange(dim // 2, dtype=torch.float64) / dim)  # (P,)


def _rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved planes (2p, 2p+1) of ``x (S, d)`` by ``theta (S, P)`` counter-clockwise."""
    a, b = x[:, 0::2], x[:, 1::2]  # (S, P)
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(x.shape)  # (S, P, 2) -> (S, d)


def _lag_scores(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RoPE's score at an arbitrary lag per pair: ``q_iᵀ A(r_ij) k_j`` with ``A(r) = ⊕ R(−ω r)``, r ``(Sq, Sk)``."""
    qa, qb, ka, kb = q[:, None, 0::2], q[:, None, 1::2], k[None, :, 0::2], k[None, :, 1::2]  # (Sq|1, Sk|1, P)
    phase = r[..., None] * w  # (Sq, Sk, P)
    return ((qa * ka + qb * kb) * torch.cos(phase) + (qa * kb - qb * ka) * torch.sin(phase)).sum(-1)


def _lags(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return t[:, None] - s[None, :]  # (Sq, Sk)


def string_hkunlp(dim: int, shift: int = 12, window: int = 4) -> ScoreFunction:
    """STRING (An et al., "Why does the effective context length of LLMs fall short?", arXiv 2410.18745):
    relative positions at or beyond ``shift`` are moved back onto well-trained ones,
    ``r ↦ r − shift + window`` (a local ``window`` kept), the others kept. A function of t − s, piecewise."""
    w = _freqs(dim)

    def score(q, k, t, s):
        r = _lags(t, s)
        return _lag_scores(q, k, torch.where(r >= shift, r - shift + window, r), w)

    return score


def self_extend(dim: int, group: int = 4, neighbor: int = 8) -> ScoreFunction:
    """Self-Extend (Jin et al., "LLM Maybe LongLM", arXiv 2401.01325): neighbours keep their lag, far tokens get
    the grouped lag ``⌊t/G⌋ − ⌊s/G⌋ + W − ⌊W/G⌋`` (G = ``group``, W = ``neighbor``): the floors break the shift."""
    w = _freqs(dim)

    def score(q, k, t, s):
        r = _lags(t, s)
        far = torch.floor(t / group)[:, None] - torch.floor(s / group)[None, :] + neighbor - neighbor // group
        return _lag_scores(q, k, torch.where(r < neighbor, r, far), w)

    return score


def rerope(dim: int, window: int = 8) -> ScoreFunction:
    """ReRoPE (Su, 2023, kexue.fm/archives/9708): lags beyond ``window`` are clipped to it, ``r ↦ min(r, W)``."""
    w = _freqs(dim)
    return lambda q, k, t, s: _lag_scores(q, k, _lags(t, s).clamp(max=float(window)), w)


def carope(dim: int, seed: int = 0) -> ScoreFunction:
    """CARoPE (Veisi & Mansourian, arXiv 2507.23083): the frequency is a bounded function of the token,
    ``ω_k f(x)`` with ``f(x) = 1/(1 + softplus(aᵀx))``, and the phase is ``t · ω_k f(x_t)`` (not a cumulative
    sum, so not a learned clock): queries and keys rotate at content-dependent speeds."""
    w = _freqs(dim)
    a = torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def rot(x, pos):
        f = 1.0 / (1.0 + torch.nn.functional.softplus(x @ a))  # (S,)
        return _rotate(x, pos[:, None] * f[:, None] * w)  # phase (S, P)

    return lambda q, k, t, s: rot(q, t) @ rot(k, s).T


def cope_contextual(dim: int, positions: int = 16, seed: int = 0) -> ScoreFunction:
    """Contextual Position Encoding (Golovneva et al., arXiv 2405.18719): gates ``g_ij = σ(q_iᵀk_j)``, positions
    ``p_ij = Σ_{j ≤ m ≤ i} g_im`` counted over the visible keys, a learned table e interpolated at ``p_ij``, and
    logits ``q_iᵀk_j + q_iᵀ e(p_ij)``: positions counted by content."""
    E = torch.randn(positions + 1, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def score(q, k, t, s):
        vis = (s[None, :] <= t[:, None]).to(torch.float64)  # (Sq, Sk), keys in time order
        g = torch.sigmoid(q @ k.T) * vis
        p = g.flip(-1).cumsum(-1).flip(-1).clamp(max=float(positions))  # p_ij = Σ_{m ≥ j} g_im
        lo = p.floor().long()
        hi = (lo + 1).clamp(max=positions)
        frac = (p - lo)[..., None]
        e = E[lo] * (1 - frac) + E[hi] * frac  # (Sq, Sk, d)
        return (q @ k.T + (q[:, None, :] * e).sum(-1)).masked_fill(vis == 0, float("-inf"))

    return score


def tapa(dim: int, length: float = 64.0, seed: int = 0) -> ScoreFunction:
    """TAPA (Token-Aware Phase Attention, arXiv 2509.12635): an amplitude part of the head times the cosine of a
    phase that is a learned function of (q, k) times the distance: ``(q_aᵀk_a) cos((q_pᵀ W k_p)(t − s)/L)``."""
    h = check_int("dim", dim, min=2, even=True) // 2
    W = torch.randn(h, h, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def score(q, k, t, s):
        phase = (q[:, h:] @ W @ k[:, h:].T) * _lags(t, s) / length
        return (q[:, :h] @ k[:, :h].T) * torch.cos(phase)

    return score


def stick_breaking(dim: int) -> ScoreFunction:
    """Stick-breaking attention (Tan et al., arXiv 2410.17980): ``w_ij = β_ij Π_{s_j < s_m < t_i} (1 − β_im)``,
    ``β = σ(qᵀk/√d)``, no softmax; the black box returns ``log w`` (each weight depends on the keys between)."""

    def score(q, k, t, s):
        logit = q @ k.T / dim**0.5
        log_beta, log_rest = torch.nn.functional.logsigmoid(logit), torch.nn.functional.logsigmoid(-logit)
        between = (s[None, None, :] > s[None, :, None]) & (s[None, None, :] < t[:, None, None])  # (Sq, j, m)
        return log_beta + (between * log_rest[:, None, :]).sum(-1)

    return score


def fope_encoders(dim: int, terms: int = 3, seed: int = 0) -> tuple[Callable, Callable]:
    """FoPE (Fourier Position Embedding, Hua et al., arXiv 2412.17739) as query and key maps: each plane is a
    Fourier series, ``F(t) x_k = Σ_m a_km R(ω_km t) x_k`` (``ω_k0`` RoPE's, the others random): the cross terms
    ``R(ω t)ᵀ R(ω' s)`` with ω ≠ ω' depend on t and s apart. ``(x (B, H, S, d), t (S,)) -> (B, H, S, d)``."""
    g = torch.Generator().manual_seed(seed)
    P = check_int("dim", dim, min=2, even=True) // 2
    w = torch.cat([_freqs(dim)[:, None], torch.rand(P, terms - 1, generator=g, dtype=torch.float64)], 1)  # (P, M)
    a = torch.cat([torch.ones(P, 1, dtype=torch.float64), 0.3 * torch.randn(P, terms - 1, generator=g,
                                                                              dtype=torch.float64)], 1)

    def encode(x, positions):
        pos = torch.as_tensor(positions, dtype=torch.float64)
        flat = x.reshape(-1, x.shape[-2], dim)  # (B·H, S, d)
        out = sum(a[:, m] .repeat_interleave(2) * torch.stack([_rotate(f, pos[:, None] * w[:, m]) for f in flat])
                  for m in range(terms))
        return out.reshape(x.shape)

    return encode, encode


def fope(dim: int, terms: int = 3, seed: int = 0) -> ScoreFunction:
    """FoPE's score ``(F(t) q)ᵀ (F(s) k)`` (:func:`fope_encoders`)."""
    enc, _ = fope_encoders(dim, terms, seed)
    return lambda q, k, t, s: enc(q[None, None], t)[0, 0] @ enc(k[None, None], s)[0, 0].T


@dataclass(frozen=True)
class OutsideMethod:
    """An outside method: its score function builder ``build(dim)``, reference, and the property it fails."""

    build: Callable[[int], ScoreFunction]
    paper: str
    fails: str
    why: str


OUTSIDE: dict[str, OutsideMethod] = {
    "string_hkunlp": OutsideMethod(string_hkunlp, "An et al., 2024 (STRING, arXiv 2410.18745)", GROUP_LAW,
                                   "relative but piecewise in t − s: the shifted lags are no group"),
    "self_extend": OutsideMethod(self_extend, "Jin et al., 2024 (Self-Extend, arXiv 2401.01325)",
                                 NOT_TRANSLATION_INVARIANT, "floor-grouped positions depend on t and s apart"),
    "rerope": OutsideMethod(rerope, "Su, 2023 (ReRoPE)", GROUP_LAW, "the clipped lag min(t − s, W) is no group"),
    "carope": OutsideMethod(carope, "Veisi & Mansourian, 2025 (CARoPE, arXiv 2507.23083)", CONTENT_DEPENDENT,
                            "the phase t·f(x_t) depends on the token"),
    "cope_contextual": OutsideMethod(cope_contextual, "Golovneva et al., 2024 (contextual CoPE, arXiv 2405.18719)",
                                     CONTENT_DEPENDENT, "positions are counted by content gates"),
    "tapa": OutsideMethod(tapa, "TAPA, 2025 (arXiv 2509.12635)", CONTENT_DEPENDENT,
                          "the phase is a function of the (q, k) pair"),
    "stick_breaking": OutsideMethod(stick_breaking, "Tan et al., 2024 (stick-breaking attention, arXiv 2410.17980)",
                                    CONTENT_DEPENDENT, "each weight depends on the keys between"),
    "fope": OutsideMethod(fope, "Hua et al., 2024 (FoPE, arXiv 2412.17739)", NOT_TRANSLATION_INVARIANT,
                          "several frequencies per plane: cross terms depend on t and s apart"),
}
"""Every outside method by namespaced id."""
