"""A rope whose cos and sin carry one entry per plane, the planes covering twice their width.

The OpenAI privacy filter rotates the interleaved pairs ``(x[2k], x[2k + 1])`` of the whole head
with cos and sin of ``d/2`` entries: the probe sees dims moving past the cos's width and reads the
planes as covering twice it. The patched model equals the unpatched one.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel  # noqa: E402

from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_verify import structure, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

TYPE = "openai_privacy_filter"
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_hidden_layers=2, vocab_size=128, max_position_embeddings=128, initializer_range=0.2, pad_token_id=0,
            num_local_experts=4, num_experts_per_tok=2)


def _config():
    if TYPE not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {TYPE}")
    cfg = AutoConfig.for_model(TYPE, **TINY)
    cfg._attn_implementation = "eager"
    return cfg


def test_the_probe_reads_planes_over_twice_the_cos_width():
    assert TYPE not in FAMILIES
    up = upstream_of(_config(), TYPE)
    cos, _ = up.rotary_for(None)(torch.zeros(1, 1, 1, 16), torch.arange(3)[None])
    assert cos.shape[-1] == 8
    s = structure(up, None, 16)
    assert (s.rotated, s.layout, s.splits) == (16, "interleaved", False)


def test_patched_equals_unpatched():
    torch.manual_seed(0)
    model = AutoModel.from_config(_config()).eval()
    x = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=x).last_hidden_state
    patch_model(model)
    try:
        assert any("_liepos" in vars(m) for m in model.modules())
        with torch.no_grad():
            got = model(input_ids=x).last_hidden_state
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    finally:
        unpatch_model(model)
