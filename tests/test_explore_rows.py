"""The explorer's design-space rows beyond the catalogue: per-layer schedules (RNoPE-SWA, SWAN-GPT, Llama 4,
SmolLM3), Scalable-Softmax with s learned per head, clipped RoPE, and learned generators' per-head spectra.

Each row's block is the library's schedule layer exactly (full forward and decode through a KVCache), its
learned parameters train, resume and are recorded, and a quick run of each goes end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

import liepos as lp
from helpers import explore_main
from liepos.explore.learned import LearnedGenerator
from liepos.explore.model import Decoder, ModelConfig, layer_specs
from liepos.explore.schedule_rows import (
    ROW_DEFAULTS,
    LearnedScalableSoftmax,
    check_row,
    parse_schedule_row,
    schedule_layers,
)
from liepos.explore.spec import from_spec, split_heads
from liepos.explore.sweep import run_path
from liepos.explore.tasks import make_task
from liepos.explore.train import TrainConfig, temperature_record, train_run
from liepos.schedule import SCHEDULES, LayerSpec, Schedule
from liepos.temperature import ScalableSoftmax

F64 = torch.float64
NEW_ROWS = ["schedule:rnope_swa", "schedule:ssmax", "cope_clipped"]
TINY = {"task": "copy", "d_model": 16, "layers": 1, "heads": 2, "steps": 8, "batch_size": 8, "train_len": 16,
        "eval_lens": [16, 32], "eval_tokens": 256, "warmup": 2}


# ---------------------------------------------------------------------- the grammar
@pytest.mark.parametrize("row", [*NEW_ROWS, *(f"schedule:{n}" for n in SCHEDULES), "schedule:rnope_swa:window=8",
                                 "schedule:ssmax:s=0.5:learn=0", "schedule:swan_gpt:alpha=0.5:train_length=32"])
@pytest.mark.parametrize("layers, heads", [(1, 2), (2, 4)])
def test_every_new_row_builds_for_the_study_shapes(row, layers, heads):
    check_row(row, 16, layers, heads)


@pytest.mark.parametrize("row, message", [
    ("schedule:rnope", "unknown schedule 'rnope'"),
    ("schedule:rnope_swa:8", "a schedule option is key=value, got '8'"),
    ("schedule:rnope_swa:window=8:window=4", "option 'window' is given twice"),
    ("schedule:rnope_swa:learn=1", "only ssmax has a temperature to learn"),
    ("schedule:ssmax:learn=2", "learn must be 0 or 1, got 2"),
    ("schedule:rnope_swa:windw=8", "bad option in 'schedule:rnope_swa:windw=8'"),
    ("schedule:rnope_swa:window=0", "window"),
    ("schedule:ssmax:s=-1", "s"),
    ("rope_clipped", "unknown encoding 'rope_clipped'"),  # clipped RoPE is cope_clipped
    ("learn:per_head", "unknown encoding 'per_head'"),  # learn:rope's spectrum is per head already
])
def test_bad_rows_are_refused_by_name(row, message):
    with pytest.raises(ValueError) as err:
        check_row(row, 16, 2, 4)
    assert message in str(err.value), str(err.value)


def test_a_schedule_row_is_not_head_groups():
    with pytest.raises(ValueError, match="per-layer schedule row, not head groups"):
        split_heads("schedule:rnope_swa", 4)


def test_the_explorer_defaults_sit_under_the_rows_options():
    assert parse_schedule_row("schedule:rnope_swa") == ("rnope_swa", {"every": 2, "window": 16})
    assert parse_schedule_row("Schedule:RNoPE_SWA:every=3") == ("rnope_swa", {"every": 3, "window": 16})
    assert set(ROW_DEFAULTS) == set(SCHEDULES)  # every layout has the explorer's sizes


def test_a_layer_pattern_goes_across_the_heads_of_a_shallower_model():
    one = schedule_layers("schedule:rnope_swa", 1, 8, 4)
    assert len(one) == 1 and isinstance(one[0], tuple)
    assert [(s.encoding.name, s.window, s.encoding.generator.num_heads) for s in one[0]] == [
        ("rope", 16, None), ("nope", None, None)]
    two = schedule_layers("schedule:rnope_swa", 2, 8, 4)
    assert [(s.encoding.name, s.window) for s in two] == [("rope", 16), ("nope", None)]
    four = schedule_layers("schedule:llama4", 4, 8, 2)
    assert [(s.encoding.name, s.chunk, s.temperature is not None) for s in four] == [
        ("rope", 16, False), ("nope", None, True)] * 2
    with pytest.raises(ValueError, match="3 heads do not split into 2 groups; use --layers 2"):
        schedule_layers("schedule:rnope_swa", 1, 8, 3)
    block = Decoder(ModelConfig(vocab_size=8, d_model=16, layers=1, heads=4), "schedule:rnope_swa").blocks[0]
    assert block.spans == [(0, 2), (2, 4)] and [s.window for s in block.layers] == [16, None]


# ---------------------------------------------------------------------- the block is the library's layer
def _block_reference(blk, x: torch.Tensor, decode_from: int | None) -> torch.Tensor:
    """Block ``blk`` rebuilt from :meth:`liepos.Schedule.attention` per head group (through a KVCache token by
    token after ``decode_from`` when given): the layer liepos' schedules define, nothing of the explorer's."""
    B, S, D = x.shape
    qkv = blk.qkv(blk.ln1(x)).view(B, S, 3, blk.heads, blk.head_dim)  # (B, S, 3, H, hd)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, S, hd)
    outs = []
    for (a, b), layer in zip(blk.spans, blk.layers):
        sch = Schedule([layer])
        qg, kg, vg = q[:, a:b], k[:, a:b], v[:, a:b]
        if decode_from is None:
            outs.append(sch.attention(0, qg, kg, vg))
            continue
        cache = lp.KVCache()
        parts = [sch.attention(0, qg[:, :, :decode_from], kg[:, :, :decode_from], vg[:, :, :decode_from], cache=cache)]
        for i in range(decode_from, S):
            parts.append(sch.attention(0, qg[:, :, i : i + 1], kg[:, :, i : i + 1], vg[:, :, i : i + 1], cache=cache))
        outs.append(torch.cat(parts, 2))
    y = torch.cat(outs, 1).transpose(1, 2).reshape(B, S, D)  # (B, H, S, hd) -> (B, S, D)
    x = x + blk.proj(y)
    return x + blk.mlp(blk.ln2(x))


@pytest.mark.parametrize("row", ["schedule:rnope_swa:window=5", "schedule:ssmax", "schedule:swan_gpt:window=3",
                                 "schedule:llama4:chunk=6:floor_scale=4", "schedule:smollm3"])
@pytest.mark.parametrize("layers", [1, 2])
def test_each_block_is_the_schedules_layer_full_and_decoded(row, layers):
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, layers=layers, heads=2), row).double()
    for blk in model.blocks:
        for p in blk.temperatures.parameters():  # learned s away from its start, per head
            with torch.no_grad():
                p.add_(torch.tensor([0.3, -0.2], dtype=F64)[: p.numel()])
    x = torch.randn(2, 20, 16, dtype=F64)
    for blk in model.blocks:
        got = blk(x)
        assert (got - _block_reference(blk, x, None)).abs().max() < 1e-12, row
        assert (got - _block_reference(blk, x, 7)).abs().max() < 1e-12, row
        x = got


def test_a_windowed_head_never_sees_past_its_window():
    """RNoPE-SWA's RoPE heads read only the last 16 tokens at every length; its NoPE heads read them all."""
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, layers=1, heads=2), "schedule:rnope_swa").double()
    blk = model.blocks[0]
    seen = {}
    x = torch.randn(1, 64, 16, dtype=F64, requires_grad=True)
    qkv = blk.qkv(blk.ln1(x)).view(1, 64, 3, 2, 8).permute(2, 0, 3, 1, 4)  # each (1, H, S, hd)
    q, k, v = qkv
    for g, ((a, b), layer) in enumerate(zip(blk.spans, blk.layers)):
        out = Schedule([layer]).attention(0, q[:, a:b], k[:, a:b], v[:, a:b])  # (1, 1, S, hd)
        (grad,) = torch.autograd.grad(out[0, 0, 63].sum(), x, retain_graph=True)
        reach = (grad[0].abs().sum(-1) > 0).nonzero().flatten()
        seen[g] = int(63 - reach.min())
    assert seen == {0: 15, 1: 63}


