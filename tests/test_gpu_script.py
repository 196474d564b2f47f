"""The prepared GPU check (benchmarks/gpu.py), run here on the CPU as the device machine runs it
(``PYTHONPATH=src python benchmarks/gpu.py``, a subprocess): its checks pass, it writes its files, a planted
error makes it fail, and asked for CUDA where there is none it says so in one line. No test needs a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
# benchmarks/attention.py encodings(): every catalogue entry causal attention takes, and RoPE's half layout
ENCODINGS = ["nope", "rope", "rope_half", "xpos", "retnet", "decay", "alibi", "jordan"]
# per encoding: query, key and attention, near 0 and near 10^6, float32 and bfloat16
ROWS_PER_ENCODING = 3 * 2 * 2


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "OUT"}
    full = {**base, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=full,
                          timeout=120)


def by_encoding(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["encoding"], []).append(r)
    return out


@pytest.mark.slow
def test_the_quick_cpu_run_passes_every_check_and_writes_its_files(tmp_path):
    r = run("--device", "cpu", "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    md = (tmp_path / "gpu.md").read_text()
    checks = by_encoding(res["checks"])
    assert list(checks) == ENCODINGS
    for name, rows in checks.items():
        assert len(rows) == ROWS_PER_ENCODING, name
        assert all(row["ok"] and row["error"] <= row["tol"] for row in rows), rows
        assert {row["dtype"] for row in rows} == {"float32", "bfloat16"}
        assert sum("near 1e6" in row["what"] for row in rows) == ROWS_PER_ENCODING // 2
    assert len(res["agree"]) == 4 and all(row["ok"] for row in res["agree"])  # HF and the fused peer, two dtypes
    apply = res["apply"]
    assert {row["dtype"] for row in apply} == {"float32", "bfloat16"}
    assert all("failed" not in row and row["median_s"] > 0 and row["gbs"] > 0 for row in apply)
    assert all(row["fraction_of_peak"] is None for row in apply)  # a CPU has no known peak: "n/a"
    assert any(row["contender"].startswith("liepos rope half") for row in apply)
    assert sum("hf" in row["contender"].lower() for row in apply) == 2
    assert sum("fused" in row["contender"] or "liger" in row["contender"] for row in apply) == 2
    att = res["attention"]
    assert [row["contender"] for row in att] == ["sdpa (causal)", *(f"lp.attention {n}" for n in ENCODINGS)]
    assert all("failed" not in row and row["ratio_to_sdpa"] > 0 for row in att)
    assert res["command"].startswith("python benchmarks/gpu.py --device cpu --quick")
    assert "| encoding | what | dtype | max error | tolerance | ok |" in md and "NOT OK" not in md
    assert "| contender | dtype | time (µs) | ratio to HF | GB/s | fraction of peak |" in md
    assert "| contender | dtype | time (ms) | ratio to SDPA |" in md
    assert "All checks passed and every row ran: yes" in md and "All checks passed" in r.stdout


@pytest.mark.slow
def test_a_planted_error_is_caught_and_fails_the_run(tmp_path):
    r = run("--device", "cpu", "--quick", "--checks-only", "--plant-error", "xpos", "--out", str(tmp_path))
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    bad = [row for row in res["checks"] if not row["ok"]]
    assert bad and all(row["encoding"] == "xpos" and row["what"].startswith("query") for row in bad)
    assert len(bad) == 4 and all(row["error"] > 10 * row["tol"] for row in bad)  # near 0 / 1e6, two dtypes
    assert len(res["checks"]) == len(ENCODINGS) * ROWS_PER_ENCODING and "apply" not in res
    assert "NOT OK" in (tmp_path / "gpu.md").read_text() and "every row ran: NO" in r.stdout


@pytest.mark.slow
def test_cuda_asked_where_there_is_none_is_one_line_not_a_traceback(tmp_path):
    r = run("--out", str(tmp_path), env={"CUDA_VISIBLE_DEVICES": ""})  # the default --device cuda; no GPU visible
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "--device 'cuda'" in r.stderr and "is_available() is False" in r.stderr
    assert "--device cpu" in r.stderr and not list(tmp_path.iterdir())  # nothing written
    r = run("--device", "meta", "--out", str(tmp_path))  # a torch device, not one the script runs on
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--device must be cpu or cuda" in r.stderr
