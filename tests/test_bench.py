"""The benchmark library (not timings): every provider computes the same encoding, the memory probe
sees allocations, and the report renders. Speed targets live in `liepos bench`, never in tests."""

import torch

from liepos import bench


def test_every_provider_agrees_with_liepos_on_a_tiny_shape():
    B, H, S, D = 1, 2, 16, 16
    provs = bench.providers(B, H, H, S, D, torch.float32, offset=5, compiled=False)
    assert {"clone", "liepos", "liepos_half", "liepos_mixed", "hf", "rotary_embedding_torch",
            "x_transformers", "dense_matrix", "dense_matrix_exp"} <= set(provs)
    q, k = bench._inputs(B, H, H, S, D, torch.float32)
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


def test_bench_case_rows_targets_and_markdown():
    rows = bench.bench_case(1, 2, 2, 16, 16, torch.float32, min_run_time=0.01, memory=True,
                            only=["clone", "liepos", "hf"])
    assert [r["provider"] for r in rows] == ["clone", "liepos", "hf"]
    assert all(r["median_s"] > 0 and r["peak_bytes"] is not None for r in rows)
    res = {"meta": {"torch": torch.__version__, "threads": 1, "cpu_count": 1, "capability": "x", "wall_s": 0.0},
           "rows": rows, "targets": bench.targets(rows)}
    md = bench.markdown(res)
    assert "| liepos | fwd | float32 |" in md and "| target | measured | bound | met |" in md
