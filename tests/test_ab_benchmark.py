"""The same-process comparison of one change (benchmarks/ab.py, not timings): the old contender's call runs the
code the change replaced and nothing else does, and the quotient is the median of the per-round ones."""

import json
import platform
from pathlib import Path

import pytest
import torch
from helpers import BENCH, bench_script

import liepos as lp
from liepos import _kernels, attention_pieces, causal_tiling, faded_keys, recentre, recentred_kernel



@pytest.fixture(scope="module")
def ab():
    with bench_script("ab") as module:
        yield module


def _flash_calls(enc, q, monkeypatch):
    calls, real = [], attention_pieces._flash
    monkeypatch.setattr(attention_pieces, "_flash", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        lp.attention(q, q, q, enc)
    monkeypatch.setattr(attention_pieces, "_flash", real)
    return len(calls)


def test_each_switch_restores_the_old_code_for_its_call_alone(ab, monkeypatch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 2048, 64, generator=g)
    decay = lp.build("decay", 64, 8)
    monkeypatch.setattr(recentred_kernel, "_MEASURED", {"here": True})  # as on the CPU kind it was timed on
    native, real_kernel = [], recentred_kernel.kernel
    monkeypatch.setattr(recentred_kernel, "kernel", lambda *a: native.append(1) or real_kernel(*a))
    assert _flash_calls(decay, q, monkeypatch) == 0 and len(native) == 1  # float32: the native kernel
    with ab.SWITCHES["native-kernel"][1]():
        new = _flash_calls(decay, q, monkeypatch)  # the tiles it replaced
    assert new > 0 and len(native) == 1 and causal_tiling.pays is recentred_kernel.pays
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the switches below are the tiling's
    with ab.SWITCHES["diagonal-exponent"][1]():
        assert _flash_calls(decay, q, monkeypatch) == new + 1  # blocks of 64 rows: one family more
    assert _flash_calls(decay, q, monkeypatch) == new
    monkeypatch.setattr(_kernels, "_ran", set())
    with ab.SWITCHES["clear-in-encoding"][1](), torch.no_grad():
        lp.attention(q, q, q, decay)
    assert "clear_ torch.float32" in _kernels.status()["native"]
    merged, real = [], _kernels.merge
    monkeypatch.setattr(_kernels, "merge", lambda *a: merged.append(1) or real(*a))
    qb = q.bfloat16()
    with torch.no_grad():
        lp.attention(qb, qb, qb, lp.xpos(64))
        assert not merged
        with ab.SWITCHES["only-tile"][1]():
            lp.attention(qb, qb, qb, lp.xpos(64))
        assert merged
    alibi, cleared = lp.alibi(64, num_heads=8), []
    real_clear = _kernels.clear_below
    monkeypatch.setattr(_kernels, "clear_below", lambda x, tau, into=None: cleared.append(1) or real_clear(x, tau, into))
    monkeypatch.setattr(_kernels, "_ran", set())
    with torch.no_grad():
        lp.attention(qb, qb, qb, alibi)
        assert not cleared and "norms torch.bfloat16" in _kernels.status()["native"]
        with ab.SWITCHES["raw-bounds"][1]():
            lp.attention(qb, qb, qb, alibi)
        assert cleared  # every tile found its own bound and cleared
        monkeypatch.setattr(_kernels, "_ran", set())
        with ab.SWITCHES["native-norms"][1]():
            lp.attention(qb, qb, qb, alibi)
        assert "norms torch.bfloat16" not in _kernels.status()["native"]


def test_the_quotient_is_the_median_of_the_rounds(ab, monkeypatch):
    fake = {"sdpa": [1.0, 2.0, 1.0], "new": [2.0, 3.0, 1.0], "old": [2.0, 4.0, 2.0]}
    monkeypatch.setattr(ab, "interleaved", lambda fns, rounds, number: {n: fake[n] for n in fns})
    got = ab.measure("only-tile", ["xpos"], 256, torch.float32, 3, False)["xpos"]
    assert got["quotient"] == pytest.approx(sorted([1.0, 0.75, 0.5])[1])
    assert got["new"] == pytest.approx(sorted([2.0, 1.5, 1.0])[1]) and got["max_abs_diff"] == 0.0


def test_every_results_file_names_the_cpu_and_its_flags(ab, tmp_path):
    """``rounds.save``, the writer of every timing script: the CPU model and its instruction-set flags (as
    ``/proc/cpuinfo`` gives them) in the json and in the md's head, beside torch and the thread count."""
    import rounds

    rounds.save(tmp_path, "x", "x.py", (0.5, 0.6), "| a |")
    here = rounds.machine()
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["cpu"] == here["cpu"] and data["cpu_flags"] == here["cpu_flags"] and data["threads"] >= 1
    head = (tmp_path / "x.md").read_text()
    assert here["cpu"] in head and f"CPU flags: {' '.join(here['cpu_flags'])}" in head
    if Path("/proc/cpuinfo").exists() and "avx2" in Path("/proc/cpuinfo").read_text():
        assert "avx2" in here["cpu_flags"]


def test_the_cpu_is_named_by_family_model_and_cache_where_linux_tells_them(ab, tmp_path, monkeypatch):
    """Two CPUs a virtual machine names alike ("AMD EPYC") are told apart in every results file: the family and
    model numbers of ``/proc/cpuinfo`` and the largest data cache level of CPU 0 (sysfs), instruction caches
    left out."""
    import rounds

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n"
                    "processor\t: 1\ncpu family\t: 99\nmodel\t\t: 7\n")
    caches = tmp_path / "cache"
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"),
                                             (3, "Unified", "32768K"), (4, "Instruction", "9M")]):
        d = caches / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    real = rounds.Path
    monkeypatch.setattr(rounds, "Path", lambda p: info if p == "/proc/cpuinfo" else caches if "cache" in p else real(p))
    here = rounds.machine()
    assert here["cpu"] == "AMD EPYC (family 25 model 1, L3 32768K)" and here["cpu_flags"] == ["avx2", "fma"]
    monkeypatch.setattr(rounds, "Path", lambda p: tmp_path / "none")
    assert rounds.machine()["cpu"] == (platform.processor() or platform.machine())


