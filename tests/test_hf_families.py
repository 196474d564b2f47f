"""patch_model over the family table: every family of issue 12 item 1, random weights, no download.

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

from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402

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
# per-family config facts a tiny model needs (upstream defaults sized for real checkpoints)
EXTRA = {
    "mixtral": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(MOE, shared_expert_intermediate_size=32),
    "qwen3_moe": MOE,
    "glm": dict(pad_token_id=0), "glm4": dict(pad_token_id=0), "smollm3": dict(pad_token_id=0),
    "phi3": dict(pad_token_id=0, partial_rotary_factor=0.75),
    "phi": dict(partial_rotary_factor=0.5), "stablelm": dict(partial_rotary_factor=0.25),
    "gpt_neox": dict(partial_rotary_factor=0.25),
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        first_k_dense_replace=1, moe_intermediate_size=32),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
    "llama4_text": dict(interleave_moe_layer_step=2, num_local_experts=2, intermediate_size_mlp=128,
                        no_rope_layers=[1, 0], attention_chunk_size=48),
}
EAGER = {"gemma2", "gemma3_text", "gpt_oss"}  # families without an sdpa path for their extra terms
SCALED = {
    "phi3": LONGROPE,
    "deepseek_v3": dict(YARN, mscale=1.0, mscale_all_dim=1.0),
    "gpt_oss": dict(YARN, truncate=False, beta_fast=32.0, beta_slow=1.0),
    "gemma3_text": {"full_attention": dict(YARN), "sliding_attention": {"rope_type": "default"}},
}
ROWS = [f.model_type for f in FAMILIES.values() if f.attention and f.axes == 1]


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
