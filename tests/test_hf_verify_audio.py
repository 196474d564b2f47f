"""Audio models whose forward takes features, not token ids: verified, patched, and equal to upstream.

LASR's encoder (``input_features`` frames) and Moonshine (a waveform into its encoder, token ids
into its decoder) are outside liepos' table: their rope is probed in the modeling code, and the
patched model must give the unpatched model's outputs on tiny random inputs. The sensitivity
check skips the rope in the patched layers and asserts the outputs move: the comparison sees it.
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

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_hidden_layers=2, vocab_size=128, max_position_embeddings=128, initializer_range=0.2)
GEN = torch.Generator().manual_seed(1)
CASES = {
    "lasr_encoder": (dict(TINY, num_mel_bins=16), lambda: {"input_features": torch.randn(1, 48, 16, generator=GEN)}),
    "moonshine": (dict(TINY, encoder_num_attention_heads=4, decoder_num_attention_heads=4, encoder_num_key_value_heads=4,
                       decoder_num_key_value_heads=4, encoder_num_hidden_layers=2, decoder_num_hidden_layers=2),
                  lambda: {"input_values": torch.randn(1, 4000, generator=GEN),
                           "decoder_input_ids": torch.randint(3, 128, (1, 12), generator=GEN)}),
}


def _model(model_type):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cfg = AutoConfig.for_model(model_type, **CASES[model_type][0])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModel.from_config(cfg).eval()


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_audio_model_patched_equals_unpatched(model_type):
    assert model_type not in FAMILIES  # verified, not a table row
    model, inputs = _model(model_type), CASES[model_type][1]()
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
    patch_model(model)
    try:
        layers = [m._liepos for m in model.modules() if "_liepos" in vars(m)]
        assert layers
        with torch.no_grad():
            got = model(**inputs).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
        rotate = type(layers[0]).rotate
        try:  # the rope left out of the patched layers: the outputs move, so the comparison above sees the rope
            type(layers[0]).rotate = lambda self, q, k, *a, **kw: (q, k)
            with torch.no_grad():
                unrotated = model(**inputs).last_hidden_state
        finally:
            type(layers[0]).rotate = rotate
        assert float((unrotated - want).abs().max() / want.abs().max()) > 1e-3
    finally:
        unpatch_model(model)


def test_a_ctc_head_over_an_encoder_is_refused_and_its_encoder_patched():
    """LASR's CTC model carries no rope parameters of its own: refused, naming the encoder's sub-config;
    the encoder it wraps is patched and equals upstream."""
    if "lasr_ctc" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no lasr_ctc")
    cfg = AutoConfig.for_model("lasr_ctc", encoder_config=CASES["lasr_encoder"][0], vocab_size=128, pad_token_id=0)
    cfg.encoder_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCTC.from_config(cfg).eval()
    with pytest.raises(ValueError, match=r"sub-config encoder_config \(lasr_encoder\) does: patch the model built from it"):
        patch_model(model)
    inputs = CASES["lasr_encoder"][1]()
    with torch.no_grad():
        want = model.encoder(**inputs).last_hidden_state
    patch_model(model.encoder)
    try:
        with torch.no_grad():
            got = model.encoder(**inputs).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    finally:
        unpatch_model(model.encoder)
