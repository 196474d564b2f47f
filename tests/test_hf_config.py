"""liepos.from_hf against transformers itself: real config classes, ROPE_INIT_FUNCTIONS, the
rotary modules and ``apply_rotary_pos_emb``. No download: every config is built from defaults or
small random sizes.

* ``precision="compat"`` reproduces transformers' float32 ``inv_freq`` exactly;
* ``precision="precise"`` equals the upstream formulas evaluated in float64 (the upstream code
  run with a torch shim whose float32 is float64) to 1e-12 relative;
* ``logit_scale`` is ``attention_factor²`` to 1e-12;
* ``enc.query`` is ``q·cos + rotate_half(q)·sin`` (upstream's function) past the original context.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from helpers import Torch64

transformers = pytest.importorskip("transformers")
mru = pytest.importorskip("transformers.modeling_rope_utils")

from transformers import (  # noqa: E402
    DeepseekV2Config,
    DeepseekV3Config,
    Gemma3Config,
    Gemma3TextConfig,
    Gemma4TextConfig,
    GptOssConfig,
    LlamaConfig,
    ModernBertConfig,
    Phi3Config,
    PhiConfig,
    Qwen2VLConfig,
)
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

import liepos as lp  # noqa: E402
from liepos import scaling  # noqa: E402
from liepos.interop import from_hf, read_hf  # noqa: E402
from liepos.scaling import rotation_freqs  # noqa: E402

transformers.logging.set_verbosity_error()


# ---------------------------------------------------------------------- the upstream, in float64
def upstream(cfg, *, seq_len=None, f64=False, monkeypatch=None):
    """(inv_freq, attention_factor) of transformers for ``cfg`` (default rope: the model's own)."""
    kind = cfg.rope_parameters["rope_type"]
    if kind == "default":
        import transformers.models.llama.modeling_llama as mod

        fn, module = LlamaRotaryEmbedding.compute_default_rope_parameters, mod
    else:
        fn, module = mru.ROPE_INIT_FUNCTIONS[kind], mru
    if not f64:
        return fn(cfg, seq_len=seq_len)
    with monkeypatch.context() as m:
        m.setattr(module, "torch", Torch64())
        w, af = fn(cfg, seq_len=seq_len)
    return w.as_subclass(torch.Tensor), af


def rel_err(a, b):
    a, b = a.to(torch.float64), b.to(torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    nz = b != 0
    assert torch.equal(a[~nz], b[~nz])
    return ((a[nz] - b[nz]).abs() / b[nz].abs()).max().item() if bool(nz.any()) else 0.0


SHORT = [1.0 + 0.05 * i for i in range(32)]
LONG = [1.5 + 0.7 * i for i in range(32)]
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024},
    "yarn-gpt-oss": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096},
    "yarn-reversed-betas": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 1, "beta_slow": 32,
                            "original_max_position_embeddings": 2048},
    "yarn-deepseek": {"rope_type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                      "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.0,
                              "original_max_position_embeddings": 2048},
    "longrope": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                 "original_max_position_embeddings": 1024},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 2.0},
}


def llama(name, **kw):
    rs = ROPES[name]
    return LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=8192, rope_theta=500000.0,
        rope_scaling=None if rs is None else dict(rs), **kw,
    )


# ---------------------------------------------------------------------- every rope type
@pytest.mark.parametrize("name", list(ROPES))
def test_every_rope_type_matches_upstream(name, monkeypatch):
    cfg = llama(name)
    w32, af = upstream(cfg)
    w64, af64 = upstream(cfg, f64=True, monkeypatch=monkeypatch)
    compat = from_hf(cfg, precision="compat", softmax_mscale=False)
    precise = from_hf(cfg, softmax_mscale=False)
    assert torch.equal(rotation_freqs(compat), w32.to(torch.float64))  # bit for bit
    assert rel_err(rotation_freqs(precise), w64) <= 1e-12
    assert rel_err(rotation_freqs(precise), w32) <= 2e-6  # float32's own error, for scale
    for enc in (compat, precise):
        assert enc.layout == "half" and enc.dim == 64
        assert math.isclose(enc.logit_scale, af * af, rel_tol=1e-12)
        assert af == af64


