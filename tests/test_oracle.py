"""The oracle is right: ``attention_reference`` (closed-form blocks at the lags) equals an explicit
dense softmax built from ``torch.matrix_exp`` of the generator per pair, in float64, for every kind of
encoding — per-dim temperatures (YaRN, LongRoPE from Hugging Face configs), logit scales, slots,
sinks, values carried by a generator, several position axes, per-head parameters and a change of
basis — and ``lp.attention`` equals it."""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp

F64 = torch.float64


def dense_attention(q, k, v, enc, tq, ts, causal=True, sinks=None, venc=None):
    """``softmax_s(c [D q; q_slots]ᵀ expm(Σ_a u_a X_a) [k; k_slots]) expm(u X_v) v`` per pair, from the dense
    generator matrices (one ``torch.matrix_exp`` per pair and head)."""
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    if k.shape[1] != H:
        k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    c = enc.logit_scale / math.sqrt(enc.content_dim)
    qf = q * c * (1.0 if enc.query_scale is None else enc.query_scale.double())
    kf = k
    if enc.num_slots:
        n = enc.num_slots
        qf = torch.cat((qf, enc.query_slots.double().reshape(1, -1, 1, n).expand(B, H, Sq, n)), -1)
        kf = torch.cat((kf, enc.key_slots.double().reshape(1, -1, 1, n).expand(B, H, Sk, n)), -1)
    perm = enc.plan.perm  # storage perm[c] holds canonical c: the generator's coordinates
    qf, kf = qf[..., perm], kf[..., perm]
    X = enc.generator.matrix().double()  # (*heads, d, d) or (axes, *heads, d, d)
    axes = enc.num_axes
    Xs = X.unsqueeze(0) if axes is None else X  # (A, *heads, d, d)
    if enc.generator.num_heads is None:
        Xs = Xs.unsqueeze(1)  # (A, 1, d, d)
    tq = tq.reshape(B if tq.dim() == (2 if axes is None else 3) else 1, Sq, -1).expand(B, Sq, Xs.shape[0])
    ts = ts.reshape(B if ts.dim() == (2 if axes is None else 3) else 1, Sk, -1).expand(B, Sk, Xs.shape[0])
    scores = torch.full((B, H, Sq, Sk), -math.inf, dtype=F64)
    mats = {}
    for b in range(B):
        for i in range(Sq):
            for j in range(Sk):
                u = tq[b, i] - ts[b, j]  # (A,)
                vis = (j <= Sk - Sq + i) if axes is not None else bool(u[0] >= 0)
                if causal and not vis:
                    continue
                for h in range(H):
                    M = torch.matrix_exp((u.view(-1, 1, 1) * Xs[:, h % Xs.shape[1]]).sum(0))  # (d, d)
                    scores[b, h, i, j] = qf[b, h, i] @ M @ kf[b, h, j]
                    if venc is not None:
                        Xv = venc.generator.matrix().double()
                        Xv = Xv if venc.generator.num_heads is None else Xv[h]
                        mats[b, h, i, j] = torch.matrix_exp(u[0] * Xv)
    if sinks is not None:
        col = sinks.double().reshape(1, H, 1, 1).expand(B, H, Sq, 1)
        w = torch.softmax(torch.cat((scores, col), -1), -1)[..., :Sk]
    else:
        w = torch.softmax(scores, -1).nan_to_num(0.0)
    if venc is None:
        return w @ v
    vc = v[..., venc.plan.perm]
    out = torch.zeros(B, H, Sq, v.shape[-1], dtype=F64)
    for (b, h, i, j), M in mats.items():
        out[b, h, i] += w[b, h, i, j] * (M @ vc[b, h, j])
    return out[..., venc.plan.inv]