def test_the_native_kernel_is_compared_only_where_it_runs_in_the_new_call_alone(ab, monkeypatch):
    """``ab.py native-kernel``: where the kernel would not run in the new call (here: forced off), the run
    stops instead of timing two tilings; ``--everywhere`` only with that switch, ``--backward`` never with it."""
    monkeypatch.setattr(recentred_kernel, "measured_here", lambda: False)
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)
    with pytest.raises(SystemExit, match="ran 0 times in the new call"):
        ab.measure("native-kernel", ["decay"], 256, torch.float32, 1, False)
    for argv in (["raw-bounds", "--everywhere"], ["native-kernel", "--backward"]):
        with pytest.raises(SystemExit):
            ab.main(argv)


def test_out_writes_the_results_into_the_folder_given(ab, tmp_path, monkeypatch):
    """``--out DIR``: the results files land in DIR (made if missing), none in benchmarks/results/."""
    before = {p.name for p in (BENCH / "results").iterdir()}
    monkeypatch.setattr(ab, "RESULTS", ab.RESULTS)  # main rebinds the module's folder: put it back after
    assert ab.main(["raw-bounds", "--encodings", "alibi", "--lengths", "128", "--rounds", "1",
                    "--out", str(tmp_path / "m" / "n")]) == 0
    assert sorted(p.name for p in (tmp_path / "m" / "n").iterdir()) == ["ab_raw-bounds_float32.json",
                                                                          "ab_raw-bounds_float32.md"]
    assert {p.name for p in (BENCH / "results").iterdir()} == before


def test_the_block_rows_and_span_tables_switches_restore_their_old_code(ab, monkeypatch):
    q = torch.randn(1, 8, 2048, 64)
    alibi, seen = lp.alibi(64, num_heads=8), []
    real_blocks = recentre._blocks
    monkeypatch.setattr(recentre, "_blocks", lambda *a: seen.append([hi - lo for lo, hi, _ in real_blocks(*a)]) or
                        real_blocks(*a))
    with torch.no_grad():
        lp.attention(q, q, q, alibi)
        with ab.SWITCHES["block-rows"][1]():
            lp.attention(q, q, q, alibi)
        lp.attention(q, q, q, alibi)
    assert seen == [[1024, 1024], [1025, 1023], [1024, 1024]]  # the origin's span of 512 on each side
    decay, looked = lp.build("decay", 64, 8), []
    real_range = lp.Encoding._range_tables
    monkeypatch.setattr(lp.Encoding, "_range_tables", lambda *a: looked.append(1) or real_range(*a))
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiles (not the native kernel) encode
    with torch.no_grad():
        first = lp.attention(q, q, q, decay)
        n = len(looked)
        again = lp.attention(q, q, q, decay)
        assert n > 0 and len(looked) == n  # every tile's rows kept
        with ab.SWITCHES["span-tables"][1]():
            old = lp.attention(q, q, q, decay)
        assert len(looked) == 2 * n  # looked up afresh, in the old call alone
    assert torch.equal(first, again) and torch.equal(first, old)


