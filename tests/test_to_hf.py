"""liepos.interop.to_hf: an encoding back into the rope_parameters transformers reads.

* an unpatched transformers model configured with ``to_hf(enc)`` computes the logits of the
  same model patched with ``enc`` (the encoding is what upstream computes, not a look-alike);
* ``from_hf(to_hf(enc))`` is ``enc``: frequencies to 1e-12, layout, dims, logit scale;
* what transformers cannot express is refused, naming the block.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

import liepos as lp  # noqa: E402
from liepos.interop import from_hf, patch_model, to_hf  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

HALF = dict(layout="half")
EXPRESSIBLE = {
    "rope": lambda: lp.rope(16, **HALF),
    "rope-base": lambda: lp.rope(16, base=500000.0, **HALF),
    "linear": lambda: lp.scaling.linear(lp.rope(16, **HALF), factor=4.0),
    "yarn": lambda: lp.scaling.yarn(lp.rope(16, **HALF), factor=4.0, original_max_position_embeddings=32),
    "llama3": lambda: lp.scaling.llama3(lp.rope(16, **HALF), factor=8.0, original_max_position_embeddings=32,
                                        low_freq_factor=1.0, high_freq_factor=4.0),
    "interleaved": lambda: lp.rope(16),
    "partial": lambda: lp.Encoding(lp.direct_sum(lp.rope(8).generator, lp.nope(8).generator), layout="half"),
}


def same(a, b):
    return (a.layout == b.layout and a.dim == b.dim and a.num_slots == b.num_slots
            and a.logit_scale == pytest.approx(b.logit_scale, rel=1e-12)
            and torch.allclose(a.generator.freqs, b.generator.freqs, rtol=1e-12, atol=0)
            and torch.equal(a.generator.rates, b.generator.rates))


@pytest.mark.parametrize("name", list(EXPRESSIBLE))
def test_round_trip(name):
    enc = EXPRESSIBLE[name]()
    back = from_hf(to_hf(enc))
    assert same(back, enc) and back.length_rule is None


def model_for(model_type, cfg, seed=0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=128, num_hidden_layers=2,
                                  max_position_embeddings=128, initializer_range=0.2, pad_token_id=0, **cfg)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("name, model_type", [
    ("rope", "llama"), ("rope-base", "llama"), ("linear", "llama"), ("yarn", "llama"), ("llama3", "qwen2"),
    ("interleaved", "cohere"), ("partial", "phi3"), ("yarn", "gpt_neox"),
])
def test_an_unpatched_model_computes_the_encoding(name, model_type):
    enc = EXPRESSIBLE[name]()
    cfg = to_hf(enc)
    if model_type == "gpt_neox":  # a partial head of 16 dims rotating 8 with a temperature
        whole = lp.scaling.yarn(EXPRESSIBLE["partial"](), factor=4.0, original_max_position_embeddings=32)
        with pytest.raises(ValueError, match="rotated dims"):
            to_hf(whole)  # a whole-head logit scale: upstream's attention_factor² covers the 8 rotated dims only
        D = torch.ones(whole.content_dim, dtype=torch.float64)
        D[:8] = whole.logit_scale
        enc = whole.replace(logit_scale=1.0, query_scale=D)  # the temperature on the rotated dims only ...
        cfg = to_hf(enc)
        back = from_hf(cfg)
        assert torch.allclose(back.query_scale, D, rtol=1e-12) and back.logit_scale == pytest.approx(1.0)
    upstream = model_for(model_type, cfg)
    x = torch.randint(0, 128, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = upstream(x).logits
        patch_model(upstream)  # ... which patch_model applies exactly, as read from the config
        got = upstream(x).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4
    if model_type != "gpt_neox":
        patched = patch_model(model_for(model_type, {}), enc)  # the same weights, the encoding given
        with torch.no_grad():
            got = patched(x).logits
        assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4


@pytest.mark.parametrize("enc, block", [
    (lp.xpos(16), "rate"),
    (lp.retnet(16, num_heads=4), "per-head"),
    (lp.jordan(3), "Jordan block of size 3"),
    (lp.alibi(16, num_heads=4), "slots"),
    (lp.Encoding(lp.rope(4).generator.with_params(), name="x").replace(
        generator=lp.Generator([0.0, 0.0], [1.0, 0.1], [1, 1], basis=torch.eye(4) + 0.1 * torch.ones(4, 4))),
     "custom basis"),
    (lp.scaling.dynamic(lp.rope(16, layout="half"), factor=2.0, original_max_position_embeddings=32), "length rule"),
])
def test_what_upstream_cannot_express_is_refused_by_name(enc, block):
    with pytest.raises(ValueError, match=block):
        to_hf(enc)
