"""Positions through a user coordinate map before the group: ``p ↦ u = φ(p)``, then ``A(u)``.

Circle-RoPE (arXiv 2505.16416) puts image tokens on a circle orthogonal to the text direction
(:func:`circle_rope`), VRoPE (arXiv 2502.11664) re-indexes video positions by a 45° rotation of the frame
with its mirror images (:func:`vrope`, with its encoding :func:`vrope_encoding`); both are a map φ on the
positions followed by a member of the family (:data:`COORDINATE_MAPS` names them). The scores are then
relative *in the mapped coordinates*: ``F(φ(t))ᵀ G(φ(s)) = A(φ(t) − φ(s))``, a function of t − s only
when φ is affine. :class:`Mapped` is the composite (its ``query``/``key`` take raw positions, so
:func:`liepos.diagnose` probes it as the user meets it); :func:`liepos.attention` takes the mapped
positions directly: ``lp.attention(q, k, v, m.encoding, m.positions(t), m.positions(s))``.

>>> import torch, liepos as lp
>>> m = Mapped(lp.rope_directions(8), ring(12))
>>> q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
>>> a = (m.query(q, [3.0]) * m.key(k, [1.0])).sum()            # raw positions 3 and 1 ...
>>> b = (m.encoding.query(q, m.positions([3.0])) * m.encoding.key(k, m.positions([1.0]))).sum()
>>> bool(torch.allclose(a, b))                                  # ... are A(φ(3) − φ(1))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from liepos._checks import check_int, check_real, describe
from liepos.catalogue import rope_directions
from liepos.encoding import Encoding

__all__ = ["Mapped", "ring", "circle_rope", "vrope", "vrope_encoding", "COORDINATE_MAPS"]


def ring(period: int, radius: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """``p ↦ r (cos 2πp/N, sin 2πp/N)``: N positions on a circle of radius r (a plain ring; Circle-RoPE's full
    map, with its text axis, is :func:`circle_rope`). Positions ``(seq,)`` -> ``(seq, 2)``.

    >>> ring(4)(torch.tensor([0.0, 1.0])).round(decimals=12).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    period = check_int("period", period, min=1)
    radius = check_real("radius", radius, positive=True)

    def phi(p: torch.Tensor) -> torch.Tensor:
        # the residue first (fmod is exact), so the angle is 2π·(p mod N)/N at any p: never 2π/N times a large p
        a = torch.fmod(p.to(torch.float64), period) * (2 * math.pi / period)
        return radius * torch.stack((torch.cos(a), torch.sin(a)), dim=-1)  # (…, seq) -> (…, seq, 2)

    phi.__qualname__ = f"ring({period}, {radius:g})"
    return phi


class Mapped:
    """``encoding`` met through the coordinate map ``fn``: ``query(q, p) = encoding.query(q, fn(p))``.

    ``fn`` takes float64 positions ``(seq,)`` or ``(batch, seq)`` (or with an axes dim) and returns the
    encoding's positions.
    """

    def __init__(self, encoding: Encoding, fn: Callable[[torch.Tensor], torch.Tensor], name: str | None = None) -> None:
        if not isinstance(encoding, Encoding):
            raise TypeError(f"`encoding` must be a liepos.Encoding, got {describe(encoding)}")
        if not callable(fn):
            raise TypeError(f"`fn` must be callable (positions -> coordinates), got {describe(fn)}")
        self.encoding, self.fn = encoding, fn
        self.name = name or f"{encoding.name}∘{getattr(fn, '__qualname__', 'map')}"
        self.dim = encoding.content_dim

    def positions(self, p: Any) -> torch.Tensor:
        """``φ(p)``: the coordinates the encoding sees."""
        return self.fn(torch.as_tensor(p, dtype=torch.float64))

    def query(self, q: torch.Tensor, positions: Any, **kw: Any) -> torch.Tensor:
        return self.encoding.query(q, self.positions(positions), **kw)

    def key(self, k: torch.Tensor, positions: Any, **kw: Any) -> torch.Tensor:
        return self.encoding.key(k, self.positions(positions), **kw)

    def __repr__(self) -> str:
        return f"Mapped({self.name})"


def _token_indices(p: torch.Tensor, name: str) -> torch.Tensor:
    """``p`` as float64, refused unless every entry is an integer (the maps index tokens)."""
    p = p.to(torch.float64)
    if not bool(torch.isfinite(p).all()) or not bool((p == torch.round(p)).all()):
        raise ValueError(f"{name} maps token indices: the positions must be integers, got {p.flatten()[:6].tolist()}")
    return p


