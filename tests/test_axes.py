"""Several position axes: commuting generators, shift invariance along every axis, the catalogue
against the upstream code (torchtune's vision RoPE, Hugging Face's Qwen2-VL M-RoPE), attention and
caches with positions (…, seq, axes)."""

import math

import pytest
import torch

import liepos as lp
from liepos import Encoding, Generator, axial_rope, decay_axial_rope, mrope, rope_mixed

F64 = torch.float64


def _jordan_axes():
    """Two axes on a damped size-2 complex block, a real size-3 Jordan block and a rotation, in a random basis."""
    g = torch.Generator().manual_seed(3)
    P = torch.eye(9, dtype=F64) + 0.2 * torch.randn(9, 9, generator=g, dtype=F64)
    rates = torch.tensor([[-0.05, -0.1, 0.0], [-0.02, 0.0, 0.0]], dtype=F64)
    freqs = torch.tensor([[0.7, 0.0, 0.3], [-0.4, 0.0, 1.1]], dtype=F64)
    nus = torch.tensor([[1.0, 0.5, 1.0], [0.25, -1.0, 1.0]], dtype=F64)
    return Generator(rates, freqs, [2, 3, 1], nus=nus, complex=[True, False, True], basis=P, axes=2)


def encodings():
    return {
        "axial2": axial_rope(8, axes=2),
        "axial3": axial_rope(12, axes=3, layout="half"),
        "mixed": rope_mixed(8, num_heads=2),
        "mrope": mrope(16, (2, 3, 3)),
        "decay_axial": decay_axial_rope(12, axes=3),
        "jordan_basis": Encoding(_jordan_axes()),
        "jordan": Encoding(_jordan_axes().with_basis(None)),
    }


def _scores(enc, q, k, t, s):
    return enc.query(q, t) @ enc.key(k, s).transpose(-1, -2)


@pytest.mark.parametrize("name", list(encodings()))
def test_shifted_positions_along_every_axis_leave_scores_unchanged(name):
    enc = encodings()[name]
    A, H = enc.num_axes, enc.num_heads or 1
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, 5, enc.content_dim, generator=g, dtype=F64)
    k = torch.randn(2, H, 6, enc.content_dim, generator=g, dtype=F64)
    t = torch.randn(2, 5, A, generator=g, dtype=F64) * 4
    s = torch.randn(2, 6, A, generator=g, dtype=F64) * 4
    ref = _scores(enc, q, k, t, s)
    shifts = [torch.eye(A, dtype=F64)[a] * c for a in range(A) for c in (1.0, -3.5, 17.0)]
    shifts.append(torch.randn(A, generator=g, dtype=F64) * 10)
    for c in shifts:
        got = _scores(enc, q, k, t + c, s + c)
        assert torch.allclose(got, ref, rtol=1e-9, atol=1e-9), (name, c)
    # and the score is exp(Σ (t_a − s_a) X_a) between the [q; slots], [k; slots]
    lags = t[:, :, None, :] - s[:, None, :, :]  # (B, Sq, Sk, A)
    M = enc.generator.exp(lags)  # (B, Sq, Sk, *heads, d, d)
    if enc.num_heads is None:
        M = M.unsqueeze(3)
    M = M.permute(0, 3, 1, 2, 4, 5)
    perm = enc.plan.perm
    qc, kc = q.index_select(-1, perm), k.index_select(-1, perm)
    want = torch.einsum("bhtd,bhtsde,bhse->bhts", qc, M, kc)
    assert torch.allclose(ref, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(encodings()))
def test_tables_agree_with_the_dense_reference_path(name):
    enc = encodings()[name]
    A, H = enc.num_axes, enc.num_heads or 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, H, 4, enc.content_dim, generator=g, dtype=F64)
    for pos in (torch.randn(4, A, generator=g, dtype=F64) * 3, torch.randn(3, 4, A, generator=g, dtype=F64) * 3):
        assert torch.allclose(enc.query(x, pos), enc.query_reference(x, pos), atol=1e-10)
        assert torch.allclose(enc.key(x, pos), enc.key_reference(x, pos), atol=1e-10)
    # re-centring at an origin per axis only changes the absolute frame
    o = torch.randn(A, generator=g, dtype=F64)
    pos = torch.randn(4, A, generator=g, dtype=F64)
    assert torch.allclose(enc.query(x, pos, origin=o), enc.query(x, pos - o))


