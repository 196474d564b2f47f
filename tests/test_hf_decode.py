"""The decode step of patched raw-key layers (liepos.interop.hf_decode), against the full forward.

Keys are kept encoded at a cache origin beside HF's cache; a step encodes its query and its new key
only, and the origin moves (every key encoded afresh from HF's raw keys) only when a query leaves the
precision budget of liepos.recentre. These tests run decoding *past* that budget, at far positions,
and check:

* every decode step's logits equal the full forward's (uncached, liepos.attention re-centred per
  block) for xPos, ALiBi, RetNet, a decay and a Jordan block;
* a step encodes one key row per layer (counted), and re-encodes the cache only when the budget is
  left (about once per budget, never per step);
* whatever invalidates the stored keys does: another encoding, a parameter changed in place or by a
  new storage, a cache reordered by beam search or cropped.
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

import liepos as lp  # noqa: E402
from liepos.interop import hf_decode, patch_model  # noqa: E402
from liepos.encoding import Encoding  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.upstream


def tiny(seed=0, layers=2):
    """Hidden 64, 4 heads of 16, 2 kv heads; sharp attention (std 0.2) so positions move the logits."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=128, num_hidden_layers=layers, max_position_embeddings=1 << 22,
                      initializer_range=0.2, attn_implementation="sdpa", attention_dropout=0.0)
    return LlamaForCausalLM(cfg).eval()


def ids(n, batch=1, seed=1):
    return torch.randint(0, 128, (batch, n), generator=torch.Generator().manual_seed(seed))


def custom_jordan():
    # a damped rotation, a slide (Jordan block of size 2, its couplings) and NoPE dims: 2 + 2 + 12 = 16
    g = lp.direct_sum(lp.Generator([-0.05, 0.0], [0.3, 0.0], [1, 2]), lp.nope(12).generator)
    return Encoding(g, name="custom")


# budgets (liepos.recentre, float32): xPos with scale_base 4 ~ 97 positions, ALiBi's slots 256, the
# decay 60, RetNet's slowest head ~930, the Jordan block 256: 300 decode steps leave all but RetNet's
ENCODINGS = {
    "xpos": lambda: lp.xpos(16, scale_base=4.0, layout="half"),
    "alibi": lambda: lp.alibi(16, num_heads=4),
    "retnet": lambda: lp.retnet(16, num_heads=4),
    "decay": lambda: lp.catalogue.build("decay", 16, 4),
    "jordan": custom_jordan,
    "head decays": lambda: head_decays(),
}


def head_decays():
    """One decay per head, fast (budget ~110 positions: the factored store's origin moves while decoding)."""
    rates = -torch.tensor([0.2, 0.1, 0.05, 0.02])[:, None].expand(4, 8)  # (heads, blocks), one rate per head
    freqs = (1.0 / 10000 ** (torch.arange(8) / 8)).expand(4, 8)
    return Encoding(lp.Generator(rates, freqs, [1] * 8, complex=[True] * 8), name="head decays")


