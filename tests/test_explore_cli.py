"""``liepos explore`` end to end: the quick sweep (learned generators, growth, YaRN at evaluation, the
lookup rung learned by RoPE and ALiBi at the quick budget), resume, and bad input refused before training."""

from __future__ import annotations

import json
import math
import os

import pytest
from helpers import explore_main as _main
import torch

from liepos.cli import explore as cli
from liepos.explore.sweep import LEARNED_ACC, run_path


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick")
    n, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    code = cli.main(["--quick", "--encodings", "rope,alibi,learn,growth", "--eval-scaling", "yarn",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    # the sweep ran at one thread with deterministic kernels, and put back the caller's settings
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (n, det)
    return out


@pytest.mark.slow
def test_quick_sweep_learns_the_task_in_distribution_for_rope_and_alibi(quick):
    res = json.loads((quick / "results.json").read_text())
    assert res["config"]["task"] == "lookup" and res["config"]["steps"] == cli.QUICK["steps"]
    for enc in ("rope", "alibi"):
        row = res["summary"][enc]
        assert row["in_acc"] >= LEARNED_ACC and row["learned"] == 1, (enc, row["in_acc"])
    table = (quick / "table.md").read_text()
    assert "| rope | 1/1 |" in table and "| rope @yarn | 1/1 |" in table  # in-distribution beside extrapolation


@pytest.mark.slow
def test_quick_sweep_records_learned_generators_growth_and_yarn(quick):
    run = json.loads(run_path(quick, "learn", 0).read_text())
    lg = run["learned_generator"]
    counts, final = lg["counts"], lg["final"]
    assert set(counts) == {"growth", "nope", "decay", "rotation", "damped_rotation", "polynomial"}
    assert counts["growth"] == 0 and sum(counts.values()) == sum(len(h) for g in final for h in g["blocks"])
    assert [s["step"] for s in lg["trajectory"]][0] == 0 and len(lg["trajectory"]) >= 3
    for g in final:  # every learned block stays on the decay side of the plane
        assert all(lam < 0 and om >= 0 for head in g["blocks"] for lam, om, _ in head)
    growth = json.loads(run_path(quick, "growth", 0).read_text())
    assert growth["diverged"] is None or isinstance(growth["diverged"], int)
    for L, e in growth["eval"].items():  # a result at every length: finite, or marked diverged
        assert e["diverged"] or math.isfinite(e["loss"]), L
    rope = json.loads(run_path(quick, "rope", 0).read_text())
    assert set(rope["eval_scaled"]["yarn"]) == {"64", "128", "256", "512"}  # past the training length only
    assert rope["eval_scaled"]["yarn"]["512"]["loss"] != rope["eval"]["512"]["loss"]
    assert json.loads(run_path(quick, "alibi", 0).read_text())["eval_scaled"]["yarn"] == {
        "not_applied": "no rotation block"}
    for figure in ("loss_vs_length.png", "learned_spectrum.png", "map.png"):
        assert (quick / figure).stat().st_size > 1000, figure


@pytest.mark.slow
def test_the_map_places_each_encoding_at_its_blocks_with_their_measured_shares(quick):
    """A point per block: RoPE at (0, ω_k) per head, learned ones at their final blocks; each head's shares sum to 1."""
    import liepos as lp
    from liepos.explore.figures import map_points
    from liepos.explore.stats import headline

    res = json.loads((quick / "results.json").read_text())
    points = {name: (blocks, share, delta) for name, blocks, share, delta in map_points(res)}
    hd, H = cli.QUICK["d_model"] // cli.QUICK["heads"], cli.QUICK["heads"]
    blocks, share, delta = points["rope"]
    assert sorted({om for _, om, _ in blocks}) == pytest.approx(sorted(set(lp.rope(hd).generator.freqs.tolist())))
    assert all(lam == 0 and n == 1 for lam, _, n in blocks) and len(blocks) == H * hd // 2
    assert sum(share) == pytest.approx(H) and len(set(share)) > 1  # measured per block, not one colour
    T = cli.QUICK["train_len"]
    assert delta == tuple(res["summary"]["rope"]["lengths"][str(headline(res["config"]))]["delta"])
    final = json.loads(run_path(quick, "learn", 0).read_text())["learned_generator"]["final"]
    assert points["learn"][0] == [tuple(b) for g in final for h in g["blocks"] for b in h]
    assert T in res["config"]["eval_lens"]


@pytest.mark.slow  # the lane keeps resume in test_explore_study
def test_resume_skips_finished_runs_and_redoes_a_removed_one_identically(tmp_path, capsys):
    argv = ["--task", "copy", "--encodings", "rope,alibi", "--steps", "4", "--batch-size", "8", "--d-model", "16",
            "--layers", "1", "--heads", "2", "--train-len", "16", "--eval-lens", "16,32", "--eval-tokens", "256",
            "--threads", "1", "--no-progress", "--out", str(tmp_path)]
    assert _main(argv, capsys)[0] == 0
    before = json.loads(run_path(tmp_path, "alibi", 0).read_text())
    run_path(tmp_path, "alibi", 0).unlink()
    code, _, log = _main(argv, capsys)
    assert code == 0 and "rope seed 0: finished earlier, skipped" in log and "alibi seed 0: finished" not in log
    after = json.loads(run_path(tmp_path, "alibi", 0).read_text())
    assert after["eval"] == before["eval"] and after["train_loss"] == before["train_loss"]


@pytest.mark.parametrize("content", ["[1, 2]", "3", "null", '"done"'])
def test_resume_over_a_run_file_that_is_json_but_not_an_object_is_a_named_error(tmp_path, capsys, content):
    argv = ["--task", "copy", "--encodings", "rope", "--steps", "2", "--batch-size", "8", "--d-model", "16",
            "--layers", "1", "--heads", "2", "--train-len", "16", "--eval-lens", "16", "--eval-tokens", "64",
            "--threads", "1", "--no-progress", "--out", str(tmp_path)]
    path = run_path(tmp_path, "rope", 0)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    code, err, _ = _main(argv, capsys)
    assert code != 0 and "Traceback" not in err and "AttributeError" not in err
    assert str(path) in err and "not a run's result" in err
    assert path.read_text() == content  # left as it was: the user decides


UNWRITABLE = "/proc/liepos-explore-test"  # nothing can be created under /proc, not even by root


@pytest.mark.parametrize("argv, names", [
    (["--batch-size", "0"], "--batch-size"), (["--threads", "-1"], "--threads"), (["--threads", "0"], "--threads"),
    (["--layers", "0"], "--layers"), (["--seed", "-1"], "--seed"), (["--steps", "0"], "--steps"),
    (["--lr", "nan"], "--lr"), (["--encodings", "rope,roap"], "roap"), (["--eval-scaling", "yarm"], "yarm"),
    (["--eval-scaling", "yarn:0.5"], ">= 1"), (["--d-model", "30", "--heads", "4"], "--d-model"),
    (["--batch-size", "7"], "--micro-batches"), (["--encodings", "decay:rate=x"], "rate"),
])
def test_bad_flags_are_one_line_exit_2_before_training(argv, names, capsys, tmp_path):
    code, err, _ = _main([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and names in err and "Traceback" not in err
    assert not (tmp_path / "o" / "runs").exists()  # refused before any training


def test_device_cuda_without_cuda_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err, _ = _main(["--device", "cuda", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--device cuda" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [b"", b"x"])
def test_text_file_too_small_is_refused(content, capsys, tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(content)
    code, err, _ = _main(["--text-file", str(p), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--text-file" in err and len(err.strip().splitlines()) == 1


def test_out_a_file_or_unwritable_is_refused_before_training(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    for out, what in ((str(f), "is a file"), (UNWRITABLE, "cannot be created")):
        code, err, _ = _main(["--quick", "--out", out], capsys)
        assert code == 2 and "--out" in err and what in err and len(err.strip().splitlines()) == 1
    runs = tmp_path / "o" / "runs"
    runs.parent.mkdir()
    runs.write_text("")  # the runs folder is a file: nothing can be written there
    code, err, _ = _main(["--quick", "--out", str(runs.parent)], capsys)
    assert code == 2 and "runs" in err
    assert os.path.getsize(runs) == 0
