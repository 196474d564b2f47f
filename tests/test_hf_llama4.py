"""Llama 4's attention temperature (``attn_temperature_tuning``) through liepos' Hugging Face bridge, against
transformers' own Llama 4 text model: random weights from a tiny config, nothing downloaded, at positions past
``floor_scale`` so that the temperature is not 1.

* ``patch_model``: the patched model's logits equal the unpatched one's (the tolerance of the family tests) and
  greedy decoding gives the same tokens; the NoPE layers keep upstream's temperature;
* ``Schedule.from_hf``: a NoPE layer run through ``Schedule.attention`` with a ``KVCache``, step by step, equals
  transformers' ``Llama4TextAttention`` with its ``DynamicCache``;
* the factor is transformers' float32 arithmetic: the scaled query states agree bit for bit in float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, Llama4TextConfig  # noqa: E402
from transformers.models.llama4 import modeling_llama4  # noqa: E402

import liepos as lp  # noqa: E402
from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.temperature import Llama4Temperature  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

F64 = torch.float64
TOL = 1e-4  # × max|logit|, as tests/test_hf_families.py
FLOOR, SCALE = 8, 0.5  # τ = 1 + 0.5·log1p(⌊(t + 1)/8⌋): 1 below t = 7, 1.55 at t = 23, 1.80 at t = 39


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def tiny(tuning=True, seed=0):
    """Two layers: layer 0 chunked RoPE, layer 1 NoPE with the temperature (no_rope_layers = [1, 0])."""
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(
        "llama4_text", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, num_hidden_layers=2, max_position_embeddings=128, initializer_range=0.2,
        interleave_moe_layer_step=2, num_local_experts=2, intermediate_size_mlp=128, no_rope_layers=[1, 0],
        attention_chunk_size=24, attn_temperature_tuning=tuning, floor_scale=FLOOR, attn_scale=SCALE)
    cfg._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(cfg).eval()


def ids(batch=2, seq=40, seed=1):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_patched_llama4_keeps_the_temperature_of_its_nope_layers():
    model, x = tiny(), ids()
    with torch.no_grad():
        want = model(x).logits
        patch_model(model)
        got = model(x).logits
        unpatch_model(model)
        plain = tiny(tuning=False)(x).logits  # the same weights without the temperature
    scale = want.abs().max()
    assert ((got - want).abs().max() / scale).item() <= TOL
    assert ((plain - want).abs().max() / scale).item() > 100 * TOL  # the temperature is felt at these positions


def test_patched_llama4_greedy_tokens_equal_upstream():
    model, x = tiny(), ids(batch=1, seq=20)
    gen = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)  # decodes t = 20 … 35: τ from 1.55 to 1.69
    with torch.no_grad():
        want = model.generate(x, **gen)
        patch_model(model)
        try:
            got = model.generate(x, **gen)
        finally:
            unpatch_model(model)
    assert torch.equal(got, want)


def llama4_config(**kw):
    cfg = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           num_hidden_layers=4, intermediate_size=64, intermediate_size_mlp=64, vocab_size=16,
                           attn_temperature_tuning=True, floor_scale=3, attn_scale=0.25, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def test_schedule_from_hf_decodes_a_nope_layer_as_transformers():
    """Prefill 5 tokens, then decode to 14 (τ from 1 to 1.35): HF's DynamicCache vs liepos' KVCache, float64."""
    cfg = llama4_config()
    layer = 3
    sch = lp.Schedule.from_hf(cfg)
    assert cfg.no_rope_layers[layer] == 0 and sch[layer].encoding.name == "nope"
    assert repr(sch[layer].temperature) == "Llama4Temperature(floor_scale=3, attn_scale=0.25)"
    torch.manual_seed(0)
    attn = modeling_llama4.Llama4TextAttention(cfg, layer).double().eval()
    S, B = 14, 2
    h = torch.randn(B, S, 32, dtype=F64)
    hf_cache, cache, want, got = DynamicCache(), lp.KVCache(), [], []
    with torch.no_grad():
        for a, b in [(0, 5)] + [(i, i + 1) for i in range(5, S)]:
            x = h[:, a:b]
            past = torch.zeros(b - a, a, dtype=F64)  # (new, past) every cached key is visible
            causal = torch.full((b - a, b - a), float("-inf"), dtype=F64).triu(1)  # (new, new)
            mask = torch.cat((past, causal), 1)[None, None]  # (1, 1, new, b)
            want.append(attn(x, None, mask, cache=hf_cache)[0])
            q = attn.q_proj(x).view(B, b - a, 4, 8).transpose(1, 2)  # (B, H, new, hd)
            k = attn.k_proj(x).view(B, b - a, 2, 8).transpose(1, 2)  # (B, Hkv, new, hd)
            v = attn.v_proj(x).view(B, b - a, 2, 8).transpose(1, 2)
            y = sch.attention(layer, q, k, v, cache=cache)  # (B, H, new, hd)
            got.append(attn.o_proj(y.transpose(1, 2).reshape(B, b - a, 32)))
    want, got = torch.cat(want, 1), torch.cat(got, 1)
    assert rel_err(got, want) < 1e-12
    # the temperature is not a no-op at these positions
    with torch.no_grad():
        q = attn.q_proj(h).view(B, S, 4, 8).transpose(1, 2)
        k, v = (p(h).view(B, S, 2, 8).transpose(1, 2) for p in (attn.k_proj, attn.v_proj))
        plain = attn.o_proj(lp.attention(q, k, v, lp.nope(8)).transpose(1, 2).reshape(B, S, 32))
    assert rel_err(plain, want) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_scaled_queries_are_transformers_bit_for_bit(dtype, monkeypatch):
    """The query states transformers hands its attention function, with and without the tuning: liepos' factor
    times the raw states, in liepos' order (float32 work dtype, then the model's dtype), is the same tensor."""
    seen = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen.append(query)
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype), None

    monkeypatch.setattr(modeling_llama4, "eager_attention_forward", capture)
    S = 64  # floor_scale 2, attn_scale 0.3: float64 τ rounded to float32 differs from float32 τ at some t
    h = torch.randn(1, S, 32).to(dtype)
    for tuning in (False, True):
        cfg = llama4_config()
        cfg.attn_temperature_tuning, cfg.floor_scale, cfg.attn_scale = tuning, 2, 0.3
        torch.manual_seed(0)
        attn = modeling_llama4.Llama4TextAttention(cfg, 3).to(dtype).eval()
        with torch.no_grad():
            attn(h, None, None)
    raw, scaled = seen  # (1, H, S, hd) each
    tau = Llama4Temperature(floor_scale=2, attn_scale=0.3).factor(torch.arange(S, dtype=F64)[None], None)  # (1,1,S)
    ours = (raw.to(torch.float32) * tau.unsqueeze(-1).to(torch.float32)).to(dtype)  # as temperature.scaled_queries
    assert not torch.equal(raw, scaled)
    assert torch.equal(ours, scaled)