@pytest.mark.parametrize("name", ["linear", "dynamic", "yarn", "yarn-gpt-oss", "llama3"])
def test_partial_rotary_with_scaling(name, monkeypatch):
    cfg = llama(name, partial_rotary_factor=0.5)
    w32, af = upstream(cfg)
    w64, _ = upstream(cfg, f64=True, monkeypatch=monkeypatch)
    assert w32.shape == (16,)
    compat, precise = read_hf(cfg, precision="compat"), read_hf(cfg)
    # the temperature is transformers' on the 32 rotated dims only: apart from the encoding
    assert compat.rotary_dim == 32 and compat.rotary_scale == pytest.approx(af * af, rel=1e-12)
    assert compat.encoding.logit_scale == pytest.approx(1.0, rel=1e-12)
    if af != 1.0:  # from_hf states the temperature on the rotated dims only, as transformers applies it
        _check_rotated_dims_temperature(cfg, compat.rotary_scale)
    compat, precise = compat.encoding, precise.encoding
    assert torch.equal(rotation_freqs(compat), w32.double())
    assert rel_err(rotation_freqs(precise), w64) <= 1e-12
    assert compat.dim == precise.dim == 64
    q = torch.randn(1, 1, 3, 64, dtype=torch.float64)
    if precise.length_rule is not None:  # a length-dependent rope is used at an explicit length
        precise = precise.at_length(20001)
    assert torch.equal(precise.query(q, [5000, 9000, 20000])[..., 32:], q[..., 32:])


def _check_rotated_dims_temperature(cfg, factor):
    """``from_hf`` of a partially rotary head with a temperature: scores are the rotation's scores with
    only the rotated dims' part multiplied by ``factor`` (transformers scales cos and sin)."""
    enc, rotation = from_hf(cfg), read_hf(cfg).encoding
    if enc.length_rule is not None:
        enc, rotation = enc.at_length(300), rotation.at_length(300)
    D = enc.query_scale
    assert D is not None and torch.all(D[:32] == factor) and torch.all(D[32:] == 1.0)
    assert enc.logit_scale == rotation.logit_scale == pytest.approx(1.0, rel=1e-12)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 64, dtype=torch.float64, generator=g) for _ in range(2))
    p = torch.tensor([0, 3, 50, 151, 299])
    got = enc.query(q, p) @ enc.key(k, p).transpose(-1, -2)  # (1, 2, 5, 5)
    qe, ke = rotation.query(q, p), rotation.key(k, p)
    want = factor * qe[..., :32] @ ke[..., :32].transpose(-1, -2) + qe[..., 32:] @ ke[..., 32:].transpose(-1, -2)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # the reference path agrees, and lp.attention uses the same scores
    assert torch.allclose(enc.query_reference(q, p), enc.query(q, p), rtol=1e-12, atol=1e-12)
    v = torch.randn(1, 2, 5, 64, dtype=torch.float64, generator=g)
    ref = torch.softmax(want / 8.0 + torch.triu(torch.full((5, 5), float("-inf"), dtype=torch.float64), 1), -1) @ v
    assert torch.allclose(lp.attention(q, k, v, enc, positions=p), ref, rtol=1e-10, atol=1e-12)


def test_a_per_dim_temperature_round_trips_through_to_hf():
    cfg = llama("yarn", partial_rotary_factor=0.5)
    enc = from_hf(cfg)
    assert enc.query_scale is not None
    back = from_hf(lp.to_hf(enc))
    assert torch.allclose(back.query_scale, enc.query_scale, rtol=1e-12)
    assert torch.allclose(rotation_freqs(back), rotation_freqs(enc), rtol=1e-12)
    # a whole-head logit scale on a partial head is not what transformers' attention_factor means
    with pytest.raises(ValueError, match="rotated dims"):
        lp.to_hf(enc.replace(query_scale=None, logit_scale=2.0))