# ---------------------------------------------------------------------- Scalable-Softmax's learned s
def test_learned_ssmax_is_the_reference_temperature_and_trains_per_layer_and_head():
    T = LearnedScalableSoftmax(0.43, 2)
    with torch.no_grad():
        T.raw_s.copy_(torch.log(torch.tensor([0.5, 1.5], dtype=F64)))
    t, n = torch.zeros(1, 3, dtype=F64), torch.tensor([[[1.0, 4.0, 9.0]]], dtype=F64)
    assert torch.allclose(T.factor(t, n), ScalableSoftmax([0.5, 1.5]).factor(t, n), atol=0, rtol=1e-15)
    assert torch.allclose(T.factor(t, n)[0, :, 2], torch.tensor([0.5, 1.5], dtype=F64) * math.log(9.0))
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, layers=2, heads=2), "schedule:ssmax")
    temps = [m for m in model.modules() if isinstance(m, LearnedScalableSoftmax)]
    assert len(temps) == 2 and temps[0].raw_s is not temps[1].raw_s  # one s per layer, per head
    assert all(torch.allclose(m.s(), torch.full((2,), 0.43, dtype=F64)) for m in temps)
    ids = {id(p) for p in model.parameters()}
    assert all(id(m.raw_s) in ids for m in temps)
    model(torch.randint(0, 11, (2, 12))).logsumexp(-1).sum().backward()
    for m in temps:
        assert m.raw_s.grad is not None and bool((m.raw_s.grad != 0).all())
    fixed = Decoder(ModelConfig(vocab_size=11, d_model=16, layers=2, heads=2), "schedule:ssmax:learn=0")
    assert not any(isinstance(m, LearnedScalableSoftmax) for m in fixed.modules())
    assert all(isinstance(s.temperature, ScalableSoftmax) for s in layer_specs("schedule:ssmax:learn=0",
                                                                               fixed.config))


