"""DeepSeek-V4 on liepos: heads laid out ``[nope | rope]``, a "main" rope for sliding layers and a "compress" rope
for compressed ones, compressors and an indexer that rotate compressed keys at their windows' positions, and
the attention's output rotated back at the query's position. The reference is upstream's own model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from liepos.interop import from_hf, patch_model, unpatch_model  # noqa: E402
from liepos.interop.hf_attention import ACTIVE  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

# one layer of each attention type; rates and a window short enough that 40 tokens fill windows of each
# compressor, slide past the window, and a decode crosses window boundaries
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            partial_rotary_factor=0.25, num_hidden_layers=3, vocab_size=128, max_position_embeddings=256,
            initializer_range=0.2, q_lora_rank=32, o_groups=2, o_lora_rank=16, moe_intermediate_size=32,
            n_routed_experts=4, num_experts_per_tok=2, index_topk=4, sliding_window=8,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})
_ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)
YARN = {"main": _ROPE, "compress": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                                        rope_theta=160000.0, partial_rotary_factor=0.25)}  # attention factor 1.139


def _tiny(**kw):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("deepseek_v4", **dict(TINY, **kw))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.normal_()  # sinks that matter
    return config, model


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("rope_parameters", [None, YARN], ids=["default", "yarn"])
def test_patched_v4_is_upstream_through_compressors_indexer_and_decode(rope_parameters):
    config, model = _tiny(**({} if rope_parameters is None else {"rope_parameters": rope_parameters}))
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids[:, :21], max_new_tokens=12, do_sample=False, output_scores=True,
                              return_dict_in_generate=True)
        patch_model(model)
        got = model(ids).logits
        out = model.generate(ids[:, :21], max_new_tokens=12, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
        assert _rel(got, ref) < 1e-5
        assert torch.equal(out.sequences, want.sequences)
        assert max(_rel(a, b) for a, b in zip(out.scores, want.scores)) < 1e-5  # each decode step
        unpatch_model(model)
        assert torch.equal(model(ids).logits, ref)


def test_liepos_drives_every_v4_rotation():
    """The encodings passed are what the model rotates with: from_hf's are upstream's, others change the logits,
    and each rope label reaches the layers that read it."""
    config, model = _tiny()
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    read = from_hf(config)
    assert sorted(read) == ["compress", "main"]
    with torch.no_grad():
        ref = model(ids).logits
        patch_model(model, read)
        assert _rel(model(ids).logits, ref) < 1e-5
        other = {k: e.replace(generator=e.generator.with_params(freqs=1.5 * e.generator.freqs)) for k, e in read.items()}
        for label in ("main", "compress"):  # one rope changed: the logits follow it
            patch_model(model, dict(read, **{label: other[label]}))
            assert _rel(model(ids).logits, ref) > 1e-3
        with pytest.raises(ValueError, match="rope_layer_type is 'compress' but the encodings are given for"):
            patch_model(model, {"main": read["main"]})
        unpatch_model(model)
        assert torch.equal(model(ids).logits, ref)


def test_from_hf_reads_the_nope_dims_first_and_the_rope_last():
    """from_hf's encodings against upstream's rotary module and apply function, both ropes, yarn included."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as up

    config = transformers.AutoConfig.for_model("deepseek_v4", **dict(TINY, rope_parameters=YARN))
    rotary = up.DeepseekV4RotaryEmbedding(config)
    pos = torch.tensor([[0, 1, 5, 15, 16, 17, 63, 200]])
    x = torch.randn(1, 2, pos.shape[1], 32, dtype=torch.float64)
    for label, enc in from_hf(config).items():
        cos, sin = rotary(x.float(), pos, layer_type=label)
        want = up.apply_rotary_pos_emb(x, cos.double(), sin.double())
        scale = enc.query_scale if enc.query_scale is not None else torch.ones(32, dtype=torch.float64)
        # the query carries the temperature D on the rotated dims (scores qᵀ D A k); upstream scales q and k by √D
        got = enc.query(x, pos[0]) / scale.sqrt()
        assert torch.allclose(got, want, atol=1e-5, rtol=0), label
        assert torch.equal(got[..., :24], x[..., :24])  # the NoPE dims come first and stay