@pytest.mark.parametrize("length", [8192, 8193, 10000, 65536])
def test_dynamic_against_the_rotary_module(length):
    cfg = llama("dynamic")
    emb = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, dtype=torch.float32)
    emb(x, torch.arange(length)[None])  # the forward pass recomputes inv_freq on growth
    compat = from_hf(cfg, precision="compat").at_length(length)
    assert torch.equal(rotation_freqs(compat), emb.inv_freq.to(torch.float64))
    ref, _ = mru.ROPE_INIT_FUNCTIONS["dynamic"](cfg, seq_len=torch.tensor(length))
    assert torch.equal(rotation_freqs(compat), ref.to(torch.float64))
    # back under the original length the module resets, and so does the rule
    emb(x, torch.arange(100)[None])
    assert torch.equal(rotation_freqs(from_hf(cfg, precision="compat").at_length(100)), emb.inv_freq.double())


def test_dynamic_precise_at_lengths(monkeypatch):
    cfg = llama("dynamic")
    enc = from_hf(cfg)
    for length in (100, 8192, 8193, 20000):
        ref, _ = upstream(cfg, seq_len=length, f64=True, monkeypatch=monkeypatch)
        assert rel_err(rotation_freqs(enc.at_length(length)), ref) <= 1e-12


def test_longrope_switch_against_phi3_module():
    cfg = Phi3Config(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=32768,
        original_max_position_embeddings=1024,
        rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
    )
    emb = Phi3RotaryEmbedding(cfg)
    enc = from_hf(cfg, precision="compat")
    x = torch.zeros(1)
    for length, which in ((1024, "short"), (1025, "long"), (3000, "long"), (10, "short")):
        emb(x, torch.arange(length)[None])
        got = rotation_freqs(enc.at_length(length))
        assert torch.equal(got, emb.inv_freq.double()), (length, which)
        assert math.isclose(enc.at_length(length).logit_scale, emb.attention_scaling**2, rel_tol=1e-12)
    # Phi-3's factor comes from max_position_embeddings / original_max_position_embeddings
    assert emb.attention_scaling == pytest.approx(math.sqrt(1 + math.log(32) / math.log(1024)), rel=1e-12)


# ---------------------------------------------------------------------- q·cos + rotate_half(q)·sin
def hf_query(q, pos, inv_freq, attention_scaling):
    """Upstream apply_rotary_pos_emb with cos/sin built in float64 from the module's inv_freq."""
    freqs = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_scaling, emb.sin() * attention_scaling
    out, _ = apply_rotary_pos_emb(q, q, cos[None], sin[None])
    return out


