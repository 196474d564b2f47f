"""An apply that rotates a query shorter than its keys (a drafter's keys carry a context the queries lack).

MuseGlimmer's assistant concatenates the main model's context before its own tokens for keys and
values only, and its ``apply_rotary_pos_emb`` rotates the queries at the keys' last positions.
liepos' layers rotate queries and keys at the same times, so the probe refuses it; the usual
apply (the same lengths) is accepted.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel  # noqa: E402

from liepos.interop import patch_model  # noqa: E402
from liepos.interop.hf_verify import slices_query, structure, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_hidden_layers=2, vocab_size=128, max_position_embeddings=128, initializer_range=0.2)
DRAFTER = "muse_glimmer_assistant"


def _drafter_config():
    if DRAFTER not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {DRAFTER}")
    return AutoConfig.for_model(DRAFTER, **TINY)


def test_the_drafters_apply_rotates_the_query_at_the_last_key_positions():
    """Upstream's own function, called directly: one query, three keys -> the query at position 2."""
    cfg = _drafter_config()
    up = upstream_of(cfg, DRAFTER)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 3, 16)
    cos, sin = up.rotary_for(None)(k, torch.arange(3)[None])
    got, _ = up.rotate(q, k, cos, sin)
    last, _ = up.rotate(q, q, cos[:, 2:], sin[:, 2:])
    torch.testing.assert_close(got, last)
    assert slices_query(up, None, structure(up, None, 16))


def test_the_usual_apply_does_not_slice():
    cfg = AutoConfig.for_model("helium", **TINY)
    up = upstream_of(cfg, "helium")
    assert not slices_query(up, None, structure(up, None, 16))


def test_the_drafter_is_refused():
    model = AutoModel.from_config(_drafter_config())
    with pytest.raises(ValueError, match="rotates a query shorter than its keys"):
        patch_model(model)
    assert not any("_liepos" in vars(m) for m in model.modules())
