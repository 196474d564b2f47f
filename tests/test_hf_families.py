"""patch_model over the family table: every family of the table, random weights, no download.

Each row builds a 2-layer model (hidden 64, 4 heads, vocab 128) of the family from a tiny config,
with ``original_max_position_embeddings = 32`` and inputs of 104 tokens (3.25× the original
context) for the scaled configs, and checks the patched model against the unpatched one:
logits equal to 1e-4 × max|logit| and, for a scaled row per family, the same 20 greedy tokens
with the default cache.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

import liepos as lp  # noqa: E402
from liepos.interop import from_hf, patch_model, read_hf, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from test_hf_deepseek_v4 import TINY as V4_TINY  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

L0 = 32  # original_max_position_embeddings
SEQ = 104  # 3.25 × L0
TOL = 1e-4  # × max|logit|
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0}
SHORT = [1.0 + 0.1 * i for i in range(6)]
LONG = [1.5 + 0.5 * i for i in range(6)]
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": L0}
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, head_dim=8,
           v_head_dim=16, n_routed_experts=4, num_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1, moe_intermediate_size=32, n_shared_experts=1, pad_token_id=0,
           index_topk=16)  # fewer keys than the input: the indexers select
# the MLA families of DeepSeek-V3's decoupled rotary slice besides deepseek_v3 (their indexers keep upstream's rope)
MLA_ROWS = ("glm4_moe_lite", "youtu", "axk1", "minicpm3", "longcat_flash", "bailing_hybrid", "deepseek_v32", "axk2",
            "deepseek_v2", "glm_moe_dsa", "hy_v4")
# per-family config facts a tiny model needs (upstream defaults sized for real checkpoints)
EXTRA = {
    "mixtral": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(MOE, shared_expert_intermediate_size=32),
    "qwen3_moe": MOE,
    "glm": dict(pad_token_id=0), "glm4": dict(pad_token_id=0),
    "smollm3": dict(pad_token_id=0, no_rope_layers=[1, 0]),  # layer 1 is NoPE
    # both layer types, a window shorter than the input
    "gemma2": dict(sliding_window=24, layer_types=["sliding_attention", "full_attention"]),
    "gemma3_text": dict(sliding_window=24, layer_types=["sliding_attention", "full_attention"]),
    "mistral": dict(sliding_window=24), "qwen2": dict(sliding_window=24, use_sliding_window=True,
                                                       layer_types=["sliding_attention", "full_attention"]),
    "phi3": dict(pad_token_id=0, partial_rotary_factor=0.75, original_max_position_embeddings=L0),
    "phi": dict(partial_rotary_factor=0.5), "stablelm": dict(partial_rotary_factor=0.25),
    "gpt_neox": dict(partial_rotary_factor=0.25),
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        first_k_dense_replace=1, moe_intermediate_size=32),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
    **{t: MLA for t in MLA_ROWS},
    "bailing_hybrid": dict(MLA, layer_types=["linear_attention", "full_attention"]),  # one attending layer
    "deepseek_v4": V4_TINY,  # [nope | rope] heads, one layer of each attention type, windows the input fills
    "llama4_text": dict(interleave_moe_layer_step=2, num_local_experts=2, intermediate_size_mlp=128,
                        no_rope_layers=[1, 0], attention_chunk_size=48),
}
EAGER = {"gemma2", "gemma3_text", "gpt_oss", "hy_v4", "deepseek_v4"}  # families without an sdpa path (for their extra terms)
SCALED = {
    "phi3": LONGROPE,
    **{t: dict(YARN, mscale=1.0, mscale_all_dim=1.0) for t in ("deepseek_v3", *MLA_ROWS)},
    "gpt_oss": dict(YARN, truncate=False, beta_fast=32.0, beta_slow=1.0),
    "gemma3_text": {"full_attention": dict(YARN), "sliding_attention": {"rope_type": "default"}},
    "deepseek_v4": {"main": {"rope_type": "default"}, "compress": dict(YARN)},
}
# the causal LMs (mistral_large4_text, a multimodal model's text half, is tested below; mistral4, whose config carries
# llama_4_scaling_beta, in tests/test_hf_query_temperature.py)
ROWS = [f.model_type for f in FAMILIES.values() if f.attention and f.axes == 1 and f.positions == "rope"
        and f.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]


def tiny(model_type, rope=None, *, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=128, num_hidden_layers=2, max_position_embeddings=4 * L0, initializer_range=0.2,
               attention_dropout=0.0)
    cfg.update(EXTRA.get(model_type, {}))
    cfg.update(kw)
    if rope is not None:
        nested = all(isinstance(v, dict) for v in rope.values())
        cfg["rope_parameters"] = (
            {k: dict(v, rope_theta=10000.0) for k, v in rope.items()} if nested else dict(rope, rope_theta=10000.0)
        )
    config = AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = "eager" if model_type in EAGER else "sdpa"
    return AutoModelForCausalLM.from_config(config).eval()


def ids(batch=2, seq=SEQ, seed=1):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def worst(model, x, **kw):
    """max |patched − upstream| / max |upstream| of the logits."""
    with torch.no_grad():
        want = model(x, **kw).logits
        patch_model(model)
        got = model(x, **kw).logits
    unpatch_model(model)
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("model_type", ROWS)
@pytest.mark.parametrize("rope", ["default", "scaled"])
def test_logits_equal_upstream(model_type, rope):
    cfg = None if rope == "default" else SCALED.get(model_type, YARN)
    model = tiny(model_type, cfg)
    assert worst(model, ids()) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ROWS)
def test_greedy_tokens_equal_upstream(model_type):
    model = tiny(model_type, SCALED.get(model_type, YARN))
    x = ids(batch=1, seq=SEQ - 20)
    gen = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(x, **gen)
        patch_model(model)
        got = model.generate(x, **gen)
    assert torch.equal(got, want)


def test_a_wrong_rotation_is_visible():
    """The tolerance is meaningful: the same model with the other layout differs by O(1)."""
    import liepos as lp

    model = tiny("cohere", YARN)
    x = ids()
    with torch.no_grad():
        want = model(x).logits
        patch_model(model, lp.from_hf(model.config).replace(layout="half"))
        got = model(x).logits
    assert ((got - want).abs().max() / want.abs().max()).item() > 1e-2


# ---------------------------------------------------------------------- rows measured against upstream
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_yarn_mscale_is_the_rope_factor_outside_deepseek(model_type):
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0,
            "mscale": 1.0, "mscale_all_dim": 0.5}
    model = tiny(model_type, rope)
    assert worst(model, ids()) <= 1e-4
    m = lp.scaling.yarn_mscale
    assert from_hf(model.config).logit_scale == pytest.approx((m(4.0, 1.0) / m(4.0, 0.5)) ** 2, rel=1e-12)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_default_rope_ignores_partial_rotary_where_the_family_does(model_type):
    model = tiny(model_type, None, partial_rotary_factor=0.5)
    assert read_hf(model.config).rotary_dim == 16  # the whole head, as upstream
    assert worst(model, ids()) <= 1e-4


def test_temperature_on_rotated_dims_only():
    model = tiny("phi3", {"rope_type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6,
                          "original_max_position_embeddings": L0})
    r = read_hf(model.config)
    assert r.rotary_dim == 12 and r.rotary_scale > 1.1  # sqrt(1 + ln 4 / ln 32)² on 12 of 16 dims
    enc = from_hf(model.config)  # the temperature on the 12 rotated dims as a per-dim query scale
    assert torch.all(enc.query_scale[:12] == r.rotary_scale) and torch.all(enc.query_scale[12:] == 1.0)
    import pickle

    back = pickle.loads(pickle.dumps(enc))  # the length rule (longrope) pickles, and keeps the scale
    assert back.version == enc.version and torch.equal(back.at_length(100).query_scale, enc.query_scale)
    with pytest.raises(ValueError, match="query_scale"):  # patch_model reads it from the config itself
        patch_model(model, enc)
    assert worst(model, ids()) <= 1e-4


def test_absolute_position_models_are_refused_by_name():
    for cfg in ({"model_type": "gpt2", "n_embd": 64, "n_head": 4}, {"model_type": "opt", "hidden_size": 64}):
        with pytest.raises(ValueError, match=cfg["model_type"]):
            from_hf(cfg)


@pytest.mark.parametrize("model_type, heads", [("bloom", 4), ("bloom", 6), ("mpt", 6), ("falcon", 6)])
def test_alibi_configs_are_alibi_with_their_own_slopes(model_type, heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    if model_type == "mpt":
        cfg = {"model_type": "mpt", "d_model": 12 * heads, "n_heads": heads, "attn_config": {"alibi": True}}
        want = -build_mpt_alibi_tensor(heads, 2)[:, 0, 0]  # slope·(1 − 2) at the first of two keys
    else:
        cfg = {"model_type": model_type, "hidden_size": 12 * heads, "num_attention_heads": heads, "alibi": True}
        want = _get_alibi_slopes(heads, "cpu").double()
        if model_type == "falcon":  # Falcon adds alibi / √d: the slope of qᵀk/√d − m(t − s) is m/√12
            want = want / 12**0.5
    enc = from_hf(cfg)
    assert torch.equal(-enc.key_slots[:, 1], want.double())


def tiny_alibi(model_type, heads, attn="sdpa"):
    torch.manual_seed(0)
    common = dict(vocab_size=128, initializer_range=0.2)
    if model_type == "mpt":
        cfg = AutoConfig.for_model("mpt", d_model=12 * heads, n_heads=heads, n_layers=2, max_seq_len=256,
                                   expansion_ratio=2, attn_config={"alibi": True}, **common)
    elif model_type == "bloom":
        cfg = AutoConfig.for_model("bloom", hidden_size=12 * heads, n_head=heads, n_layer=2, **common)
    else:
        cfg = AutoConfig.for_model("falcon", hidden_size=12 * heads, num_attention_heads=heads, num_hidden_layers=2,
                                   alibi=True, new_decoder_architecture=True, num_kv_heads=2, **common)
    cfg._attn_implementation = attn
    return AutoModelForCausalLM.from_config(cfg).eval()


def alibi_case(model_type, heads):
    model = tiny_alibi(model_type, heads, attn="eager" if model_type != "falcon" else "sdpa")
    # no pad token inside the prompt: Bloom and Falcon count ALiBi times over non-padding tokens
    # (a padding token mid-row shifts the later ones), liepos over token order; the same for
    # left or right padding, where the shift is the same for every token of a row
    return model, ids() % 127 + 1


@pytest.mark.parametrize("model_type", ["bloom", "mpt", "falcon"])
@pytest.mark.parametrize("heads", [4, 6])
def test_alibi_models_patched_through_the_slots(model_type, heads):
    """Same logits, the bias carried by the nilpotent block and two slots."""
    model, x = alibi_case(model_type, heads)
    assert worst(model, x) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["bloom", "mpt", "falcon"])
def test_alibi_models_greedy_tokens(model_type):
    model, x = alibi_case(model_type, 6)
    gen = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(x[:1, :60], **gen)
        patch_model(model)
        got = model.generate(x[:1, :60], **gen)
    assert torch.equal(got, want)


@pytest.mark.parametrize("attn, weights", [("eager", False), ("sdpa", True), ("sdpa", False)])
def test_falcon_alibi_follows_upstream_on_both_branches(attn, weights):
    """Upstream's eager branch (any backend but sdpa, and sdpa with ``output_attentions``) adds
    alibi/√d in the mask and again in the scores, its sdpa branch once: the two disagree (by
    ~0.1 of the logits here). The patched model takes the same branch per call: its logits,
    weights and greedy tokens are upstream's on each."""
    x = ids() % 127 + 1
    ref, model = tiny_alibi("falcon", 4, attn), patch_model(tiny_alibi("falcon", 4, attn))
    with torch.no_grad():
        once = tiny_alibi("falcon", 4, "sdpa")(x).logits
        want, got = ref(x, output_attentions=weights), model(x, output_attentions=weights)
        gen = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, output_attentions=weights,
                   return_dict_in_generate=True)
        tokens = ref.generate(x[:1, :40], **gen).sequences, model.generate(x[:1, :40], **gen).sequences
    twice = attn == "eager" or weights
    assert ((want.logits - once).abs().max() > 1e-2) == twice
    assert (got.logits - want.logits).abs().max() <= 1e-5 * want.logits.abs().max()
    assert torch.equal(*tokens)
    if weights:
        assert len(got.attentions) == len(want.attentions) == 2
        for g, w in zip(got.attentions, want.attentions):
            assert g.shape == w.shape and (g - w).abs().max() < 1e-5


