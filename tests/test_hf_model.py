"""liepos.interop.patch_model against transformers itself on Llama / Mistral / Qwen2 / Qwen3 in
depth (the other families of the table: test_hf_families.py), random weights, no download.

* RoPE and its static scalings (default, linear, yarn, llama3): the patched model's logits equal
  the unpatched model's to 1e-4 (float32) past ``original_max_position_embeddings`` and at
  shifted ``position_ids``, in both precisions, and greedy ``generate`` with the cache gives the
  same tokens;
* the raw-key path (times kept beside HF's cache, liepos.attend) equals upstream too when fed
  RoPE, with padding, sliding windows, the cache, static caches and ``output_attentions``; it is
  causal by token order (packed sequences);
* xPos, ALiBi, RetNet and a custom generator: the patched model runs, trains (an optimizer step
  lowers the loss) and generates, and decoding with the cache equals the full forward.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import liepos as lp  # noqa: E402
from liepos.interop import patch_model, unpatch_model  # noqa: E402
from liepos.interop import from_hf  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.upstream

L0 = 64  # original_max_position_embeddings: every test runs past it
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": L0},
}
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def tiny(family="llama", rope=None, *, attn="sdpa", std=0.2, seed=0, **kw):
    """A 2-layer model with hidden 64, 4 heads, 2 kv heads, vocab 128 and random weights.

    ``std=0.2`` (not the usual 0.02) makes attention sharp, so that positions move the logits
    by O(1): a wrong encoding is visible (see ``test_a_wrong_encoding_is_visible``).
    """
    torch.manual_seed(seed)
    ccls, mcls = FAMILIES[family]
    kw.setdefault("max_position_embeddings", 512)
    kw.setdefault("num_hidden_layers", 2)
    cfg = ccls(
        hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, rope_theta=10000.0,
        rope_scaling=None if rope is None else dict(rope), initializer_range=std,
        attn_implementation=attn, attention_dropout=0.0, **kw,
    )
    return mcls(cfg).eval()


def logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits


def ids(batch=2, seq=160, seed=1):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- parity with upstream
@pytest.mark.parametrize("precision", ["precise", pytest.param("compat", marks=pytest.mark.slow)])
@pytest.mark.parametrize("rope", list(ROPES))
def test_logits_equal_upstream_past_the_original_context(rope, precision):
    model, x = tiny(rope=ROPES[rope]), ids()
    shift = torch.arange(160)[None] + 200  # positions 200..359: 3 to 5.6 times L0 = 64
    ref, ref_shift = logits(model, x), logits(model, x, position_ids=shift)
    patch_model(model, precision=precision)
    assert (logits(model, x) - ref).abs().max() < 1e-4
    assert (logits(model, x, position_ids=shift) - ref_shift).abs().max() < 1e-4


def test_far_positions_liepos_is_closer_to_float64_than_upstream():
    """Past ~1000 the gap grows, and it is upstream's: HF forms ``inv_freq · position`` in float32
    (angle error ~ position · 2⁻²⁴). Against the same model in float64 with float64 angles,
    liepos in float32 stays at float32 matmul noise while upstream drifts."""
    model, x = tiny(rope=ROPES["yarn"]), ids()
    far = torch.arange(160)[None] + 4000
    upstream = logits(model, x, position_ids=far)
    patch_model(model)
    ours = logits(model, x, position_ids=far)
    truth_model = tiny(rope=ROPES["yarn"]).double()
    truth = logits(patch_model(truth_model), x, position_ids=far).float()
    err_ours, err_upstream = (ours - truth).abs().max(), (upstream - truth).abs().max()
    assert err_ours < 5e-5 and 3 * err_ours < err_upstream


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_and_backends(family):
    for attn in ("sdpa", "eager"):
        model, x = tiny(family, ROPES["yarn"], attn=attn), ids()
        ref = logits(model, x)
        patch_model(model)
        assert (logits(model, x) - ref).abs().max() < 1e-4, (family, attn)


@pytest.mark.parametrize("rope", ["yarn", "llama3"])
def test_generate_gives_the_same_tokens(rope):
    model, x = tiny(rope=ROPES[rope]), ids(seq=100)
    with torch.no_grad():
        ref = model.generate(x, max_new_tokens=10, do_sample=False)
        patch_model(model)
        got = model.generate(x, max_new_tokens=10, do_sample=False)
    assert torch.equal(got, ref)


def test_generate_with_left_padding():
    model, x = tiny(rope=ROPES["yarn"]), ids(seq=90)
    mask = torch.ones_like(x)
    mask[0, :7] = 0  # the first row is left-padded
    with torch.no_grad():
        ref = model.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
        patch_model(model)
        got = model.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
        # the raw-key path with RoPE (a length rule that changes nothing forces it) agrees too
        enc = from_hf(model.config)
        patch_model(model, enc.replace(length_rule=lambda n: enc))
        raw = model.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, ref) and torch.equal(raw, ref)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_raw_key_path_equals_upstream(family):
    """Keys cached raw with their times, encoded by liepos.attention: RoPE still equals upstream,
    through the cache and (Mistral) a sliding window shorter than the sequence."""
    extra = {"sliding_window": 48} if family == "mistral" else {}
    model, x = tiny(family, ROPES["yarn"], **extra), ids(seq=120)
    with torch.no_grad():
        ref = model(x).logits
        out = model(x[:, :100], use_cache=True)
        ref_step = model(x[:, 100:], cache=out.cache).logits
    enc = from_hf(model.config)
    patch_model(model, enc.replace(length_rule=lambda n: enc))
    assert not model.model.layers[0].self_attn._liepos.encoded
    with torch.no_grad():
        assert (model(x).logits - ref).abs().max() < 1e-4
        out = model(x[:, :100], use_cache=True)
        assert (model(x[:, 100:], cache=out.cache).logits - ref_step).abs().max() < 1e-4


def test_a_wrong_encoding_is_visible():
    model, x = tiny(rope=ROPES["yarn"]), ids()
    ref = logits(model, x)
    for wrong in (from_hf(model.config).replace(layout="interleaved"), lp.rope(16, layout="half")):
        patch_model(model, wrong)
        assert (logits(model, x) - ref).abs().max() > 0.1


def test_unpatch_and_repatch():
    model, x = tiny(rope=ROPES["llama3"]), ids(seq=80)
    ref = logits(model, x)
    patch_model(model, lp.xpos(16, layout="half"))
    assert (logits(model, x) - ref).abs().max() > 1e-3
    patch_model(model)  # re-patching replaces the encoding
    assert (logits(model, x) - ref).abs().max() < 1e-4
    unpatch_model(model)
    assert torch.equal(logits(model, x), ref)


LENGTH_DEPENDENT = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(8)],
                 "long_factor": [1.5 + 0.25 * i for i in range(8)], "original_max_position_embeddings": L0},
}


@pytest.mark.parametrize("precision", ["precise", "compat"])
@pytest.mark.parametrize("rope", list(LENGTH_DEPENDENT))
def test_length_dependent_ropes_follow_upstream_through_generate(rope, precision):
    """``encoding=None`` on a dynamic-NTK or longrope config is upstream's model: its rotary module
    recomputes the frequencies each forward (dynamic: at the longest length seen, back to the
    original below it; longrope: at this forward's length) and the cache keeps every key as it was
    rotated. Greedy generate from 40 to 100 tokens (past L0 = 64): every step's logits and every
    token equal upstream's; then a forward of 80 (below the 100 seen: dynamic keeps its longest
    length), one of 30 (the reset) and one of 80 again (growth from the reset)."""
    ref, model = tiny(rope=LENGTH_DEPENDENT[rope], max_position_embeddings=L0), tiny(
        rope=LENGTH_DEPENDENT[rope], max_position_embeddings=L0)
    patch_model(model, precision=precision)
    x = ids(batch=1, seq=100)
    gen = dict(max_new_tokens=60, min_new_tokens=60, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want, got = ref.generate(x[:, :40], **gen), model.generate(x[:, :40], **gen)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.logits) == 60
    for g, w in zip(got.logits, want.logits):
        assert (g - w).abs().max() < 2e-4 * w.abs().max()
    for n in (80, 30, 80):
        w, g = logits(ref, x[:, :n]), logits(model, x[:, :n])
        assert (g - w).abs().max() < 2e-4 * w.abs().max(), n


def test_a_length_dependent_rope_is_visible_in_generate():
    """The test above can fail: re-encoding the cached keys at each step's length (what an explicit
    length-dependent Encoding does, next test) changes upstream's tokens."""
    ref = tiny(rope=LENGTH_DEPENDENT["dynamic"], max_position_embeddings=L0)
    model = tiny(rope=LENGTH_DEPENDENT["dynamic"], max_position_embeddings=L0)
    patch_model(model, from_hf(model.config))
    x = ids(batch=1, seq=40)
    gen = dict(max_new_tokens=60, min_new_tokens=60, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want, got = ref.generate(x, **gen), model.generate(x, **gen)
    gap = max(((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got.logits, want.logits))
    assert gap > 1e-2


def test_dynamic_decoding_keeps_no_stale_keys():
    """An explicit dynamic-NTK Encoding means its rule: at every length L all keys rotate under the
    generator of L. Upstream's cache keeps keys rotated under the old base (transformers #25104),
    so its decode step differs from its own full forward (``encoding=None`` reproduces that, test
    above). Patched with ``from_hf(config)``, the cache holds raw keys and every step encodes all of
    them under the current generator. One layer, so that the keys do not depend on earlier layers'
    outputs (in a deeper model those were computed, by design, under the generator of their time)."""
    model = tiny(rope={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=L0, num_hidden_layers=1)
    x = ids(batch=1, seq=110)

    def step_vs_full():
        with torch.no_grad():  # prefill first: upstream's rotary module has not seen 110 yet
            out = model(x[:, :100], use_cache=True)
            step = model(x[:, 100:], cache=out.cache).logits
            full = model(x).logits
        return full, (step - full[:, 100:]).abs().max()

    ref_full, upstream_gap = step_vs_full()
    patch_model(model, from_hf(model.config))
    full, gap = step_vs_full()
    assert (full - ref_full).abs().max() < 1e-4  # one forward: the same as upstream
    assert gap < 1e-5 < 1e-2 < upstream_gap


# ---------------------------------------------------------------------- other encodings
def custom_generator():
    # a damped rotation, a slide (Jordan block of size 2) and NoPE dims: 2 + 2 + 12 = 16
    g = lp.direct_sum(lp.Generator([-0.05, 0.0], [0.3, 0.0], [1, 2]), lp.nope(12).generator)
    return lp.Encoding(g, name="custom")


OTHERS = {
    "xpos": lambda: lp.xpos(16, layout="half"),
    "alibi": lambda: lp.alibi(16, num_heads=4),
    "retnet": lambda: lp.retnet(16, num_heads=4),
    "custom": custom_generator,
}


@pytest.mark.parametrize(
    "name, family",
    [(name, "llama") for name in OTHERS] + [("alibi", "mistral"), ("xpos", "qwen2"), ("custom", "qwen2")],
)
def test_other_encodings_run_train_and_generate(name, family):
    model, x = tiny(family, std=0.02), ids(seq=48)
    patch_model(model, OTHERS[name]())
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss0 = model(x, labels=x).loss
    loss0.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    opt.step()
    opt.zero_grad()
    model.eval()
    with torch.no_grad():
        loss1 = model(x, labels=x).loss
        full = model(x[:, :32]).logits
        out = model(x[:, :24], use_cache=True)
        step = model(x[:, 24:32], cache=out.cache).logits
        cached = model.generate(x[:, :20], max_new_tokens=6, do_sample=False)
        uncached = model.generate(x[:, :20], max_new_tokens=6, do_sample=False, use_cache=False)
    assert loss1 < loss0
    assert (step - full[:, 24:]).abs().max() < 1e-5  # prefill + decode = the full forward
    assert torch.equal(cached, uncached) and cached.shape == (2, 26)


def test_alibi_matches_a_dense_bias_model():
    """The patched ALiBi model equals the same attention written with an explicit bias -m(t-s)."""
    model = tiny(std=0.2)
    patch_model(model, lp.alibi(16, num_heads=4))
    attn = model.model.layers[0].self_attn
    h = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        # upstream's forward still unpacks cos and sin; the liepos dispatcher does not read them
        got, _ = attn(h, position_embeddings=(None, None), attention_mask=None)
        q = attn.q_proj(h).view(1, 40, 4, 16).transpose(1, 2)
        k = attn.k_proj(h).view(1, 40, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        v = attn.v_proj(h).view(1, 40, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        t = torch.arange(40.0)
        bias = -lp.alibi_slopes(4).float()[:, None, None] * (t[:, None] - t[None, :])
        bias = bias.masked_fill(t[:, None] < t[None, :], float("-inf"))
        ref = torch.softmax(q @ k.transpose(-1, -2) / 4.0 + bias, -1) @ v
        ref = attn.o_proj(ref.transpose(1, 2).reshape(1, 40, 64))
    assert (got - ref).abs().max() < 1e-5


# ---------------------------------------------------------------------- bad input
def test_errors():
    model = tiny()
    with pytest.raises(ValueError, match="rotates 16 dims"):
        patch_model(model, lp.rope(32))
    with pytest.raises(ValueError, match="5 heads"):
        patch_model(model, lp.alibi(16, num_heads=5))
    with pytest.raises(TypeError, match="encoding"):
        patch_model(model, "rope")
    with pytest.raises(ValueError, match="gpt2"):
        patch_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)))
    # the config is read by from_hf: unknown types, missing and contradictory keys name themselves
    for params, msg in (
        ({"rope_type": "su", "factor": 2.0, "rope_theta": 1e4}, "unknown rope_type 'su'"),
        ({"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4, "original_max_position_embeddings": 64,
          "high_freq_factor": 4.0}, "low_freq_factor"),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0, "rope_theta": 1e4}, "type='yarn' but rope_type='linear'"),
    ):
        model.config.rope_parameters = params
        with pytest.raises(ValueError, match=msg):
            patch_model(model)
    # nothing was patched by the failed calls
    assert "forward" not in model.model.layers[0].self_attn.__dict__