def decode(model, x, prefill, pos0=0):
    """Logits of each token after ``prefill``, decoded one token per step through the cache."""
    n = x.shape[1]
    position_ids = torch.arange(pos0, pos0 + n)[None]
    cache = DynamicCache()
    with torch.no_grad():
        out = [model(x[:, :prefill], position_ids=position_ids[:, :prefill], cache=cache).logits[:, -1]]
        for i in range(prefill, n - 1):
            out.append(model(x[:, i:i + 1], position_ids=position_ids[:, i:i + 1], cache=cache).logits[:, -1])
    return torch.stack(out, 1), cache  # (B, n - prefill, vocab): the logits at tokens prefill-1 … n-2


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("pos0, prefill", [(0, 40), *(pytest.param(*c, marks=pytest.mark.slow) for c in [(10**6, 40), (0, 300)])])
def test_decode_steps_equal_the_full_forward_past_the_budget(name, pos0, prefill, monkeypatch):
    """Prefill 40 (within every budget) or 300 (wider than all but RetNet's: one origin per block of
    queries), then one token per step past the budget."""
    enc = ENCODINGS[name]()
    model = patch_model(tiny(), enc)
    x = ids(340)
    rebuilds = []
    real = hf_decode._rebuild
    monkeypatch.setattr(hf_decode, "_rebuild", lambda *a: rebuilds.append(a[5]) or real(*a))
    steps, cache = decode(model, x, prefill, pos0)
    rebuilds = list(rebuilds)
    at = torch.arange(pos0, pos0 + x.shape[1] - 1)[None]
    with torch.no_grad():  # without a cache: liepos.attention, re-centred per block, the independent reference
        full = model(x[:, :-1], position_ids=at, use_cache=False).logits[:, prefill - 1:]
        ref = patch_model(tiny().double(), enc)(x[:, :-1], position_ids=at, use_cache=False).logits[:, prefill - 1:]
    # decoding is as close to the float64 model as the full forward is (the Jordan block's couplings
    # cost both about span·eps, docs/guide/precision.md), and equals the full forward
    err_step, err_full = (steps - ref).abs().max(), (full - ref).abs().max()
    assert err_step <= 2 * err_full + 2e-5
    assert (steps - full).abs().max() < (1e-3 if name == "jordan" else 5e-5)
    span = hf_decode.budget(enc, torch.float32)
    layers = len(model.model.layers)
    assert cache.__dict__[hf_decode.STORES].keys() == set(range(layers))  # every layer decoded from its store
    # the stored keys are encoded afresh only when a query leaves the budget around the origin (placed a
    # span ahead of the query that moved it): about once per two spans per layer, never once per step
    assert len(rebuilds) <= layers * (math.ceil(x.shape[1] / span) + 2)
    if span < x.shape[1] - prefill:
        assert rebuilds, "the test must leave the budget at least once"


@pytest.mark.parametrize("name", ["xpos", "alibi", "retnet"])
def test_a_step_encodes_one_key_per_layer(name, monkeypatch):
    """Counted, not timed: each decode step encodes the new key only (one row per layer), the query
    once per layer, and nothing re-encodes the cache while the queries stay within the budget."""
    model = patch_model(tiny(layers=3), ENCODINGS[name]())
    x = ids(60)
    rows = {"key": 0, "query": 0, "whole": 0}
    real_keys, real_encode = hf_decode._encode_keys, hf_decode._encode
    monkeypatch.setattr(hf_decode, "_encode_keys",
                        lambda layer, enc, kn, *a: rows.__setitem__("key", rows["key"] + kn.shape[-2])
                        or real_keys(layer, enc, kn, *a))
    monkeypatch.setattr(hf_decode, "_encode",
                        lambda layer, enc, x, rel, side, *a: rows.__setitem__(side, rows[side] + x.shape[-2])
                        or real_encode(layer, enc, x, rel, side, *a))
    real_key = Encoding.key
    monkeypatch.setattr(Encoding, "key", lambda self, k, *a, **kw: rows.__setitem__("whole", rows["whole"] + 1)
                        or real_key(self, k, *a, **kw))
    cache = DynamicCache()
    with torch.no_grad():
        model(x[:, :20], cache=cache)
        for _ in rows:
            rows[_] = 0
        for i in range(20, 40):
            model(x[:, i:i + 1], cache=cache)
    assert rows["key"] == 3 * 20  # one new key per layer and step
    assert rows["query"] <= 3 * 20  # one query per layer and step (ALiBi's content query is HF's own)
    assert rows["whole"] == 0  # no call of Encoding.key over the cache



def test_far_batch_with_left_padding_generates_as_without_cache():
    model = patch_model(tiny(), lp.xpos(16, scale_base=4.0, layout="half"))
    x = ids(30, batch=2)
    mask = torch.ones_like(x)
    mask[0, :7] = 0  # row 0 left-padded
    gen = dict(max_new_tokens=12, do_sample=False, attention_mask=mask)
    with torch.no_grad():
        cached = model.generate(x, **gen)
        uncached = model.generate(x, use_cache=False, **gen)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("name", ["xpos", "alibi"])
def test_beam_search_reorders_the_cache_and_the_store_follows(name):
    model = patch_model(tiny(), ENCODINGS[name]())
    x = ids(24)
    gen = dict(max_new_tokens=8, do_sample=False, num_beams=3, num_return_sequences=3)
    with torch.no_grad():
        cached = model.generate(x, **gen)
        uncached = model.generate(x, use_cache=False, **gen)
    assert torch.equal(cached, uncached)


