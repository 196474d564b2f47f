"""Values carried by the group: ``o_t = Σ_s w_ts A_v(t − s) v_s``.

Checked against a dense float64 reference built here from ``torch.linalg.matrix_exp((t − s) X_v)``
(one matrix per query–key pair, in storage order), for every block type, near 0 and near 10⁶, through
the fused causal kernel, query blocks with masks and a cache.
"""

import pytest
import torch

import liepos as lp

F64 = torch.float64
H, D, DV = 4, 8, 6


def value_encodings():
    return {
        "rope": lp.rope(DV),
        "rope_half": lp.rope(DV, layout="half"),
        "decay": lp.decay(torch.tensor([0.02, 0.1, 0.3, 0.05, 0.2, 0.01], dtype=F64)),
        "xpos": lp.xpos(DV),
        "jordan": lp.Encoding(
            lp.Generator([-0.1, -0.05, -0.2], [0.0, 0.4, 0.0], [3, 1, 1], complex=[False, True, False])
        ),
        "rotation_jordan": lp.Encoding(lp.Generator([-0.05, -0.2], [0.3, 0.0], [2, 2], complex=[True, False])),
        "per_head": lp.Encoding(lp.Generator(-torch.rand(H, 3, dtype=F64) * 0.2, torch.rand(H, 3, dtype=F64), [1, 1, 1],
                                             complex=[True, True, True])),
    }


def qkv(B=2, S=10, kv_heads=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g, dtype=F64)
    k = torch.randn(B, kv_heads, S, D, generator=g, dtype=F64)
    v = torch.randn(B, kv_heads, S, DV, generator=g, dtype=F64)
    return q, k, v


def dense_reference(q, k, v, enc, venc, t, s):
    """Σ_s w_ts expm((t − s) X_v) v_s with the weights of liepos's lag reference and a dense matrix per pair."""
    B, Sk = v.shape[0], v.shape[2]
    G = H // v.shape[1]
    one_hot = torch.eye(Sk, dtype=F64).expand(B, k.shape[1], Sk, Sk)  # value j = e_j: the output is w
    w = lp.attention_reference(q, k, one_hot, enc, t, s)  # (B, H, Sq, Sk)
    X = venc.generator.matrix()  # (*heads, d, d) canonical order
    inv = venc.plan.inv
    X = X.index_select(-1, inv).index_select(-2, inv)  # storage order: X_s[i, j] = X_c[inv i, inv j]
    X = X if X.dim() == 3 else X.expand(H, DV, DV)
    lags = (torch.as_tensor(t, dtype=F64)[:, None] - torch.as_tensor(s, dtype=F64)[None, :])  # (Sq, Sk)
    A = torch.linalg.matrix_exp(lags[None, :, :, None, None] * X[:, None, None])  # (H, Sq, Sk, d, d)
    vv = v.repeat_interleave(G, 1)  # (B, H, Sk, d)
    return torch.einsum("bhts,htsde,bhse->bhtd", w, A, vv)


@pytest.mark.parametrize("name", list(value_encodings()))
@pytest.mark.parametrize("where", [0.0, 1e6])
def test_values_carried_by_every_block_type_match_the_dense_reference(name, where):
    venc = value_encodings()[name]
    q, k, v = qkv()
    t = torch.arange(10, dtype=F64) * 0.75 + where
    for enc in (lp.rope(D), lp.xpos(D)):
        want = dense_reference(q, k, v, enc, venc, t, t)
        for block in (256, 3):
            out = lp.attention(q, k, v, enc, t, t, value_encoding=venc, block_size=block)
            assert torch.allclose(out, want, atol=1e-8, rtol=1e-8), (enc, block, (out - want).abs().max())
        assert torch.allclose(lp.attention_reference(q, k, v, enc, t, t, value_encoding=venc), want, atol=1e-8)


@pytest.mark.parametrize("name", ["rope", "decay", "jordan", "per_head"])
def test_values_carried_through_a_cache_equal_the_full_forward(name):
    venc = value_encodings()[name]
    q, k, v = qkv(kv_heads=2, seed=3)
    for enc in (lp.rope(D), lp.retnet(D, num_heads=H)):
        t = torch.arange(10, dtype=F64) + 10**6
        full = lp.attention(q, k, v, enc, t, t, value_encoding=venc)
        cache = lp.KVCache()
        outs = [lp.attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc, t[:6], cache=cache, value_encoding=venc)]
        for i in range(6, 10):
            sl = slice(i, i + 1)
            step = lp.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc, t[sl], cache=cache, value_encoding=venc)
            outs.append(step)
        assert torch.allclose(torch.cat(outs, 2), full, atol=1e-9)
        assert torch.allclose(full, dense_reference(q, k, v, enc, venc, t, t), atol=1e-8)


def test_the_identity_venc_is_ordinary_attention():
    q, k, v = qkv()
    nope = lp.nope(DV)
    for enc in (lp.rope(D), lp.alibi(D, num_heads=H)):
        assert torch.allclose(lp.attention(q, k, v, enc, value_encoding=nope), lp.attention(q, k, v, enc), atol=1e-12)


def test_value_transport_gradcheck():
    q, k, v = qkv(B=1, S=5)
    venc = value_encodings()["jordan"]
    for enc in (lp.rope(D), lp.xpos(D)):
        for block in (256, 2):
            f = lambda q, k, v: lp.attention(q, k, v, enc, value_encoding=venc, block_size=block)  # noqa: B023, E731
            args = tuple(x.clone().requires_grad_(True) for x in (q, k, v))
            assert torch.autograd.gradcheck(f, args, fast_mode=True)


def test_value_transport_never_builds_a_pair_matrix():
    from test_attention import LargestTensor

    q, k, v = (x.float() for x in qkv(B=1, S=64))
    mode = LargestTensor()
    with mode:
        lp.attention(q, k, v, lp.rope(D), value_encoding=lp.xpos(DV), block_size=16)
    # the largest tensor is a score block (heads × block × keys), never (seq × seq × d × d)
    assert mode.largest <= H * 64 * 64


def test_bad_value_encodings_are_refused():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="`value_encoding` must be a liepos.Encoding"):
        lp.attention(q, k, v, lp.rope(D), value_encoding="rope")
    with pytest.raises(ValueError, match="`value_encoding` acts on 8 dims but v has 6"):
        lp.attention(q, k, v, lp.rope(D), value_encoding=lp.rope(8))
    with pytest.raises(ValueError, match="`value_encoding` must have no slots"):
        lp.attention(q, k, v, lp.rope(D), value_encoding=lp.alibi(DV, num_heads=H))
    with pytest.raises(ValueError, match="bidirectional"):
        lp.attention(q, k, v, lp.rope(D), causal=False, value_encoding=lp.xpos(DV))
