"""liepos against the real upstream packages, imported (test dependencies):

* transformers — attention with every rope type (cos/sin from the model's own rotary module,
  ``apply_rotary_pos_emb``, the eager softmax) equals ``lp.attention`` with ``from_hf`` (the
  rotation alone is checked in tests/test_hf_config.py);
* rotary-embedding-torch — its RoPE (with offset, position interpolation and NTK rescaling) and
  its xPos; its cached xPos decoding differs from its own parallel forward, liepos's does not;
* x-transformers — ALiBi slopes (exactly, n = 1…64) and bias;
* torchscale — xPos (``XPOS``) and RetNet (``RetNetRelPos`` decay mask and ``theta_shift``).
  torchscale 0.3.0 installs with ``pip install --no-deps torchscale``; its xPos needs only torch,
  and ``torchscale.architecture.retnet`` imports fairscale and timm (torchvision) for classes
  that are not used here, so they are stubbed when missing.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

import liepos as lp
from liepos import scaling

pytestmark = pytest.mark.upstream
F64 = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------------- transformers
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [2.0 + 0.5 * i for i in range(8)], "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("name", list(ROPES))
def test_transformers_attention_every_rope_type(name):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                                   rope_theta=10000.0, rope_scaling=ROPES[name])
    S = 200  # past the original context (64) and past max_position_embeddings (128)
    q, k, v = (rand(1, 4, S, 16, seed=i).float() * 3 for i in range(3))
    pos = torch.arange(S)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(q, pos)  # attention_scaling folded in, as the model does
    qe, ke = apply_rotary_pos_emb(q, k, cos, sin)
    scores = qe @ ke.transpose(-1, -2) / 4.0
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -math.inf)
    ref = torch.softmax(scores, -1) @ v
    for precision in ("precise", "compat"):
        enc = lp.from_hf(cfg, precision=precision)
        assert rel(lp.attention(q, k, v, enc), ref) < 1e-4, precision


# ---------------------------------------------------------------------- rotary-embedding-torch
def test_rotary_embedding_torch_rope():
    ret = pytest.importorskip("rotary_embedding_torch")
    q = rand(2, 3, 40, 32)
    t = torch.arange(40)
    # its freqs are computed in float32 before .double(): 1e-6 is float32's rounding times the angle
    ref = ret.RotaryEmbedding(32).double().rotate_queries_or_keys(q)
    assert rel(lp.rope(32).query(q, t), ref) < 1e-6  # interleaved, counter-clockwise
    ref = ret.RotaryEmbedding(32).double().rotate_queries_or_keys(q, offset=1000)
    assert rel(lp.rope(32).query(q, t + 1000), ref) < 1e-4
    # with its own (float32-rounded) frequencies as the generator, the two agree to float64
    w = ret.RotaryEmbedding(32).freqs.detach().double()
    enc = lp.Encoding(lp.Generator(torch.zeros_like(w), w, [1] * 16))
    assert rel(enc.query(q, t + 1000), ref) < 1e-12
    # position interpolation = scaling.linear; theta_rescale_factor = NTK base * f^(d/(d-2))
    ref = ret.RotaryEmbedding(32, interpolate_factor=4.0).double().rotate_queries_or_keys(q)
    assert rel(scaling.linear(lp.rope(32), factor=4.0).query(q, t), ref) < 1e-6
    ref = ret.RotaryEmbedding(32, theta_rescale_factor=8.0).double().rotate_queries_or_keys(q)
    assert rel(lp.rope(32, base=10000.0 * 8.0 ** (32 / 30)).query(q, t), ref) < 1e-6  # its freqs are float32


def xpos_scores(enc, q, k, t):
    return enc.query(q, t) @ enc.key(k, t).transpose(-1, -2)


def test_rotary_embedding_torch_xpos_and_its_cached_decoding():
    ret = pytest.importorskip("rotary_embedding_torch")
    n, D = 300, 32
    q, k = rand(1, 2, n, D, seed=1), rand(1, 2, n, D, seed=2)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    rot = ret.RotaryEmbedding(D, use_xpos=True, xpos_scale_base=512).double()
    rq, rk = rot.rotate_queries_and_keys(q, k)  # the parallel forward
    ref = rq @ rk.transpose(-1, -2)
    ours = xpos_scores(lp.xpos(D, scale_base=512.0), q, k, torch.arange(n))
    assert rel(ours[..., causal], ref[..., causal]) < 1e-5  # its freqs are float32

    # decoding the last query against all cached keys: its q is centred on q_len // 2 = 0 and its
    # k on k_len // 2, so every plane is off by zeta_i^(k_len//2 / scale_base) (0.69 to 0.98 here)
    rot = ret.RotaryEmbedding(D, use_xpos=True, xpos_scale_base=512).double()
    cq, ck = rot.rotate_queries_with_cached_keys(q[:, :, -1:], k)
    dec = cq @ ck.transpose(-1, -2)
    ratio = (dec / ref[:, :, -1:]).flatten()
    assert ratio.min() < 0.9 and rel(dec, ref[:, :, -1:]) > 0.05
    zeta = (torch.arange(0, D, 2, dtype=F64) + 0.4 * D) / (1.4 * D)
    factor = zeta ** ((n // 2) / 512)
    assert factor.min() == pytest.approx(0.6928, abs=1e-4) and factor.max() < 0.99

    # liepos: prefill + one decode step through a KVCache equals the full forward
    enc, v = lp.xpos(D, scale_base=512.0), rand(1, 2, n, D, seed=3)
    full = lp.attention(q, k, v, enc)
    cache = lp.KVCache()
    lp.attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], enc, cache=cache)
    step = lp.attention(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], enc, cache=cache)
    assert rel(step, full[:, :, -1:]) < 1e-12


# ---------------------------------------------------------------------- x-transformers
def test_x_transformers_alibi_slopes_and_bias():
    xt = pytest.importorskip("x_transformers.x_transformers")
    for n in range(1, 65):
        assert lp.alibi_slopes(n).tolist() == xt.AlibiPositionalBias._get_slopes(n), n
    H, D, S = 6, 8, 50
    bias = xt.AlibiPositionalBias(H, H)(S, S).double()  # (H, S, S): -m_h |i - j|
    enc = lp.alibi(D, num_heads=H)
    z = torch.zeros(1, H, S, D, dtype=F64)
    slot = enc.query(z, torch.arange(S)) @ enc.key(z, torch.arange(S)).transpose(-1, -2)  # -m_h (t - s)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    assert rel(slot[0][:, causal], bias[:, causal]) < 1e-6  # x-transformers' slopes are float32
    q, k, v = rand(1, H, S, D, seed=4), rand(1, H, S, D, seed=5), rand(1, H, S, D, seed=6)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D) + bias
    ref = torch.softmax(scores.masked_fill(~causal, -math.inf), -1) @ v
    assert rel(lp.attention(q, k, v, enc), ref) < 1e-6


# ---------------------------------------------------------------------- torchscale
def test_torchscale_xpos():
    xpos_mod = pytest.importorskip("torchscale.component.xpos_relative_position")
    D, n = 32, 120
    q, k = rand(2, n, D, seed=7), rand(2, n, D, seed=8)  # (batch·heads, seq, head_dim) as torchscale
    xp = xpos_mod.XPOS(D, scale_base=512).double()
    ref = xp(q) @ xp(k, downscale=True).transpose(-1, -2)
    enc = lp.xpos(D, scale_base=512.0)
    ours = xpos_scores(enc, q[:, None], k[:, None], torch.arange(n))[:, 0]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    # torchscale builds its angles in float32 (fixed_pos_embedding): float32 rounding for scale
    assert rel(ours[:, causal], ref[:, causal]) < 1e-5
    # its incremental decoding (offset = past length) is consistent with its parallel forward
    dec = xp(q[:, -1:], offset=n - 1) @ xp(k, downscale=True).transpose(-1, -2)
    assert rel(dec, ref[:, -1:]) < 1e-6


@pytest.fixture
def retnet_relpos(monkeypatch):
    pytest.importorskip("torchscale")
    # torchscale.architecture.retnet imports fairscale and timm for its layers, not for RetNetRelPos
    for name in ("fairscale", "fairscale.nn", "timm", "timm.models", "timm.models.layers"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.checkpoint_wrapper = stub.wrap = stub.drop_path = lambda *a, **k: None
            monkeypatch.setitem(sys.modules, name, stub)
    from torchscale.architecture.retnet import RetNetRelPos
    from torchscale.component.multiscale_retention import theta_shift

    return RetNetRelPos, theta_shift


def test_torchscale_retnet(retnet_relpos):
    RetNetRelPos, theta_shift = retnet_relpos
    H, D, n = 4, 16, 64
    args = types.SimpleNamespace(decoder_embed_dim=H * D, decoder_retention_heads=H, recurrent_chunk_size=16)
    (sin, cos), mask = RetNetRelPos(args).double()(n)  # mask: gamma^(n-m), rows divided by sqrt(row sum)
    q, k = rand(1, H, n, D, seed=9), rand(1, H, n, D, seed=10)
    ref = (theta_shift(q, sin, cos) @ theta_shift(k, sin, cos).transpose(-1, -2)) * mask
    enc = lp.retnet(D, num_heads=H)
    ours = xpos_scores(enc, q, k, torch.arange(n))
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=F64))
    lag = (torch.arange(n)[:, None] - torch.arange(n)[None]).double()
    row = torch.where(lag >= 0, gamma[:, None, None] ** lag, torch.zeros(())).sum(-1, keepdim=True)
    causal = lag >= 0
    # upstream's decay mask is float32 inside (log(1 - 2^(-5-h)) in float32)
    assert rel((ours / row.sqrt())[..., causal], ref[..., causal]) < 1e-5
