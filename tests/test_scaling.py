"""liepos.scaling: context extension as maps on the spectrum.

Identities of each map (which planes move, by how much, the logit scale kept separately), the
golden values users report, errors, and the maps against transformers' own
``ROPE_INIT_FUNCTIONS`` — evaluated in float64 by running the upstream code with a torch shim
whose float32 is float64, so the comparison is of formulas, not of float32 rounding.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import Torch64

import liepos as lp
from liepos import scaling
from liepos.generator import Generator, direct_sum
from liepos.scaling import SCALINGS, rotation_freqs


def freqs(enc):
    return rotation_freqs(enc)


# ---------------------------------------------------------------------- the upstream, in float64
@pytest.fixture
def upstream64(monkeypatch):
    mru = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    def run(rope_scaling, *, head_dim=64, base=500000.0, max_pos=8192, seq_len=None, prf=None):
        kw = {} if prf is None else {"partial_rotary_factor": prf}
        cfg = LlamaConfig(
            hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=max_pos,
            rope_theta=base, rope_scaling=dict(rope_scaling), **kw,
        )
        with monkeypatch.context() as m:
            m.setattr(mru, "torch", Torch64())
            w, af = mru.ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](cfg, seq_len=seq_len)
        return w.as_subclass(torch.Tensor), af

    return run


def close(a, b, rtol=1e-12):
    a, b = a.to(torch.float64), b.to(torch.float64)
    assert a.shape == b.shape
    err = ((a - b).abs() / b.abs().clamp_min(1e-300)).max().item()
    assert err <= rtol, f"max relative error {err:.3g} > {rtol:g}"


# ---------------------------------------------------------------------- the maps vs upstream
def test_linear_matches_upstream(upstream64):
    ref, af = upstream64({"rope_type": "linear", "factor": 4.0})
    enc = scaling.linear(lp.rope(64, 500000.0, layout="half"), factor=4.0)
    close(freqs(enc), ref)
    assert enc.logit_scale == af == 1.0


@pytest.mark.parametrize(
    "params",
    [
        {"factor": 8.0, "original_max_position_embeddings": 1024},
        {"factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False},
        {"factor": 16.0, "original_max_position_embeddings": 2048, "beta_fast": 64, "beta_slow": 2},
        # the reversed ordering runs the ramp the other way, as upstream does
        {"factor": 16.0, "original_max_position_embeddings": 2048, "beta_fast": 1, "beta_slow": 32},
        {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.707},
        {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5},
        {"factor": 4.0, "original_max_position_embeddings": 4096, "attention_factor": 1.0},
        {"factor": 0.5, "original_max_position_embeddings": 4096},
    ],
)
def test_yarn_matches_upstream(upstream64, params):
    ref, af = upstream64({"rope_type": "yarn", **params})
    enc = scaling.yarn(lp.rope(64, 500000.0, layout="half"), **params)
    close(freqs(enc), ref)
    assert math.isclose(enc.logit_scale, af * af, rel_tol=1e-12)
    # the base read off the spectrum and the explicit base agree
    explicit = scaling.yarn(lp.rope(64, 500000.0, layout="half"), base=500000.0, **params)
    assert torch.equal(freqs(explicit), freqs(enc))


@pytest.mark.parametrize("length", [100, 8192, 8193, 12000, 65536])
def test_dynamic_matches_upstream_at_lengths(upstream64, length):
    ref, _ = upstream64({"rope_type": "dynamic", "factor": 2.0}, seq_len=length)
    enc = scaling.dynamic(lp.rope(64, 500000.0, layout="half"), factor=2.0, original_max_position_embeddings=8192)
    close(freqs(enc.at_length(length)), ref)
    if length <= 8192:
        assert torch.equal(freqs(enc.at_length(length)), freqs(lp.rope(64, 500000.0)))


def test_longrope_matches_upstream_and_switches(upstream64):
    short = [1.0 + 0.05 * i for i in range(32)]
    long = [1.5 + 0.7 * i for i in range(32)]
    rs = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
          "original_max_position_embeddings": 1024}
    ref_short, af = upstream64(rs, max_pos=32768, seq_len=1024)
    ref_long, _ = upstream64(rs, max_pos=32768, seq_len=1025)
    enc = scaling.longrope(lp.rope(64, 500000.0, layout="half"), short_factor=short, long_factor=long,
                           original_max_position_embeddings=1024, max_position_embeddings=32768)
    close(freqs(enc), ref_short)
    close(freqs(enc.at_length(1024)), ref_short)
    close(freqs(enc.at_length(1025)), ref_long)
    assert math.isclose(enc.logit_scale, af * af, rel_tol=1e-12)
    assert math.isclose(enc.at_length(5000).logit_scale, af * af, rel_tol=1e-12)  # one factor for both


def test_llama3_matches_upstream(upstream64):
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    ref, af = upstream64(rs, head_dim=128, max_pos=131072)
    enc = scaling.llama3(lp.rope(128, 500000.0, layout="half"), factor=8.0, original_max_position_embeddings=8192)
    close(freqs(enc), ref)
    assert enc.logit_scale == af == 1.0
    w0, w = freqs(lp.rope(128, 500000.0)), freqs(enc)
    wavelen = 2 * math.pi / w0
    assert torch.equal(w[wavelen < 8192 / 4], w0[wavelen < 8192 / 4])  # fast planes kept
    assert torch.allclose(w[wavelen > 8192], w0[wavelen > 8192] / 8, rtol=1e-15, atol=0)  # slow ones / s
    assert int(((wavelen >= 2048) & (wavelen <= 8192)).sum()) > 0  # the ramp is exercised


def test_proportional_matches_upstream(upstream64):
    ref, af = upstream64({"rope_type": "proportional", "factor": 2.0}, head_dim=64, prf=0.25)
    enc = scaling.proportional(lp.rope(64, 500000.0, layout="half"), partial_rotary_factor=0.25, factor=2.0)
    close(freqs(enc)[:8], ref[:8])
    assert torch.equal(freqs(enc)[8:], ref[8:]) and bool((ref[8:] == 0).all())
    # the NoPE planes stay planes (complex blocks of frequency 0), so the half layout is the full head's
    assert all(enc.generator.complex) and enc.generator.dim == 64


# ---------------------------------------------------------------------- identities of the maps
def test_linear_is_position_division():
    enc = lp.rope(16)
    q = torch.randn(1, 1, 5, 16, dtype=torch.float64)
    pos = torch.tensor([0.0, 3.0, 100.0, 4096.0, 1e5], dtype=torch.float64)
    out = scaling.linear(enc, factor=4.0).query(q, pos)
    assert torch.allclose(out, enc.query(q, pos / 4.0), atol=1e-12)


def test_ntk_keeps_fastest_and_divides_slowest():
    enc = lp.rope(64, 10000.0)
    w0, w = freqs(enc), freqs(scaling.ntk(enc, factor=8.0))
    assert w[0] == w0[0]
    assert math.isclose(float(w[-1]), float(w0[-1]) / 8.0, rel_tol=1e-13)
    # it is RoPE with base b·s^{d/(d−2)}
    close(w, freqs(lp.rope(64, 10000.0 * 8.0 ** (64 / 62))), rtol=1e-12)


def test_dynamic_is_ntk_at_kappa():
    enc = lp.rope(32, 10000.0)
    dyn = scaling.dynamic(enc, factor=4.0, original_max_position_embeddings=100)
    kappa = 4.0 * 250 / 100 - 3.0
    close(freqs(dyn.at_length(250)), freqs(scaling.ntk(enc, factor=kappa)), rtol=1e-14)
    assert torch.equal(freqs(dyn), freqs(enc))  # the returned encoding is the unscaled one
    assert dyn.at_length(250).version != dyn.at_length(300).version
    # the rule is idempotent and history-free
    assert dyn.at_length(250).at_length(300).version == dyn.at_length(300).version
    assert dyn.at_length(300).at_length(50).version == dyn.at_length(50).version


def test_yarn_structure_and_both_beta_orderings():
    enc = lp.rope(64, 150000.0)
    w0 = freqs(enc)
    y = scaling.yarn(enc, factor=32.0, original_max_position_embeddings=4096)
    w = freqs(y)
    low, high = scaling.yarn_correction_range(rotary_dim=64, base=150000.0, original_max_position_embeddings=4096)
    i = torch.arange(32)
    assert torch.equal(w[i <= low], w0[i <= low])  # extrapolated: unchanged
    close(w[i >= high], w0[i >= high] / 32.0, rtol=1e-15)  # interpolated: divided by s
    assert not torch.equal(w, w0)  # scaled != unscaled
    ratio = w / w0
    assert bool((ratio[1:] <= ratio[:-1]).all())  # the ramp is monotone
    rev = scaling.yarn(enc, factor=32.0, original_max_position_embeddings=4096, beta_fast=1.0, beta_slow=32.0)
    assert not torch.equal(freqs(rev), w)
    assert y.logit_scale == pytest.approx((0.1 * math.log(32.0) + 1) ** 2, rel=1e-14)


def test_golden_gpt_oss_correction_range():
    low, high = scaling.yarn_correction_range(
        rotary_dim=64, base=150000.0, original_max_position_embeddings=4096,
        beta_fast=32.0, beta_slow=1.0, truncate=False,
    )
    assert low == pytest.approx(8.0928, abs=5e-5) and high == pytest.approx(17.398, abs=5e-4)
    assert scaling.yarn_correction_range(
        rotary_dim=64, base=150000.0, original_max_position_embeddings=4096
    ) == (8.0, 18.0)


def test_golden_deepseek_mscale():
    # DeepSeek-V2-Lite: mscale = mscale_all_dim = 0.707, factor 40: the rotation factor is 1.0 and
    # the softmax multiplier m(40, 0.707)² ≈ 1.59; DeepSeek-V3 (1.0, 1.0): ≈ 1.87
    assert scaling.yarn_attention_factor(40.0, mscale=0.707, mscale_all_dim=0.707) == 1.0
    assert scaling.yarn_mscale(40.0, 0.707) ** 2 == pytest.approx(1.59, abs=5e-3)
    assert scaling.yarn_mscale(40.0, 1.0) ** 2 == pytest.approx(1.87, abs=5e-3)
    enc = scaling.yarn(lp.rope(64), factor=40.0, original_max_position_embeddings=4096,
                       mscale=0.707, mscale_all_dim=0.707)
    assert enc.logit_scale == 1.0
    # an explicit attention_factor=1.0 disables the temperature
    assert scaling.yarn(lp.rope(64), factor=40.0, original_max_position_embeddings=4096,
                        attention_factor=1.0).logit_scale == 1.0
    # one mscale alone (or a zero one) falls back to m(s, 1), as upstream's truthiness test
    assert scaling.yarn_attention_factor(40.0, mscale=0.707) == scaling.yarn_mscale(40.0)


def test_logit_scale_multiplies_and_composes():
    enc = lp.rope(32).replace(logit_scale=2.0)
    y = scaling.yarn(enc, factor=4.0, original_max_position_embeddings=1024)
    af = scaling.yarn_attention_factor(4.0)
    assert y.logit_scale == pytest.approx(2.0 * af * af, rel=1e-15)
    lr = scaling.longrope(y, short_factor=[1.0] * 16, long_factor=[2.0] * 16,
                          original_max_position_embeddings=1024, factor=4.0)
    assert lr.logit_scale == pytest.approx(y.logit_scale * scaling.longrope_attention_factor(4.0, 1024) ** 2)


def test_static_map_composes_with_a_length_rule():
    enc = lp.rope(16)
    dyn = scaling.dynamic(enc, factor=2.0, original_max_position_embeddings=64)
    both = scaling.linear(dyn, factor=3.0)
    for L in (10, 64, 65, 500):
        assert torch.equal(freqs(both.at_length(L)), freqs(scaling.linear(dyn.at_length(L), factor=3.0)))


def test_maps_apply_to_any_generator():
    # xPos: rates kept, frequencies scaled
    x = lp.xpos(16)
    xs = scaling.yarn(x, factor=8.0, original_max_position_embeddings=512)
    assert torch.equal(xs.generator.rates, x.generator.rates)
    assert not torch.equal(xs.generator.freqs, x.generator.freqs)
    # real blocks (decay, NoPE) are untouched; i and d count complex blocks only
    g = direct_sum(lp.rope(8).generator, lp.decay([0.1, 0.2]).generator, lp.rope(8).generator)
    enc = lp.Encoding(g)
    out = scaling.llama3(enc, factor=4.0, original_max_position_embeddings=16)
    assert torch.equal(out.generator.freqs[4:6], g.freqs[4:6])
    assert torch.equal(out.generator.rates, g.rates)
    p = scaling.proportional(enc, partial_rotary_factor=0.5)
    assert freqs(p).tolist() == freqs(enc).tolist()[:4] + [0.0] * 4
    # per-head generators
    r = lp.retnet(16, num_heads=3)
    rs = scaling.ntk(r, factor=4.0)
    assert rs.generator.freqs.shape == (3, 8)
    assert torch.equal(rs.generator.freqs[:, 0], r.generator.freqs[:, 0])


def test_yarn_per_head_rows_and_non_geometric_spectrum():
    g = Generator(torch.zeros(2, 4), torch.tensor([[1.0, 0.1, 0.01, 0.001], [2.0, 0.2, 0.02, 0.002]]), [1] * 4)
    y = scaling.yarn(lp.Encoding(g), factor=4.0, original_max_position_embeddings=100)
    assert y.generator.freqs.shape == (2, 4)
    odd = lp.Encoding(Generator(torch.zeros(3), torch.tensor([1.0, 0.3, 0.2]), [1] * 3))
    with pytest.raises(ValueError, match="base"):
        scaling.yarn(odd, factor=4.0, original_max_position_embeddings=100)
    scaling.yarn(odd, factor=4.0, original_max_position_embeddings=100, base=100.0)  # explicit base is fine


def test_longrope_and_llama3_boundaries():
    enc = lp.rope(8)
    lr = scaling.longrope(enc, short_factor=[1, 1, 1, 1], long_factor=[2, 2, 2, 2],
                          original_max_position_embeddings=100, factor=1.0)
    assert torch.equal(freqs(lr.at_length(100)), freqs(enc))
    assert torch.equal(freqs(lr.at_length(101)), freqs(enc) / 2)
    assert lr.logit_scale == 1.0  # s <= 1: no temperature


def test_scaled_attention_through_length_rule():
    """attention() uses enc.at_length(max position + 1): the dynamic rule is honoured end to end."""
    attention = lp.attention
    enc = scaling.dynamic(lp.rope(8), factor=2.0, original_max_position_embeddings=4)
    q = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    k = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    v = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    got = attention(q, k, v, enc)
    want = attention(q, k, v, enc.at_length(10).replace(length_rule=None))
    assert torch.allclose(got, want, atol=1e-12)


# ---------------------------------------------------------------------- registry and errors
def test_registry_one_signature():
    assert set(SCALINGS) == {"linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional", "clipped",
                             "factors"}
    enc = lp.rope(8)
    params = {
        "linear": dict(factor=2.0),
        "ntk": dict(factor=2.0),
        "dynamic": dict(factor=2.0, original_max_position_embeddings=16),
        "yarn": dict(factor=2.0, original_max_position_embeddings=16),
        "longrope": dict(short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=16, factor=2.0),
        "llama3": dict(factor=2.0, original_max_position_embeddings=16),
        "proportional": dict(partial_rotary_factor=0.5),
        "clipped": dict(clip=2),
        "factors": dict(factors=[1.0, 2.0, 3.0, 4.0]),
    }
    for name, fn in SCALINGS.items():
        out = fn(enc, **params[name])
        assert isinstance(out, lp.Encoding) and out.layout == enc.layout
        assert scaling.scale(enc, name, **params[name]).version == out.version


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["linear", "ntk", "yarn", "llama3"])
def test_bad_factor_names_it(name, bad):
    extra = {} if name in ("linear", "ntk") else {"original_max_position_embeddings": 16}
    with pytest.raises(ValueError, match="factor"):
        SCALINGS[name](lp.rope(8), factor=bad, **extra)


def test_errors_name_the_argument():
    enc = lp.rope(8)
    with pytest.raises(TypeError, match="factor"):
        scaling.linear(enc, factor=True)
    with pytest.raises(TypeError, match="factor"):
        scaling.linear(enc, factor="2")
    with pytest.raises(TypeError, match="bogus"):
        scaling.scale(enc, "linear", factor=2.0, bogus=1)
    with pytest.raises(TypeError, match="factor"):
        scaling.scale(enc, "linear")
    with pytest.raises(TypeError, match="bogus"):
        scaling.linear(enc, factor=2.0, bogus=1)
    with pytest.raises(ValueError, match="unknown scaling 'nope'"):
        scaling.scale(enc, "nope", factor=2.0)
    with pytest.raises(ValueError, match="short_factor"):
        scaling.longrope(enc, short_factor=[1.0] * 3, long_factor=[1.0] * 4, original_max_position_embeddings=8)
    with pytest.raises(ValueError, match="long_factor"):
        scaling.longrope(enc, short_factor=[1.0] * 4, long_factor=[1.0, 0.0, 1.0, 1.0],
                         original_max_position_embeddings=8, factor=2.0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        scaling.longrope(enc, short_factor=[1.0] * 4, long_factor=[1.0] * 4, original_max_position_embeddings=8)
    with pytest.raises(ValueError, match="high_freq_factor"):
        scaling.llama3(enc, factor=8.0, original_max_position_embeddings=16, low_freq_factor=4, high_freq_factor=1)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        scaling.yarn(enc, factor=2.0, original_max_position_embeddings=0)
    with pytest.raises(ValueError, match="beta_fast"):
        scaling.yarn(enc, factor=2.0, original_max_position_embeddings=16, beta_fast=-1)
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        scaling.proportional(enc, partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match="rotary_dim"):
        scaling.dynamic(enc, factor=2.0, original_max_position_embeddings=8, rotary_dim=12)
    with pytest.raises(ValueError, match="no rotation"):
        scaling.linear(lp.nope(4), factor=2.0)
    with pytest.raises(TypeError, match="Encoding"):
        scaling.linear(lp.rope(8).generator, factor=2.0)