def test_a_cropped_cache_decodes_as_the_full_forward():
    model = patch_model(tiny(), lp.xpos(16, scale_base=4.0, layout="half"))
    x = ids(50)
    cache = DynamicCache()
    with torch.no_grad():
        model(x[:, :30], cache=cache)
        for i in range(30, 40):
            model(x[:, i:i + 1], cache=cache)
        cache.crop(-5)  # back to 35 tokens (assisted decoding does this)
        steps = [model(x[:, i:i + 1], cache=cache).logits[:, -1] for i in range(35, 45)]
        full = model(x[:, :45], use_cache=False).logits[:, 35:45]
    assert (torch.stack(steps, 1) - full).abs().max() < 1e-4


@pytest.mark.parametrize("how", ["in place", "new storage", "another encoding"])
def test_a_changed_encoding_is_never_read_from_stale_keys(how):
    """Mutating or re-learning a parameter (in place: an optimizer step; or ``p.data = …``, which keeps
    torch's version counter) changes the decoded logits exactly as a fresh forward says. One layer, so
    that the cached keys do not depend on outputs computed under the old encoding."""
    enc = lp.xpos(16, layout="half")
    model = patch_model(tiny(layers=1), enc)
    x = ids(40)
    cache = DynamicCache()
    with torch.no_grad():
        model(x[:, :30], cache=cache)
        before = model(x[:, 30:31], cache=cache).logits
        if how == "in place":
            enc.generator.freqs.mul_(1.5)
        elif how == "new storage":
            enc.generator.freqs.data = enc.generator.freqs.data * 1.5
        else:
            patch_model(model, lp.xpos(16, scale_base=64.0, layout="half"))
        step = model(x[:, 31:32], cache=cache).logits[:, -1]
        full = model(x[:, :32], use_cache=False).logits[:, -1]
    assert (step - full).abs().max() < 1e-4
    assert (before[:, -1] - full).abs().max() > 1e-3  # the change is visible at all


def test_version_follows_the_parameters():
    enc = lp.alibi(16, num_heads=4)
    q = torch.randn(1, 4, 3, 16)
    v0, a = enc.version, enc.query(q, torch.arange(3))
    assert enc.version is v0  # kept while nothing changed (no recomputation per call)
    with torch.no_grad():
        enc.query_slots.mul_(2.0)
    assert enc.version != v0 and not torch.equal(enc.query(q, torch.arange(3)), a)
    v1 = enc.version
    enc.key_slots.data = enc.key_slots.data * 2.0  # a new storage: the version counter stays
    assert enc.version != v1


