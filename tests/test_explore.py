"""liepos.explore: spec strings, the decoder, the tasks, the quick sweep end to end, resume, DDP."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

import liepos as lp
from liepos.explore import from_spec, split_heads
from liepos.explore.model import Decoder, ModelConfig
from liepos.explore.tasks import IGNORE, CopyTask, CountTask, RecallTask, make_task
from liepos.explore.train import TrainConfig, evaluate, train_run


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------- specs
@pytest.mark.parametrize("spec", ["rope", "alibi", "xpos", "nope", "decay", "jordan3", "jordan5", "retnet",
                                  "rope+decay", "rope+alibi", "alibi+jordan3", "decay+xpos+nope"])
def test_every_spec_builds_and_attends(spec):
    enc = from_spec(spec, 16, 4)
    assert enc.content_dim == 16 and enc.name == spec
    q, k, v = torch.randn(3, 1, 4, 40, 16, dtype=torch.float64)
    out = lp.attention(q, k, v, enc)
    ref = lp.attention_reference(q, k, v, enc)
    assert torch.allclose(out, ref, atol=1e-9)


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


def test_bad_specs_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown encoding 'roap'"):
        from_spec("roap", 8)
    with pytest.raises(ValueError, match="more than one 'alibi'"):
        from_spec("alibi+alibi", 8, 2)
    with pytest.raises(ValueError, match="jordan9"):
        from_spec("jordan9+rope", 8)
    with pytest.raises(ValueError, match="head groups"):
        split_heads("rope|alibi|nope", 2)


# ---------------------------------------------------------------------- the model
def test_default_model_is_about_a_million_parameters():
    n = Decoder(ModelConfig(), "rope").num_parameters()
    assert 0.8e6 < n < 1.2e6


def test_decoder_is_causal_and_pluggable_per_layer_and_head():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=16, d_model=32, layers=3, heads=4)
    m = Decoder(cfg, ["rope", "alibi|decay", (lp.nope(8), "jordan3")])
    assert [len(b.groups) for b in m.blocks] == [1, 2, 2]
    x = torch.randint(16, (2, 20))
    y = m(x)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 16
    assert torch.allclose(m(x2)[:, :10], y[:, :10], atol=1e-6)  # the future never leaks back
    assert not torch.allclose(m(x2)[:, 10:], y[:, 10:])


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


def test_lm_corpus_is_fixed_and_recorded():
    a, b = make_task("lm"), make_task("lm")
    assert a.sha256 == b.sha256 and len(a.files) >= 10
    info = a.describe()
    assert info["source"] == "python-stdlib" and info["train_bytes"] > 100_000
    x, y = a.sample(torch.Generator().manual_seed(0), 2, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_lm_on_a_user_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("hello world " * 200)
    t = make_task("lm", str(p))
    assert t.describe()["source"] == str(p)


# ---------------------------------------------------------------------- training
TINY = dict(task="copy", d_model=16, layers=1, heads=2, steps=6, batch_size=8, train_len=16,
            eval_lens=[16, 32], eval_tokens=256, warmup=2)


def test_training_is_deterministic_and_learns(one_thread):
    cfg = TrainConfig(**TINY)
    task = make_task("copy")
    m1, r1 = train_run(cfg, task, "rope", 3, progress=False)
    m2, r2 = train_run(cfg, task, "rope", 3, progress=False)
    assert r1["train_loss"] == r2["train_loss"]
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    ev = evaluate(m1, task, [16, 32], 256)
    assert set(ev) == {"16", "32"} and 0 <= ev["32"]["acc"] <= 1


def _run_cli(*argv, env_extra=None, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "liepos.explore", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_quick_sweep_end_to_end_and_resume(tmp_path):
    from liepos.cli import main

    out = tmp_path / "quick"
    t0 = time.time()
    assert main(["explore", "--quick", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    first = time.time() - t0
    res = json.loads((out / "results.json").read_text())
    encs = ["rope", "alibi", "xpos", "nope", "decay", "jordan3"]
    assert res["encodings"] == encs
    for e in encs:
        for L in (32, 64, 128, 256):
            row = res["summary"][e][str(L)]
            assert math.isfinite(row["loss"]) and 0 <= row["acc"] <= 1
    assert "| rope |" in (out / "table.md").read_text()
    pytest.importorskip("matplotlib")
    assert (out / "loss_vs_length.png").stat().st_size > 1000
    # resume: a rerun skips every finished run; a removed one is redone, identically
    before = json.loads((out / "runs" / "alibi-seed0.json").read_text())
    (out / "runs" / "alibi-seed0.json").unlink()
    t0 = time.time()
    assert main(["explore", "--quick", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    again = time.time() - t0
    after = json.loads((out / "runs" / "alibi-seed0.json").read_text())
    assert after["eval"] == before["eval"] and after["train_loss"] == before["train_loss"]
    assert again < first


def test_cli_refuses_a_bad_spec(tmp_path, capsys):
    from liepos.cli import main

    assert main(["explore", "--encodings", "rope,roap", "--out", str(tmp_path)]) == 2
    assert "roap" in capsys.readouterr().err


def test_ddp_two_processes_equal_one_process(tmp_path):
    """torchrun with 2 gloo processes on the CPU = 1 process with the same global batch."""
    args = ["--task", "copy", "--encodings", "rope,alibi", "--steps", "5", "--batch-size", "8",
            "--d-model", "16", "--layers", "1", "--heads", "2", "--train-len", "16", "--eval-lens", "16,32",
            "--eval-tokens", "256", "--no-progress", "--save-model", "--threads", "1"]
    one = _run_cli(*args, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    env = dict(os.environ, OMP_NUM_THREADS="1")
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "liepos.explore", *args, "--out", str(tmp_path / "two")],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    for enc in ("rope", "alibi"):
        r1 = json.loads((tmp_path / "one" / "runs" / f"{enc}-seed0.json").read_text())
        r2 = json.loads((tmp_path / "two" / "runs" / f"{enc}-seed0.json").read_text())
        assert r1["world_size"] == 1 and r2["world_size"] == 2
        assert r1["train_loss"] == pytest.approx(r2["train_loss"], abs=1e-5)
        s1 = torch.load(tmp_path / "one" / "runs" / f"{enc}-seed0.pt")
        s2 = torch.load(tmp_path / "two" / "runs" / f"{enc}-seed0.pt")
        for name in s1:
            assert torch.allclose(s1[name], s2[name], atol=1e-5), name
        for L in ("16", "32"):
            assert r1["eval"][L]["loss"] == pytest.approx(r2["eval"][L]["loss"], abs=1e-5)


def test_progress_without_tqdm_prints(monkeypatch, capsys):
    from liepos.explore.train import _progress

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails: plain prints instead
    bar = _progress(10, "run", True)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert "run: 10/10" in capsys.readouterr().out
