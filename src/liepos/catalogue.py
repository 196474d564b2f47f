"""The catalogue: named points of the design space, each an :class:`~liepos.Encoding`.

Every entry is a generator X (plus slots for ALiBi); every one satisfies the same identity
``enc.query(q, t)ᵀ enc.key(k, s) = qᵀ exp((t − s) X) k``. :data:`CATALOGUE` is a plain dict with
one signature, ``build(head_dim, num_heads=1, **options) -> Encoding``; the functions below keep
their natural signatures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum

__all__ = [
    "nope", "decay", "rope", "xpos", "retnet", "alibi", "jordan",
    "alibi_slopes", "rope_freqs", "CATALOGUE", "CatalogueEntry", "build",
]


def _check_dim(dim: int, name: str = "dim", even: bool = False) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {dim!r}")
    if dim < 1:
        raise ValueError(f"{name} must be positive, got {dim}")
    if even and dim % 2:
        raise ValueError(f"{name} must be even (rotation planes come in pairs of dims), got {dim}")
    return dim


def _check_positive(x: float, name: str) -> float:
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{name} must be positive and finite, got {x}")
    return x


def rope_freqs(dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE frequencies ``ω_k = base^(−2k/dim)``, k = 0 … dim/2 − 1, in float64.

    >>> [round(float(w), 4) for w in rope_freqs(16)[:3]]
    [1.0, 0.3162, 0.1]
    """
    _check_dim(dim, even=True)
    base = _check_positive(base, "base")
    k = torch.arange(dim // 2, dtype=torch.float64)
    return base ** (-2.0 * k / dim)


def nope(dim: int) -> Encoding:
    """NoPE: X = 0, A(u) = I. Scores ignore position (a causal mask still reveals order).

    >>> nope(4).generator.is_orthogonal
    True
    """
    _check_dim(dim)
    z = torch.zeros(dim, dtype=torch.float64)
    return Encoding(Generator(z, z, [1] * dim), name="nope")


def decay(rates: Sequence[float] | torch.Tensor, *, allow_growth: bool = False) -> Encoding:
    """Exponential decay: one real block per dimension, ``A(u) = diag(e^{−rate·u})``.

    ``rates`` ≥ 0 (a negative rate grows with the lag and is refused unless ``allow_growth``).
    Shape ``(dim,)`` or ``(heads, dim)``. Linear attention, SSMs, the fade.

    >>> enc = decay([0.1])
    >>> float(enc.generator.exp(10.0)[0, 0])  # e^{-1}
    0.36787944117144233
    """
    r = torch.as_tensor(rates, dtype=torch.float64)
    if r.dim() == 0:
        r = r.reshape(1)
    if r.numel() == 0:
        raise ValueError("rates must not be empty")
    if not bool(torch.isfinite(r).all()):
        raise ValueError(f"rates must be finite, got {r.tolist()}")
    if not allow_growth and bool((r < 0).any()):
        raise ValueError(
            f"rates must be >= 0 (e^(-rate*u) with a negative rate grows with the lag), got "
            f"{r[r < 0].tolist()}; pass allow_growth=True to build it anyway"
        )
    return Encoding(
        Generator(-r, torch.zeros_like(r), [1] * r.shape[-1], allow_growth=allow_growth), name="decay"
    )


def rope(dim: int, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """RoPE (Su et al., RoFormer, 2021): dim/2 rotation planes with ``ω_k = base^(−2k/dim)``.

    ``A(u) = ⊕_k R(−ω_k u)``; query and key both rotate counter-clockwise by ω_k·position, so
    ``ω_k`` equals Hugging Face's ``inv_freq``. ``layout="half"`` is the Hugging Face / NeoX order.
    """
    w = rope_freqs(_check_dim(dim, even=True), base)
    return Encoding(Generator(torch.zeros_like(w), w, [1] * (dim // 2)), layout=layout, name="rope")


def xpos(dim: int, base: float = 10000.0, scale_base: float = 512.0, layout: str = "interleaved") -> Encoding:
    """xPos (Sun et al., "A Length-Extrapolatable Transformer", 2022): damped rotation.

    Plane k rotates at ``ω_k = base^(−2k/dim)`` and decays at
    ``λ_k = ln(ζ_k)/scale_base`` with ``ζ_k = (2k + 0.4·dim)/(1.4·dim)``, so the score carries
    ``ζ_k^{(t−s)/scale_base}``: the query is scaled by ``ζ^{t/scale_base}``, the key by
    ``ζ^{−s/scale_base}`` (torchscale and rotary-embedding-torch), here re-centred to stay finite.
    """
    _check_dim(dim, even=True)
    scale_base = _check_positive(scale_base, "scale_base")
    w = rope_freqs(dim, base)
    k = torch.arange(dim // 2, dtype=torch.float64)
    zeta = (2 * k + 0.4 * dim) / (1.4 * dim)
    return Encoding(Generator(torch.log(zeta) / scale_base, w, [1] * (dim // 2)), layout=layout, name="xpos")


def retnet(num_heads: int, head_dim: int, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """RetNet (Sun et al., "Retentive Network", 2023): per-head decay γ_h = 1 − 2^(−5−h) with rotation.

    Head h: every plane decays at ``λ_h = ln γ_h`` and plane k rotates at
    ``ω_k = base^(−linspace(0, 1, head_dim/2)_k)`` (torchscale's schedule, not RoPE's 2k/d), so the
    score is ``γ_h^{t−s} · qᵀ R(−ω(t−s)) k`` — the retention decay mask D_nm = γ^{n−m} (RetNet's
    separate normalisations are not part of the encoding).
    """
    _check_dim(num_heads, "num_heads")
    _check_dim(head_dim, "head_dim", even=True)
    base = _check_positive(base, "base")
    P = head_dim // 2
    w = base ** (-torch.linspace(0.0, 1.0, P, dtype=torch.float64))
    h = torch.arange(num_heads, dtype=torch.float64)
    lam = torch.log1p(-(2.0 ** (-5.0 - h)))  # (H,)
    rates = lam.unsqueeze(-1).expand(num_heads, P).clone()
    freqs = w.unsqueeze(0).expand(num_heads, P).clone()
    return Encoding(Generator(rates, freqs, [1] * P), layout=layout, name="retnet")


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al.'s ALiBi slopes for any head count (float64).

    A power of two n gives the geometric sequence ``m_i = r^{i+1}`` with ``r = 2^(−8/n)``;
    otherwise the slopes of the closest lower power of two are followed by every other slope of
    twice that power, as in the paper's reference code.

    >>> alibi_slopes(8).tolist()
    [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    """
    _check_dim(num_heads, "num_heads")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    def slopes(n: int) -> list[float]:
        if math.log2(n).is_integer():
            return power_of_two(n)
        p = 2 ** math.floor(math.log2(n))
        return power_of_two(p) + slopes(2 * p)[0::2][: n - p]

    return torch.tensor(slopes(num_heads), dtype=torch.float64)


def alibi(num_heads: int, head_dim: int, slopes: Sequence[float] | torch.Tensor | None = None) -> Encoding:
    """ALiBi (Press et al., "Train Short, Test Long", 2022) exactly, as a slide.

    Content dims are NoPE; two slots carry the nilpotent block ``N = [[0, 1], [0, 0]]`` with
    query slots ``(1, 0)`` and key slots ``(0, −m_h)``, so ``(1, 0) exp((t−s)N) (0, −m_h)ᵀ = −m_h (t − s)``
    and the score is ``qᵀk − m_h (t − s)``: no bias matrix is ever built.
    """
    _check_dim(num_heads, "num_heads")
    _check_dim(head_dim, "head_dim")
    m = alibi_slopes(num_heads) if slopes is None else torch.as_tensor(slopes, dtype=torch.float64)
    if m.shape != (num_heads,):
        raise ValueError(f"slopes must have shape ({num_heads},), got {tuple(m.shape)}")
    z = torch.zeros(head_dim, dtype=torch.float64)
    g = direct_sum(Generator(z, z, [1] * head_dim), Generator([0.0], [0.0], [2]))
    qs = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(num_heads, 2).clone()
    ks = torch.stack([torch.zeros_like(m), -m], dim=-1)
    return Encoding(g, query_slots=qs, key_slots=ks, name="alibi")


def jordan(size: int, rate: float = 0.0, freq: float = 0.0, *, allow_growth: bool = False) -> Encoding:
    """One Jordan block: ``A(u) = e^{λu} Σ_{k<n} u^k/k! N^k`` (⊗ R(−ωu) when ``freq`` ≠ 0).

    Size 2 at rate 0 is the slide (the hockey puck); size 3 adds acceleration.

    >>> enc = jordan(3)
    >>> enc.generator.exp(2.0)[0].tolist()  # the first row is (1, u, u^2/2)
    [1.0, 2.0, 2.0]
    """
    _check_dim(size, "size")
    return Encoding(
        Generator([float(rate)], [float(freq)], [size], allow_growth=allow_growth), name=f"jordan{size}"
    )


# ---------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class CatalogueEntry:
    """A registry entry: ``build(head_dim, num_heads=1, **options)``, its paper and identity."""

    build: Callable[..., Encoding]
    paper: str
    identity: str
    row: str


def default_decay_rates(dim: int) -> torch.Tensor:
    """Geometric rates from 1/2 to 1/2048 across ``dim`` dims: memories of 2 to ~2000 tokens."""
    return 2.0 ** -torch.linspace(1.0, 11.0, dim, dtype=torch.float64)


def _decay_rates(head_dim: int, rates=None, rate: float | None = None) -> torch.Tensor:
    """The registry's decay rates: ``rates`` as given, one ``rate`` for every dim, or the default bank."""
    if rates is not None and rate is not None:
        raise ValueError(f"give `rates` or `rate`, not both; got rates={rates!r} and rate={rate!r}")
    if rate is not None:
        return torch.full((head_dim,), float(rate), dtype=torch.float64)
    return default_decay_rates(head_dim) if rates is None else rates


def _growth(head_dim: int, rate: float = 0.05) -> Encoding:
    """Growth, ``A(u) = e^{+rate·u} I`` with rate > 0: the forbidden row, built only on explicit request."""
    rate = _check_positive(rate, "rate")
    enc = decay(torch.full((head_dim,), -rate, dtype=torch.float64), allow_growth=True)
    return enc.replace(name="growth")


def _jordan_bank(head_dim: int, num_heads: int = 1, size: int = 3, rate: float | None = None) -> Encoding:
    """head_dim // size decaying Jordan blocks of ``size`` (rates spread like decay), the rest NoPE."""
    nb = head_dim // size
    if nb < 1:
        raise ValueError(f"head_dim {head_dim} is smaller than the Jordan size {size}")
    rates = -default_decay_rates(nb) if rate is None else torch.full((nb,), float(rate), dtype=torch.float64)
    gens = [Generator(rates, torch.zeros(nb, dtype=torch.float64), [size] * nb)]
    rest = head_dim - nb * size
    if rest:
        gens.append(nope(rest).generator)
    return Encoding(direct_sum(*gens), name=f"jordan{size}")


CATALOGUE: dict[str, CatalogueEntry] = {
    "nope": CatalogueEntry(
        lambda head_dim, num_heads=1: nope(head_dim),
        "Kazemnejad et al., 2023 (NoPE)", "A(u) = I", "nope",
    ),
    "decay": CatalogueEntry(
        lambda head_dim, num_heads=1, rates=None, rate=None: decay(_decay_rates(head_dim, rates, rate)),
        "linear attention / SSMs", "A(u) = diag(e^{-r u})", "decay",
    ),
    "growth": CatalogueEntry(
        lambda head_dim, num_heads=1, rate=0.05: _growth(head_dim, rate),
        "the row the theory calls forbidden", "A(u) = diag(e^{+r u}), r > 0 (explicitly allowed)", "growth",
    ),
    "rope": CatalogueEntry(
        lambda head_dim, num_heads=1, base=10000.0, layout="interleaved": rope(head_dim, base, layout),
        "Su et al., 2021 (RoFormer)", "A(u) = ⊕ R(-ω_k u), ω_k = base^(-2k/d)", "rotation",
    ),
    "xpos": CatalogueEntry(
        lambda head_dim, num_heads=1, base=10000.0, scale_base=512.0, layout="interleaved": xpos(
            head_dim, base, scale_base, layout
        ),
        "Sun et al., 2022 (xPos)", "A(u) = ⊕ ζ_k^(u/scale_base) R(-ω_k u)", "damped_rotation",
    ),
    "retnet": CatalogueEntry(
        lambda head_dim, num_heads=1, base=10000.0, layout="interleaved": retnet(num_heads, head_dim, base, layout),
        "Sun et al., 2023 (RetNet)", "A_h(u) = γ_h^u ⊕ R(-ω_k u), γ_h = 1 - 2^(-5-h)", "damped_rotation",
    ),
    "alibi": CatalogueEntry(
        lambda head_dim, num_heads=1: alibi(num_heads, head_dim),
        "Press et al., 2022 (ALiBi)", "score = q·k - m_h (t - s) via slots and N = [[0,1],[0,0]]", "polynomial",
    ),
    "jordan": CatalogueEntry(
        _jordan_bank,
        "the seeds' untried corner", "A(u) = e^{λu} Σ u^k/k! N^k", "polynomial",
    ),
}


def build(name: str, head_dim: int, num_heads: int = 1, **options: object) -> Encoding:
    """Build a catalogue entry by name with the registry's one signature."""
    try:
        entry = CATALOGUE[name]
    except KeyError:
        raise ValueError(f"unknown encoding {name!r}; known: {sorted(CATALOGUE)}") from None
    try:
        return entry.build(head_dim, num_heads, **options)
    except TypeError as err:
        raise TypeError(f"bad options {sorted(options)} for encoding {name!r}: {err}") from err
