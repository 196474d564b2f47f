"""A rope applied once per tensor, ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2)`` (Gemma 3n, Gemma 4):
patched through the same dispatcher, q and k each in its own call, sequence-first as the attention passes
them; Gemma 4's layer types have their own head sizes (sliding 16, full 32 here), each proven at its own.
The reference is the unpatched model: logits and greedy tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_verify import one_tensor, rotate_one, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

L0 = 32
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, num_hidden_layers=2, max_position_embeddings=4 * L0, initializer_range=0.2,
             attention_dropout=0.0, pad_token_id=0, sliding_window=24,
             layer_types=["sliding_attention", "full_attention"])
CONFIGS = {
    "gemma3n_text": dict(num_kv_shared_layers=0, altup_num_inputs=2, laurel_rank=8, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=128, activation_sparsity_pattern=[0.0, 0.0]),
    "gemma4_text": dict(global_head_dim=32),  # the full-attention layers' own head size
}


def tiny(model_type):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **dict(SMALL, **CONFIGS[model_type]))
    cfg._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_a_per_tensor_rope_is_patched_exactly(model_type):
    assert model_type not in FAMILIES
    model = tiny(model_type)
    text = model.config.get_text_config()
    assert one_tensor(upstream_of(text, text.model_type).apply)  # apply(x, cos, sin, unsqueeze_dim=1)
    x = torch.randint(3, 128, (2, 2 * L0 + 8), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want, want_tokens = model(x).logits, model.generate(x, **gen)
        patch_model(model)
        got, got_tokens = model(x).logits, model.generate(x, **gen)
    unpatch_model(model)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    assert torch.equal(got_tokens, want_tokens)


def test_gemma4_layer_types_keep_their_own_head_sizes():
    model = tiny("gemma4_text")
    patch_model(model)
    sizes = {m.layer_type: m._liepos.encoding.content_dim for m in model.modules() if hasattr(m, "_liepos")}
    unpatch_model(model)
    assert sizes == {"sliding_attention": 16, "full_attention": 32}


def test_a_per_tensor_call_refuses_an_encoding_whose_sides_differ():
    """One call per tensor does not say query from key: an encoding whose query and key transforms
    differ is refused there, never applied to both as one side."""
    layer = SimpleNamespace(encoded=True, sided=True, family=SimpleNamespace(model_type="gemma4_text"), encoding="enc")
    with pytest.raises(NotImplementedError, match="applied per tensor.*query from key"):
        rotate_one(layer, torch.zeros(1, 3, 2, 4), (torch.zeros(1, 3, 4),), {"unsqueeze_dim": 2})
