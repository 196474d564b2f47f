"""Circle-RoPE and VRoPE: positions through a coordinate map, then a member of the family.

Each map against its definition written out token by token (both reimplemented from the papers and the
authors' released code; no package ships them), the geometry each paper claims (Circle-RoPE's cone, VRoPE's
centred frames), the identity ``F(φ(t))ᵀ G(φ(s)) = qᵀ A(φ(t) − φ(s)) k`` in the mapped coordinates,
``diagnose``'s verdict in the raw positions and in the mapped coordinates, and decode == full forward.
"""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp
from liepos.coordinates import COORDINATE_MAPS, Mapped, circle_rope, ring, vrope, vrope_encoding

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def circle_reference(n, H, W, m, R, a):
    """Circle-RoPE's positions, one token at a time with math (arXiv 2505.16416; the grid centred)."""
    angles = [math.atan2(h - (H - 1) / 2, w - (W - 1) / 2) for h in range(H) for w in range(W)]
    lo, hi = min(angles), max(angles)
    u = (0.0, 1 / math.sqrt(2), -1 / math.sqrt(2))  # (t, h, w), orthogonal to (1, 1, 1)
    v = (2 / math.sqrt(6), -1 / math.sqrt(6), -1 / math.sqrt(6))
    out = [[float(p)] * 3 for p in range(n)]
    for k, ang in enumerate(angles):
        th_a = (ang - lo) / (hi - lo) * 2 * math.pi if hi > lo else ang
        th = a * th_a + (1 - a) * (2 * math.pi * k / (H * W))
        out.append([n + R * math.cos(th) * u[i] + R * math.sin(th) * v[i] for i in range(3)])
    start = max(max(c) for c in out[n:]) + 1
    out += [[start + j] * 3 for j in range(m)]
    return torch.tensor(out, dtype=F64)


def vrope_reference(n, T, H, W, m):
    """VRoPE's four indices, one token at a time (arXiv 2502.11664)."""
    L = H + W - 1
    out = [[float(p)] * 4 for p in range(n)]
    for tau in range(T):
        for h in range(H):
            for w in range(W):
                base = n + tau * L
                out.append([base + h + w, base + h + (W - 1 - w), base + (H - 1 - h) + w,
                            base + (H - 1 - h) + (W - 1 - w)])
    out += [[float(n + T * L + j)] * 4 for j in range(m)]
    return torch.tensor(out, dtype=F64)


@pytest.mark.parametrize("n, H, W, m, R, a", [(3, 3, 4, 2, 10.0, 0.5), (0, 2, 2, 1, 1.0, 0.0), (4, 4, 3, 2, 2.5, 1.0),
                                              (2, 1, 1, 2, 3.0, 0.5)])
def test_circle_rope_is_its_definition(n, H, W, m, R, a):
    p = torch.arange(n + H * W + m, dtype=F64)
    got = circle_rope(n, H, W, radius=R, alpha=a)(p)
    assert got.shape == (len(p), 3)
    assert rel_err(got, circle_reference(n, H, W, m, R, a)) < 1e-14


def test_circle_rope_is_a_cone_over_the_text_line():
    """The image's tokens lie on a circle of radius R around n·(1, 1, 1), in the plane orthogonal to the text
    direction, so each text token is equally far from all of them: √(3(p − n)² + R²)."""
    n, H, W, R = 5, 3, 4, 2.0
    c = circle_rope(n, H, W, radius=R)(torch.arange(n + H * W + 3, dtype=F64))
    img = c[n : n + H * W] - n  # (HW, 3) around the centre
    assert (img.sum(-1).abs() < 1e-12).all() and ((img.norm(dim=-1) - R).abs() < 1e-12).all()
    text = torch.cat((c[:n], c[n + H * W :]))  # (n + 3, 3), each on the diagonal
    d = torch.cdist(text, c[n : n + H * W])  # (text, image)
    p = text[:, 0]
    assert ((d - torch.sqrt(3 * (p - n) ** 2 + R**2)[:, None]).abs() < 1e-12).all()


@pytest.mark.parametrize("n, T, H, W, m", [(3, 2, 3, 4, 2), (0, 1, 2, 5, 3), (5, 3, 1, 1, 1)])
def test_vrope_is_its_definition(n, T, H, W, m):
    got = vrope(n, T, H, W)(torch.arange(n + T * H * W + m, dtype=F64))
    assert torch.equal(got, vrope_reference(n, T, H, W, m))


