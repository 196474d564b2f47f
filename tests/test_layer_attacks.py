"""What the adversarial attacks of tests/attacks.py found in the layers above the encoding (temperatures,
per-request batches, schedules, coordinate maps, the diagnosis, the Hugging Face bridge), in float16 near
its range, in ALiBi's key window and in the float64 oracle, each held right: the right value against an
independent computation, or a refusal that names the argument."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

import liepos as lp
from liepos.coordinates import ring
from liepos.temperature import ScalableSoftmax

F64 = torch.float64


def _rnd(*shape, seed=0):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("u", [3.0, 1e9, 2.0**52 + 1, 1e18])
def test_the_dense_exp_is_exact_at_any_lag(u):
    """``Generator.exp`` (what ``attention_reference`` and ``query_reference`` build from) reduces each angle
    ``ω u`` from the exact product: every entry equals the 200-bit rotation to a few ulps at any lag."""
    g = lp.rope(8).generator
    A = g.exp(torch.tensor(u, dtype=F64))
    with mpmath.workprec(200):
        for i, w in enumerate(g.freqs.tolist()):
            a = mpmath.mpf(w) * mpmath.mpf(u)
            c, s = float(mpmath.cos(a)), float(mpmath.sin(a))
            block = A[2 * i : 2 * i + 2, 2 * i : 2 * i + 2]
            assert abs(float(block[0, 0]) - c) <= 4e-16 and abs(float(block[1, 1]) - c) <= 4e-16, (u, w)
            assert abs(abs(float(block[0, 1])) - abs(s)) <= 4e-16, (u, w)


def test_the_reference_equals_the_fast_path_at_lags_of_1e9():
    """Keys at 0 … 4 and queries at 1e9: the oracle's lag blocks are as exact as the fast path's tables."""
    enc = lp.rope(8)
    q, k, v = (_rnd(1, 4, 8, 8, seed=i) for i in range(3))
    p = torch.tensor([0.0, 1, 2, 3, 4, 1e9, 1e9 + 1, 1e9 + 2], dtype=F64)
    ref = lp.attention_reference(q, k, v, enc, p, p)
    assert float((lp.attention(q, k, v, enc, p, p) - ref).abs().max()) < 1e-14
    assert float((enc.query(q, p) - enc.query_reference(q, p)).abs().max()) < 1e-14
    moved = enc.key_reference(k, p, origin=torch.tensor(1e9, dtype=F64))
    assert float((enc.transport(enc.key(k, p), 1e9) - moved).abs().max()) < 1e-14


def test_the_dense_exp_keeps_its_derivative_in_the_lag():
    """d/du exp(uX) = X exp(uX), through the exact reduction."""
    g = lp.xpos(8).generator
    u = torch.tensor(1234.5, dtype=F64, requires_grad=True)
    (d,) = torch.autograd.grad(g.exp(u).sum(), u)
    assert math.isclose(float(d), float((g.matrix() @ g.exp(u.detach())).sum()), rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("t0", [1e9, 1e12, 2.0**53 - 24])
def test_a_ring_reduces_the_token_index_by_its_period_first(t0):
    """``ring(N)(p) = ring(N)(p mod N)`` exactly: the angle is 2π (p mod N)/N, never 2π/N times a large p."""
    phi = ring(12, radius=3.0)
    t = t0 + torch.arange(24, dtype=F64)
    assert torch.equal(phi(t), phi(torch.remainder(t, 12)))


@pytest.mark.parametrize("padded", [False, True])
def test_ssmax_counts_every_row_over_several_query_blocks(padded):
    """Bidirectional attention without a per-row mask: each row of each block sees the same keys; the counts
    have a row axis of the block's length (they had one entry per block)."""
    q, k, v = (_rnd(2, 2, 7, 8, seed=i) for i in range(3))
    p = torch.arange(7, dtype=F64)
    keep = torch.ones(2, 7, dtype=torch.bool)
    if padded:
        keep[1, 2:4] = False
    got = lp.attention(q, k, v, lp.rope(8), p, p, causal=False, block_size=3, key_padding_mask=keep,
                       temperature=ScalableSoftmax(0.6))
    n = keep.sum(-1).to(F64)  # (B,) every row of a batch row sees its kept keys
    qs = q * (0.6 * torch.log(n)).view(2, 1, 1, 1)
    want = lp.attention_reference(qs, k, v, lp.rope(8), p, p, causal=False, mask=keep[:, None, None, :])
    assert float((got - want).abs().max()) < 1e-12


