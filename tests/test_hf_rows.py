"""Rows of issue 12's measured table, each a test: what transformers means, read and run as it means it."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import liepos as lp  # noqa: E402
from liepos.interop import from_hf, patch_model, read_hf  # noqa: E402
from test_hf_families import ids, tiny, worst  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.upstream
L0 = 32


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
        want = _get_alibi_slopes(heads, "cpu")
    enc = from_hf(cfg)
    assert torch.equal(-enc.key_slots[:, 1], want.double())