def test_vrope_centres_each_frame_on_the_text_diagonal():
    """Temporal centred arrangement: frame τ's mean on every coordinate is n + τL + (L − 1)/2; the four are
    ±(h + w), ±(h − w) up to constants (the frame rotated by 45° and mirrored)."""
    n, T, H, W = 2, 3, 3, 5
    L = H + W - 1
    c = vrope(n, T, H, W)(torch.arange(n + T * H * W, dtype=F64))[n:].reshape(T, H * W, 4)  # (T, HW, 4)
    want = n + torch.arange(T, dtype=F64) * L + (L - 1) / 2
    assert torch.equal(c.mean(1), want[:, None].expand(T, 4))
    hh = torch.arange(H, dtype=F64).repeat_interleave(W)
    ww = torch.arange(W, dtype=F64).repeat(H)
    f = c[0] - n  # frame 0
    assert torch.equal(f[:, 0] - f[:, 3], 2 * (hh + ww) - (L - 1)) and torch.equal(f[:, 1] - f[:, 2], 2 * (hh - ww) + (W - H))


MAPS = {
    "circle_rope": (lambda: circle_rope(2, 3, 3, radius=4.0), lambda: lp.mrope(12, (2, 2, 2), layout="interleaved"), 3),
    "vrope": (lambda: vrope(2, 2, 2, 3), lambda: vrope_encoding(16, layout="interleaved"), 4),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_the_identity_holds_in_the_mapped_coordinates(name):
    """F(φ(t))ᵀ G(φ(s)) = qᵀ A(φ(t) − φ(s)) k with A(u) = exp(Σ_a u_a X_a) the generator's dense exponential."""
    fn, make, axes = MAPS[name]
    enc = make()
    m = Mapped(enc, fn())
    d = enc.content_dim
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, d, dtype=F64), torch.randn(1, 1, 1, d, dtype=F64)
    for t, s in [(1, 0), (5, 3), (9, 4), (14, 6), (16, 15)]:
        score = (m.query(q, [float(t)]) * m.key(k, [float(s)])).sum()
        u = m.positions([float(t)])[0] - m.positions([float(s)])[0]  # (axes,) the mapped lag
        assert u.shape == (axes,)
        want = q.flatten() @ enc.generator.exp(u) @ k.flatten()
        assert abs(float(score - want)) < 1e-12 * max(1.0, abs(float(want))), (name, t, s)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_diagnose_says_relative_in_the_mapped_coordinates_only(name):
    """The composite (raw token index in) is not translation invariant — an image token's coordinates are not a
    shift of its index; the encoding on the mapped coordinates (axes in) is relative."""
    fn, make, axes = MAPS[name]
    enc = make()
    m = Mapped(enc, fn(), name=name)
    raw = lp.diagnose(m.query, m.key, dim=enc.content_dim, domain="integer", lengths=(16, 24), label=name)
    assert not raw.relative and "not_translation_invariant" in raw.names()
    mapped = lp.diagnose(enc.query, enc.key, dim=enc.content_dim, axes=axes, lengths=(16, 24))
    assert mapped.relative


@pytest.mark.parametrize("name", sorted(MAPS))
def test_decode_equals_full_forward_on_mapped_positions(name):
    fn, make, _ = MAPS[name]
    enc, phi = make(), fn()
    S, d = 14, make().content_dim
    q, k, v = (torch.randn(1, 2, S, d, dtype=F64) for _ in range(3))
    pos = phi(torch.arange(S, dtype=F64))  # (S, axes)
    full = lp.attention(q, k, v, enc, pos, pos)
    cache = lp.KVCache()
    parts = [lp.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, pos[:4], pos[:4], cache=cache)]
    for i in range(4, S):
        parts.append(lp.attention(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], enc, pos[i : i + 1],
                                  pos[i : i + 1], cache=cache))
    assert rel_err(torch.cat(parts, 2), full) < 1e-12


def test_vrope_encoding_is_rope_on_text_and_follows_coordinate_k_mod_4():
    enc = vrope_encoding(16)
    w = enc.generator.freqs  # (axes, planes)
    assert (w != 0).int().argmax(0).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.allclose(w.abs().sum(0), lp.rope_freqs(16, 10000.0)) and enc.name == "vrope"


def test_the_maps_are_registered_and_refuse_bad_arguments():
    assert COORDINATE_MAPS == {"ring": ring, "circle_rope": circle_rope, "vrope": vrope}
    with pytest.raises(ValueError, match="integers"):
        circle_rope(1, 2, 2)(torch.tensor([0.5]))
    with pytest.raises(ValueError, match="integers"):
        vrope(1, 1, 2, 2)(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="alpha"):
        circle_rope(1, 2, 2, alpha=1.5)
    with pytest.raises(ValueError, match="radius"):
        circle_rope(1, 2, 2, radius=0.0)
    with pytest.raises(ValueError, match="grid_w"):
        vrope(1, 1, 2, 0)
    with pytest.raises(ValueError, match="frames"):
        vrope(1, 0, 2, 2)