@pytest.mark.parametrize("model_type", ["mpt", "bloom"])
def test_alibi_models_return_upstreams_attention_weights(model_type):
    """``output_attentions=True``: MPT's block returns its attention's weights without telling the
    attention it wants them; patched, every layer still returns upstream's weights (and none when
    not asked)."""
    x = ids() % 127 + 1
    ref, model = tiny_alibi(model_type, 4, "eager"), patch_model(tiny_alibi(model_type, 4, "eager"))
    with torch.no_grad():
        want, got, plain = ref(x, output_attentions=True), model(x, output_attentions=True), model(x)
    assert (got.logits - want.logits).abs().max() <= TOL * want.logits.abs().max()
    assert len(got.attentions) == len(want.attentions) == 2
    for g, w in zip(got.attentions, want.attentions):
        assert g is not None and g.shape == w.shape and (g - w).abs().max() < 1e-5
    assert plain.attentions is None


# ---------------------------------------------------------------------- M-RoPE: three position axes, the same mechanism
def tiny_vl(name):
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    ccls, mcls = {"qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
                  "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)}[name]
    torch.manual_seed(0)
    cfg = ccls(
        text_config=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=128, num_hidden_layers=2, max_position_embeddings=256, initializer_range=0.2,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=64),
        image_token_id=120, video_token_id=121, vision_start_token_id=122,
    )
    cfg._attn_implementation = "sdpa"
    return mcls(cfg).eval()


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_m_rope_text_and_image_grid_positions(name):
    model = tiny_vl(name)
    x = ids(seq=40) % 100
    S = 40
    # an image grid's positions: time, row, column differ (text tokens have three equal axes)
    grid = torch.stack([torch.arange(S), torch.arange(S) // 3, torch.arange(S) % 5])[:, None].expand(3, 2, S)
    assert worst(model, x) <= TOL
    assert worst(model, x, position_ids=grid) <= TOL
    with torch.no_grad():
        moved = (model(x, position_ids=grid).logits - model(x).logits).abs().max()
    assert moved > 1.0  # the grid positions matter: the test sees the axes


def worst_table() -> str:
    """The table of docs/guide/huggingface.md: ``cd tests && python -c "import test_hf_families as t; print(t.worst_table())"``."""
    lines = ["| model_type | default rope | scaled rope |", "|---|---|---|"]
    for mt in ROWS:
        a, b = worst(tiny(mt), ids()), worst(tiny(mt, SCALED.get(mt, YARN)), ids())
        lines.append(f"| {mt} | {a:.1e} | {b:.1e} |")
    S = 40
    grid = torch.stack([torch.arange(S), torch.arange(S) // 3, torch.arange(S) % 5])[:, None].expand(3, 2, S)
    for name in ("qwen2_vl", "qwen2_5_vl"):
        model = tiny_vl(name)
        x = ids(seq=S) % 100
        lines.append(f"| {name} (M-RoPE) | {worst(model, x):.1e} (text) | {worst(model, x, position_ids=grid):.1e} (image grid) |")
    for mt in ("bloom", "mpt", "falcon"):
        a, b = (worst(tiny_alibi(mt, h, "sdpa" if mt == "falcon" else "eager"), ids() % 127 + 1) for h in (4, 6))
        lines.append(f"| {mt} (ALiBi) | {a:.1e} (4 heads) | {b:.1e} (6 heads) |")
    return "\n".join(lines)


@pytest.mark.parametrize("model_type, layout", [
    ("llama", "half"), ("cohere", "interleaved"), ("glm", "interleaved"), ("glm4", "interleaved"),
    ("llama4_text", "interleaved"), ("deepseek_v3", "interleaved"),
    # MLA: DeepSeek-V2's complex pairs and the always-interleaved rows are (2k, 2k + 1); MiniCPM3 rotate_half
    ("deepseek_v2", "interleaved"), ("longcat_flash", "interleaved"), ("glm_moe_dsa", "interleaved"),
    ("minicpm3", "half"), ("hy_v4", "half"),
])
def test_from_hf_reads_the_family_layout(model_type, layout):
    """The layout is the family's (DeepSeek-V3: its rope_interleave flag), not always rotate_half."""
    model = tiny(model_type, YARN if model_type == "deepseek_v3" else None)
    assert from_hf(model.config).layout == layout
    if model_type == "deepseek_v3":
        model.config.rope_interleave = False
        assert from_hf(model.config, softmax_mscale=False).layout == "half"


@pytest.mark.parametrize("rope", ["default", "scaled"])
def test_mistral_large4_text_hidden_states_equal_upstream(rope):
    """The text decoder of a multimodal MLA model (its indexer on upstream's rope), past the original length."""
    from transformers.models.mistral_large4.modeling_mistral_large4 import MistralLarge4TextModel

    torch.manual_seed(0)
    cfg = dict(MLA, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128, num_hidden_layers=2,
               max_position_embeddings=4 * L0, initializer_range=0.2, attention_dropout=0.0)
    if rope == "scaled":
        cfg["rope_parameters"] = dict(YARN, mscale=1.0, mscale_all_dim=1.0, rope_theta=10000.0)
    config = AutoConfig.for_model("mistral_large4_text", **cfg)
    config._attn_implementation = "eager"
    model = MistralLarge4TextModel(config).eval()
    x = ids()
    with torch.no_grad():
        want = model(input_ids=x).last_hidden_state
        patch_model(model)
        got = model(input_ids=x).last_hidden_state
    unpatch_model(model)
    assert ((got - want).abs().max() / want.abs().max()).item() <= TOL
