"""Bidirectional encoders whose attention numbers no layer (GTE, NomicBERT): verified and patched.

Their attention modules carry no ``layer_idx`` (no cache to index); patch_model numbers them in
the model's order and runs them on liepos. The patched encoder equals the unpatched one, and the
rope is exercised: skipping it in the patched layers moves the hidden states.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel  # noqa: E402

from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
            max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)


@pytest.mark.parametrize("model_type", ["gte", "nomic_bert"])
def test_encoder_without_layer_numbers_patched_equals_unpatched(model_type):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    assert model_type not in FAMILIES
    cfg = AutoConfig.for_model(model_type, **TINY)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg).eval()
    assert not any(hasattr(m, "layer_idx") for m in model.modules() if type(m).__name__.endswith("Attention"))
    x = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=x).last_hidden_state
    patch_model(model)
    try:
        layers = [m for m in model.modules() if "_liepos" in vars(m)]
        assert sorted(m.layer_idx for m in layers) == list(range(len(layers))) and layers
        with torch.no_grad():
            got = model(input_ids=x).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
        cls = type(layers[0]._liepos)
        rotate = cls.rotate
        try:  # the rope left out: the hidden states move, so the comparison above sees it
            cls.rotate = lambda self, q, k, *a, **kw: (q, k)
            with torch.no_grad():
                unrotated = model(input_ids=x).last_hidden_state
        finally:
            cls.rotate = rotate
        assert float((unrotated - want).abs().max() / want.abs().max()) > 1e-3
    finally:
        unpatch_model(model)


def _attention_layers(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def test_unpatch_and_a_refusal_take_the_layer_numbers_back():
    """The numbers patch_model gives an encoder's attention are part of the patch: unpatch_model takes them
    back, and so does a patch refused after the family check numbered the layers."""
    cfg = AutoConfig.for_model("gte", **TINY)
    cfg._attn_implementation = "eager"
    model = AutoModel.from_config(cfg).eval()
    patch_model(model)
    assert all(isinstance(m.layer_idx, int) for m in _attention_layers(model))
    unpatch_model(model)
    assert not any(hasattr(m, "layer_idx") for m in _attention_layers(model))
    import liepos as lp

    with pytest.raises(ValueError, match="layer type"):
        patch_model(model, {"sliding_attention": lp.rope(16)})  # no layer of the model has that type
    assert not any(hasattr(m, "layer_idx") for m in _attention_layers(model))
    assert not any("_liepos" in vars(m) for m in model.modules())
