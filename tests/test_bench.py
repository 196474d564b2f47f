"""The benchmark suite (benchmarks/bench.py, not timings): every provider computes the same encoding, the
memory probe sees allocations, and the report renders. Speed targets live in `liepos bench`, never in tests."""

import subprocess
import sys

import pytest
import torch

from liepos.cli.bench import load_suite

bench = load_suite()


def test_every_provider_agrees_with_liepos_on_a_tiny_shape():
    B, H, S, D = 1, 2, 16, 16
    provs = bench.providers(B, H, H, S, D, torch.float32, offset=5, compiled=False)
    assert {"clone", "liepos", "liepos_half", "liepos_mixed", "hf", "rotary_embedding_torch",
            "x_transformers", "dense_matrix", "dense_matrix_exp"} <= set(provs)
    q, k = bench.inputs(B, H, H, S, D, torch.float32)
    ref_q, ref_k = provs["liepos"](q.clone(), k.clone())
    # the interleaved-layout peers compute the same rotation on the same inputs
    for name in ("dense_matrix", "dense_matrix_exp", "rotary_embedding_torch", "x_transformers"):
        yq, yk = provs[name](q.clone(), k.clone())
        assert torch.allclose(yq, ref_q, atol=1e-4) and torch.allclose(yk, ref_k, atol=1e-4), name


def test_peak_allocated_sees_a_known_allocation():
    n = 16 * 2**20 // 4  # 16 MiB of float32

    def fn():
        x = torch.ones(n)
        y = x + 1  # a second buffer alive at the same time
        return float(y[0])

    bench.peak_allocated(fn)  # the first call in a process also pays one-time allocations
    peak = bench.peak_allocated(fn)
    assert peak is not None and 2 * 16 * 2**20 <= peak < 2.5 * 16 * 2**20


@pytest.mark.slow  # the lane runs the suite end to end in test_liepos_bench_runs_the_suite_and_writes_where_asked
def test_bench_case_rows_targets_and_markdown():
    rows = bench.bench_case(1, 2, 2, 16, 16, torch.float32, min_run_time=0.01, memory=True,
                            only=["clone", "liepos", "hf"])
    assert [r["provider"] for r in rows] == ["clone", "liepos", "hf"]
    assert all(r["median_s"] > 0 and r["peak_bytes"] is not None for r in rows)
    res = {"meta": {"torch": torch.__version__, "threads": 1, "cpu_count": 1, "capability": "x", "wall_s": 0.0},
           "rows": rows, "targets": bench.targets(rows)}
    md = bench.markdown(res)
    assert "| liepos | fwd | float32 |" in md and "| target | measured | bound | met |" in md


def test_the_suite_is_not_in_the_package_and_bench_from_a_wheel_says_what_to_do(tmp_path):
    """Run from a copy of the package alone (as a wheel installs it) in a folder with no checkout."""
    import shutil

    import liepos

    assert bench.__file__.endswith("benchmarks/bench.py")
    site = tmp_path / "site"
    shutil.copytree(__import__("pathlib").Path(liepos.__file__).parent, site / "liepos")
    assert [str(p.relative_to(site)) for p in site.rglob("bench*.py")] == ["liepos/cli/bench.py"]  # the command only
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([sys.executable, "-m", "liepos.cli", "bench", "--quick"], capture_output=True, text=True,
                       cwd=work, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "source checkout" in r.stderr and "clone the repository" in r.stderr


def test_liepos_bench_runs_the_suite_and_writes_where_asked(tmp_path, monkeypatch, capsys):
    """The command's glue (find, check --out, load, run, write), with the suite's timing loop made tiny."""
    import json

    import liepos.cli.bench as bench_cli
    from liepos.cli import main

    rows = bench.bench_case(1, 2, 2, 16, 16, torch.float32, min_run_time=0.01, only=["clone", "liepos"])
    meta = {"torch": torch.__version__, "threads": 1, "cpu_count": 1, "capability": "x", "wall_s": 0.0}
    monkeypatch.setattr(bench, "run_suite", lambda quick, log: {"meta": meta, "rows": rows,
                                                                "targets": bench.targets(rows)})
    monkeypatch.setattr(bench_cli, "load_suite", lambda path: bench)
    assert main(["bench", "--quick", "--out", str(tmp_path / "r")]) == 0
    assert [r["provider"] for r in json.loads((tmp_path / "r" / "quick.json").read_text())["rows"]] == ["clone", "liepos"]
    assert "| liepos | fwd | float32 |" in (tmp_path / "r" / "quick.md").read_text()
    assert "wrote" in capsys.readouterr().out