def test_group_law_and_commuting_generators():
    ag = _jordan_axes()
    X = ag.matrix()
    assert X.shape == (2, 9, 9)
    assert torch.linalg.norm(X[0] @ X[1] - X[1] @ X[0]) < 1e-10
    g = torch.Generator().manual_seed(2)
    u, v = torch.randn(2, generator=g, dtype=F64), torch.randn(2, generator=g, dtype=F64)
    assert torch.allclose(ag.exp(u + v), ag.exp(u) @ ag.exp(v), atol=1e-12)
    assert torch.allclose(ag.exp(torch.zeros(2, dtype=F64)), torch.eye(9, dtype=F64))
    assert torch.allclose(ag.exp(u), torch.linalg.matrix_exp(u[0] * X[0] + u[1] * X[1]), atol=1e-12)
    # one-axis views: along(e_a) is X_a, along(c) is Σ c_a X_a
    for a in range(2):
        assert torch.allclose(ag.axis(a).matrix(), X[a], atol=1e-12)
    c = torch.tensor([0.3, -2.0], dtype=F64)
    assert torch.allclose(ag.along(c).matrix(), c[0] * X[0] + c[1] * X[1], atol=1e-12)


def test_from_matrices_recovers_commuting_generators():
    ag = _jordan_axes()
    got = lp.Generator.from_matrices(list(ag.matrix()))
    assert got.num_axes == 2 and got.sizes.count(1) >= 1
    assert sorted(zip(got.sizes, got.complex)) == sorted(zip(ag.sizes, ag.complex))
    g = torch.Generator().manual_seed(4)
    u = torch.randn(5, 2, generator=g, dtype=F64) * 3
    assert torch.allclose(got.exp(u), ag.exp(u), rtol=1e-7, atol=1e-7)
    # the catalogue's axes come back exactly (canonical basis, rates snapped to 0)
    m = mrope(16, (2, 3, 3)).generator
    back = lp.Generator.from_matrices(m.matrix())
    assert back.is_orthogonal and back.num_axes == 3
    assert torch.allclose(back.exp(torch.tensor([1.0, 2.0, 3.0], dtype=F64)),
                          m.exp(torch.tensor([1.0, 2.0, 3.0], dtype=F64)), atol=1e-12)


def test_from_matrices_refuses_non_commuting_axes_and_reports_the_norm():
    # LieRE-style: two random skew generators do not commute
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64)
    X1, X2 = a - a.T, b - b.T
    c = float(torch.linalg.norm(X1 @ X2 - X2 @ X1))
    with pytest.raises(ValueError, match=r"do not commute: ‖\[X_0, X_1\]‖ = ") as err:
        lp.Generator.from_matrices([X1, X2])
    assert f"{c:.3g}" in str(err.value)
    with pytest.raises(ValueError, match="square"):
        lp.Generator.from_matrices([torch.zeros(2, 3)])