def _sequence_map(text_len: int, offsets: torch.Tensor, after: float, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The map of [text_len text tokens, one visual block, text]: text before at ``p·1``, visual token k at
    ``text_len·1 + offsets[k]``, text after at ``(p − text_len − len(offsets) + after)·1``."""
    size, axes = offsets.shape

    def phi(p: torch.Tensor) -> torch.Tensor:
        p = _token_indices(p, name)
        out = p.unsqueeze(-1).repeat_interleave(axes, dim=-1)  # (…, seq) -> (…, seq, axes): text at p·1
        block = (p >= text_len) & (p < text_len + size)
        out[block] = text_len + offsets[(p[block] - text_len).long()]  # (n_block, axes)
        tail = p >= text_len + size
        out[tail] = (p[tail] - (text_len + size) + after).unsqueeze(-1)  # (n_tail, 1) -> every axis
        return out

    phi.__qualname__ = name
    return phi


def circle_rope(text_len: int, grid_h: int, grid_w: int, *, radius: float = 10.0,
                alpha: float = 0.5) -> Callable[[torch.Tensor], torch.Tensor]:
    """Circle-RoPE (Wang et al., arXiv 2505.16416): an image's tokens on a circle orthogonal to the text line.

    For the sequence ``[text_len text tokens, a grid_h × grid_w image, text]`` the token index p maps to
    M-RoPE's ``(t, h, w)`` coordinates::

        text before (p < n):   φ(p) = (p, p, p)                         (n = text_len)
        image token k = h·W + w (row-major):
            x = w − (W−1)/2,  y = h − (H−1)/2                           (centred on the grid)
            θ_a = atan2(y, x) rescaled linearly from [min, max] over the grid to [0, 2π]
            θ_i = 2π k / (H W)
            θ   = α θ_a + (1 − α) θ_i
            φ(n + k) = n·(1, 1, 1) + R cos θ · u + R sin θ · v
              with u = (−1, 1, 0)/√2, v = (−1, −1, 2)/√6 in (w, h, t), i.e. (0, 1, −1)/√2, (2, −1, −1)/√6
              in (t, h, w): an orthonormal basis of the plane orthogonal to the text direction (1, 1, 1)
        text after (p ≥ n + HW):  φ(p) = (p − n − HW + m)·(1, 1, 1),  m = max over the image's coordinates + 1

    so every image token is at distance ``√(3(p − n)² + R²)`` from the text token p: a cone with its apex on
    the text line (the paper's equal distance from a text token to all image tokens). ``R = radius``, ``α =
    alpha`` (the authors' released configuration: 10 and 0.5, the grid centred). As in the authors' code for
    Qwen2.5-VL, with M-RoPE (:func:`liepos.mrope`) on these coordinates; their alternation with plain M-RoPE
    indices across layers (AGE) is the caller's, one map per layer. Computed in float64 (the reference code
    runs in float32). Token indices ``(…, seq)`` (integers) -> ``(…, seq, 3)``.

    >>> import torch
    >>> phi = circle_rope(2, 2, 2, radius=1.0)
    >>> c = phi(torch.arange(7.0))  # 2 text tokens, the 4 image tokens, 1 text token
    >>> c[:2].tolist(), bool(torch.allclose((c[2:6] - 2.0).sum(-1), torch.zeros(4, dtype=torch.float64)))
    ([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], True)
    """
    n = check_int("text_len", text_len, min=0)
    H, W = check_int("grid_h", grid_h, min=1), check_int("grid_w", grid_w, min=1)
    R = check_real("radius", radius, positive=True)
    a = check_real("alpha", alpha, min=0.0, max=1.0)
    hh = torch.arange(H, dtype=torch.float64).repeat_interleave(W)  # (HW,) row-major h
    ww = torch.arange(W, dtype=torch.float64).repeat(H)  # (HW,) row-major w
    angle = torch.atan2(hh - (H - 1) / 2, ww - (W - 1) / 2)
    span = angle.max() - angle.min()
    theta_a = (angle - angle.min()) / span * (2 * math.pi) if float(span) > 0 else angle
    theta_i = torch.arange(H * W, dtype=torch.float64) / (H * W) * (2 * math.pi)
    theta = a * theta_a + (1 - a) * theta_i
    u = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64) / math.sqrt(2.0)  # (t, h, w)
    v = torch.tensor([2.0, -1.0, -1.0], dtype=torch.float64) / math.sqrt(6.0)
    offsets = R * (torch.cos(theta)[:, None] * u + torch.sin(theta)[:, None] * v)  # (HW, 3) around the centre
    return _sequence_map(n, offsets, n + float(offsets.max()) + 1.0, f"circle_rope({n}, {H}, {W}, R={R:g}, α={a:g})")


def vrope(text_len: int, frames: int, grid_h: int, grid_w: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """VRoPE (Liu et al., arXiv 2502.11664): a video's tokens at four symmetric, 45°-rotated indices.

    For the sequence ``[text_len text tokens, frames × grid_h × grid_w video, text]`` the token index p maps
    to four coordinates (one per group of planes, :func:`vrope_encoding`)::

        text before (p < n):  φ(p) = (p, p, p, p)                         (n = text_len)
        video token k = τ·HW + h·W + w (frame τ, row h, column w),  L = H + W − 1:
            φ(n + k) = n + τ L + (h + w,  h + (W−1−w),  (H−1−h) + w,  (H−1−h) + (W−1−w))
        text after (p ≥ n + T·HW):  φ(p) = (p − n − T·HW + n + T·L)·(1, 1, 1, 1)

    The four are ``±(h + w)`` and ``±(h − w)`` up to constants — the frame rotated by 45° and mirrored
    (symmetric bias mitigation) — and each frame's centre ``n + τL + (L − 1)/2`` lies on the text diagonal,
    frames one after the other along it (temporal centred arrangement), each taking L indices. As in the
    authors' released ``vrope.py`` (no separate time planes). Token indices ``(…, seq)`` -> ``(…, seq, 4)``.

    >>> import torch
    >>> vrope(1, 1, 2, 2)(torch.arange(6.0)).int().tolist()  # 1 text token, a 2×2 frame, 1 text token
    [[0, 0, 0, 0], [1, 2, 2, 3], [2, 1, 3, 2], [2, 3, 1, 2], [3, 2, 2, 1], [4, 4, 4, 4]]
    """
    n = check_int("text_len", text_len, min=0)
    T = check_int("frames", frames, min=1)
    H, W = check_int("grid_h", grid_h, min=1), check_int("grid_w", grid_w, min=1)
    L = H + W - 1
    tau = torch.arange(T, dtype=torch.float64).repeat_interleave(H * W)  # (THW,) frame-major
    hh = torch.arange(H, dtype=torch.float64).repeat_interleave(W).repeat(T)  # (THW,)
    ww = torch.arange(W, dtype=torch.float64).repeat(H * T)  # (THW,)
    hf, wf = (H - 1) - hh, (W - 1) - ww  # the mirrored indices
    offsets = torch.stack((hh + ww, hh + wf, hf + ww, hf + wf), dim=-1) + (tau * L)[:, None]  # (THW, 4)
    return _sequence_map(n, offsets, float(n + T * L), f"vrope({n}, {T}, {H}, {W})")


def vrope_encoding(dim: int, base: float = 10000.0, layout: str = "half") -> Encoding:
    """VRoPE's encoding of :func:`vrope`'s four coordinates: RoPE's plane k (``ω_k = base^(−2k/dim)``)
    rotates along coordinate ``k mod 4`` — :func:`liepos.rope_directions` with ``d_k = e_(k mod 4)``:
    ``A(u) = ⊕_k R(−ω_k u_(k mod 4))``. Text tokens (all four coordinates equal) get exactly ``rope(dim, base)``.

    >>> import torch, liepos as lp
    >>> q, t = torch.randn(1, 1, 3, 16, dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)
    >>> text = t.unsqueeze(-1).expand(3, 4)
    >>> bool(torch.allclose(vrope_encoding(16).query(q, text), lp.rope(16, layout="half").query(q, t)))
    True
    """
    dim = check_int("dim", dim, min=2, even=True)
    P = dim // 2
    d = torch.zeros(P, 4, dtype=torch.float64)
    d[torch.arange(P), torch.arange(P) % 4] = 1.0  # (planes, axes): plane k follows coordinate k mod 4
    enc = rope_directions(dim, axes=4, directions=d, base=check_real("base", base, positive=True), layout=layout)
    return enc.replace(name="vrope")


COORDINATE_MAPS: dict[str, Callable[..., Callable[[torch.Tensor], torch.Tensor]]] = {
    "ring": ring,
    "circle_rope": circle_rope,
    "vrope": vrope,
}
"""Every named coordinate map: ``COORDINATE_MAPS[name](*args, **params) -> φ`` (token indices -> coordinates)."""