@pytest.mark.parametrize("name", ["default", "linear", "yarn", "yarn-gpt-oss", "llama3"])
def test_query_equals_apply_rotary_pos_emb(name, monkeypatch):
    torch.manual_seed(0)
    cfg = llama(name)
    emb = LlamaRotaryEmbedding(cfg)
    pos = torch.tensor([0, 1, 17, 1023, 1024, 1025, 4095, 4097, 8191, 12000, 30000])
    q = torch.randn(2, 4, len(pos), 64, dtype=torch.float64)
    for precision, inv in (("compat", emb.inv_freq), ("precise", upstream(cfg, f64=True, monkeypatch=monkeypatch)[0])):
        enc = from_hf(cfg, precision=precision)
        assert enc.logit_scale == pytest.approx(emb.attention_scaling**2, rel=1e-12)
        want = hf_query(q, pos, inv, emb.attention_scaling)
        got = enc.query(q, pos) * math.sqrt(enc.logit_scale)
        assert torch.allclose(got, want, atol=1e-9, rtol=0), precision
        assert torch.allclose(enc.key(q, pos) * math.sqrt(enc.logit_scale), want, atol=1e-9, rtol=0)
        # in float32 too
        got32 = enc.query(q.float(), pos) * math.sqrt(enc.logit_scale)
        assert torch.allclose(got32, want.float(), atol=1e-5, rtol=0), precision
    # the module's own float32 cos/sin agree where float32 angles are still accurate
    short = torch.arange(32)
    qs = torch.randn(2, 4, 32, 64)
    cos, sin = emb(qs, short[None])
    want, _ = apply_rotary_pos_emb(qs, qs, cos, sin)
    got = from_hf(cfg, precision="compat").query(qs, short) * emb.attention_scaling
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_partial_rotary_phi():
    """T18: head_dim 256, rotary_dim 64, positions 700–2355; the pass-through dims are untouched."""
    torch.manual_seed(1)
    cfg = PhiConfig(hidden_size=512, num_attention_heads=2, partial_rotary_factor=0.25, max_position_embeddings=2048)
    emb = PhiRotaryEmbedding(cfg)
    ref, _ = PhiRotaryEmbedding.compute_default_rope_parameters(cfg)
    assert ref.shape == (32,)
    pos = torch.arange(700, 2356, 37)
    q = torch.randn(1, 2, len(pos), 256, dtype=torch.float64)
    for precision in ("compat", "precise"):
        enc = from_hf(cfg, precision=precision)
        assert enc.dim == 256 and len(rotation_freqs(enc)) == 32
        out = enc.query(q, pos)
        assert torch.equal(out[..., 64:], q[..., 64:])
        if precision == "compat":
            assert torch.equal(rotation_freqs(enc), ref.double())  # the exponent uses rotary_dim = 64
            rot = hf_query(q[..., :64], pos, emb.inv_freq, emb.attention_scaling)
            assert torch.allclose(out[..., :64], rot, atol=1e-9, rtol=0)
        else:
            assert torch.allclose(rotation_freqs(enc), 1.0 / 10000.0 ** (torch.arange(0, 64, 2).double() / 64),
                                  rtol=1e-15, atol=0)


# ---------------------------------------------------------------------- config shapes (T30)
def test_v4_v5_object_and_alias_give_identical_encodings():
    params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    base = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072}
    v4 = dict(base, rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **params})
    v4_type = dict(base, rope_theta=500000.0, rope_scaling={"type": "llama3", **params})
    v5 = dict(base, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **params})
    obj = LlamaConfig(**v4)
    saved = obj.to_dict()
    for precision in ("precise", "compat"):
        keys = {from_hf(c, precision=precision).version for c in (v4, v4_type, v5, obj, saved)}
        assert len(keys) == 1


