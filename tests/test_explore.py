"""liepos.explore: the spec grammar, learned generators, the decoder, the tasks, training, evaluation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos.explore import from_spec, split_heads
from liepos.explore.eval_scaling import scaling_transform
from liepos.explore.evaluate import evaluate
from liepos.explore.learned import COUPLING_RANGE, LearnedGenerator, snapshot
from liepos.explore.model import Decoder, ModelConfig
from liepos.explore.spec import SpecEncoding, decoder_entries, parse_part
from liepos.explore.sweep import learned
from liepos.explore.tasks import (
    IGNORE,
    CopyTask,
    CountTask,
    LookupTask,
    RecallTask,
    make_task,
)
from liepos.explore.train import TrainConfig, train_run


# ---------------------------------------------------------------------- the spec grammar
@pytest.mark.parametrize("spec", ["rope", "alibi", "xpos", "nope", "decay", "jordan3", "jordan5", "retnet",
                                  "growth", "decay:0.01", "xpos:scale=256", "jordan:size=4:rate=-0.1",
                                  "rope+decay", "rope+alibi", "alibi+jordan3", "decay+xpos+nope", "learn",
                                  "learn:rope", "learn:decay", "learn:jordan3", "rope+learn:jordan2+alibi"])
def test_every_spec_builds_and_attends(spec):
    enc = from_spec(spec, 16, 4)
    assert enc.content_dim == 16 and enc.name == spec
    q, k, v = torch.randn(3, 1, 4, 40, 16, dtype=torch.float64)
    assert torch.allclose(lp.attention(q, k, v, enc), lp.attention_reference(q, k, v, enc), atol=1e-9)


@pytest.mark.parametrize("name", sorted(decoder_entries()))
def test_a_bare_name_is_the_catalogue_entry(name):
    """The grammar resolves through the one registry: ``name`` is ``CATALOGUE[name].build(dim, heads)``."""
    part = parse_part(name)
    assert part.name == name and not part.options
    got, want = part.build(16, 2), lp.CATALOGUE[name].build(16, 2)
    assert torch.equal(got.generator.exp(5.0), want.generator.exp(5.0))


@pytest.mark.parametrize("name", sorted(set(lp.CATALOGUE) - set(decoder_entries())))
def test_a_several_axes_entry_is_refused_by_name(name):
    """The decoder's positions are token indices: axial RoPE / M-RoPE are refused, naming the entry."""
    assert lp.CATALOGUE[name].build(16, 1).num_axes is not None
    with pytest.raises(ValueError, match=name):
        parse_part(name).build(16, 2)


@pytest.mark.parametrize("spec, name, options", [
    ("decay:0.01", "decay", {"rate": 0.01}), ("growth:0.02", "growth", {"rate": 0.02}),
    ("xpos:scale=256", "xpos", {"scale_base": 256}), ("rope:500000", "rope", {"base": 500000}),
    ("jordan4", "jordan", {"size": 4}), ("jordan:size=2:rate=-0.1", "jordan", {"size": 2, "rate": -0.1}),
    ("retnet:base=100", "retnet", {"base": 100}),
])
def test_options_are_the_catalogue_options(spec, name, options):
    got = from_spec(spec, 16, 2)
    want = lp.CATALOGUE[name].build(16, 2, **options)
    assert torch.equal(got.generator.exp(7.0), want.generator.exp(7.0))


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_jordan_sizes(size):
    c = lp.classify(from_spec(f"jordan{size}", 20, 1))
    assert c.counts["polynomial"] == 20 // size and all(n == size for _, _, n in c.blocks[: 20 // size])


def test_growth_is_built_only_when_named_and_classified_as_growth():
    c = lp.classify(from_spec("growth:0.02", 8, 1))
    assert c.counts["growth"] == 8 and all(r == pytest.approx(0.02) for r, _, _ in c.blocks)
    with pytest.raises(ValueError, match="rate"):
        from_spec("growth:-0.1", 8, 1)