def _torchtune_position_embeddings():
    """torchtune's ``modules/position_embeddings.py`` (torch only), loaded without torchtune's
    ``__init__`` (which needs a matching torchao); skips when torchtune is not installed."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtune is not installed")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "modules" / "position_embeddings.py"
    mod_spec = importlib.util.spec_from_file_location("_torchtune_position_embeddings", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_axial_2d_matches_torchtune_vision_rope():
    tt = _torchtune_position_embeddings()
    head_dim, grid, base = 16, 3, 10000
    ref = tt.VisionRotaryPositionalEmbeddings(
        patch_size=10, tile_size=10 * grid, max_num_tiles=1, dim=head_dim // 2, base=base
    )
    S = grid * grid + 1  # patches, then the CLS token
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, S, 2, head_dim, generator=g)  # torchtune: (b, s, heads, head_dim)
    want = ref(x).transpose(1, 2)
    idx = torch.arange(grid * grid)
    # torchtune's patch positions are (x + 1, y + 1); the CLS token sits at (0, 0)
    pos = torch.stack([idx % grid + 1, idx // grid + 1], dim=-1).to(F64)
    pos = torch.cat([pos, torch.zeros(1, 2, dtype=F64)])
    got = axial_rope(head_dim, axes=2, base=base).query(x.transpose(1, 2).double(), pos)
    assert torch.allclose(got.float(), want, atol=2e-6)


def _hf_mrope(head_dim, sections, base, x, position_ids):
    """Hugging Face's Qwen2-VL rotary embedding and apply_rotary_pos_emb on x (B, H, S, D)."""
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers import Qwen2VLConfig

    heads = x.shape[1]
    cfg = Qwen2VLConfig(text_config=dict(
        hidden_size=head_dim * heads, num_attention_heads=heads,
        rope_parameters=dict(rope_type="default", rope_theta=base, mrope_section=list(sections)),
    )).get_text_config()
    rot = hf.Qwen2VLRotaryEmbedding(cfg).double()
    rot.inv_freq = lp.rope_freqs(head_dim, base)  # float64 frequencies: compare the formula, not rounding
    cos, sin = rot(x, position_ids)
    out, _ = hf.apply_rotary_pos_emb(x, x, cos, sin)
    return out


def test_mrope_matches_qwen2_vl_and_reduces_to_rope_on_text():
    head_dim, sections, base = 16, (2, 3, 3), 10000.0
    enc = mrope(head_dim, sections, base)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 2, 7, head_dim, generator=g, dtype=F64)
    # an image of 2×3 patches between text tokens, Qwen2-VL style position ids (t, h, w)
    t = torch.tensor([0, 1, 2, 2, 2, 2, 2, 2, 5], dtype=F64)[:7]
    h = torch.tensor([0, 1, 2, 2, 2, 3, 3, 3, 5], dtype=F64)[:7]
    w = torch.tensor([0, 1, 2, 3, 4, 2, 3, 4, 5], dtype=F64)[:7]
    pos = torch.stack([t, h, w], dim=-1)  # (S, 3)
    want = _hf_mrope(head_dim, sections, base, x, pos.T[:, None, :].expand(3, 2, 7))
    assert torch.allclose(enc.query(x, pos), want, atol=1e-12)
    # text only: equal axes is exactly 1-D RoPE in the half layout (same tables, same values)
    text = torch.arange(7, dtype=F64) * 3.0 + 1e6
    rope = lp.rope(head_dim, base, layout="half")
    pos3 = text[:, None].expand(7, 3)
    ta, tr = enc.tables(pos3, "query"), rope.tables(text, "query")
    assert torch.equal(ta.a, tr.a) and torch.equal(ta.b, tr.b)
    assert torch.allclose(enc.query(x, pos3), rope.query(x, text), rtol=0, atol=1e-14)
    assert torch.allclose(enc.generator.along(torch.ones(3, dtype=F64)).matrix(), rope.generator.matrix())
    q, k, v = (torch.randn(2, 2, 7, head_dim, generator=g, dtype=F64) for _ in range(3))
    a1 = lp.attention(q, k, v, enc, positions=pos3, key_positions=pos3)
    a2 = lp.attention(q, k, v, rope, positions=text, key_positions=text)
    assert torch.allclose(a1, a2, atol=1e-12)


def _reference_attention(enc, q, k, v, t, s, causal=True):
    """Dense float64 reference: softmax(qᵀ exp(Σ (t_a − s_a) X_a) k / √d) with a token-order causal mask."""
    lags = t[:, :, None, :] - s[:, None, :, :]
    M = enc.generator.exp(lags)
    if enc.num_heads is None:
        M = M.unsqueeze(3)
    M = M.permute(0, 3, 1, 2, 4, 5)
    perm = enc.plan.perm
    sc = torch.einsum("bhtd,bhtsde,bhse->bhts", q.index_select(-1, perm), M, k.index_select(-1, perm))
    sc = sc / math.sqrt(enc.content_dim)
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(Sq)[:, None] + (Sk - Sq)
        sc = sc.masked_fill(torch.arange(Sk)[None, :] > i, -math.inf)
    return torch.softmax(sc, -1) @ v