def test_gemma3_per_layer_types():
    obj = Gemma3TextConfig(rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_theta=1e6,
                           rope_local_base_freq=1e4)
    encs = from_hf(obj, precision="compat")
    assert set(encs) == {"full_attention", "sliding_attention"}
    emb = Gemma3RotaryEmbedding(obj)
    for lt, enc in encs.items():
        assert torch.equal(rotation_freqs(enc), getattr(emb, f"{lt}_inv_freq").double())
    sliding = from_hf(obj, layer_type="sliding_attention")  # precise: plain RoPE, unscaled
    assert torch.allclose(rotation_freqs(sliding), rotation_freqs(lp.rope(256, 1e4)), rtol=1e-15, atol=0)
    assert from_hf(obj, layer_type="sliding_attention", precision="compat").version == encs["sliding_attention"].version
    # the same model as a v4 config.json, a v5 one, the object and the multimodal wrapper
    v4 = {"head_dim": 256, "hidden_size": 2304, "num_attention_heads": 8, "rope_theta": 1e6,
          "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    v5 = {"head_dim": 256, "hidden_size": 2304, "num_attention_heads": 8, "layer_types": obj.layer_types,
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    mm = Gemma3Config(text_config=obj.to_dict())
    for other in (v4, v5, obj.to_dict(), mm, {"text_config": v5}):
        got = from_hf(other, precision="compat")
        assert {k: e.version for k, e in got.items()} == {k: e.version for k, e in encs.items()}


def test_gemma4_proportional_with_per_layer_head_dim():
    cfg = Gemma4TextConfig()
    emb = Gemma4TextRotaryEmbedding(cfg)
    encs = from_hf(cfg, precision="compat")
    assert encs["full_attention"].dim == 512 and encs["sliding_attention"].dim == 256
    for lt, enc in encs.items():
        assert torch.equal(rotation_freqs(enc), getattr(emb, f"{lt}_inv_freq").double())
    full = from_hf(cfg, layer_type="full_attention")
    w = rotation_freqs(full)
    assert int((w != 0).sum()) == 64 and bool((w[64:] == 0).all())  # 0.25 of 256 planes rotate
    assert all(full.generator.complex)  # NoPE planes stay in place, paired (k, k + 256)


def test_gemma4_as_config_json():
    cfg = Gemma4TextConfig()
    want = {k: e.version for k, e in from_hf(cfg).items()}
    saved = cfg.to_dict()  # per_layer_config {"05": {"head_dim": 512}, ...}
    assert {k: e.version for k, e in from_hf(saved).items()} == want
    hub = {k: v for k, v in saved.items() if k != "per_layer_config"}
    hub["global_head_dim"] = 512  # the shape of the published config.json
    assert {k: e.version for k, e in from_hf(hub).items()} == want


@pytest.mark.parametrize(
    "make",
    [
        lambda: llama("yarn-deepseek"),
        lambda: llama("longrope"),
        lambda: PhiConfig(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.4),
        lambda: Phi3Config(hidden_size=256, num_attention_heads=4, max_position_embeddings=32768,
                           original_max_position_embeddings=1024,
                           rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
        GptOssConfig,
        lambda: DeepseekV2Config(rope_scaling={"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                                               "original_max_position_embeddings": 4096},
                                 max_position_embeddings=163840),
    ],
)
def test_object_and_its_saved_dict_agree(make):
    cfg = make()
    for precision in ("precise", "compat"):
        a, b = from_hf(cfg, precision=precision), from_hf(cfg.to_dict(), precision=precision)
        assert a.version == b.version
        assert a.at_length(200000).version == b.at_length(200000).version


def test_transformers_v4_style_object():
    """An object with rope_scaling / rope_theta attributes and no rope_parameters (transformers 4.x)."""
    from types import SimpleNamespace

    old = SimpleNamespace(hidden_size=256, num_attention_heads=4, max_position_embeddings=8192,
                          rope_theta=500000.0, rope_scaling=dict(ROPES["llama3"]))
    assert from_hf(old, precision="compat").version == from_hf(llama("llama3"), precision="compat").version


def test_modernbert_nested_defaults():
    encs = from_hf(ModernBertConfig())
    assert rotation_freqs(encs["full_attention"])[1] == pytest.approx(160000.0 ** (-2 / 64), rel=1e-15)
    assert rotation_freqs(encs["sliding_attention"])[1] == pytest.approx(10000.0 ** (-2 / 64), rel=1e-15)


def test_nested_none_is_nope():
    cfg = {"head_dim": 8, "layer_types": ["a", "b"], "rope_parameters": {"a": {"rope_type": "default"}, "b": None}}
    encs = from_hf(cfg)
    assert encs["b"].generator.is_orthogonal and not any(encs["b"].generator.complex)
    assert encs["b"].dim == 8


# ---------------------------------------------------------------------- golden values
def test_deepseek_v2_lite_softmax_multiplier():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import yarn_apply_mscale

    rs = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
          "original_max_position_embeddings": 4096, "type": "yarn"}
    cfg_json = {"model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": rs}
    obj = DeepseekV2Config(hidden_size=2048, num_attention_heads=16, max_position_embeddings=163840,
                           rope_scaling=dict(rs))
    for cfg in (cfg_json, obj):
        enc = from_hf(cfg)
        assert enc.dim == 64
        # the rotation's attention factor m(40, .707)/m(40, .707) is 1.0 ...
        assert from_hf(cfg, softmax_mscale=False).logit_scale == 1.0
        # ... and the model multiplies its softmax scale by m(40, 0.707)² ≈ 1.59
        assert enc.logit_scale == pytest.approx(1.59, abs=5e-3)
        assert enc.logit_scale == pytest.approx(yarn_apply_mscale(obj.rope_parameters, 1.0), rel=1e-12)
    v3 = DeepseekV3Config(rope_scaling={"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
                          max_position_embeddings=163840)
    assert from_hf(v3).logit_scale == pytest.approx(1.87, abs=5e-3)


def test_deepseek_v3_rope_interleave_scores():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3RotaryEmbedding,
        apply_rotary_pos_emb_interleave,
    )

    torch.manual_seed(2)
    cfg = DeepseekV3Config(rope_scaling={"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
                           max_position_embeddings=163840)
    assert cfg.rope_interleave
    emb = DeepseekV3RotaryEmbedding(cfg)
    pos = torch.tensor([0, 1, 5, 20])  # where upstream's float32 angles are still exact to ~1e-7
    q, k = torch.randn(1, 2, 4, 64), torch.randn(1, 2, 4, 64)
    cos, sin = emb(q, pos[None])
    qh, kh = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    enc = from_hf(cfg, precision="compat", softmax_mscale=False).replace(layout="interleaved")
    want = qh.double() @ kh.double().transpose(-1, -2)
    got = enc.query(q.double(), pos) @ enc.key(k.double(), pos).transpose(-1, -2) * enc.logit_scale
    assert torch.allclose(got, want, atol=1e-6 * want.abs().max().item(), rtol=0)
    assert from_hf(cfg).layout == "interleaved"  # the config's rope_interleave, read
    half = from_hf(cfg, precision="compat", softmax_mscale=False).replace(layout="half")
    other = half.query(q.double(), pos) @ half.key(k.double(), pos).transpose(-1, -2)
    assert not torch.allclose(other, want, atol=1e-2 * want.abs().max().item())  # the layout matters


def test_gpt_oss_truncate_false():
    cfg = GptOssConfig()
    assert cfg.rope_parameters["truncate"] is False
    ref, af = mru.ROPE_INIT_FUNCTIONS["yarn"](cfg)
    enc = from_hf(cfg, precision="compat")
    assert torch.equal(rotation_freqs(enc), ref.double())
    assert enc.logit_scale == pytest.approx(af * af, rel=1e-12)
    low, high = scaling.yarn_correction_range(rotary_dim=cfg.head_dim, base=cfg.rope_parameters["rope_theta"],
                                              original_max_position_embeddings=4096, truncate=False)
    assert (round(low, 4), round(high, 3)) == (8.0928, 17.398)
    # truncation changes the frequencies: the flag is honoured
    truncated = dict(cfg.rope_parameters, truncate=True)
    assert not torch.equal(rotation_freqs(from_hf(dict(cfg.to_dict(), rope_parameters=truncated))),
                           rotation_freqs(from_hf(cfg)))


# ---------------------------------------------------------------------- errors
BASE = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 1024}


def err(match, config, exc=ValueError, **kw):
    with pytest.raises(exc, match=match):
        from_hf(config, **kw)


def test_errors_name_the_key():
    err("bogus", dict(BASE, rope_scaling={"rope_type": "linear", "factor": 2.0, "bogus": 1}))
    err("original_max_position_embeddings", dict(BASE, rope_scaling={"type": "dynamic", "factor": 2.0,
                                                                     "original_max_position_embeddings": 512}))
    err(r"missing required parameters \['factor'\]", dict(BASE, rope_scaling={"rope_type": "linear"}))
    err("low_freq_factor", dict(BASE, rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}))
    err("unknown rope_type 'su'", dict(BASE, rope_scaling={"type": "su", "factor": 2.0}))
    err("type='yarn' but rope_type='linear'", dict(BASE, rope_scaling={"type": "yarn", "rope_type": "linear",
                                                                       "factor": 2.0}))
    err("rope_theta", dict(BASE, rope_theta=1e4, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    err("rope_scaling", dict(BASE, rope_parameters={"rope_type": "default"}, rope_scaling={"rope_type": "linear",
                                                                                          "factor": 2.0}))
    err("precision", BASE, precision="fast")
    err("layer_type 'global'", Gemma3TextConfig(), layer_type="global")
    err("partial_rotary_factor", dict(BASE, partial_rotary_factor=0.0))
    err("head_dim", {"rope_theta": 1e4})
    err("factor", dict(BASE, rope_scaling={"rope_type": "linear", "factor": -1.0}))
    err("factor", dict(BASE, rope_scaling={"rope_type": "linear", "factor": float("nan")}))
    err("max_position_embeddings", {"head_dim": 8, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    err("attention_factor", dict(BASE, rope_scaling={"rope_type": "yarn", "factor": 2.0, "attention_factor": 0.0,
                                                     "original_max_position_embeddings": 512}))


def test_mrope_section_is_m_rope():
    cfg = Qwen2VLConfig(text_config={"hidden_size": 256, "num_attention_heads": 4,
                                     "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12]}})
    q = torch.randn(1, 1, 3, 64, dtype=torch.float64)
    p = torch.tensor([[0, 5, 9], [1, 2, 3], [4, 4, 4]], dtype=torch.float64)  # (seq, axes)
    base = cfg.get_text_config().rope_parameters["rope_theta"]
    assert torch.allclose(from_hf(cfg).query(q, p), lp.mrope(64, [8, 12, 12], base).query(q, p))
    enc = from_hf(cfg, ignore_keys={"mrope_section"})  # the 1-D text positions, knowingly
    assert enc.dim == 64


def test_yarn_nested_truncate_is_ignored_as_upstream():
    cfg = {"head_dim": 64, "max_position_embeddings": 131072, "layer_types": ["full"],
           "rope_parameters": {"full": {"rope_type": "yarn", "factor": 32.0, "truncate": False, "rope_theta": 150000.0,
                                        "original_max_position_embeddings": 4096}}}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        enc = from_hf(cfg, layer_type="full")
    assert any("truncate" in str(r.message) for r in rec)
    flat = dict(cfg["rope_parameters"]["full"], truncate=True)
    assert enc.generator.key() == from_hf({"head_dim": 64, "max_position_embeddings": 131072,
                                           "rope_parameters": flat}).generator.key()


def test_exported_at_top_level():
    assert lp.from_hf is from_hf


# ---------------------------------------------------------------------- upstream-accepted edge configs
@pytest.mark.parametrize("rope", [
    {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0], "original_max_position_embeddings": 1024},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
     "original_max_position_embeddings": 1024},
])
@pytest.mark.parametrize("length", [100, 5000])
def test_edge_configs_upstream_accepts_mean_the_same(rope, length):
    """A length-1 longrope list broadcasts to every plane; llama3 with an empty smooth band is a step."""
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=8192, rope_theta=10000.0,
                      rope_scaling=dict(rope))
    w, af = mru.ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, seq_len=length)
    enc = from_hf(cfg, precision="compat").at_length(length)
    assert torch.equal(rotation_freqs(enc), w.double())
    assert enc.logit_scale == pytest.approx(af * af, rel=1e-12)


def test_an_unused_key_upstream_warns_about_is_refused_with_the_reason():
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "foo": 1}}
    with pytest.raises(ValueError, match="transformers only warns"):
        from_hf(cfg)
    assert from_hf(cfg, ignore_keys={"foo"}).generator.freqs[0] == 0.5