def test_learned_ssmax_is_recorded_after_training(one_thread):
    """Its s moves in training and the run file's record is the model's s (resuming it: test_explore_study)."""
    m0, _ = train_run(TrainConfig(**TINY), make_task("copy"), "schedule:ssmax", 0, progress=False)
    rec = temperature_record(m0)
    assert [(r["layer"], r["group"], len(r["s"])) for r in rec] == [(0, 0, 2)]
    (T,) = [m for m in m0.modules() if isinstance(m, LearnedScalableSoftmax)]
    assert rec[0]["s"] == [float(v) for v in T.s().detach()] and all(s != 0.43 for s in rec[0]["s"])


# ---------------------------------------------------------------------- clipped RoPE, per-head spectra
def test_clipped_rope_is_cope_clipped_the_hann_taper_of_rope():
    """CoPE's clipped RoPE: the slowest 20 of 64 planes (5 of a 32-dim head's 16) tapered by ½(1 + cos(πj/(n − 1)))."""
    enc = from_spec("cope_clipped", 32)
    assert torch.equal(enc.generator.freqs, lp.scaling.clipped(lp.rope(32), clip=5).generator.freqs)
    w0, w = lp.rope(32).generator.freqs.flatten(), enc.generator.freqs.flatten()
    taper = torch.tensor([0.5 * (1 + math.cos(math.pi * j / 4)) for j in range(5)], dtype=F64)
    assert torch.equal(w[:11], w0[:11]) and torch.allclose(w[11:], w0[11:] * taper, rtol=1e-15, atol=0)
    assert float(w[-1]) == 0.0