@pytest.mark.parametrize("name", ["alibi", "xpos", "retnet"])
def test_non_finite_padding_keys_reach_no_query(name):
    """Left padding whose embedding is NaN: the padded keys are hidden from every query, so the
    decoded tokens are finite and equal the uncached ones (the store's select-masked form)."""
    model = patch_model(tiny(), ENCODINGS[name]())
    with torch.no_grad():
        model.model.embed_tokens.weight[0] = float("nan")  # the pad token
    x = ids(20, batch=2) % 127 + 1
    x[0, :5] = 0
    mask = torch.ones_like(x)
    mask[0, :5] = 0
    gen = dict(max_new_tokens=6, do_sample=False, attention_mask=mask, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(x, **gen)
        uncached = model.generate(x, use_cache=False, **gen)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("name", ["rope", "xpos", "jordan", "retnet"])
def test_a_step_matrix_equals_the_apply_at_its_position(name):
    """Mᵀ of a decode step, read from a cached window of them (built for 64 positions in one apply), is
    bit for bit the transform of the identity at that one position, on both sides, at far positions."""
    enc = lp.rope(16, layout="half") if name == "rope" else ENCODINGS[name]()
    c = enc.content_dim
    for p in (0.0, 63.0, 64.0, 1000.0, -7.0, 12345.0):
        pos = torch.tensor([[p]], dtype=torch.float64)
        for side in ("query", "key"):
            ft = enc._fast_tables(pos, side, torch.float32, False)
            want = lp._fast.apply_fast(torch.eye(c).expand(1, enc.num_heads or 1, c, c), ft)
            got = hf_decode.step_matrix(enc, pos, side, torch.float32, lambda ft=ft: ft)
            assert got.shape == (1, enc.num_heads or 1, c, c)
            # equal bit for bit (NaN where the scale overflows at a far position: in both alike)
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f"{p} {side}")
    x = torch.randn(2, enc.num_heads or 3, 1, c)
    pos = torch.tensor([[77.0]], dtype=torch.float64)
    m = hf_decode.step_matrix(enc, pos, "key", torch.float32, lambda: enc._fast_tables(pos, "key", torch.float32, False))
    assert torch.allclose(x @ m, enc.key(x, pos), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("how", ["in place", "new storage"])
def test_a_cached_step_matrix_follows_the_parameters(how):
    """The window of Mᵀ is keyed by the encoding's version: a parameter changed in place (an optimizer
    step) or given a new storage (``p.data = …``) is never read from the stale window."""
    enc = lp.xpos(16, layout="half")
    pos = torch.tensor([[130.0]], dtype=torch.float64)

    def matrix():
        return hf_decode.step_matrix(enc, pos, "query", torch.float32,
                                     lambda: enc._fast_tables(pos, "query", torch.float32, False))

    before = matrix().clone()
    assert torch.equal(matrix(), before)  # read from the window
    with torch.no_grad():
        if how == "in place":
            enc.generator.freqs.mul_(1.5)
        else:
            enc.generator.freqs.data = enc.generator.freqs.data * 1.5
    after = matrix()
    ft = enc._fast_tables(pos, "query", torch.float32, False)
    assert torch.equal(after, lp._fast.apply_fast(torch.eye(16).expand(1, 1, 16, 16), ft))
    assert not torch.equal(after, before)


def test_rope_decode_steps_read_their_matrices_from_a_window(monkeypatch):
    """The encoded-key path (RoPE): a decode step builds no Mᵀ of its own (one window per 64 steps), and
    the greedy tokens equal upstream's."""
    model = tiny()
    x = ids(20)
    with torch.no_grad():
        upstream = model.generate(x, max_new_tokens=70, do_sample=False)
    patch_model(model, None)
    hf_decode.MATRICES.clear()
    windows = []
    real = hf_decode._window_matrices
    monkeypatch.setattr(hf_decode, "_window_matrices", lambda enc, base, *a: windows.append(base) or real(enc, base, *a))
    with torch.no_grad():
        patched = model.generate(x, max_new_tokens=70, do_sample=False)
    assert torch.equal(patched, upstream)
    assert windows == [0, 64]  # steps at 20 … 88: two windows, every step's Mᵀ from one of them


def per_head_rates():
    """Per-head rates that differ from block to block (not one decay per head): per-head keys."""
    rates = -torch.linspace(0.01, 0.08, 4)[:, None] * torch.linspace(0.5, 1.5, 8)[None]  # (heads, blocks)
    freqs = (1.0 / 10000 ** (torch.arange(8) / 8)).expand(4, 8)
    return Encoding(lp.Generator(rates, freqs, [1] * 8, complex=[True] * 8), name="per-head")


@pytest.mark.parametrize("name", ["retnet", "per-head"])
def test_per_head_keys_over_grouped_heads(name):
    """4 query heads over 2 key/value heads. RetNet (one decay per head): the store keeps the keys
    rotated at HF's 2 heads and one decay factor per head and key; other per-head parameters: a key per
    query head. Neither keeps values of its own (HF's grouped values serve); every decoded step equals
    the full forward."""
    enc = ENCODINGS["retnet"]() if name == "retnet" else per_head_rates()
    model = patch_model(tiny(), enc)
    x = ids(60)
    steps, cache = decode(model, x, 40)
    with torch.no_grad():
        full = model(x[:, :-1], use_cache=False).logits[:, 39:]
    assert (steps - full).abs().max() < 5e-5
    st = cache.__dict__[hf_decode.STORES][0]
    assert "v" not in st.keys and not st.own_v
    if name == "retnet":
        assert st.keys.get("k").shape[1] == 2 and st.factor is not None and st.keys.get("scale").shape[1] == 4
    else:
        assert st.keys.get("k").shape[1] == 4 and st.factor is None


def test_grouped_and_factored_attention_equal_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 1, 16, generator=g), torch.randn(2, 4, 9, 16, generator=g)
    v = torch.randn(2, 2, 9, 8, generator=g)
    bias = torch.zeros(2, 1, 1, 9).masked_fill(torch.rand(2, 1, 1, 9, generator=g) < 0.3, -math.inf)
    bias[..., -1] = 0.0  # the query's own key is visible
    kr = torch.randn(2, 2, 9, 16, generator=g)  # keys at the 2 key heads, and per-head factors
    kf, qf = torch.rand(1, 4, 9, generator=g) + 0.5, torch.rand(1, 4, 1, generator=g) + 0.5
    per_head = kr.repeat_interleave(2, dim=1) * kf[..., None]  # the keys a per-head store would hold
    for b in (None, bias):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v.repeat_interleave(2, dim=1), attn_mask=b,
                                                                scale=0.3)
        assert torch.allclose(hf_decode._grouped(q, k, v, b, 0.3), want, atol=1e-6)
        want = torch.nn.functional.scaled_dot_product_attention(q * qf[..., None], per_head,
                                                                v.repeat_interleave(2, dim=1), attn_mask=b, scale=0.3)
        assert torch.allclose(hf_decode._factored_attention(q, kr, kf, qf, v, b, 0.3), want, atol=1e-6)