@pytest.mark.parametrize("name", ["axial2", "mixed", "decay_axial", "jordan"])
def test_attention_with_several_axes_and_a_cache(name):
    enc = encodings()[name]
    A, H = enc.num_axes, enc.num_heads or 2
    g = torch.Generator().manual_seed(8)
    B, S = 2, 9
    q, k, v = (torch.randn(B, H, S, enc.content_dim, generator=g, dtype=F64) for _ in range(3))
    # positions that are monotone on the first axis (time), arbitrary on the others
    pos = torch.randn(B, S, A, generator=g, dtype=F64) * 3
    pos[..., 0] = torch.cumsum(torch.rand(B, S, generator=g, dtype=F64), -1) + 100.0
    kw = dict(allow_bidirectional=True) if enc.needs_recentring else {}
    full = lp.attention(q, k, v, enc, positions=pos, key_positions=pos, block_size=4, **kw)
    want = _reference_attention(enc, q, k, v, pos, pos)
    assert torch.allclose(full, want, atol=1e-9)
    # shifting every position along every axis changes nothing
    c = torch.tensor([1e4, -37.0, 5.5][:A], dtype=F64)
    assert torch.allclose(lp.attention(q, k, v, enc, positions=pos + c, key_positions=pos + c, block_size=4), full,
                          atol=1e-9)
    # prefill + decode with a cache that stores the positions equals the full forward
    cache = lp.KVCache()
    outs = [lp.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, positions=pos[:, :5],
                         key_positions=pos[:, :5], cache=cache)]
    for i in range(5, S):
        sl = slice(i, i + 1)
        outs.append(lp.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc, positions=pos[:, sl],
                                 key_positions=pos[:, sl], cache=cache))
    assert cache.times.shape == (B, S, A)
    assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-9)
    # bidirectional (rotations are fine both ways)
    if not enc.needs_recentring:
        bi = lp.attention(q, k, v, enc, positions=pos, key_positions=pos, causal=False)
        assert torch.allclose(bi, _reference_attention(enc, q, k, v, pos, pos, causal=False), atol=1e-9)


def test_mrope_decode_continues_after_the_largest_position():
    enc = mrope(16, (2, 3, 3))
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 1, 4, 16, generator=g, dtype=F64) for _ in range(3))
    img = torch.tensor([[0, 0, 0], [1, 1, 1], [1, 1, 2], [1, 2, 1]], dtype=F64)  # text, then 3 patches
    cache = lp.KVCache()
    lp.attention(q, k, v, enc, positions=img, key_positions=img, cache=cache)
    qn, kn, vn = (torch.randn(1, 1, 1, 16, generator=g, dtype=F64) for _ in range(3))
    out = lp.attention(qn, kn, vn, enc, cache=cache)  # default: next text token at max + 1 = 3
    assert cache.times[0, -1].tolist() == [3.0, 3.0, 3.0]
    allpos = torch.cat([img, torch.full((1, 3), 3.0, dtype=F64)])
    want = _reference_attention(enc, torch.cat([q, qn], 2), torch.cat([k, kn], 2), torch.cat([v, vn], 2),
                                allpos[None], allpos[None])[:, :, -1:]
    assert torch.allclose(out, want, atol=1e-10)


def test_positions_must_carry_the_axes():
    enc = axial_rope(8, axes=2)
    x = torch.zeros(1, 1, 3, 8, dtype=F64)
    with pytest.raises(ValueError, match=r"\(seq, 2\) or \(batch, seq, 2\)"):
        enc.query(x, torch.arange(3))
    with pytest.raises(ValueError, match="has length 4 but the sequence has 3"):
        enc.query(x, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="growth"):
        Generator([[0.1]], [[0.0]], [1], axes=1)
    with pytest.raises(ValueError, match="sum to dim/2"):
        mrope(16, (2, 2, 2))


def test_diagnose_finds_each_axis_and_that_they_commute():
    enc = decay_axial_rope(8, axes=2)
    d = lp.diagnose(enc.query, enc.key, 8, axes=2, lengths=(8, 16))
    assert d.relative, str(d)
    X = enc.generator.matrix()
    for a in range(2):
        assert torch.allclose(torch.as_tensor(d.axes[a].matrix), X[a], atol=1e-6)
