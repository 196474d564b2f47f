"""Per-layer schedules (RNoPE-SWA / Command A, SWAN-GPT, Llama 4, SmolLM3): the layouts against transformers'
own configs and attention modules, the windows against transformers' mask functions, decode == full."""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp
from liepos.schedule import SCHEDULES, LayerSpec, Schedule, build_schedule, window_mask
from liepos.temperature import Llama4Temperature

F64 = torch.float64


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def hf_mask(fn, S):
    """A transformers mask function evaluated on the (q_idx, kv_idx) grid: (S, S) bool."""
    qi, ki = torch.arange(S)[:, None], torch.arange(S)[None, :]
    return fn(torch.tensor(0), torch.tensor(0), qi, ki).expand(S, S)


@pytest.mark.parametrize("W", [1, 3, 5])
def test_sliding_window_is_transformers_mask(W):
    from transformers.masking_utils import sliding_window_causal_mask_function

    t = torch.arange(9, dtype=F64)[None]
    ours = window_mask(t, t, window=W)[0, 0] & (t[0][None, :] <= t[0][:, None])
    assert torch.equal(ours, hf_mask(sliding_window_causal_mask_function(W), 9))


@pytest.mark.parametrize("C", [2, 4])
def test_chunked_window_is_transformers_mask(C):
    from transformers.masking_utils import chunked_causal_mask_function

    t = torch.arange(9, dtype=F64)[None]
    ours = window_mask(t, t, chunk=C)[0, 0] & (t[0][None, :] <= t[0][:, None])
    assert torch.equal(ours, hf_mask(chunked_causal_mask_function(C, torch.zeros(1, dtype=torch.long)), 9))


def layer_reference(spec, q, k, v, t):
    """The schedule's identity, written out: attention_reference with causal ∧ window, τ on the query rows."""
    m = window_mask(t[None], t[None], window=spec.window, chunk=spec.chunk)
    if spec.temperature is not None:
        n = (m & (t[None, :] <= t[:, None])).sum(-1).double()  # (1, 1, S) keys each row sees
        tau = spec.temperature.factor(t[None], n)  # (1, 1, S)
        q = q * tau.unsqueeze(-1)
    return lp.attention_reference(q, k, v, spec.encoding, t, t, mask=m)


SCHED = [("rnope_swa", {"window": 3}), ("swan_gpt", {"window": 2}), ("ssmax", {"s": 0.7}),
         ("swan_gpt", {"window": 2, "alpha": 0.5, "train_length": 3}),
         ("llama4", {"chunk": 4, "floor_scale": 2.0, "attn_scale": 0.3}), ("smollm3", {})]


@pytest.mark.parametrize("name, opts", SCHED, ids=[n for n, _ in SCHED])
def test_every_layer_is_its_reference_and_decode_equals_full(name, opts):
    sch = build_schedule(name, layers=4, head_dim=8, num_heads=2, **opts)
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=F64) for _ in range(3))
    t = torch.arange(10, dtype=F64)
    for layer in range(4):
        full = sch.attention(layer, q, k, v)
        assert rel_err(full, layer_reference(sch[layer], q, k, v, t)) < 1e-12, (name, layer)
        cache = lp.KVCache()
        parts = [sch.attention(layer, q[:, :, :4], k[:, :, :4], v[:, :, :4], cache=cache)]
        for i in range(4, 10):
            parts.append(sch.attention(layer, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], cache=cache))
        assert rel_err(torch.cat(parts, 2), full) < 1e-12, (name, layer)


def test_the_named_layouts_follow_transformers_rules():
    """Cohere 2's sliding_window_pattern, Llama 4's and SmolLM3's no_rope_layer_interval, as their configs build them."""
    from transformers import Cohere2Config, Llama4TextConfig, SmolLM3Config

    L = 8
    cohere = Cohere2Config(num_hidden_layers=L)
    sch = build_schedule("rnope_swa", layers=L, head_dim=8, window=cohere.sliding_window)
    assert [s.window is not None for s in sch] == [t == "sliding_attention" for t in cohere.layer_types]
    assert [s.encoding.name for s in sch] == ["rope" if t == "sliding_attention" else "nope" for t in cohere.layer_types]
    for name, cfg in (("llama4", Llama4TextConfig(num_hidden_layers=L)), ("smollm3", SmolLM3Config(num_hidden_layers=L))):
        sch = build_schedule(name, layers=L, head_dim=8)
        assert [s.encoding.name == "rope" for s in sch] == [bool(r) for r in cfg.no_rope_layers], name


def test_from_hf_reads_command_a_llama4_and_smollm3_as_their_attention_modules_do():
    """Schedule.from_hf against transformers' attention modules: which layer rotates, its window, its temperature."""
    from transformers import Cohere2Config, Llama4TextConfig, SmolLM3Config
    from transformers.models.cohere2.modeling_cohere2 import Cohere2Attention
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Attention

    small = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=8)
    cohere = Cohere2Config(sliding_window=16, **small)
    sch = Schedule.from_hf(cohere)
    for i, spec in enumerate(sch):
        hf = Cohere2Attention(cohere, i)  # rotates only when it has a sliding window
        assert spec.window == hf.sliding_window and (spec.encoding.name != "nope") == (hf.sliding_window is not None)
    llama = Llama4TextConfig(attention_chunk_size=32, attn_temperature_tuning=True, floor_scale=64, attn_scale=0.2,
                             intermediate_size=64, intermediate_size_mlp=64, **small)
    sch = Schedule.from_hf(llama)
    for i, spec in enumerate(sch):
        hf = Llama4TextAttention(llama, i)
        assert (spec.encoding.name != "nope") == bool(hf.use_rope)
        assert spec.chunk == (32 if llama.layer_types[i] == "chunked_attention" else None)
        if hf.use_rope:
            assert spec.temperature is None
        else:
            assert (spec.temperature.floor_scale, spec.temperature.attn_scale) == (hf.floor_scale, hf.attn_scale)
    smol = SmolLM3Config(**small)
    sch = Schedule.from_hf(smol)
    assert [(s.encoding.name != "nope") for s in sch] == [bool(SmolLM3Attention(smol, i).use_rope) for i in range(8)]
    q = torch.randn(1, 4, 3, 8, dtype=F64)
    rope_layer = next(s for s in sch if s.encoding.name != "nope")
    assert rel_err(rope_layer.encoding.query(q, [0, 1, 2]), lp.from_hf(smol).query(q, [0, 1, 2])) == 0.0


