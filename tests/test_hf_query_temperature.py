"""Mistral 3/4's ``llama_4_scaling_beta``: a query temperature of the attention, beside the rope.

Their attention multiplies the rotated query by ``1 + β·log(1 + ⌊t / L0⌋)`` (``get_llama_4_attn_scale``).
A patched model keeps that factor (upstream's attention code) and replaces the rope: exact past ``L0``,
where the factor is not 1. :func:`from_hf` returns an Encoding, which cannot carry a factor of the query's
time: it refuses the key by name unless it is dropped knowingly.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from liepos.interop import from_hf, patch_model, read_hf, unpatch_model  # noqa: E402
from liepos.interop.hf_verify import upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

L0 = 16
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, num_hidden_layers=2, max_position_embeddings=4 * L0, initializer_range=0.2,
             attention_dropout=0.0, pad_token_id=0)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1, moe_intermediate_size=32)


def rope(beta, **kw):
    return {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": L0,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": beta, **kw}


def ministral3(beta=0.5):
    return AutoConfig.for_model("ministral3", **dict(SMALL, rope_parameters=rope(beta)))


def mistral4(beta=0.5):
    # its rotary module reads head_dim · partial_rotary_factor = qk_rope_head_dim dims
    return AutoConfig.for_model("mistral4", **dict(SMALL, **MLA, rope_parameters=rope(beta, partial_rotary_factor=0.5)))


def outputs(cfg, x, patched):
    torch.manual_seed(0)
    cfg._attn_implementation = "eager"
    cls = AutoModelForCausalLM if cfg.model_type == "ministral3" else AutoModel
    model = cls.from_config(cfg).eval()
    if patched:
        patch_model(model)
    with torch.no_grad():
        out = model(x)
    if patched:
        unpatch_model(model)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("make", [ministral3, mistral4])
def test_patched_model_keeps_the_query_temperature_past_the_original_length(make):
    x = torch.randint(3, 128, (2, 3 * L0 + 5), generator=torch.Generator().manual_seed(1))
    want = outputs(make(), x, patched=False)
    got = outputs(make(), x, patched=True)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    flat = outputs(make(beta=0.0), x, patched=False)
    assert float((flat - want).abs().max()) > 1e-3  # the factor matters past L0: the test sees it


@pytest.mark.parametrize("make", [ministral3, mistral4])
def test_from_hf_names_the_temperature_and_reads_the_rope_when_told(make):
    cfg = make()
    with pytest.raises(ValueError, match=r"llama_4_scaling_beta=0.5 is a query temperature 1 \+ 0.5·log\(1 \+ ⌊t / 16⌋\)"):
        from_hf(cfg)
    assert read_hf(cfg).query_temperature == ("llama_4_scaling_beta", 0.5, L0)
    enc = from_hf(cfg, ignore_keys={"llama_4_scaling_beta"})
    text = cfg.get_text_config()
    up = upstream_of(text, text.model_type) if cfg.model_type == "ministral3" else None
    if up is None:  # a table family: its rotary module
        import transformers.models.mistral4.modeling_mistral4 as m4
        rotary = m4.Mistral4RotaryEmbedding(text)
    else:
        rotary = up.rotary(text)
    # the rotated dims and their frequencies are upstream's (mistral4: qk_rope_head_dim, not half of it)
    rotated = enc.generator.freqs[enc.generator.freqs != 0]
    assert rotated.numel() == rotary.inv_freq.numel()
    assert torch.allclose(rotated.sort().values, rotary.inv_freq.double().sort().values, rtol=1e-6)