def test_a_temperature_on_meta_tensors_gives_the_shapes_and_is_still_checked():
    q = torch.empty(1, 2, 5, 8, device="meta")
    out = lp.attention(q, q, q, lp.rope(8), temperature=ScalableSoftmax(0.5))
    assert out.device.type == "meta" and tuple(out.shape) == (1, 2, 5, 8)
    qa = torch.empty(1, 4, 5, 8, device="meta")
    with pytest.raises(ValueError, match="temperature"):
        lp.attention(qa, qa, qa, lp.alibi(8, num_heads=4), temperature=ScalableSoftmax(0.5))


def _mrope_rows():
    return [lp.mrope(12, sections=(2, 2, 2)), lp.scaling.linear(lp.mrope(12, sections=(2, 2, 2)), factor=2.0),
            lp.mrope(12, sections=(2, 2, 2))]


def test_per_request_splits_batched_several_axis_positions_by_row():
    encs = _mrope_rows()
    q, k, v = (_rnd(3, 1, 5, 12, seed=i) for i in range(3))
    p = torch.randint(0, 9, (3, 5, 3), generator=torch.Generator().manual_seed(0)).to(F64)  # (batch, seq, axes)
    got = lp.PerRequest(encs).attention(q, k, v, p, p)
    for b, e in enumerate(encs):
        want = lp.attention_reference(q[b:b + 1], k[b:b + 1], v[b:b + 1], e, p[b], p[b])
        assert float((got[b:b + 1] - want).abs().max()) < 1e-12, b


def test_per_request_keeps_unbatched_several_axis_positions_whole():
    """Positions ``(seq, axes)`` with ``seq`` equal to the batch are every row's, not one row each."""
    encs = _mrope_rows()
    q, k, v = (_rnd(3, 1, 3, 12, seed=i) for i in range(3))
    p = torch.tensor([[0.0, 0, 0], [1, 2, 1], [2, 2, 3]], dtype=F64)  # (seq = 3, axes = 3)
    got = lp.PerRequest(encs).attention(q, k, v, p, p)
    for b, e in enumerate(encs):
        want = lp.attention_reference(q[b:b + 1], k[b:b + 1], v[b:b + 1], e, p, p)
        assert float((got[b:b + 1] - want).abs().max()) < 1e-12, b


@pytest.mark.parametrize("kind", ["window", "chunk"])
def test_a_window_on_a_several_axis_layer_is_refused_at_construction(kind):
    with pytest.raises(ValueError, match=f"`{kind}`=3 .*3 position axes"):
        lp.LayerSpec(lp.mrope(12, sections=(2, 2, 2)), **{kind: 3})


def test_diagnose_names_an_encoder_that_is_not_callable():
    with pytest.raises(TypeError, match=r"`encode_query` must be callable.*its \.query and \.key"):
        lp.diagnose(lp.rope(8))
    with pytest.raises(TypeError, match="`encode_key` must be callable"):
        lp.diagnose(lp.rope(8).query, 3, 8)