def test_sum_is_the_direct_sum_of_the_parts():
    enc = from_spec("rope+decay", 16, 1)
    rope, dec = from_spec("rope", 8, 1), from_spec("decay", 8, 1)
    assert torch.allclose(enc.generator.exp(3.0), torch.block_diag(rope.generator.exp(3.0), dec.generator.exp(3.0)))
    assert sum(enc.generator.complex) == 4  # 4 rotation planes, then 8 fading dims


def test_alibi_bias_is_press_et_al():
    """score = q·k/√d − m_h (t − s): the bias is added after the 1/√d scaling."""
    H, d, S = 4, 8, 12
    q, k, v = torch.randn(3, 2, H, S, d, dtype=torch.float64)
    out = lp.attention(q, k, v, from_spec("alibi", d, H))  # what the decoder calls
    t = torch.arange(S, dtype=torch.float64)
    bias = -lp.alibi_slopes(H)[:, None, None] * (t[:, None] - t[None, :])  # (H, S, S)
    s = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
    s = s.masked_fill(t[:, None] < t[None, :], -math.inf)
    assert torch.allclose(out, torch.softmax(s, -1) @ v, atol=1e-10)


@pytest.mark.parametrize("spec", ["alibi", "rope+alibi", "retnet+alibi", "rope"])
def test_a_batch_equals_one_sequence_at_a_time(spec):
    enc = from_spec(spec, 16, 4)
    q, k, v = torch.randn(3, 3, 4, 70, 16, dtype=torch.float64)
    ref = torch.cat([lp.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], enc) for i in range(3)])
    assert torch.allclose(lp.attention(q, k, v, enc), ref, atol=1e-12)


@pytest.mark.parametrize("spec, message", [
    ("roap", "unknown encoding 'roap'"), ("alibi+alibi", "more than one part with slots"),
    ("jordan9+rope", "jordan|size|smaller"), ("alibi:3", "takes no bare value"),
    ("rope:bass=3", "bad option for 'rope'.*base"), ("learn:alibi", "slots"), ("learn:growth", "decay side"),
    ("decay:rate=1:rate=2", "twice"), ("schedule:ssmax", "per-layer schedule row"),
])
def test_bad_specs_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        from_spec(spec, 8, 2)


def test_head_groups():
    assert split_heads("rope|alibi", 4) == [(0, 2, "rope"), (2, 4, "alibi")]
    with pytest.raises(ValueError, match="head groups"):
        split_heads("rope|alibi|nope", 2)
    with pytest.raises(ValueError, match="schedule row, not head groups"):
        split_heads("schedule:rnope_swa", 4)
    with pytest.raises(ValueError, match="'schedule:ssmax' is a per-layer schedule row"):
        split_heads("rope|schedule:ssmax", 4)  # a schedule is the whole decoder's, never one group's


# ---------------------------------------------------------------------- learned generators
def _randomise(module: torch.nn.Module, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(0.0, 30.0), seed=st.integers(0, 2**16), start=st.sampled_from(["rope", "decay", "jordan3",
                                                                                     "xpos", "retnet", "nope"]))
def test_learned_generators_stay_in_the_family_whatever_the_parameters(scale, seed, start):
    """Any parameter values: rates ≤ 0 (never growth), frequencies ≥ 0, couplings inside (1/C, C)."""
    m = LearnedGenerator(from_spec(start, 12, 3), 3)
    _randomise(m, scale, seed)
    enc = m()  # constructs: finite, invertible basis, no growth
    c = lp.classify(enc)
    assert c.counts["growth"] == 0 and bool((m.rates() <= 0).all()) and bool((m.freqs() >= 0).all())
    cpl = m.couplings()
    assert bool(((cpl >= 1 / COUPLING_RANGE) & (cpl <= COUPLING_RANGE)).all())