def _hf(kind: str) -> lp.Encoding:
    from transformers import LlamaConfig, Phi3Config

    if kind == "yarn":  # partial rotary: attention_factor² on the rotated dims only (query_scale)
        cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=8192, rope_theta=5e5,
                          rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024},
                          partial_rotary_factor=0.5)
        return lp.from_hf(cfg)
    short, long = [1.0 + 0.05 * i for i in range(8)], [1.5 + 0.7 * i for i in range(8)]
    cfg = Phi3Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                     original_max_position_embeddings=1024, partial_rotary_factor=0.5,
                     rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
    return lp.from_hf(cfg).at_length(2000)


def _basis() -> lp.Encoding:
    g = torch.Generator().manual_seed(1)
    P = torch.eye(4, dtype=F64) + 0.3 * torch.randn(4, 4, dtype=F64, generator=g)
    return lp.Encoding(lp.Generator([-0.1, 0.0], [0.5, 0.2], [1, 1], basis=P))


# name -> (encoding, head dim, extra arguments); times near 1500 (LongRoPE's long factors apply)
CASES = {
    "yarn (query_scale)": (lambda: _hf("yarn"), {}),
    "longrope (query_scale, logit_scale)": (lambda: _hf("longrope"), {}),
    "logit_scale": (lambda: lp.xpos(8).replace(logit_scale=1.7), {}),
    "query_scale": (lambda: lp.rope(8, layout="half").replace(query_scale=torch.linspace(0.5, 2.0, 8)), {}),
    "alibi (slots)": (lambda: lp.alibi(8, num_heads=2), {}),
    "jordan": (lambda: lp.build("jordan", 8), {}),
    "retnet (per head)": (lambda: lp.retnet(8, num_heads=2), {}),
    "sinks": (lambda: lp.decay([0.1, 0.2, 0.0, 0.05]), {"sinks": torch.tensor([0.3, -0.7], dtype=F64)}),
    "value_encoding": (lambda: lp.rope(8), {"venc": lp.xpos(8)}),
    "basis": (_basis, {}),
    "mrope (3 axes)": (lambda: lp.mrope(12, sections=(2, 2, 2)), {}),
    "axial_rope (2 axes)": (lambda: lp.axial_rope(8, axes=2), {}),
    "decay_axial_rope (2 axes)": (lambda: lp.decay_axial_rope(8, axes=2), {}),
}


def _inputs(enc, S=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, S, enc.content_dim, dtype=F64, generator=g) for _ in range(3))
    if enc.num_axes is None:
        p = 1500.0 + torch.cumsum(torch.rand(S, dtype=F64, generator=g) * 2, 0)
    else:
        p = torch.randint(0, 9, (S, enc.num_axes), generator=g).to(F64)
    return q, k, v, p


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reference_equals_a_dense_matrix_exp_softmax(case):
    make, kw = CASES[case]
    enc = make()
    q, k, v, p = _inputs(enc)
    venc = kw.get("venc")
    ref = lp.attention_reference(q, k, v, enc, p, p, sinks=kw.get("sinks"), value_encoding=venc)
    dense = dense_attention(q, k, v, enc, p, p, sinks=kw.get("sinks"), venc=venc)
    assert float((ref - dense).abs().max()) < 1e-10, case


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_equals_the_reference(case):
    make, kw = CASES[case]
    enc = make()
    q, k, v, p = _inputs(enc, seed=1)
    out = lp.attention(q, k, v, enc, p, p, sinks=kw.get("sinks"), value_encoding=kw.get("venc"))
    ref = lp.attention_reference(q, k, v, enc, p, p, sinks=kw.get("sinks"), value_encoding=kw.get("venc"))
    assert float((out - ref).abs().max()) < 1e-10, case


def test_the_reference_takes_several_axes_with_default_positions():
    enc = lp.mrope(12, sections=(2, 2, 2))
    q, k, v, _ = _inputs(enc)
    ref = lp.attention_reference(q, k, v, enc)  # 0 … S − 1 on every axis
    t = torch.arange(5, dtype=F64).unsqueeze(-1).expand(5, 3)
    assert torch.allclose(ref, dense_attention(q, k, v, enc, t, t), atol=1e-12)