def test_per_layer_type_dict():
    model, x = tiny("qwen2", ROPES["linear"]), ids(seq=70)
    ref = logits(model, x)
    enc = from_hf(model.config)
    patch_model(model, {"full_attention": enc})
    assert (logits(model, x) - ref).abs().max() < 1e-4
    with pytest.raises(ValueError, match="full_attention"):
        patch_model(model, {"sliding_attention": enc})


# ---------------------------------------------------------------------- the raw-key path
RAW = {
    "xpos": lambda: lp.xpos(16, layout="half"),
    "alibi": lambda: lp.alibi(16, num_heads=4),
    "retnet": lambda: lp.retnet(16, num_heads=4),
    "dynamic": lambda: lp.scaling.dynamic(lp.rope(16, layout="half"), factor=2.0, original_max_position_embeddings=16),
}


@pytest.mark.parametrize("name", list(RAW))
def test_packed_sequences_never_see_a_later_document(name):
    """position_ids restarting inside a row: changing only document 2 leaves document 1 bit-identical."""
    model = patch_model(tiny(), RAW[name]())
    pos = torch.cat((torch.arange(20), torch.arange(24)))[None]  # two documents in one row
    a = ids(batch=1, seq=44)
    b = a.clone()
    b[:, 20:] = (b[:, 20:] + 1) % 128  # another document 2
    la, lb = logits(model, a, position_ids=pos), logits(model, b, position_ids=pos)
    assert torch.equal(la[:, :20], lb[:, :20])
    assert not torch.equal(la[:, 20:], lb[:, 20:])


