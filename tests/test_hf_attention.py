"""The attention implementation of a patched model: a twin registered with transformers, or the
modeling file's hooks where transformers reads the name (liepos.interop.hf_attention).

* under ``sdpa`` the patched layers' config names ``liepos_sdpa``; the modeling file's
  ``ALL_ATTENTION_FUNCTIONS`` stays transformers' object, and the twin's mask is upstream's to the bit;
* ``unpatch_model`` gives every config the name it had, in any order over several models, and the
  models still patched keep running on liepos;
* ``eager`` and ``sdpa`` are both exact, the fixed-rotation path and the raw-key path;
* a name changed after patching is refused, not followed silently; a vision tower's config is untouched.
"""

from __future__ import annotations

import gc
import itertools
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))

import transformers.models.llama.modeling_llama as ml  # noqa: E402
from transformers.masking_utils import create_causal_mask  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

import liepos as lp  # noqa: E402
from liepos.interop import from_hf, patch_model, unpatch_model  # noqa: E402
from liepos.interop.hf_attention import twin_name  # noqa: E402
from test_hf_model import ROPES, ids, logits, tiny  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.upstream


def _clean_file():
    """Every live patched model of modeling_llama unpatched (collected ones give the file back themselves)."""
    from liepos.interop.hf_modeling_hooks import patched_models

    gc.collect()
    for m in patched_models(ml.__name__):
        unpatch_model(m)
    assert not hasattr(ml.apply_rotary_pos_emb, "_liepos_upstream")
    assert ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS


def _raw(model):
    """RoPE through the raw-key path (a length rule that changes nothing forces it)."""
    enc = from_hf(model.config)
    return enc.replace(length_rule=lambda n: enc)


def test_sdpa_runs_on_the_registered_twin_and_leaves_the_modeling_file_table_alone():
    model, x = tiny(rope=ROPES["yarn"]), ids(seq=40)
    ref = logits(model, x)
    patch_model(model)
    assert model.config._attn_implementation == twin_name("sdpa") == "liepos_sdpa"
    assert ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS  # transformers' own object, not a wrapper
    assert "liepos_sdpa" in ALL_ATTENTION_FUNCTIONS.valid_keys()
    assert (logits(model, x) - ref).abs().max() < 1e-4
    unpatch_model(model)
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(logits(model, x), ref)


@pytest.mark.parametrize("padded", [False, True])
def test_the_twin_mask_is_upstreams_sdpa_mask(padded):
    """create_causal_mask under ``liepos_sdpa`` returns what it returns under ``sdpa`` (both None when the
    causal kernel suffices), so the model's own mask format reaches the attention."""
    model = tiny(sliding_window=None)
    patch_model(model)  # registers the twin
    embeds = torch.randn(2, 9, 64)
    mask = torch.ones(2, 9, dtype=torch.long)
    if padded:
        mask[0, :3] = 0
    got = create_causal_mask(model.config, embeds, mask, None)
    unpatch_model(model)
    want = create_causal_mask(model.config, embeds, mask, None)
    assert (got is None) == (want is None) == (not padded)
    if padded:
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("path", ["fixed", "raw"])
def test_eager_and_sdpa_are_both_exact(attn, path):
    """Logits, a cached decode step and (eager) the attention weights equal upstream's on both routes."""
    model, x = tiny(rope=ROPES["yarn"], attn=attn), ids(seq=60)
    with torch.no_grad():
        ref = model(x, output_attentions=attn == "eager")
        out = model(x[:, :50], use_cache=True)
        ref_step = model(x[:, 50:], cache=out.cache).logits
    patch_model(model, _raw(model) if path == "raw" else None)
    assert model.model.layers[0].self_attn._liepos.encoded == (path == "fixed")
    assert model.config._attn_implementation == ("liepos_sdpa" if attn == "sdpa" else "eager")
    with torch.no_grad():
        got = model(x, output_attentions=attn == "eager")
        out = model(x[:, :50], use_cache=True)
        step = model(x[:, 50:], cache=out.cache).logits
    assert (got.logits - ref.logits).abs().max() < 1e-4
    assert (step - ref_step).abs().max() < 1e-4
    if attn == "eager":
        for g, w in zip(got.attentions, ref.attentions):
            assert (g - w).abs().max() < 1e-5


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_unpatch_restores_the_implementation_it_found(attn):
    model = tiny(attn=attn)
    before = model.config._attn_implementation
    patch_model(model, lp.xpos(16, layout="half"))
    patch_model(model)  # a repatch keeps the name found first
    unpatch_model(model)
    assert model.config._attn_implementation == before == attn