def test_positions_on_the_meta_device_give_shapes_with_meta_data_and_are_named_with_real_data():
    qm = torch.empty(1, 2, 4, 8, device="meta")
    pm = torch.arange(4.0, device="meta")
    out = lp.attention(qm, qm, qm, lp.xpos(8), pm, pm)
    assert out.device.type == "meta" and tuple(out.shape) == (1, 2, 4, 8)
    q = _rnd(1, 2, 4, 8)
    with pytest.raises(ValueError, match="positions are on the meta device .* on cpu"):
        lp.attention(q, q, q, lp.rope(8), pm)
    with pytest.raises(ValueError, match="key_positions are on the meta device"):
        lp.attention(q, q, q, lp.rope(8), torch.arange(4.0), pm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_alibis_key_window_keeps_the_nearest_key_when_a_blocks_own_keys_are_anti_aligned(dtype):
    """A block whose queries meet only huge anti-aligned keys of their own: the row's largest score is the
    nearest earlier key's (lag 1000), which a window bounded by the keys before the block alone (or by a
    row maximum of at least the bias) would leave out — in float32 by 1.8."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 4, 8, dtype=F64, generator=g) for _ in range(3))
    q[:, :, 3] = q[:, :, 2]  # both queries of the last block point the same way ...
    for i in (2, 3):  # ... and their block's keys are huge and anti-aligned with them
        k[:, :, i] = -q[:, :, 2] / q[:, :, 2].norm(dim=-1, keepdim=True) * 1e3
    p = torch.tensor([0.0, 1000.0, 2000.0, 2000.5], dtype=F64)
    enc = lp.alibi(8, num_heads=4)
    got = lp.attention(q.to(dtype), k.to(dtype), v.to(dtype), enc, p, p, block_size=2)
    want = lp.attention_reference(*(x.to(dtype).double() for x in (q, k, v)), enc, p, p)
    assert float((got.double() - want).abs().max()) <= 16 * torch.finfo(dtype).eps


def _big_half(*shape, scale, seed):
    return (_rnd(*shape, seed=seed).clamp(-2, 2) * scale).half()  # finite float16, |x| ≤ 2·scale


@pytest.mark.parametrize("how", ["ssmax", "query_scale", "decay", "value_encoding"])
def test_float16_inputs_near_its_range_are_encoded_without_overflow(how):
    """Queries up to 2e4 (finite in float16) times a temperature, a per-dim query scale or an origin's factors
    overflowed float16 (the output was inf); such calls now compute in float32 and round once."""
    S = 40
    q, k, v = (_big_half(1, 2, S, 8, scale=s, seed=i) for i, s in enumerate((1e4, 1e-3, 1.0)))
    p = 1e5 + torch.cumsum(torch.rand(S, dtype=F64, generator=torch.Generator().manual_seed(3)) * 2 + 0.1, 0)
    enc, kw = lp.rope(8), {}
    qr = q.double()
    if how == "ssmax":
        kw["temperature"] = ScalableSoftmax(2.0)
        qr = qr * (2.0 * torch.log(torch.arange(1, S + 1, dtype=F64))).view(1, 1, S, 1)
    elif how == "query_scale":
        enc = lp.rope(8, layout="half").replace(query_scale=torch.full((8,), 8.0))
    elif how == "decay":
        enc = lp.decay([0.5, 0.3, 0.2, 0.1, 0.05, 0.5, 0.4, 0.0])
    else:
        kw["value_encoding"] = lp.decay([0.5] * 8)
    got = lp.attention(q, k, v, enc, p, p, **kw)
    want = lp.attention_reference(qr, k.double(), v.double(), enc, p, p, value_encoding=kw.get("value_encoding"))
    assert bool(torch.isfinite(got).all())
    assert float((got.double() - want).abs().max()) <= 4 * 2.0**-11 * float(want.abs().max())  # float16's rounding


def test_a_cache_whose_work_dtype_changes_never_mixes_encoded_keys():
    """Small queries first (float16 holds them), large ones later (computed in float32): the cache's encoded
    store is re-encoded from the raw keys, never appended in another dtype."""
    S = 12
    q, k, v = (_big_half(1, 2, S, 8, scale=s, seed=i) for i, s in enumerate((1e4, 1e-3, 1.0)))
    q[:, :, :5] = q[:, :, :5] * 1e-3
    enc, p, cache = lp.decay([0.5] * 8), 1e5 + 1.5 * torch.arange(S, dtype=F64), lp.KVCache()
    out = torch.cat([lp.attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], enc, p[lo:hi], p[lo:hi], cache=cache)
                     for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 12))], 2)
    want = lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p)
    assert float((out.double() - want).abs().max()) <= 4 * 2.0**-11 * float(want.abs().max())


def test_qwen2_vls_legacy_mrope_type_is_read_as_transformers_reads_it():
    """Qwen2-VL's config.json says ``rope_scaling: {"type": "mrope", "mrope_section": …}``; transformers' config
    keeps ``type="mrope"`` beside ``rope_type="default"`` (it rewrites the type) and builds M-RoPE from the
    section. That config, and the same dict as a plain mapping, give the encoding of the modern form."""
    from transformers import Qwen2VLConfig

    common = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 10}
    legacy = Qwen2VLConfig(**common, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    modern = Qwen2VLConfig(**common, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6})
    raw = {"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e6,
           "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    want = lp.from_hf(modern)
    assert want.num_axes == 3
    assert lp.from_hf(legacy).version == want.version == lp.from_hf(raw).version
    with pytest.raises(ValueError, match="contradictory rope type"):  # a real contradiction is still named
        lp.from_hf({**raw, "rope_scaling": {"type": "linear", "rope_type": "yarn", "factor": 2.0}})