def test_learn_rope_learns_a_spectrum_per_head():
    """AdaRoPE-like per-head spectra: learn:rope's rates and frequencies are (heads, blocks) parameters, a
    loss on one head moves that head's row only, and training leaves the heads apart."""
    model = Decoder(ModelConfig(vocab_size=11, d_model=16, layers=1, heads=2), "learn:rope")
    (gen,) = [m for m in model.modules() if isinstance(m, LearnedGenerator)]
    assert gen.raw_freq.shape == (2, 4) and gen.raw_rate.shape == (2, 4)
    w0 = lp.rope(8).generator.freqs.flatten().to(F64)
    assert all(torch.allclose(gen.freqs()[h], w0, rtol=1e-15, atol=0) for h in range(2))  # started at RoPE
    enc = gen()
    q, k = torch.randn(1, 2, 6, 8, dtype=F64), torch.randn(1, 2, 6, 8, dtype=F64)
    lp.attention(q, k, k, enc, causal=True)[:, 0].sum().backward()  # head 0's output only
    assert bool((gen.raw_freq.grad[0] != 0).all()) and bool((gen.raw_freq.grad[1] == 0).all())
    _, rec = train_run(TrainConfig(**TINY), make_task("copy"), "learn:rope", 0, progress=False)
    final = rec["trajectory"][-1]["generators"][0]["blocks"]
    assert final[0] != final[1]  # two heads, two spectra


# ---------------------------------------------------------------------- end to end
ARGV = ["--steps", "4", "--batch-size", "8", "--d-model", "16", "--heads", "2", "--train-len", "16",
        "--eval-lens", "16,32", "--eval-tokens", "256", "--threads", "1", "--no-progress", "--seed", "0"]


@pytest.mark.parametrize("layers", ["1", "2"])
def test_each_new_row_runs_through_the_explorer_with_every_map(layers, capsys, tmp_path):
    maps = ",".join(lp.scaling.SCALINGS)
    code, err, _ = explore_main([*ARGV, "--task", "passkey", "--layers", layers, "--encodings", ",".join(NEW_ROWS),
                          "--eval-scaling", maps, "--out", str(tmp_path)], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    for row in NEW_ROWS:
        run = json.loads(run_path(tmp_path, row, 0).read_text())
        assert math.isfinite(run["eval"]["32"]["loss"]) and set(run["eval_scaled"]) == set(lp.scaling.SCALINGS)
        assert row in results["summary"]
        assert (run["learned_temperature"] is not None) == (row == "schedule:ssmax")
    assert (tmp_path / "map.png").exists() and (tmp_path / "loss_vs_length.png").exists()
    ssmax = json.loads(run_path(tmp_path, "schedule:ssmax", 0).read_text())["learned_temperature"]
    assert len(ssmax) == int(layers) and all(len(r["s"]) == 2 for r in ssmax)


def test_a_row_that_cannot_split_its_heads_is_refused_before_training(capsys, tmp_path):
    code, err, _ = explore_main([*ARGV, "--task", "copy", "--layers", "1", "--heads", "1", "--d-model", "16",
                          "--encodings", "schedule:rnope_swa", "--out", str(tmp_path)], capsys)
    assert code == 2 and "1 heads do not split into 2 groups" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_layer_spec_items_are_what_the_figures_classify():
    specs = layer_specs("schedule:rnope_swa", ModelConfig(d_model=16, layers=1, heads=2))
    assert all(isinstance(s, LayerSpec) for s in specs) and [s.encoding.name for s in specs] == ["rope", "nope"]