@pytest.mark.parametrize("order", list(itertools.permutations(range(2))))
@pytest.mark.parametrize("attns", [("sdpa", "sdpa"), ("sdpa", "eager")])
def test_two_models_patched_and_unpatched_in_either_order(order, attns):
    """Each unpatched model is upstream's again, bit for bit, while the other still runs on liepos
    (xPos, visibly not upstream's); at the end the modeling file holds transformers' own objects."""
    _clean_file()
    apply0 = ml.apply_rotary_pos_emb
    models = [tiny(attn=attn, seed=i) for i, attn in enumerate(attns)]
    x = ids(seq=30)
    upstream = [logits(m, x) for m in models]
    for m in models:
        patch_model(m, lp.xpos(16, layout="half"))
    patched = [logits(m, x) for m in models]
    for up, pa in zip(upstream, patched):
        assert (pa - up).abs().max() > 1e-3
    first, second = order
    unpatch_model(models[first])
    assert torch.equal(logits(models[first], x), upstream[first])
    assert models[first].config._attn_implementation == attns[first]
    assert torch.equal(logits(models[second], x), patched[second])
    unpatch_model(models[second])
    assert torch.equal(logits(models[second], x), upstream[second])
    assert [m.config._attn_implementation for m in models] == list(attns)
    assert ml.apply_rotary_pos_emb is apply0 and ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS


def test_a_name_changed_after_patching_is_refused():
    model, x = tiny(), ids(seq=12)
    patch_model(model, lp.xpos(16, layout="half"))
    model.config._attn_implementation = "eager"
    with pytest.raises(RuntimeError, match="'liepos_sdpa', but its config now names 'eager'"):
        logits(model, x)
    unpatch_model(model)  # the user's name stays
    assert model.config._attn_implementation == "eager"


def test_a_family_that_reads_the_name_keeps_it():
    """DeepSeek-V3.2's attention branches on ``in ("eager", "sdpa")`` (its indexer's mask): its config keeps
    ``sdpa`` and the modeling file's table is wrapped while patched, transformers' own again after."""
    import importlib

    from liepos.interop.families import family_of
    from test_hf_families import tiny as family_tiny

    mod = importlib.import_module(family_of("deepseek_v32").modeling)
    model, x = family_tiny("deepseek_v32"), ids(seq=20)
    ref = logits(model, x)
    patch_model(model)
    assert model.config._attn_implementation == "sdpa"
    assert mod.ALL_ATTENTION_FUNCTIONS is not ALL_ATTENTION_FUNCTIONS
    assert (logits(model, x) - ref).abs().max() < 1e-4
    unpatch_model(model)
    assert mod.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS


@pytest.mark.parametrize("name", [None, "xpos"])
def test_packed_documents_on_the_twin_beside_a_model_on_the_hooks(name, one_thread, deterministic):
    """An eager model of the same modeling file wraps its table; the sdpa model's packed row still runs each
    document once (bit for bit its documents alone), not split twice."""
    from test_hf_packed import packed_and_separate

    other = patch_model(tiny(attn="eager"))
    model = patch_model(tiny(), None if name is None else lp.xpos(16, layout="half"))
    assert ml.ALL_ATTENTION_FUNCTIONS is not ALL_ATTENTION_FUNCTIONS and model.config._attn_implementation == "liepos_sdpa"
    for position_ids in (False, True):
        packed, separate = packed_and_separate(model, position_ids, cache=False)
        assert torch.equal(packed, separate)
    unpatch_model(other)
    unpatch_model(model)


def test_a_model_collected_while_patched_gives_the_modeling_file_back():
    _clean_file()
    apply0 = ml.apply_rotary_pos_emb
    model = patch_model(tiny(attn="eager"))
    assert ml.apply_rotary_pos_emb is not apply0 and ml.ALL_ATTENTION_FUNCTIONS is not ALL_ATTENTION_FUNCTIONS
    del model
    gc.collect()
    assert ml.apply_rotary_pos_emb is apply0 and ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS


def test_a_vision_tower_keeps_its_implementation():
    """Qwen2-VL: only the text decoder's config names the twin; the vision tower's and the top config's
    names stay, the logits stay upstream's, and unpatching gives every config its name back."""
    from test_hf_families import tiny_vl

    model, x = tiny_vl("qwen2_vl"), ids(seq=24) % 100
    configs = (model.config, model.config.text_config, model.config.vision_config)
    before = [c._attn_implementation for c in configs]
    ref = logits(model, x)
    patch_model(model)
    assert [c._attn_implementation for c in configs] == [before[0], "liepos_sdpa", before[2]]
    assert (logits(model, x) - ref).abs().max() < 1e-4
    unpatch_model(model)
    assert [c._attn_implementation for c in configs] == before


def test_transformers_reads_the_name_only_where_the_twin_is_exact():
    """The shared code a twinned model runs through: the mask builders read the name only to look up
    the mask function (the twin's is upstream's), sdpa's attention not at all, and the flash checks
    (``"flash" in name``) say False for the twin as for ``sdpa``. A release that reads it elsewhere fails here."""
    import inspect
    import re

    import transformers.integrations.sdpa_attention as sdpa
    import transformers.masking_utils as masking
    from transformers.utils.generic import is_flash_attention_requested

    reads = re.findall(r"[^\n]*_attn_implementation[^\n]*", inspect.getsource(masking))
    lookups = [r for r in reads if re.search(r"ALL_MASK_ATTENTION_FUNCTIONS(\._global_mapping)?\b", r)]
    assert reads and lookups == reads, reads
    assert "_attn_implementation" not in inspect.getsource(sdpa)
    assert not is_flash_attention_requested(requested_attention_implementation=twin_name("sdpa"))