def test_factored_only_for_one_decay_per_head():
    assert hf_decode._factored(lp.retnet(16, num_heads=4), lp.retnet(16, num_heads=4).version) is not None
    for enc in (per_head_rates(), lp.xpos(16), lp.alibi(16, num_heads=4), custom_jordan()):
        assert hf_decode._factored(enc, enc.version) is None
    rot, rates = hf_decode._factored(lp.retnet(16, num_heads=4), lp.retnet(16, num_heads=4).version)
    enc, kx = lp.retnet(16, num_heads=4), torch.randn(1, 4, 5, 16, dtype=torch.float64)
    s = torch.arange(5, dtype=torch.float64) * 7 - 3
    want = enc.key(kx, s)  # G_h(s) k
    got = rot.key(kx, s) * torch.exp(-rates[None, :, None, None] * s[None, None, :, None])
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("dtype,T", [(torch.float64, 32), (torch.float32, 32), (torch.bfloat16, 32),
                                     (torch.float64, 1100), (torch.float32, 1100)])
def test_alibi_prefill_runs_the_causal_kernel_with_a_per_key_mask(dtype, T, monkeypatch):
    """A causal prefill under ALiBi takes the fused kernels with ``m_h (s − o)`` as a broadcast mask (no
    ``S × n`` bias): in one step, or (T = 1100, past one origin's span of ±512) in blocks of queries, each over the
    keys before it and its own. Its logits are those of the dense-bias path (float64: to rounding), and a
    decode step after it is the full forward's."""
    taken = []
    real = hf_decode._linear_prefill
    monkeypatch.setattr(hf_decode, "_linear_prefill", lambda *a: taken.append(real(*a)) or taken[-1])
    model = tiny().to(dtype)
    patch_model(model, lp.alibi(16, num_heads=4))
    x = ids(T + 8, batch=2 if T < 1024 else 1)  # blocks of queries take one row of times (hf_decode._blocks)
    with torch.no_grad():
        fast = model(x[:, :T]).logits
        blocks = T > 1024  # one origin holds the slots' span of ±512 (hf_decode.budget)
        assert len(taken) >= (4 if blocks else 2) and all(t is not None for t in taken)  # every block took it
        monkeypatch.setattr(hf_decode, "_linear_prefill", lambda *a: None)
        dense = model(x[:, :T]).logits
        tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
        assert float((fast - dense).abs().max()) <= tol * max(1.0, float(dense.abs().max()))
        monkeypatch.setattr(hf_decode, "_linear_prefill", real)
        out = model(x[:, : T - 1], use_cache=True)
        step = model(x[:, T - 1 : T], past_key_values=out.past_key_values).logits[:, -1]
    scale = max(1.0, float(dense.abs().max()))
    assert float((step.double() - dense[:, T - 1].double()).abs().max()) <= 10 * tol * scale


def test_alibi_two_rows_past_the_first_origin_then_a_step():
    """Two batch rows, a 699-token prompt (past the span one origin gives the slots' first encoding) and a
    decode step: the slot buffer, encoded first for one row of times, widens to the batch (it used to
    fail to grow: ``output with shape [1, 4, 513, 2] doesn't match [2, 4, 513, 2]``); the step equals the
    full forward."""
    model = tiny().to(torch.float64)
    patch_model(model, lp.alibi(16, num_heads=4))
    x = ids(700, batch=2)
    with torch.no_grad():
        out = model(x[:, :699], use_cache=True)
        step = model(x[:, 699:700], past_key_values=out.past_key_values).logits[:, -1]
        full = model(x).logits[:, -1]
    assert float((step - full).abs().max()) <= 1e-10
