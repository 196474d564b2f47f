"""M-RoPE families outside liepos' table: their axes probed, the encoding proven on per-axis positions.

The reference is upstream's code called directly: the family's text ``*RotaryEmbedding`` on
``(3, batch, seq)`` position_ids whose axes differ (an image grid's time, row and column), and its
``apply_rotary_pos_emb``; and the unpatched model on the same grid positions.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel  # noqa: E402

from liepos.interop import from_hf, patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_config import read_hf, spread_axes  # noqa: E402
from liepos.interop.hf_verify import prove, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

L0 = 32
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, num_hidden_layers=2, max_position_embeddings=L0, initializer_range=0.2,
             attention_dropout=0.0, pad_token_id=0)
# (model_type, rope parameters beyond the default, the pattern of its axes over the planes)
CASES = [
    ("qwen3_vl_text", dict(mrope_section=[2, 3, 3]), "hf:mrope_interleaved"),  # the axes interleaved (t h w t h w …)
    ("glm4v_text", dict(mrope_section=[2, 3, 3]), "hf:mrope"),  # consecutive sections, dims (2k, 2k + 1)
    ("qwen3_5_text", dict(mrope_section=[2, 1, 1], partial_rotary_factor=0.5), "hf:mrope_interleaved"),  # 8 of 16 dims
    ("paddleocr_vl_text", dict(mrope_section=[2, 3, 3]), "hf:mrope"),
]


# a hybrid's layers: one of them attends
LAYERS = {"qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"])}


def config(model_type, **rope):
    params = {"rope_type": "default", "rope_theta": 1e4, **rope}
    return AutoConfig.for_model(model_type, **dict(SMALL, rope_parameters=params, **LAYERS.get(model_type, {})))


def grid(S, batch=1):
    """Positions ``(S, 3)`` of an image grid after a text prefix: time, row and column differ."""
    t = torch.arange(S)
    return torch.stack([t, 3 + t // 3, 5 + (t * 7) % 11], dim=-1)  # (S, 3): past L0 on the first axis too


def upstream_scores(cfg, q, k, pos):
    up = upstream_of(cfg, cfg.model_type)
    ids = pos[None, :] if pos.dim() == 1 else pos.T[:, None, :]  # (S,) -> (1, S); (S, 3) -> (3, 1, S)
    cos, sin = up.rotary(cfg)(q, ids)
    qe, ke = up.rotate(q, k, cos, sin)
    return qe.double() @ ke.double().transpose(-1, -2)


def worst(cfg, enc, pos, mine=None):
    """Upstream at ``pos`` against ``enc`` at ``mine`` (default ``pos``)."""
    mine = pos if mine is None else mine
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, pos.shape[0], 16, generator=gen)
    k = torch.randn(1, 2, pos.shape[0], 16, generator=gen)
    want = upstream_scores(cfg, q, k, pos)
    got = (enc.query(q.double(), mine) @ enc.key(k.double(), mine).transpose(-1, -2)) * enc.logit_scale
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("model_type, rope, name", CASES)
def test_m_rope_axes_are_probed_and_exact_on_grid_positions(model_type, rope, name):
    cfg = config(model_type, **rope)
    assert model_type not in FAMILIES  # verified, not listed
    enc = from_hf(cfg)
    assert enc.generator.num_axes == 3 and enc.name == name
    pos = grid(3 * L0)
    assert worst(cfg, enc, pos) < 1e-5
    text = pos[:, :1].expand(-1, 3)  # text tokens: every axis at the token's time
    assert worst(cfg, enc, text) < 1e-5
    plain = from_hf(cfg, ignore_keys={"mrope_section"})  # the 1-D text positions, knowingly
    assert worst(cfg, plain, pos[:, 0]) < 1e-5
    assert worst(cfg, plain, pos, pos[:, 0]) > 1e-2  # the check has teeth: off once the axes differ


def test_the_proof_refuses_planes_on_the_wrong_axes():
    cfg = config("qwen3_vl_text", mrope_section=[2, 3, 3])
    read = read_hf(cfg)
    owners = read.family.axis_of
    assert owners == (0, 1, 2, 0, 1, 2, 0, 1)  # Qwen3-VL's interleave of mrope_section (2, 3, 3) over 8 planes
    plain = read_hf(cfg, ignore_keys={"mrope_section"}).encoding
    wrong = spread_axes(plain, (0, 2, 1, 0, 2, 1, 0, 2), 3)  # h and w exchanged
    with pytest.raises(ValueError, match="scores differ by"):
        prove(cfg, cfg.model_type, dataclasses.replace(read, encoding=wrong))


def test_a_plane_fed_by_two_axes_is_refused():
    """HunYuan-VL splits cos and sin over the whole head by sections: a plane's two dims take different axes."""
    cfg = config("hunyuan_vl_text", mrope_section=[2, 2, 2, 2])
    with pytest.raises(ValueError, match="turns with position axes"):
        from_hf(cfg)


@pytest.mark.parametrize("model_type, rope, name", CASES[:3])
def test_patched_m_rope_model_is_exact_on_grid_positions(model_type, rope, name):
    torch.manual_seed(0)
    cfg = config(model_type, **rope)
    cfg._attn_implementation = "eager"
    model = AutoModel.from_config(cfg).eval()
    S = 2 * L0 + 8
    x = torch.randint(3, 128, (2, S), generator=torch.Generator().manual_seed(1))
    ids = grid(S).T[:, None, :].expand(3, 2, S)  # (S, 3) -> (3, batch, S)
    with torch.no_grad():
        want, plain = model(x, position_ids=ids).last_hidden_state, model(x).last_hidden_state
        patch_model(model)
        got, text = model(x, position_ids=ids).last_hidden_state, model(x).last_hidden_state
    unpatch_model(model)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    assert float((text - plain).abs().max() / plain.abs().max()) < 1e-4
    assert float((want - plain).abs().max()) > 1e-2  # the grid positions matter: the test sees the axes


def test_the_rotary_class_is_the_one_the_text_model_builds():
    """Qwen3-Omni's modeling file has three text rotary classes; its thinker's text model builds one of them."""
    cfg = AutoConfig.for_model("qwen3_omni_moe", thinker_config=dict(text_config=dict(
        SMALL, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})))
    text = cfg.thinker_config.text_config
    assert upstream_of(text, text.model_type).rotary.__name__ == "Qwen3OmniMoeThinkerTextRotaryEmbedding"
    enc = from_hf(text)
    assert enc.name == "hf:mrope_interleaved" and worst(text, enc, grid(3 * L0)) < 1e-5