@pytest.mark.parametrize("spec", ["schedule:rnope_swa:window=3", "schedule:ssmax:s=0.6:learn=0",
                                  "schedule:llama4:chunk=2", "schedule:rnope_swa:every=4"])
def test_the_explorers_decoder_runs_a_schedule_by_name(spec):
    """Decoder(config, "schedule:…") gives each block its layer's encoding, window and temperature: block ℓ's
    attention is the schedule's layer ℓ."""
    from liepos.explore.model import Decoder, ModelConfig
    from liepos.explore.schedule_rows import parse_schedule_row

    cfg = ModelConfig(vocab_size=16, d_model=16, layers=4, heads=2)
    torch.manual_seed(0)
    model = Decoder(cfg, spec).double()
    name, opts = parse_schedule_row(spec)  # the row's options over the explorer's defaults (every=2, window=16 …)
    opts.pop("learn", None)
    sch = build_schedule(name, 4, 8, 2, **opts)
    x = torch.randn(1, 6, 16, dtype=F64)
    with torch.no_grad():
        for layer, blk in enumerate(model.blocks):
            (mine,), want = blk.layers, sch[layer]
            assert (mine.encoding.name, mine.window, mine.chunk, repr(mine.temperature)) == (
                want.encoding.name, want.window, want.chunk, repr(want.temperature))
            qkv = blk.qkv(blk.ln1(x)).view(1, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)  # each (B, H, S, hd)
            y = sch.attention(layer, *qkv).transpose(1, 2).reshape(1, 6, 16)
            h = x + blk.proj(y)
            assert rel_err(blk(x), h + blk.mlp(blk.ln2(h))) < 1e-12, (spec, layer)
    assert model(torch.randint(0, 16, (1, 5))).shape == (1, 5, 16)
    with pytest.raises(ValueError, match="key=value"):
        Decoder(cfg, "schedule:rnope_swa:64")


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="window"):
        LayerSpec(lp.rope(8), window=0)
    with pytest.raises(TypeError, match="encoding"):
        LayerSpec("rope")
    with pytest.raises(ValueError, match="name"):
        build_schedule("command_r", layers=2, head_dim=8)
    with pytest.raises(TypeError, match="layers"):
        Schedule([])
    assert set(SCHEDULES) == {"rnope_swa", "swan_gpt", "llama4", "smollm3", "ssmax"}
    assert isinstance(build_schedule("llama4", 4, 8)[3].temperature, Llama4Temperature)
    assert math.isfinite(build_schedule("llama4", 4, 8)[0].chunk)


def test_the_explorers_report_and_cli_read_a_schedule_row():
    """The report colours a schedule row by its layers' blocks (RNoPE-SWA: mostly rotation); the CLI's
    up-front check builds it (an unknown name is refused before training)."""
    from liepos.cli._common import UsageError
    from liepos.cli.explore import _check
    from liepos.explore.figures import row_of
    from liepos.explore.train import TrainConfig

    results = {"summary": {"r": {"dominant": None, "base": "schedule:rnope_swa:window=8"}},
               "config": {"d_model": 16, "layers": 4, "heads": 2}}
    assert row_of("r", results) == "rotation"
    results["summary"]["r"]["base"] = "schedule:smollm3:every=1"  # every layer NoPE
    assert row_of("r", results) == "nope"
    cfg = TrainConfig(d_model=16, layers=4, heads=2, task="lookup")
    _check(cfg, ["schedule:ssmax:s=0.5"], 1)
    with pytest.raises(UsageError, match="nosuch"):
        _check(cfg, ["schedule:nosuch"], 1)


def test_patch_model_takes_a_schedule_by_layer_type():
    """SmolLM3 (RoPE with a NoPE layer every 4th): patching a random-weight model with its own schedule, a layer
    type at a time, gives the unpatched logits; a rescaled schedule changes them."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    from liepos.interop import patch_model

    cfg = SmolLM3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=4,
                        intermediate_size=64, vocab_size=64, max_position_embeddings=128, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = SmolLM3ForCausalLM(cfg).double().eval()
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
        sch = Schedule.from_hf(cfg)
        patch_model(model, sch.by_layer_type(cfg.layer_types))
        got = model(ids).logits
        assert rel_err(got, want) < 1e-6  # transformers computes inv_freq and the angles in float32
        longer = Schedule([LayerSpec(lp.scaling.linear(s.encoding, factor=4.0)) if s.encoding.name != "nope" else s
                           for s in sch])
        patch_model(model, longer.by_layer_type(cfg.layer_types))
        assert rel_err(model(ids).logits, want) > 1e-4
    with pytest.raises(ValueError, match="layer_types"):
        sch.by_layer_type(["full_attention"])