def test_the_sliced_rows_switch_takes_the_three_slices(ab, monkeypatch):
    from liepos.attention_pieces import Rows

    x, r, strided = torch.randn(1, 2, 64, 8), Rows(4, 3, 16, 2, 9), []
    real = torch.Tensor.as_strided
    monkeypatch.setattr(torch.Tensor, "as_strided", lambda *a: strided.append(1) or real(*a))
    new = r.view(x)
    assert strided
    with ab.SWITCHES["sliced-rows"][1]():
        old = r.view(x)
    assert len(strided) == 1 and torch.equal(new, old) and new.data_ptr() == old.data_ptr()


def test_the_head_groups_switch_restores_a_call_pair_per_run_of_equal_starts(ab, monkeypatch):
    q = torch.randn(1, 8, 2048, 64)
    alibi = lp.alibi(64, num_heads=8)
    new = _flash_calls(alibi, q, monkeypatch)
    with ab.SWITCHES["head-groups"][1]():
        old = _flash_calls(alibi, q, monkeypatch)
    # the second block's heads 0 and 1 (windows of about 274 and 545 keys) share the call of their earlier keys now
    # (the block's own keys: one call over every head, and one per group of heads for its earlier keys)
    assert (new, old) == (4, 5)


def test_the_term_bounds_switch_restores_each_tiles_own_clearing(ab, monkeypatch):
    q = torch.randn(1, 4, 2048, 64)
    jordan = lp.build("jordan", 64)
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiling's tiles (a CPU with AMX takes the kernel)
    monkeypatch.setattr(_kernels, "_ran", set())
    with torch.no_grad():
        new = lp.attention(q, q, q, jordan)
        assert "clear_ torch.float32" not in _kernels.status()["native"]
        with ab.SWITCHES["term-bounds"][1]():
            old = lp.attention(q, q, q, jordan)
    assert "clear_ torch.float32" in _kernels.status()["native"]  # each tile cleared its own q and k
    assert causal_tiling.term_bounds.__name__ == "term_bounds" and torch.equal(new, old)  # restored after


def test_the_shared_own_keys_switch_restores_the_calls_per_group(ab, monkeypatch):
    """ALiBi's per-head windows: the own keys of a block in one call over every head, or (the switch, for its call
    alone) each group of heads with its share of them, a call per group more; the outputs agree to float32's
    rounding of their merges."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, 4096, 64, generator=g)
    alibi = lp.alibi(64, num_heads=8)
    groups, real = [], recentre.pieces_by_heads
    monkeypatch.setattr(recentre, "pieces_by_heads", lambda *a, **kw: groups.append(len(a[2])) or real(*a, **kw))
    new = _flash_calls(alibi, q, monkeypatch)
    assert groups and max(groups) > 1
    monkeypatch.setattr(recentre, "pieces_by_heads", real)
    with ab.SWITCHES["shared-own-keys"][1]():
        old = _flash_calls(alibi, q, monkeypatch)
        with torch.no_grad():
            before = lp.attention(q, q, q, alibi)
    assert recentre.pieces_by_heads is real and old == new + sum(n - 1 for n in groups)
    with torch.no_grad():
        now = lp.attention(q, q, q, alibi)
    assert float((now - before).abs().max()) <= 1e-5 * float(q.abs().max())


def test_the_windowed_keys_switch_restores_a_tile_per_block_distance(ab, monkeypatch):
    """RetNet at T = 4096: head 0 fades over m blocks; its near keys are one flash call of windows, or (the switch, for
    its call alone) one call per block distance, m − 1 calls more; the same outputs to float32's rounding."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 8, 4096, 64, generator=g)
    retnet = lp.build("retnet", 64, 8)
    with torch.no_grad():
        new_out = lp.attention(q, q, q, retnet)
        new = _flash_calls(retnet, q, monkeypatch)
        with ab.SWITCHES["windowed-keys"][1]():
            old = _flash_calls(retnet, q, monkeypatch)
            old_out = lp.attention(q, q, q, retnet)
    assert faded_keys.WINDOWED and old - new >= 2  # restored after; at least two distances became one call
    assert float((new_out - old_out).abs().max()) <= 1e-5
