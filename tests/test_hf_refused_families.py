"""Families liepos refuses by name, with why: patch_model and from_hf both say so, nothing is patched."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from liepos.interop import from_hf, patch_model  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_hidden_layers=2, vocab_size=128, max_position_embeddings=128)


def _tiny(model_type: str):
    import torch

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **SMALL)
    return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.slow
def test_deepseek_v4_is_refused_with_its_compressed_rope():
    config, model = _tiny("deepseek_v4")
    before = {n: type(m.forward) for n, m in model.named_modules()}
    with pytest.raises(ValueError, match="DeepSeek-V4's compressed attention layers read the 'compress' rope"):
        patch_model(model)
    assert {n: type(m.forward) for n, m in model.named_modules()} == before
    assert not any("_liepos" in k for m in model.modules() for k in m.__dict__)
    with pytest.raises(ValueError, match="DeepSeek-V4"):
        from_hf(config)
