"""A composite whose tower has a config of its own: the text decoder is patched, the tower keeps upstream's rope.

Voxtral Realtime's audio encoder and text decoder live in one modeling file and both call its
``apply_rotary_pos_emb``, each with the rotary module of its own config (their rope parameters
differ). The probe proves the text decoder's rope only, so only its attention layers are patched.
An attention class that serves two configs at once (Dia's encoder and decoder) is patched where
both configs' rotary modules give the same cos and sin, and refused where they differ.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel  # noqa: E402

from liepos.interop import patch_model, unpatch_model  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_hidden_layers=2, vocab_size=128, max_position_embeddings=128, initializer_range=0.2)


def _voxtral():
    if "voxtral_realtime" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no voxtral_realtime")
    cfg = AutoConfig.for_model("voxtral_realtime", text_config=dict(TINY), audio_config=dict(TINY, num_mel_bins=16))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModel.from_config(cfg).eval()


def test_voxtral_towers_have_different_ropes():
    """The premise: the audio tower's rope is not the text decoder's (patching it with the text's would differ)."""
    cfg = _voxtral().config
    assert cfg.audio_config.rope_parameters != cfg.text_config.rope_parameters


def test_voxtral_patched_equals_unpatched_and_leaves_the_audio_tower():
    model = _voxtral()
    gen = torch.Generator().manual_seed(1)
    x, feats = torch.randint(3, 128, (1, 24), generator=gen), torch.randn(1, 16, 192, generator=gen)
    with torch.no_grad():
        want = model(input_ids=x, input_features=feats).last_hidden_state
    patch_model(model)
    try:
        patched = sorted(n for n, m in model.named_modules() if "_liepos" in vars(m))
        assert patched and all(n.startswith("language_model.") for n in patched)
        with torch.no_grad():
            got = model(input_ids=x, input_features=feats).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    finally:
        unpatch_model(model)


def _dia(encoder_theta):
    if "dia" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no dia")
    rope = {"rope_type": "default", "rope_theta": encoder_theta}
    cfg = AutoConfig.for_model("dia", encoder_config=dict(TINY, rope_parameters=rope),
                               decoder_config=dict(TINY, cross_hidden_size=64))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModel.from_config(cfg).eval()


def test_an_attention_class_of_two_configs_with_one_rope_is_patched():
    """Dia's DiaSelfAttention runs in the encoder (dia_encoder) and the decoder (dia_decoder), here with one rope."""
    model = _dia(encoder_theta=10000.0)
    assert model.config.decoder_config.rope_parameters["rope_theta"] == 10000.0
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (1, 16), generator=gen)
    dec = torch.randint(3, 128, (1, 16, model.config.decoder_config.num_channels), generator=gen)
    with torch.no_grad():
        want = model(input_ids=ids, decoder_input_ids=dec).last_hidden_state
    patch_model(model)
    try:
        assert any(n.startswith("encoder.") for n, m in model.named_modules() if "_liepos" in vars(m))
        with torch.no_grad():
            got = model(input_ids=ids, decoder_input_ids=dec).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    finally:
        unpatch_model(model)


def test_an_attention_class_of_two_configs_with_two_ropes_is_refused():
    model = _dia(encoder_theta=500.0)
    with pytest.raises(ValueError, match=r"DiaSelfAttention serves both the 'dia_decoder' layers and the 'dia_encoder' "
                                         r"layers, whose rotary module gives other cos and sin"):
        patch_model(model)
    assert not any("_liepos" in vars(m) for m in model.modules())
