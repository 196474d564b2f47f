"""The catalogue: named points of the design space, each an :class:`~liepos.Encoding`, one or several axes.

Every entry is a generator X (plus slots for ALiBi); every one satisfies the same identity
``enc.query(q, t)ᵀ enc.key(k, s) = qᵀ exp((t − s) X) k`` (with several position axes,
``exp(Σ_a (t_a − s_a) X_a)``). Every builder takes the head's width ``dim`` first and ``num_heads=``
by keyword only (where the encoding has per-head parameters), so a ``(num_heads, dim)`` call
raises instead of building another model. :data:`CATALOGUE` maps a name to an entry holding the
builder itself: ``build(name, dim, num_heads, **options)`` calls that function with exactly those
arguments, and the function's own defaults apply. Each function's doctest checks its defining identity.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from liepos._checks import check_bool, check_choice, check_int, check_ints, check_real, check_real_tensor
from liepos.encoding import Encoding
from liepos.generator import Generator, direct_sum
from liepos.scaling import clipped
from liepos.tables import LAYOUTS

import liepos._graph_key  # noqa: F401, E402  (names an encoding inside torch.compile: every catalogue encoding compiles)

__all__ = [
    "CATALOGUE", "CatalogueEntry", "build",
    "nope", "decay", "rope", "xpos", "retnet", "alibi", "jordan", "growth",
    "axial_rope", "rope_mixed", "mrope", "decay_axial_rope", "p_rope", "rope_id", "cope_clipped",
    "string_google", "mrope_interleaved", "rope_directions", "mhrope", "alibi_slopes", "default_decay_rates", "rope_freqs",
]


# xPos (Sun et al. 2022, torchscale): plane k decays at ζ_k = (2k + γ·d)/((1 + γ)·d) per scale_base
# tokens, with γ = 0.4 fixed by the paper (the slowest plane ζ → 1, the fastest ζ = 0.4/1.4)
_XPOS_GAMMA = 0.4
# RetNet (Sun et al. 2023): head h keeps γ_h = 1 − 2^(−5−h) of its memory per token
_RETNET_FIRST_EXPONENT = 5.0
# the default decay bank: rates 2^-1 … 2^-11, memories of 2 to ~2000 tokens
_DECAY_EXPONENTS = (1.0, 11.0)


def _layout(layout: str) -> str:
    return check_choice("layout", layout, LAYOUTS)


def _zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


def rope_freqs(dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE frequencies ``ω_k = base^(−2k/dim)``, k = 0 … dim/2 − 1, in float64.

    >>> import torch
    >>> w = rope_freqs(16, base=100.0)
    >>> bool(torch.allclose(w[1:] / w[:-1], torch.full((7,), 100.0 ** (-2 / 16), dtype=torch.float64)))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    base = check_real("base", base, positive=True)
    k = torch.arange(dim // 2, dtype=torch.float64)
    return base ** (-2.0 * k / dim)


def default_decay_rates(dim: int) -> torch.Tensor:
    """Geometric rates from 1/2 to 1/2048 across ``dim`` dims: memories of 2 to ~2000 tokens.

    >>> r = default_decay_rates(11)
    >>> float(r[0]), float(r[-1]), bool(((r[1:] / r[:-1]) - 0.5).abs().max() < 1e-15)
    (0.5, 0.00048828125, True)
    """
    dim = check_int("dim", dim, min=1)
    return 2.0 ** -torch.linspace(*_DECAY_EXPONENTS, dim, dtype=torch.float64)


def nope(dim: int) -> Encoding:
    """NoPE: X = 0, A(u) = I. Scores ignore position (a causal mask still reveals order).

    >>> import torch
    >>> q = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    >>> bool(torch.equal(nope(4).query(q, [7, 8, 9]), q))
    True
    """
    dim = check_int("dim", dim, min=1)
    return Encoding(Generator(_zeros(dim), _zeros(dim), [1] * dim), name="nope")


def decay(rates: Sequence[float] | torch.Tensor, *, allow_growth: bool = False) -> Encoding:
    """Exponential decay: one real block per dimension, ``A(u) = diag(e^{−rate·u})``.

    ``rates`` ≥ 0 (a negative rate grows with the lag and is refused unless ``allow_growth``).
    Shape ``(dim,)`` or ``(heads, dim)``. Linear attention, SSMs, the fade.

    >>> import math, torch
    >>> g = decay([0.1, 0.5]).generator
    >>> bool(torch.allclose(g.exp(10.0), torch.diag(torch.tensor([math.exp(-1.0), math.exp(-5.0)], dtype=torch.float64))))
    True
    """
    allow_growth = check_bool("allow_growth", allow_growth)
    r = check_real_tensor("rates", rates, ndim=(0, 1, 2), nonnegative=not allow_growth)
    r = r.reshape(1) if r.dim() == 0 else r  # () -> (1,): one dim
    if r.shape[-1] == 0:
        raise ValueError("`rates` must hold at least one rate, got none")
    return Encoding(Generator(-r, torch.zeros_like(r), [1] * r.shape[-1], allow_growth=allow_growth), name="decay")


def growth(dim: int, rate: float = 0.05) -> Encoding:
    """Growth, ``A(u) = e^{+rate·u} I`` with rate > 0: the row the theory calls forbidden, built on request.

    >>> import math, torch
    >>> g = growth(2, rate=0.1).generator
    >>> g.allow_growth, bool(torch.allclose(g.exp(10.0), math.e * torch.eye(2, dtype=torch.float64)))
    (True, True)
    """
    dim = check_int("dim", dim, min=1)
    rate = check_real("rate", rate, positive=True)
    return decay(torch.full((dim,), -rate, dtype=torch.float64), allow_growth=True).replace(name="growth")


def rope(dim: int, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """RoPE (Su et al., RoFormer, 2021): dim/2 rotation planes with ``ω_k = base^(−2k/dim)``.

    ``A(u) = ⊕_k R(−ω_k u)``; query and key both rotate counter-clockwise by ω_k·position, so
    ``ω_k`` equals Hugging Face's ``inv_freq``. ``layout="half"`` is the Hugging Face / NeoX order.

    >>> import torch
    >>> u, w = 3.0, rope_freqs(4)
    >>> R = lambda a: torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=torch.float64)
    >>> bool(torch.allclose(rope(4).generator.exp(u), torch.block_diag(R(w[0] * u), R(w[1] * u))))
    True
    """
    w = rope_freqs(dim, base)
    return Encoding(Generator(torch.zeros_like(w), w, [1] * (dim // 2)), layout=_layout(layout), name="rope")


def xpos(dim: int, base: float = 10000.0, scale_base: float = 512.0, layout: str = "interleaved") -> Encoding:
    """xPos (Sun et al., "A Length-Extrapolatable Transformer", 2022): damped rotation.

    Plane k rotates at ``ω_k = base^(−2k/dim)`` and decays at
    ``λ_k = ln(ζ_k)/scale_base`` with ``ζ_k = (2k + 0.4·dim)/(1.4·dim)``, so the score carries
    ``ζ_k^{(t−s)/scale_base}``: the query is scaled by ``ζ^{t/scale_base}``, the key by
    ``ζ^{−s/scale_base}`` (torchscale and rotary-embedding-torch), here re-centred to stay finite.

    >>> import torch
    >>> q = torch.ones(1, 1, 1, 4, dtype=torch.float64)
    >>> zeta = torch.tensor([1.6 / 5.6, 3.6 / 5.6], dtype=torch.float64)  # (2k + 0.4·4)/(1.4·4)
    >>> norms = xpos(4, scale_base=8.0).query(q, [16]).reshape(2, 2).norm(dim=-1)  # one norm per plane
    >>> bool(torch.allclose(norms, 2**0.5 * zeta ** (16 / 8)))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    scale_base = check_real("scale_base", scale_base, positive=True)
    w = rope_freqs(dim, base)
    k = torch.arange(dim // 2, dtype=torch.float64)
    zeta = (2 * k + _XPOS_GAMMA * dim) / ((1 + _XPOS_GAMMA) * dim)
    return Encoding(Generator(torch.log(zeta) / scale_base, w, [1] * (dim // 2)), layout=_layout(layout), name="xpos")


def retnet(dim: int, *, num_heads: int, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """RetNet (Sun et al., "Retentive Network", 2023): per-head decay γ_h = 1 − 2^(−5−h) with rotation.

    Head h: every plane decays at ``λ_h = ln γ_h`` and plane k rotates at
    ``ω_k = base^(−linspace(0, 1, dim/2)_k)`` (torchscale's schedule, not RoPE's 2k/d), so the
    score is ``γ_h^{t−s} · qᵀ R(−ω(t−s)) k`` — the retention decay mask D_nm = γ^{n−m} (RetNet's
    separate normalisations are not part of the encoding).

    >>> import torch
    >>> q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    >>> gamma = 1 - 2.0 ** -torch.tensor([5.0, 6.0], dtype=torch.float64)
    >>> ratio = retnet(4, num_heads=2).query(q, [10]).norm(dim=-1) / q.norm(dim=-1)  # (1, heads, 1)
    >>> bool(torch.allclose(ratio.flatten(), gamma**10))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    num_heads = check_int("num_heads", num_heads, min=1)
    base = check_real("base", base, positive=True)
    P = dim // 2
    w = base ** (-torch.linspace(0.0, 1.0, P, dtype=torch.float64))
    h = torch.arange(num_heads, dtype=torch.float64)
    lam = torch.log1p(-(2.0 ** (-_RETNET_FIRST_EXPONENT - h)))  # (H,)
    rates = lam.unsqueeze(-1).expand(num_heads, P).clone()  # (H,) -> (H, P)
    freqs = w.unsqueeze(0).expand(num_heads, P).clone()  # (P,) -> (H, P)
    return Encoding(Generator(rates, freqs, [1] * P), layout=_layout(layout), name="retnet")


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al.'s ALiBi slopes for any head count (float64).

    A power of two n gives the geometric sequence ``m_i = r^{i+1}`` with ``r = 2^(−8/n)``;
    otherwise the slopes of the closest lower power of two are followed by every other slope of
    twice that power, as in the paper's reference code.

    >>> import torch
    >>> m = alibi_slopes(8)
    >>> bool(torch.equal(m, 2.0 ** -torch.arange(1.0, 9.0, dtype=torch.float64)))  # r = 2^(-8/8)
    True
    """
    num_heads = check_int("num_heads", num_heads, min=1)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    def slopes(n: int) -> list[float]:
        if math.log2(n).is_integer():
            return power_of_two(n)
        p = 2 ** math.floor(math.log2(n))
        return power_of_two(p) + slopes(2 * p)[0::2][: n - p]

    return torch.tensor(slopes(num_heads), dtype=torch.float64)


def alibi(dim: int, *, num_heads: int, slopes: Sequence[float] | torch.Tensor | None = None) -> Encoding:
    """ALiBi (Press et al., "Train Short, Test Long", 2022) exactly, as a slide.

    Content dims are NoPE; two slots carry the nilpotent block ``N = [[0, 1], [0, 0]]`` with
    query slots ``(1, 0)`` and key slots ``(0, −m_h)``, so ``(1, 0) exp((t−s)N) (0, −m_h)ᵀ = −m_h (t − s)``
    and the score is ``qᵀk − m_h (t − s)``: no bias matrix is ever built. ``slopes`` ``m_h ≥ 0``.

    >>> import torch
    >>> enc, m = alibi(4, num_heads=2), alibi_slopes(2)
    >>> q, k = torch.randn(1, 2, 1, 4, dtype=torch.float64), torch.randn(1, 2, 1, 4, dtype=torch.float64)
    >>> score = (enc.query(q, [9]) * enc.key(k, [2])).sum(-1).flatten()
    >>> bool(torch.allclose(score, (q * k).sum(-1).flatten() - m * (9 - 2)))
    True
    """
    dim = check_int("dim", dim, min=1)
    num_heads = check_int("num_heads", num_heads, min=1)
    m = alibi_slopes(num_heads) if slopes is None else check_real_tensor("slopes", slopes, ndim=1, nonnegative=True)
    if m.shape != (num_heads,):
        raise ValueError(f"`slopes` must have shape ({num_heads},), got {tuple(m.shape)}")
    z = _zeros(dim)
    g = direct_sum(Generator(z, z, [1] * dim), Generator([0.0], [0.0], [2]))
    qs = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(num_heads, 2).clone()  # (2,) -> (H, 2)
    ks = torch.stack([torch.zeros_like(m), -m], dim=-1)  # (H, 2)
    return Encoding(g, query_slots=qs, key_slots=ks, name="alibi")


def jordan(size: int, rate: float = 0.0, freq: float = 0.0, *, allow_growth: bool = False) -> Encoding:
    """One Jordan block: ``A(u) = e^{λu} Σ_{k<n} u^k/k! N^k`` (⊗ R(−ωu) when ``freq`` ≠ 0).

    Size 2 at rate 0 is the slide (the hockey puck); size 3 adds acceleration.

    >>> import torch
    >>> N = torch.diag(torch.ones(2, dtype=torch.float64), 1)
    >>> bool(torch.allclose(jordan(3).generator.exp(2.0), torch.eye(3, dtype=torch.float64) + 2 * N + 2 * N @ N))
    True
    """
    size = check_int("size", size, min=1)
    rate, freq = check_real("rate", rate), check_real("freq", freq)
    return Encoding(Generator([rate], [freq], [size], allow_growth=check_bool("allow_growth", allow_growth)),
                    name=f"jordan{size}")


def _jordan_bank(dim: int, size: int = 3, rate: float | None = None) -> Encoding:
    """The registry's jordan: ``dim // size`` decaying Jordan blocks of ``size`` (rates spread like
    decay, or one ``rate``), the rest NoPE (:func:`jordan` is one block)."""
    dim = check_int("dim", dim, min=1)
    size = check_int("size", size, min=1, max=dim)
    nb = dim // size
    rates = -default_decay_rates(nb) if rate is None else torch.full((nb,), check_real("rate", rate), dtype=torch.float64)
    gens = [Generator(rates, _zeros(nb), [size] * nb)]
    if dim - nb * size:
        gens.append(nope(dim - nb * size).generator)
    return Encoding(direct_sum(*gens), name=f"jordan{size}")


# ---------------------------------------------------------------------- several position axes
def _rotations(freqs: torch.Tensor, axes: int) -> Generator:
    """Pure rotation planes with per-axis frequencies ``(…, axes, planes)``."""
    P = freqs.shape[-1]
    return Generator(torch.zeros_like(freqs), freqs, [1] * P, complex=[True] * P, axes=axes)


def axial_rope(dim: int, axes: int = 2, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """Axial RoPE: axis ``a`` owns the planes ``[a·P, (a+1)·P)``, ``P = dim/(2·axes)``, with
    ``ω_k = base^(−2k/(dim/axes))``. torchtune's ``VisionRotaryPositionalEmbeddings(dim=head_dim/2)``
    with (x + 1, y + 1) patch positions for ``axes=2`` (its CLS token sits at (0, 0)); CogVideo-style 3D
    with ``axes=3`` (equal thirds). Along one axis it is RoPE of ``dim/axes`` on that axis's planes.

    >>> import torch
    >>> q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    >>> x_only = axial_rope(8, axes=2).query(q, [[3.0, 0.0]])
    >>> bool(torch.allclose(x_only[..., :4], rope(4).query(q[..., :4], [3.0]))), bool(torch.equal(x_only[..., 4:], q[..., 4:]))
    (True, True)
    """
    axes = check_int("axes", axes, min=1)
    dim = check_int("dim", dim, min=2 * axes, multiple_of=2 * axes)
    P = dim // (2 * axes)
    w = rope_freqs(dim // axes, base)  # (P,)
    freqs = _zeros(axes, axes * P)
    for a in range(axes):
        freqs[a, a * P : (a + 1) * P] = w
    return Encoding(_rotations(freqs, axes), layout=_layout(layout), name=f"axial_rope{axes}d")


def rope_mixed(
    dim: int, *, num_heads: int, base: float = 10.0, angles: Any = None, seed: int = 0, layout: str = "interleaved",
) -> Encoding:
    """RoPE-Mixed (Heo et al., 2024, naver-ai/rope-vit ``init_2d_freqs``): 2D frequency vectors.

    Head h has a direction angle φ_h; plane k < dim/4 rotates along ``(cos φ_h, sin φ_h)`` and plane
    ``k + dim/4`` along ``(cos(φ_h + π/2), sin(φ_h + π/2))``, both with magnitude ``base^(−4k/dim)``.
    ``angles``: the φ_h ``(num_heads,)``; default uniform on [0, 2π) from ``seed``. The generators of x
    and y are diagonal in the same planes, so they commute: exactly relative in 2D. Learned in
    :class:`liepos.nn.LearnableEncoding` (``init="mixed"``).

    >>> import torch
    >>> enc = rope_mixed(8, num_heads=2, angles=[0.0, 0.5])
    >>> w = enc.generator.freqs  # (heads, axes, planes): the plane-k vectors of both halves are orthogonal
    >>> bool(torch.allclose((w[:, :, :2] * w[:, :, 2:]).sum(1), torch.zeros(2, 2, dtype=torch.float64)))
    True
    """
    dim = check_int("dim", dim, min=4, multiple_of=4)
    num_heads = check_int("num_heads", num_heads, min=1)
    base = check_real("base", base, positive=True)
    if angles is None:
        rng = torch.Generator().manual_seed(check_int("seed", seed, min=0))
        angles = torch.rand(num_heads, generator=rng, dtype=torch.float64) * 2 * math.pi
    phi = check_real_tensor("angles", angles, ndim=1)
    if phi.shape != (num_heads,):
        raise ValueError(f"`angles` must have shape ({num_heads},), got {tuple(phi.shape)}")
    phi = phi.reshape(num_heads, 1)  # (H,) -> (H, 1)
    mag = rope_freqs(dim // 2, base)  # base^(−4k/dim), (dim/4,)
    fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(math.pi / 2 + phi)], dim=-1)  # (H, dim/2)
    fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(math.pi / 2 + phi)], dim=-1)
    freqs = torch.stack([fx, fy], dim=1)  # (H, 2, dim/2)
    return Encoding(_rotations(freqs, 2), layout=_layout(layout), name="rope_mixed")


def _interleaved_sections(dim: int) -> list[int]:
    """Qwen3-VL's (24, 20, 20) of 64 planes, scaled to ``dim/2`` planes (t gets the rest)."""
    P = check_int("dim", dim, min=6, even=True) // 2
    hw = (20 * P) // 64
    return [P - 2 * hw, hw, hw]


def _mrope_sections(dim: int) -> list[int]:
    """Qwen2-VL's split of the dim/2 planes, (16, 24, 24) at dim 128, scaled to ``dim/2`` planes (t gets the rest)."""
    P = check_int("dim", dim, min=6, even=True) // 2
    hw = (3 * P) // 8  # 24 of 64
    return [P - 2 * hw, hw, hw]


def mrope(dim: int, sections: Sequence[int] | None = None, base: float = 10000.0, layout: str = "half") -> Encoding:
    """M-RoPE (Qwen2-VL): RoPE's planes split into sections; section i follows axis ``i % 3`` (t, h, w).

    Plane k keeps RoPE's ``ω_k = base^(−2k/dim)`` and rotates with the axis of the section holding
    it, as in transformers' ``Qwen2VLRotaryEmbedding`` (``sum(sections) == dim/2``; by default Qwen2-VL's
    (16, 24, 24) of 64 planes scaled to ``dim/2``, t taking the rest; Hugging Face's half layout by
    default). Positions ``(…, seq, 3)``; a text token has equal axes, so text-only input is exactly
    ``rope(dim, base, layout)``.

    >>> import torch
    >>> q, t = torch.randn(1, 1, 3, 16, dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)
    >>> text = t.unsqueeze(-1).expand(3, 3)  # every axis at the token's time
    >>> bool(torch.allclose(mrope(16, (2, 3, 3)).query(q, text), rope(16, layout="half").query(q, t)))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    sections = _mrope_sections(dim) if sections is None else check_ints("sections", sections, min=0)
    if sum(sections) != dim // 2:
        raise ValueError(f"`sections` must sum to dim/2 = {dim // 2}, got {sections}")
    w = rope_freqs(dim, base)
    freqs = _zeros(3, dim // 2)
    start = 0
    for i, s in enumerate(sections):
        freqs[i % 3, start : start + s] = w[start : start + s]
        start += s
    return Encoding(_rotations(freqs, 3), layout=_layout(layout), name="mrope")


def decay_axial_rope(
    dim: int, axes: int = 2, base: float = 10000.0, rates: Any = None, decay_axis: int = 0, layout: str = "interleaved",
) -> Encoding:
    """Decay along one axis, rotation along all: axial RoPE whose every plane also fades along
    ``decay_axis`` (e.g. time in a video, ``axes=3``) at rate ``rates[k] ≥ 0`` (default: from 1/2 to 1/2048);
    two axes by default, as :func:`axial_rope`.

    The generators commute (each is diagonal in the same planes), so scores are relative in every
    axis; along ``decay_axis`` plane k weighs a lag u by ``e^{−rate_k u}``. Causal along that axis
    keeps it in the family (a key later on the decay axis grows instead of fading).

    >>> import torch
    >>> enc = decay_axial_rope(4, axes=2, rates=[0.1, 0.2])
    >>> q = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    >>> norms = enc.query(q, [[5.0, 9.0]]).reshape(2, 2).norm(dim=-1) / q.reshape(2, 2).norm(dim=-1)
    >>> bool(torch.allclose(norms, torch.exp(-5.0 * torch.tensor([0.1, 0.2], dtype=torch.float64))))
    True
    """
    enc = axial_rope(dim, axes, base, layout)
    decay_axis = check_int("decay_axis", decay_axis, min=0, max=axes - 1)
    P = dim // 2
    r = default_decay_rates(P) if rates is None else check_real_tensor("rates", rates, ndim=1, nonnegative=True)
    if r.shape != (P,):
        raise ValueError(f"`rates` must have {P} entries (one per plane), got shape {tuple(r.shape)}")
    R = _zeros(axes, P)
    R[decay_axis] = -r
    g = Generator(R, enc.generator.freqs, [1] * P, complex=[True] * P, axes=axes)
    return Encoding(g, layout=layout, name="decay_axial_rope")


# the golden angle π(3 − √5): consecutive planes' directions never line up (golden-gate RoPE)
_GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))


def mrope_interleaved(dim: int, sections: Sequence[int] | None = None, base: float = 10000.0,
                      layout: str = "half") -> Encoding:
    """MRoPE-Interleave (Qwen3-VL, arXiv 2510.23095): the axes t, h, w interleaved across the spectrum.

    Plane k rotates at RoPE's ``ω_k`` along axis h when ``k ≡ 1 (mod 3)`` and ``k < 3·sections[1]``, along
    w when ``k ≡ 2 (mod 3)`` and ``k < 3·sections[2]``, else along t — transformers'
    ``Qwen3VLTextRotaryEmbedding``; every axis sees the whole frequency range (M-RoPE gives each a band).
    ``sections`` defaults to Qwen3-VL's (24, 20, 20) of 64 planes scaled to ``dim/2`` (t taking the rest).

    >>> import torch
    >>> w = mrope_interleaved(16, (4, 2, 2)).generator.freqs  # (axes, planes): which axis owns plane k
    >>> (w != 0).int().argmax(0).tolist()
    [0, 1, 2, 0, 1, 2, 0, 0]
    """
    dim = check_int("dim", dim, min=2, even=True)
    sections = _interleaved_sections(dim) if sections is None else check_ints("sections", sections, min=0, length=3)
    P = dim // 2
    if sum(sections) != P:
        raise ValueError(f"`sections` must sum to dim/2 = {P}, got {sections}")
    w = rope_freqs(dim, base)
    freqs = _zeros(3, P)
    owner = torch.zeros(P, dtype=torch.long)
    for axis, offset in ((1, 1), (2, 2)):
        owner[offset : 3 * sections[axis] : 3] = axis
    freqs[owner, torch.arange(P)] = w
    return Encoding(_rotations(freqs, 3), layout=_layout(layout), name="mrope_interleaved")


def rope_directions(dim: int, axes: int = 2, directions: Any = "golden", base: float = 100.0, seed: int = 0,
                    layout: str = "interleaved") -> Encoding:
    """N-D RoPE with one direction per plane (golden-gate / random-direction RoPE, "On N-dimensional RoPE").

    Plane k rotates at ``ω_k = base^(−2k/dim)`` along the unit direction ``d_k`` of position space:
    ``A(u) = ⊕ R(−ω_k ⟨d_k, u⟩)``. ``directions``: ``"golden"`` (2 axes: ``d_k = (cos kφ, sin kφ)`` with the
    golden angle φ = π(3 − √5)), ``"random"`` (uniform on the sphere, from ``seed``), or a tensor
    ``(planes, axes)`` (normalised). The axes' generators are diagonal in the same planes, so they commute:
    exactly relative in every axis, without axial RoPE's "cross" of planes that see one axis only. The
    default base 100 is the scale of 2-D vision RoPE (image coordinates of tens, not thousands, of patches).

    >>> import torch
    >>> w = rope_directions(8).generator.freqs  # (axes, planes)
    >>> bool(torch.allclose(w.norm(dim=0), rope_freqs(8, 100.0)))  # |ω_k d_k| = ω_k
    True
    """
    axes = check_int("axes", axes, min=1)
    dim = check_int("dim", dim, min=2, even=True)
    P = dim // 2
    if isinstance(directions, str):
        check_choice("directions", directions, ("golden", "random"))
        if directions == "golden":
            if axes != 2:
                raise ValueError(f"directions='golden' is the 2-axis golden angle; for axes={axes} use 'random' "
                                 f"or a tensor of directions")
            phi = torch.arange(P, dtype=torch.float64) * _GOLDEN_ANGLE
            d = torch.stack([torch.cos(phi), torch.sin(phi)], dim=-1)  # (P, 2)
        else:
            d = torch.randn(P, axes, generator=torch.Generator().manual_seed(check_int("seed", seed, min=0)),
                            dtype=torch.float64)
    else:
        d = check_real_tensor("directions", directions, ndim=2)
        if tuple(d.shape) != (P, axes):
            raise ValueError(f"`directions` must have shape ({P}, {axes}) (planes, axes), got {tuple(d.shape)}")
    norm = d.norm(dim=-1, keepdim=True)
    if bool((norm == 0).any()):
        raise ValueError("`directions` must not hold a zero vector (a plane needs a direction)")
    freqs = (d / norm * rope_freqs(dim, base)[:, None]).T.contiguous()  # (P, axes) -> (axes, P)
    return Encoding(_rotations(freqs, axes), layout=_layout(layout), name="rope_directions")


def mhrope(dim: int, *, num_heads: int, axes: int = 3, base: float = 10000.0, head_axes: Any = None,
           layout: str = "half") -> Encoding:
    """Multi-Head RoPE (Qwen, arXiv 2510.23095): each head rotates all its planes along one axis.

    Head h follows axis ``head_axes[h]`` (default ``h % axes``) with RoPE's full spectrum
    ``ω_k = base^(−2k/dim)``: ``A_h(u) = ⊕ R(−ω_k u_{axis(h)})``. Per-head axis assignment, one plane
    per direction, commuting axes.

    >>> import torch
    >>> w = mhrope(8, num_heads=3).generator.freqs  # (heads, axes, planes)
    >>> [int(w[h].abs().sum(-1).argmax()) for h in range(3)]
    [0, 1, 2]
    """
    dim = check_int("dim", dim, min=2, even=True)
    num_heads = check_int("num_heads", num_heads, min=1)
    axes = check_int("axes", axes, min=1)
    own = [h % axes for h in range(num_heads)] if head_axes is None else check_ints("head_axes", head_axes, min=0,
                                                                                     length=num_heads)
    if any(a >= axes for a in own):
        raise ValueError(f"`head_axes` must name axes below {axes}, got {own}")
    freqs = _zeros(num_heads, axes, dim // 2)
    for h, a in enumerate(own):
        freqs[h, a] = rope_freqs(dim, base)
    return Encoding(_rotations(freqs, axes), layout=_layout(layout), name="mhrope")


# RoPE-ID (arXiv 2603.18017) rotates half of the channels at RoPE's high frequencies, the rest NoPE
_ROPE_ID_FRACTION = 0.5
# CoPE's reference code clips the last 20 of the 64 planes of a 128-dim head
_COPE_CLIP, _COPE_PLANES = 20, 64


def p_rope(dim: int, p: float = 0.75, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """p-RoPE (Barbero et al., "Round and round we go", arXiv 2410.06205): RoPE's highest frequencies only.

    Of the ``dim/2`` planes the first ``r = ⌊p·dim/2⌋`` keep RoPE's ``ω_k = base^(−2k/dim)`` (the
    exponent over the full head, not over the rotated dims); the other planes are zero-eigenvalue
    (NoPE) planes, paired in place: ``A(u) = ⊕_{k<r} R(−ω_k u) ⊕ I``. In the half layout the zero
    planes are the pairs ``(k, k + dim/2)``, as Gemma's proportional RoPE
    (:func:`liepos.scaling.proportional`, which this equals).

    >>> import torch
    >>> w, w0 = p_rope(8, p=0.5).generator.freqs, rope_freqs(8)
    >>> bool(torch.equal(w[:2], w0[:2])), bool(torch.equal(w[2:], torch.zeros(2, dtype=torch.float64)))
    (True, True)
    """
    dim = check_int("dim", dim, min=2, even=True)
    p = check_real("p", p, min=0.0, max=1.0)
    w = rope_freqs(dim, base)
    keep = (torch.arange(dim // 2) < int(p * dim // 2)).to(w.dtype)
    return Encoding(Generator(torch.zeros_like(w), w * keep, [1] * (dim // 2), complex=[True] * (dim // 2)),
                    layout=_layout(layout), name=f"p_rope({p:g})")


def rope_id(dim: int, fraction: float = _ROPE_ID_FRACTION, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """RoPE-ID ("Frayed RoPE", Wertheimer et al., arXiv 2603.18017): high-frequency RoPE on a subset of channels.

    ``fraction`` of the channels (half by default) rotate at RoPE's fastest frequencies
    ``ω_k = base^(−2k/dim)``, the rest are NoPE: :func:`p_rope` with ``p = fraction`` (the paper's
    code is not public; this is its stated construction).

    >>> import torch
    >>> bool(torch.equal(rope_id(16).generator.freqs, p_rope(16, 0.5).generator.freqs))
    True
    """
    return p_rope(dim, fraction, base, layout).replace(name="rope_id")


def cope_clipped(dim: int, clip: int | None = None, base: float = 10000.0, layout: str = "interleaved") -> Encoding:
    """Clipped RoPE (CoPE, Li et al., arXiv 2602.05258): RoPE with its ``clip`` slowest planes Hann-tapered to 0.

    :func:`liepos.scaling.clipped` of :func:`rope`; ``clip`` defaults to the reference code's 20 of
    64 planes, scaled to ``dim/2`` (at least 1). Not contextual CoPE (Golovneva et al., 2024),
    which is outside the family (``liepos.diagnosis.outside``).

    >>> import torch
    >>> w = cope_clipped(128).generator.freqs  # 20 of 64 planes tapered, the slowest to 0
    >>> bool(torch.equal(w[:44], rope_freqs(128)[:44])), float(w[-1])
    (True, 0.0)
    """
    dim = check_int("dim", dim, min=2, even=True)
    n = max(1, round(dim // 2 * _COPE_CLIP / _COPE_PLANES)) if clip is None else check_int("clip", clip, min=1)
    return clipped(rope(dim, base, layout), clip=n).replace(name="cope_clipped")



def string_google(dim: int, base: float = 10000.0, seed: int = 0, layout: str = "interleaved") -> Encoding:
    """STRING (Schenck et al., Google, arXiv 2502.02562): RoPE in an orthogonal basis, ``X = P J Pᵀ``.

    ``P`` is orthogonal (learned in the paper: :class:`liepos.LearnableGenerator` with
    ``basis="orthogonal"``; here a fixed random one from ``seed``, the Q of a QR of a Gaussian matrix), so
    ``A(u) = P exp(uJ) Pᵀ`` is still a one-parameter group: in the family. Not HKUNLP's STRING
    (shifted RoPE, ``liepos.diagnosis.outside``), which is outside.

    >>> import torch
    >>> enc, J = string_google(4), rope(4).generator
    >>> P = enc.generator.basis
    >>> bool(torch.allclose(enc.generator.exp(3.0), P @ J.exp(3.0) @ P.T))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    g = torch.Generator().manual_seed(check_int("seed", seed, min=0))
    P, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    return rope(dim, base, layout).replace(generator=rope(dim, base).generator.with_basis(P), name="string_google")


# ---------------------------------------------------------------------- the registry
@functools.cache
def _takes_heads(fn: Callable[..., Encoding]) -> bool:
    """Whether ``fn`` has per-head parameters: a keyword-only ``num_heads``."""
    p = inspect.signature(fn).parameters.get("num_heads")
    return p is not None and p.kind is inspect.Parameter.KEYWORD_ONLY


@dataclass(frozen=True)
class CatalogueEntry:
    """A registry entry: the builder ``fn(dim, *, num_heads, **options)`` itself (``num_heads`` only where the
    encoding has per-head parameters), its paper, identity and row of the six."""

    fn: Callable[..., Encoding]
    paper: str
    identity: str
    row: str

    @property
    def takes_heads(self) -> bool:
        """Whether the builder needs ``num_heads`` (per-head parameters: ALiBi's slopes, RetNet's decays, ...)."""
        return _takes_heads(self.fn)

    @property
    def options(self) -> list[str]:
        """The builder's options: its parameters after ``dim`` and ``num_heads``."""
        return [p for p in inspect.signature(self.fn).parameters if p not in ("dim", "num_heads")]

    def build(self, dim: int, num_heads: int | None = None, **options: Any) -> Encoding:
        """``fn(dim, num_heads=num_heads, **options)``, exactly as given: the builder's own defaults apply.

        An encoding without per-head parameters serves every head count, so ``num_heads`` is checked
        and then not passed; one with them refuses a missing ``num_heads``.
        """
        dim = check_int("dim", dim, min=1)
        if num_heads is not None:
            num_heads = check_int("num_heads", num_heads, min=1)
        if not self.takes_heads:
            return self.fn(dim, **options)
        if num_heads is None:
            raise TypeError(f"{self.fn.__name__}() has per-head parameters: give `num_heads` "
                            f"(build(name, dim, num_heads), or {self.fn.__name__}(dim, num_heads=...))")
        return self.fn(dim, num_heads=num_heads, **options)


def _decay_bank(dim: int, rates: Any = None, rate: float | None = None) -> Encoding:
    """The registry's decay: ``rates`` as given, one ``rate`` for every dim, or the default bank of ``dim``
    rates (:func:`decay` takes the rates themselves)."""
    if rates is not None and rate is not None:
        raise ValueError(f"give `rates` or `rate`, not both; got rates={rates!r} and rate={rate!r}")
    dim = check_int("dim", dim, min=1)
    if rate is not None:
        return decay(torch.full((dim,), check_real("rate", rate, nonnegative=True), dtype=torch.float64))
    return decay(default_decay_rates(dim) if rates is None else rates)


CATALOGUE: dict[str, CatalogueEntry] = {
    "nope": CatalogueEntry(nope, "Kazemnejad et al., 2023 (NoPE)", "A(u) = I", "nope"),
    "decay": CatalogueEntry(_decay_bank, "linear attention / SSMs", "A(u) = diag(e^{-r u})", "decay"),
    "growth": CatalogueEntry(
        growth, "the row the theory calls forbidden", "A(u) = diag(e^{+r u}), r > 0 (explicitly allowed)", "growth",
    ),
    "rope": CatalogueEntry(rope, "Su et al., 2021 (RoFormer)", "A(u) = ⊕ R(-ω_k u), ω_k = base^(-2k/d)", "rotation"),
    "xpos": CatalogueEntry(
        xpos, "Sun et al., 2022 (xPos)", "A(u) = ⊕ ζ_k^(u/scale_base) R(-ω_k u)", "damped_rotation",
    ),
    "retnet": CatalogueEntry(
        retnet, "Sun et al., 2023 (RetNet)", "A_h(u) = γ_h^u ⊕ R(-ω_k u), γ_h = 1 - 2^(-5-h)", "damped_rotation",
    ),
    "alibi": CatalogueEntry(
        alibi, "Press et al., 2022 (ALiBi)", "score = q·k - m_h (t - s) via slots and N = [[0,1],[0,0]]", "polynomial",
    ),
    "jordan": CatalogueEntry(_jordan_bank, "the theory's untried corner", "A(u) = e^{λu} Σ u^k/k! N^k", "polynomial"),
    "axial_rope": CatalogueEntry(
        axial_rope, "torchtune vision RoPE / CogVideo 3D", "A(u) = exp(Σ_a u_a X_a), axis a owns a block of planes",
        "rotation",
    ),
    "rope_mixed": CatalogueEntry(
        rope_mixed, "Heo et al., 2024 (RoPE-Mixed)", "A(u) = ⊕ R(-(ω_k · u)), ω_k a 2D frequency vector per head",
        "rotation",
    ),
    "mrope": CatalogueEntry(
        mrope, "Wang et al., 2024 (Qwen2-VL M-RoPE)", "A(u) = ⊕ R(-ω_k u_{axis(k)}), sections of planes per (t, h, w)",
        "rotation",
    ),
    "decay_axial_rope": CatalogueEntry(
        decay_axial_rope, "decay along one axis, rotation along all", "A(u) = e^{-r u_decay} ⊕ R(-ω_k u_{axis(k)})",
        "damped_rotation",
    ),
    "p_rope": CatalogueEntry(
        p_rope, "Barbero et al., 2024 (p-RoPE, arXiv 2410.06205)", "A(u) = ⊕_{k<p·d/2} R(-ω_k u) ⊕ I", "rotation",
    ),
    "rope_id": CatalogueEntry(
        rope_id, "Wertheimer et al., 2026 (RoPE-ID, arXiv 2603.18017)", "A(u) = ⊕_{fast half} R(-ω_k u) ⊕ I", "rotation",
    ),
    "cope_clipped": CatalogueEntry(
        cope_clipped, "Li et al., 2026 (clipped RoPE / CoPE, arXiv 2602.05258)",
        "A(u) = ⊕ R(-m_k ω_k u), m = Hann taper of the slowest", "rotation",
    ),
    "string_google": CatalogueEntry(
        string_google, "Schenck et al., 2025 (STRING, arXiv 2502.02562)", "A(u) = P exp(uJ) Pᵀ, P orthogonal", "rotation",
    ),
    "mrope_interleaved": CatalogueEntry(
        mrope_interleaved, "Qwen3-VL, 2025 (MRoPE-Interleave, arXiv 2510.23095)", "A(u) = ⊕ R(-ω_k u_{k mod 3})",
        "rotation",
    ),
    "rope_directions": CatalogueEntry(
        rope_directions, "golden-gate / random-direction N-D RoPE (NovelAI; \"On N-dimensional RoPE\")",
        "A(u) = ⊕ R(-ω_k ⟨d_k, u⟩)", "rotation",
    ),
    "mhrope": CatalogueEntry(
        mhrope, "Qwen, 2025 (Multi-Head RoPE, arXiv 2510.23095)", "A_h(u) = ⊕ R(-ω_k u_{axis(h)})", "rotation",
    ),
}


def build(name: str, dim: int, num_heads: int | None = None, **options: object) -> Encoding:
    """``CATALOGUE[name].fn(dim, num_heads=num_heads, **options)``: a catalogue entry by name, the width
    first; ``num_heads`` is passed to the encodings with per-head parameters (and required by them).

    >>> import torch
    >>> bool(torch.equal(build("rope", 8, base=500.0).generator.freqs, rope(8, 500.0).generator.freqs))
    True
    >>> build("alibi", 8, 4).num_heads == alibi(8, num_heads=4).num_heads == 4
    True
    """
    entry = CATALOGUE[check_choice("name", name, sorted(CATALOGUE))]
    try:
        return entry.build(dim, num_heads, **options)
    except TypeError as err:
        if "`" in str(err):  # a checked argument: already names itself
            raise
        raise TypeError(f"bad options {sorted(options)} for encoding {name!r}: {err}; its options: "
                        f"{entry.options}") from err
