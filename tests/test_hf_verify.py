"""Families outside liepos' table: verified against transformers' own modeling code, or refused.

The reference of every test is upstream's code called directly (the family's ``*RotaryEmbedding``
and ``apply_rotary_pos_emb``), not liepos' probe: scores ``apply(q, t)ᵀ apply(k, s)`` at positions
before and past the original length against ``enc.query(q, t)ᵀ enc.key(k, s) · logit_scale``.
"""

from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from liepos.interop import from_hf, patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_verify import structure, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

L0 = 32
POS = [0, 1, 2, 5, 17, L0 - 1, L0, L0 + 3, 2 * L0 + 1, 4 * L0 - 1]
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, num_hidden_layers=2, max_position_embeddings=L0, initializer_range=0.2,
             attention_dropout=0.0, pad_token_id=0)
# the families from_hf used to read with Llama's conventions, silently wrong (1.05-1.17 of max|score|)
SILENT = ["cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "nanochat", "helium"]


def config(model_type, **kw):
    return AutoConfig.for_model(model_type, **dict(SMALL, **kw))


def upstream_scores(cfg, q, k, pos):
    """Upstream's scores (1, H, S, S) from the family's own rotary module and apply function."""
    text = cfg.get_text_config()
    up = upstream_of(text, text.model_type)
    cos, sin = up.rotary(text)(q, pos[None, :])
    qe, ke = up.rotate(q, k, cos, sin)
    return qe.double() @ ke.double().transpose(-1, -2)


def liepos_scores(enc, q, k, pos):
    qe, ke = enc.query(q.double(), pos), enc.key(k.double(), pos)
    return (qe @ ke.transpose(-1, -2)) * enc.logit_scale


def worst(cfg, enc):
    gen = torch.Generator().manual_seed(0)
    pos = torch.tensor(POS)
    q = torch.randn(1, 2, len(POS), 16, generator=gen)
    k = torch.randn(1, 2, len(POS), 16, generator=gen)
    want = upstream_scores(cfg, q, k, pos)
    return float((liepos_scores(enc, q, k, pos) - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("model_type", SILENT)
def test_families_read_wrongly_before_are_exact_now(model_type):
    cfg = config(model_type)
    assert cfg.get_text_config().model_type not in FAMILIES  # outside the table: verified, not listed
    enc = from_hf(cfg)
    assert worst(cfg, enc) < 1e-5  # float32 rounding of upstream's angles at positions up to 4 L0


def test_ernie_vl_text_rope_is_exact_with_its_m_rope_axes():
    """Ernie 4.5 VL's text rope: M-RoPE sections over h, w, t (neither Qwen2-VL's order nor Qwen3-VL's
    interleave), probed axis by axis; exact on grid positions, and its 1-D text positions knowingly."""
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]}
    cfg = AutoConfig.for_model("ernie4_5_vl_moe", text_config=dict(SMALL, rope_parameters=rope))
    enc = from_hf(cfg)
    assert enc.generator.num_axes == 3 and enc.name == "hf:mrope[probed]"
    text = cfg.get_text_config()
    up = upstream_of(text, text.model_type)
    t = torch.tensor(POS)
    pos = torch.stack([t, t // 3 + 1, (t * 5) % 7], dim=-1)  # (S, 3): the axes differ
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, len(POS), 16, generator=gen), torch.randn(1, 2, len(POS), 16, generator=gen)
    cos, sin = up.rotary(text)(q, pos.T[:, None, :])  # (S, 3) -> (3, 1, S) position_ids
    qe, ke = up.rotate(q, k, cos, sin)
    want = qe.double() @ ke.double().transpose(-1, -2)
    got = enc.query(q.double(), pos) @ enc.key(k.double(), pos).transpose(-1, -2)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    assert worst(cfg, from_hf(cfg, ignore_keys={"mrope_section"})) < 1e-5


@pytest.mark.parametrize("model_type", ["cohere2", "nanochat", "helium"])
def test_llama_conventions_would_be_wrong_there(model_type):
    """The check has teeth: the same frequencies in Llama's layout and sense are off by O(1)."""
    cfg = config(model_type)
    llama = from_hf(config("llama"))
    assert worst(cfg, llama) > 0.5


def test_direction_and_partial_slice_are_recovered():
    nano = upstream_of(config("nanochat"), "nanochat")
    assert structure(nano, None, 16).direction == -1  # nanochat's rotation runs the other way
    glm = config("glm4_moe", partial_rotary_factor=0.5)
    s = structure(upstream_of(glm, "glm4_moe"), None, 16)
    assert (s.rotated, s.layout, s.direction, s.splits) == (8, "half", 1, False)
    assert worst(glm, from_hf(glm)) < 1e-5
    persimmon = config("persimmon", partial_rotary_factor=0.5)
    s = structure(upstream_of(persimmon, "persimmon"), None, 16)
    assert (s.rotated, s.splits) == (8, True)  # its attention passes only the rotated dims


def test_scaled_rope_of_a_verified_family():
    cfg = config("helium", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                            "original_max_position_embeddings": L0 // 4})
    assert worst(cfg, from_hf(cfg)) < 1e-5


def test_an_attention_that_cuts_the_head_is_refused_without_the_model():
    with pytest.raises(ValueError, match="passes only 8 of 16 dims"):
        from_hf(config("persimmon", partial_rotary_factor=0.5))


def test_unknown_model_type_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="no such model type.*'llama'.*'cohere'"):
        from_hf({"model_type": "not_a_family", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4})


@pytest.mark.parametrize("model_type, vision", [("nemotron_h", None), ("glm5_next_text", "Glm5NextVisionRotaryEmbedding")])
def test_a_text_model_without_rope_is_refused_by_name(model_type, vision):
    with pytest.raises(ValueError, match="no text \\*RotaryEmbedding class: its text attention takes no rotary") as err:
        from_hf(dict(SMALL, model_type=model_type, rope_theta=1e4, num_key_value_heads=4))
    assert (vision is None) or f"only its vision tower rotates: {vision}" in str(err.value)


def test_gptj_says_once_what_it_is():
    with pytest.raises(ValueError) as err:
        from_hf(AutoConfig.for_model("gptj", n_embd=64, n_head=4, rotary_dim=8))
    text = str(err.value)
    assert text.count("GPT-J") == 1 and "rotary_dim" in text and "absolute" not in text


@pytest.fixture
def planted(monkeypatch):
    """Helium's rope made wrong: its apply by 1e-3 on sin, or its rotary module past the original length only."""
    modeling = importlib.import_module("transformers.models.helium.modeling_helium")
    apply, rotary = modeling.apply_rotary_pos_emb, modeling.HeliumRotaryEmbedding.forward

    def off_apply(q, k, cos, sin, *args, **kwargs):
        return apply(q, k, cos, sin * (1 + 1e-3), *args, **kwargs)

    def off_late(self, x, position_ids):
        cos, sin = rotary(self, x, position_ids)
        late = (position_ids >= L0)[..., None]  # (B, S, 1): the positions past the original length turn back
        return cos, torch.where(late, -sin, sin)

    def plant(kind):
        if kind == "sin":
            monkeypatch.setattr(modeling, "apply_rotary_pos_emb", off_apply)
        else:
            monkeypatch.setattr(modeling.HeliumRotaryEmbedding, "forward", off_late)

    return plant


@pytest.mark.parametrize("kind", ["sin", "late"])
def test_a_planted_mismatch_is_refused(planted, kind):
    cfg = config("helium")
    from_hf(cfg)  # verified while upstream is itself
    planted(kind)
    with pytest.raises(ValueError, match="scores differ by"):
        from_hf(cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ValueError, match="verification failed"):
        patch_model(model)


def patched_worst(model_type, **kw):
    torch.manual_seed(0)
    cfg = config(model_type, **kw)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    x = torch.randint(0, 128, (2, 2 * L0 + 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).logits
        patch_model(model)
        got = model(x).logits
    unpatch_model(model)
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("model_type, kw", [
    ("nanochat", {}),  # the other direction
    ("cohere2", {}),  # interleaved
    ("persimmon", dict(partial_rotary_factor=0.5)),  # the attention passes only the rotated dims
    ("glm4_moe", dict(partial_rotary_factor=0.5)),  # the apply splits the head itself
])
def test_patch_model_runs_verified_families_exactly(model_type, kw):
    assert patched_worst(model_type, **kw) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["apertus", "arcee", "bitnet", "exaone4", "olmoe", "granitemoe", "seed_oss"])
def test_patch_model_more_verified_families(model_type):
    assert patched_worst(model_type) < 1e-4


def coverage_script():
    """benchmarks/hf_coverage.py as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "hf_coverage.py"
    spec = importlib.util.spec_from_file_location("hf_coverage", path)
    cov = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cov)
    return cov


def test_the_coverage_script_rows():
    """benchmarks/hf_coverage.py on one verified family, one table family and one refusal."""
    cov = coverage_script()
    assert {"helium", "cohere2", "llama", "bloom"} <= set(cov.model_types())
    for model_type in ("helium", "llama"):
        row = cov.run_one(model_type)
        assert (row["status"], row["greedy"]) == ("exact", True) and row["rel"] <= cov.TOL
    row = cov.run_one("gptj")
    assert row["status"] == "refused" and "GPT-J rotates" in row["reason"]


@pytest.mark.slow
def test_the_coverage_script_repairs_validators_and_names_components():
    """The tiny config agrees with what a validator names; a sub-config type is a component of its parent."""
    cov = coverage_script()
    d = {"num_attention_heads": 4, "num_key_value_heads": 2}
    assert cov._repair("ValueError: num_attention_heads (4) must be the same as num_key_value_heads (2).", d)
    assert d["num_key_value_heads"] == 4
    d = {"hidden_size": 64, "codebook_dim": 512}
    msg = "ValueError: no projections around the quantizer, so `codebook_dim` (512) must equal `hidden_size` (64)."
    assert cov._repair(msg, d) and d["codebook_dim"] == 64
    assert not cov._repair("ValueError: something no rule knows", d)
    row = cov.run_one("blt_local_decoder")
    assert (row["status"], row["parent"]) == ("component", "blt")
    row = cov.run_one("lfm3")  # a hybrid shrunk to two layers keeps one attending layer
    assert (row["status"], row["greedy"]) == ("exact", True) and row["rel"] <= cov.TOL
    # layers of two head sizes, one per layer type: each layer type proven at its own head size
    row = cov.run_one("embedding_gemma2_text")
    assert row["status"] == "exact" and row["rel"] <= cov.TOL, row


@pytest.mark.parametrize("model_type, status", [
    ("lfm2_moe", "exact"),  # a hybrid whose layer list has no default for the shrunk depth
    ("cohere_compass_text", "exact"),  # per-layer-type rope parameters, M-RoPE
    ("csm", "exact"),  # its Mimi codec's depthwise upsampling over the shrunk width
    ("mimi", "not measured"),  # the codec alone builds; it takes audio, not token ids
])
def test_the_coverage_script_builds_tiny_configs_with_their_own_layer_lists(model_type, status):
    cov = coverage_script()
    row = cov.run_one(model_type)
    assert row["status"] == status, row
    if status == "exact":
        assert row["rel"] <= cov.TOL and row["greedy"] is not False
