"""GPT-J's rope by verification: ``apply(x, sin, cos)`` on the first ``rotary_dim`` dims, in pairs (2k, 2k + 1).

GPT-J and CodeGen look their sin and cos up in a table of ``max_position_embeddings`` rows
(``embed_positions``), pass the attention's slice ``q[..., :rotary_dim]`` sequence-first to a
one-tensor apply, and count their rotated dims as ``rotary_dim``. The probe reads that, the proof
runs within the table's rows (upstream answers no other position), and the patched model equals
the unpatched one; a rope planted wrong is refused.
"""

from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from liepos.interop import from_hf, patch_model, unpatch_model  # noqa: E402
from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_verify import reach, sin_first, structure, upstream_of  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]

TINY = dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, vocab_size=128, n_positions=64, initializer_range=0.2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
TYPES = ["gptj", "codegen"]


def _config(model_type):
    cfg = AutoConfig.for_model(model_type, **TINY)
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("model_type", TYPES)
def test_the_probe_reads_gptj_conventions(model_type):
    assert model_type not in FAMILIES
    up = upstream_of(_config(model_type), model_type)
    assert sin_first(up.apply) and up.per_tensor
    assert reach(up, None) == TINY["n_positions"]
    s = structure(up, None, 16)
    assert (s.rotated, s.layout, s.direction, s.splits) == (8, "interleaved", 1, True)
    want = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    torch.testing.assert_close(torch.tensor(s.omega, dtype=torch.float64), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("model_type", TYPES)
def test_patched_equals_unpatched(model_type):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(model_type)).eval()
    x = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want, want_tokens = model(x).logits, model.generate(x, **gen)
    patch_model(model)
    try:
        assert any("_liepos" in vars(m) for m in model.modules())
        with torch.no_grad():
            got, got_tokens = model(x).logits, model.generate(x, **gen)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
        assert torch.equal(got_tokens, want_tokens)
    finally:
        unpatch_model(model)


def test_from_hf_says_once_what_it_is_and_refuses_without_the_model():
    with pytest.raises(ValueError) as err:
        from_hf(_config("gptj"))
    text = str(err.value)
    assert text.count("GPT-J") == 1 and "rotary_dim" in text and "patch_model(model) verifies it" in text


def test_a_table_planted_wrong_is_refused(monkeypatch):
    """CodeGen's sin and cos table off by 1e-3: the proof refuses, nothing is patched."""
    modeling = importlib.import_module("transformers.models.codegen.modeling_codegen")
    forward = modeling.CodeGenRotaryEmbedding.forward

    def wrong(self, x, position_ids):
        sin, cos = forward(self, x, position_ids)
        return sin * (1 + 1e-3), cos

    monkeypatch.setattr(modeling.CodeGenRotaryEmbedding, "forward", wrong)
    model = AutoModelForCausalLM.from_config(_config("codegen"))
    with pytest.raises(ValueError, match="verification failed"):
        patch_model(model)
    assert not any("_liepos" in vars(m) for m in model.modules())