def test_v4_refuses_what_it_cannot_follow():
    config, model = _tiny()
    with pytest.raises(NotImplementedError, match="not a fixed rotation, so it needs the raw-key path, and DeepSeek-V4"):
        patch_model(model, _xpos())
    dyn = {"main": _ROPE, "compress": dict(_ROPE, rope_type="dynamic", factor=2.0)}
    config2, model2 = _tiny(rope_parameters=dyn)
    with pytest.raises(NotImplementedError, match="compressors, indexer"):
        patch_model(model2)
    assert not any("_liepos" in k for m in model2.modules() for k in m.__dict__)


def _xpos():
    from liepos import build

    return build("xpos", 32)


def test_a_v4_rope_call_of_unknown_positions_is_refused():
    """Inside a patched attention a rope call must carry a cos a patched rotary module returned, and its sin or
    that sin negated: anything else has positions liepos cannot know."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as up

    config, model = _tiny()
    patch_model(model)
    attention = next(m for m in model.modules() if type(m).__name__ == "DeepseekV4Attention")
    x = torch.randn(1, 4, 5, 32)
    cos, sin = model.model.rotary_emb(x, torch.arange(5)[None], layer_type="main")
    token = ACTIVE.set(attention)
    try:
        with pytest.raises(RuntimeError, match="no patched rotary module"):
            up.apply_rotary_pos_emb(x, cos.clone(), sin)
        with pytest.raises(RuntimeError, match="neither the sin"):
            up.apply_rotary_pos_emb(x, cos, 2 * sin)
        back = up.apply_rotary_pos_emb(up.apply_rotary_pos_emb(x, cos, sin), cos, -sin)
        assert torch.allclose(back, x, atol=1e-6)  # -sin: the rotation back
    finally:
        ACTIVE.reset(token)
    unpatch_model(model)


def test_v4_training_gradients_are_upstream_s():
    """The loss and every parameter's gradient of a training step equal upstream's to rounding (the MoE gates'
    gradients, of order 1e-9, are rounding themselves: the bound is relative to the largest gradient too)."""
    config, model = _tiny()
    model.train()
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(1))

    def step():
        model.zero_grad()
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want_loss, want = step()
    patch_model(model)
    got_loss, got = step()
    unpatch_model(model)
    assert abs(float(got_loss - want_loss)) <= 1e-5 * abs(float(want_loss))
    assert got.keys() == want.keys()
    top = max(float(g.abs().max()) for g in want.values())
    for name, g in want.items():
        assert float((got[name] - g).abs().max()) <= 1e-5 * top + 1e-4 * float(g.abs().max()), name


# the rope keys of a DeepSeek-V4-Flash-style config.json: flat, which the config class nests at construction
FLASH_JSON = {"model_type": "deepseek_v4", "hidden_size": 4096, "num_attention_heads": 64, "head_dim": 512,
              "qk_rope_head_dim": 64, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
              "max_position_embeddings": 1048576,
              "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                               "beta_fast": 32, "beta_slow": 1}}


def test_a_v4_config_json_is_read_through_its_config_class():
    """Read as it stands, the flat dict would be one yarn rope over all 512 dims; its config class says 64 rotated
    dims, a plain "main" rope and a yarn "compress" rope without a temperature, and so does from_hf."""
    from_dict = from_hf(FLASH_JSON)
    config = transformers.AutoConfig.for_model("deepseek_v4", **{k: v for k, v in FLASH_JSON.items()
                                                                 if k != "model_type"})
    from_object = from_hf(config)
    assert sorted(from_dict) == ["compress", "main"]
    x = torch.randn(1, 1, 3, 512, dtype=torch.float64)
    for label, enc in from_dict.items():
        assert enc.generator.complex.count(True) == 32  # 64 rotated dims, the last of the head
        assert torch.equal(enc.query(x, [0, 7, 70000]), from_object[label].query(x, [0, 7, 70000]))
        assert enc.query_scale is None and enc.logit_scale == 1.0  # V4 sets the yarn attention factor to 1


def test_a_v4_config_json_without_transformers_is_refused(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it raises ImportError
    with pytest.raises(ValueError, match="derives the rope parameters .* transformers is not installed"):
        from_hf(FLASH_JSON)