@pytest.mark.parametrize("spec", ["learn:jordan3", "learn", "rope+learn:jordan2+alibi", "learn:rope|learn:decay"])
def test_learned_attention_is_the_basis_identity_and_trains_every_parameter(spec):
    """The decoder attends with q·p, k/p and the canonical blocks: ``(Pq)ᵀ e^{uJ} (P⁻¹k) = qᵀ P e^{uJ} P⁻¹ k``."""
    torch.manual_seed(0)
    groups = split_heads(spec, 2)
    for a, b, g in groups:
        m = SpecEncoding(g, 16, b - a)
        _randomise(m, 0.7, 1)
        q, k, v = torch.randn(3, 2, b - a, 30, 16, dtype=torch.float64)
        enc, p = m.canonical()
        qg, kg = (q, k) if p is None else (q * p, k / p)
        out = lp.attention(qg, kg, v, enc, causal=True)
        ref = lp.attention_reference(q, k, v, m(), causal=True)  # the dense reference, basis P included
        assert torch.allclose(out, ref, atol=1e-10)
        out.square().sum().backward()
        for name, par in m.named_parameters():
            assert par.grad is not None and bool(par.grad.abs().sum() > 0), name


def test_snapshot_counts_are_classify_of_the_learned_blocks():
    m = LearnedGenerator(from_spec("rope+decay+jordan2", 16, 2), 2)
    snap = snapshot(m, tol=1e-3)
    assert snap["counts"] == dict(lp.classify(m(), tol=1e-3).counts)
    assert sum(snap["counts"].values()) == sum(len(h) for h in snap["blocks"])  # every block has a row
    assert snap["counts"]["polynomial"] == 2 * sum(1 for n in m.sizes if n > 1)  # two heads


# ---------------------------------------------------------------------- the model
def test_default_model_is_about_a_million_parameters():
    n = Decoder(ModelConfig(), "rope").num_parameters()
    assert 0.8e6 < n < 1.2e6


def test_decoder_is_causal_and_pluggable_per_layer_and_head():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=16, d_model=32, layers=3, heads=4)
    m = Decoder(cfg, ["rope", "alibi|learn:decay", (lp.nope(8), "jordan3")])
    assert [len(b.groups) for b in m.blocks] == [1, 2, 2]
    x = torch.randint(16, (2, 20))
    y = m(x)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 16
    assert torch.allclose(m(x2)[:, :10], y[:, :10], atol=1e-6)  # the future never leaks back
    assert not torch.allclose(m(x2)[:, 10:], y[:, 10:])


# ---------------------------------------------------------------------- evaluation-time scaling
@pytest.mark.parametrize("name", ["linear", "ntk", "yarn", "llama3", "dynamic"])
def test_scaling_applies_past_the_training_length_with_factor_length_over_train_length(name):
    T = 32
    apply = scaling_transform(name, T)
    rope = lp.rope(16)
    assert apply(rope, T) is rope  # within the training length: unchanged
    alibi = lp.alibi(16, num_heads=2)
    assert apply(alibi, 4 * T) is alibi  # no rotation block: unchanged
    want = lp.scaling.scale(rope, name, factor=4.0, **({} if name in ("linear", "ntk") else
                                                        {"original_max_position_embeddings": T}))
    want = want.at_length(4 * T)
    got = apply(rope, 4 * T)
    assert torch.equal(got.generator.freqs, want.generator.freqs) and got.logit_scale == want.logit_scale
    fixed = scaling_transform(f"{name}:2", T)(rope, 4 * T)  # a given factor wins
    assert not torch.equal(fixed.generator.freqs, got.generator.freqs)