@pytest.mark.parametrize("name", ["xpos", "alibi"])
def test_static_cache_on_the_raw_key_path(name):
    model, x = patch_model(tiny(), RAW[name]()), ids(batch=1, seq=24)
    gen = dict(max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        dynamic = model.generate(x, **gen)
        static = model.generate(x, cache_implementation="static", **gen)
    assert torch.equal(static, dynamic)


def test_output_attentions_on_the_raw_key_path():
    """The weights come back, and for RoPE they are upstream's (eager) weights."""
    model, x = tiny(attn="eager"), ids(batch=1, seq=30)
    with torch.no_grad():
        want = model(x, output_attentions=True).attentions
    enc = from_hf(model.config)
    patch_model(model, enc.replace(length_rule=lambda n: enc))  # a rule forces the raw-key path
    with torch.no_grad():
        got = model(x, output_attentions=True).attentions
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and (g - w).abs().max() < 1e-5


def test_prefill_and_decode_with_two_layers_for_length_dependent_types():
    """Where equality holds and where it cannot: an explicit dynamic-NTK Encoding at 2 layers.

    Up to the original length the rotation is fixed, and prefill + decode equals the full
    forward. Past it, a length-dependent rotation changes every earlier token's hidden state
    with the total length; a cache holds the earlier layers' outputs computed at their own
    length, so no cache reproduces the full forward at 2+ layers (the 1-layer case is exact:
    ``test_dynamic_decoding_keeps_no_stale_keys``). Measured here: ~2e-2 of logits of ~4.
    """
    model = tiny(rope={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=L0)
    patch_model(model, from_hf(model.config))  # the rule's meaning, not upstream's per-forward length
    x = ids(batch=1, seq=110)

    def gap(prefill):
        with torch.no_grad():
            out = model(x[:, :prefill], use_cache=True)
            step = model(x[:, prefill:prefill + 1], cache=out.cache).logits
            full = model(x[:, :prefill + 1]).logits
        return (step[:, -1] - full[:, -1]).abs().max().item()

    assert gap(40) < 1e-5  # 41 tokens <= 64: the rotation does not change
    assert 1e-3 < gap(100) < 1e-1  # past it: the earlier layers' hidden states, as documented


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_unpatch_model_restores_the_modeling_file_once_no_patched_model_is_left(attn):
    """patch_model puts dispatchers in the family's modeling file for its rope function (and, under eager,
    wraps its attention table; under sdpa the table stays transformers' own); unpatching the last patched
    model puts transformers' own objects back, and two patched models share the wraps."""
    import gc

    import transformers.models.llama.modeling_llama as ml
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from liepos.interop.hf_modeling_hooks import patched_models

    gc.collect()  # models of earlier tests that nobody holds are gone; the ones still held are unpatched
    for m in patched_models(ml.__name__):
        unpatch_model(m)
    apply0 = ml.apply_rotary_pos_emb
    assert not hasattr(apply0, "_liepos_upstream") and ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS
    a, b = tiny(attn=attn), tiny(seed=1, attn=attn)
    patch_model(a)
    patch_model(b)
    assert ml.apply_rotary_pos_emb is not apply0
    assert (ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS) == (attn == "sdpa")
    unpatch_model(a)
    assert ml.apply_rotary_pos_emb is not apply0  # b still runs on liepos
    ids = torch.randint(0, 128, (1, 12))
    patched = logits(b, ids)
    unpatch_model(b)
    assert ml.apply_rotary_pos_emb is apply0 and ml.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS
    torch.testing.assert_close(logits(b, ids), patched, rtol=1e-4, atol=1e-5)