def test_linear_scaling_at_eval_is_position_interpolation(one_thread):
    """PI at 4× is the model reading positions t/4: checked on the decoder's own attention."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 64, 16, dtype=torch.float64)
    got = lp.attention(q, k, v, scaling_transform("linear", 16)(lp.rope(16), 64), causal=True)
    t = torch.arange(64, dtype=torch.float64) / 4
    want = lp.attention(q, k, v, lp.rope(16), positions=t, key_positions=t, causal=True)
    assert torch.allclose(got, want, atol=1e-10)


# ---------------------------------------------------------------------- tasks
def test_tasks_targets():
    g = torch.Generator().manual_seed(0)
    x, y = CopyTask(lag=3).sample(g, 4, 20)
    assert (y[:, :3] == IGNORE).all() and torch.equal(y[:, 3:], x[:, :-3])
    x, y = CountTask(window=4).sample(g, 2, 30)
    for t in range(30):
        assert int(y[0, t]) == int((x[0, max(0, t - 3) : t + 1] == x[0, t]).sum())
    x, y = RecallTask(keys=4).sample(g, 2, 40)
    for t in range(0, 40, 2):
        if y[0, t] != IGNORE:
            assert x[0, t] in x[0, :t : 2] and y[0, t] == x[0, t + 1]


def test_lookup_targets_are_the_value_paired_earlier():
    task = LookupTask(keys=4, values=5)
    K, V = 4, 5
    x, y = task.sample(torch.Generator().manual_seed(1), 6, 50)
    scored = 0
    for b in range(6):
        pairs = {}
        for t in range(50):
            tok = int(x[b, t])
            if tok < K * V:  # a pair token (k, v)
                k, v = divmod(tok, V)
                assert pairs.setdefault(k, v) == v  # one value per key in a sequence
                assert y[b, t] == IGNORE
            else:
                k = tok - K * V
                want = K * V + K + pairs[k] if k in pairs else IGNORE
                assert int(y[b, t]) == want
                scored += want != IGNORE
    assert scored > 20


def test_lm_corpus_is_fixed_and_recorded():
    a, b = make_task("lm"), make_task("lm")
    assert a.sha256 == b.sha256 and len(a.files) >= 10
    info = a.describe()
    assert info["source"] == "python-stdlib" and info["train_bytes"] > 100_000
    x, y = a.sample(torch.Generator().manual_seed(0), 2, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_lm_learned_bar_is_the_byte_entropy(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("ab" * 500)
    t = make_task("lm", str(p))
    assert t.describe()["source"] == str(p)
    assert t.unigram_entropy() == pytest.approx(math.log(2))  # two equally frequent bytes
    assert learned(t, {"loss": 0.5, "acc": 0.0}) and not learned(t, {"loss": 0.7, "acc": 1.0})
    assert learned(make_task("lookup"), {"loss": 9.0, "acc": 0.9}) and not learned(
        make_task("lookup"), {"loss": float("nan"), "acc": 1.0})


# ---------------------------------------------------------------------- training and evaluation
TINY = dict(task="copy", d_model=16, layers=1, heads=2, steps=6, batch_size=8, train_len=16,
            eval_lens=[16, 32], eval_tokens=256, warmup=2)


def test_training_is_deterministic_and_snapshots_learned_generators(one_thread):
    cfg = TrainConfig(**TINY, snapshots=3)
    task = make_task("copy")
    m1, r1 = train_run(cfg, task, "rope|learn:jordan2", 3, progress=False)
    m2, r2 = train_run(cfg, task, "rope|learn:jordan2", 3, progress=False)
    assert r1["train_loss"] == r2["train_loss"] and r1["diverged"] is None
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert [s["step"] for s in r1["trajectory"]] == [0, 2, 4, 6]
    first, last = r1["trajectory"][0]["generators"][0], r1["trajectory"][-1]["generators"][0]
    assert first["start"] == "jordan2" and first["blocks"] != last["blocks"]  # it trained
    ev = evaluate(m1, task, [16, 32], 8, 16)
    assert set(ev) == {"16", "32"} and 0 <= ev["32"]["acc"] <= 1 and not ev["32"]["diverged"]


def test_divergence_is_a_recorded_result_not_a_crash(one_thread):
    """Growth at rate 1 overflows past ~700 tokens (e^{λu} beyond float64): the length is marked diverged."""
    cfg = TrainConfig(**TINY)
    task = make_task("copy")
    model, rec = train_run(cfg, task, "growth:1", 0, progress=False)
    ev = evaluate(model, task, [16, 1024], 2, 16)
    assert ev["1024"]["diverged"] and math.isnan(ev["1024"]["loss"])
    assert not ev["16"]["diverged"] and math.isfinite(ev["16"]["loss"])
