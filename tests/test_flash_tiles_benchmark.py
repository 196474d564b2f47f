"""benchmarks/flash_tiles.py, not its timings: the flash calls it records are the ones the attention call makes,
grouped into families that partition them, its parts of a family are the family cut along the batch (their
outputs are the whole calls' outputs), and its results name the machine, the thread counts and every family."""

import json

import pytest
import torch
from helpers import bench_script

import liepos as lp
from liepos import attention_pieces, causal_tiling


@pytest.fixture(scope="module")
def ft():
    with bench_script("flash_tiles") as module:
        yield module


@pytest.fixture(autouse=True)
def tiled(monkeypatch):
    """The tiling on every CPU: where oneDNN packs bfloat16 (AMX) decay and RetNet take the native re-centring
    kernel instead, which makes no flash calls for the script to record (its rows say 0 calls there)."""
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)


def _inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 8, T, 64, generator=g) for _ in range(3))


@pytest.mark.parametrize("name", ["decay", "jordan", "alibi", "retnet"])
def test_the_recorded_calls_are_the_calls_the_attention_makes(ft, name, monkeypatch):
    """Recorded by the script's spy and, independently, by one of the test's own: the same calls in the same
    order (shapes, causal, mask or not), and the families' counts add up to all of them."""
    q, k, v = _inputs(2048)
    enc = ft.encoding(name)
    got = ft.recorded(enc, q, k, v)
    seen = []
    real = attention_pieces._flash

    def spy(q, k, v, dropout, causal, *, attn_mask=None, scale=None):
        seen.append((tuple(q.shape), tuple(k.shape), causal, attn_mask is not None, scale))
        return real(q, k, v, dropout, causal, attn_mask=attn_mask, scale=scale)

    monkeypatch.setattr(attention_pieces, "_flash", spy)
    with torch.no_grad():
        lp.attention(q, k, v, enc)
    assert [(tuple(c[0].shape), tuple(c[1].shape), c[3], c[4] is not None, c[5]) for c in got] == seen
    assert len(got) > 1  # a re-centred encoding: several tiles
    families: dict[str, int] = {}
    for c in got:
        families[ft.family(c)] = families.get(ft.family(c), 0) + 1
    assert sum(families.values()) == len(got)
    for c in got:  # a family's name says its shapes, its causal flag and its mask
        f = ft.family(c)
        assert str(tuple(c[0].shape)) in f and ("causal" in f) == c[3] and ("mask" in f) == (c[4] is not None)


@pytest.mark.parametrize("name", ["decay", "jordan"])
def test_the_parts_of_a_family_are_the_family_cut_along_the_batch(ft, name):
    """Every family of the call and a masked one (a per-row per-key mask, cut with the batch, and a shared one,
    kept whole) cut in two along the batch: the parts' flash outputs, side by side, equal the whole calls' bit for
    bit; a batch that does not cut evenly gives no parts."""
    q, k, v = _inputs(2048, seed=1)
    calls = ft.recorded(ft.encoding(name), q, k, v)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 8, 96, 64, generator=g)
    calls += [(x, x.flip(2), x * 2, False, torch.randn(4, 8, 1, 96, generator=g), 0.125),
              (x, x, x, True, torch.randn(1, 8, 1, 96, generator=g), 0.125)]
    even = [c for c in calls if c[0].shape[0] % 2 == 0]
    parts = ft.cut(even, 2)
    assert parts is not None and len(parts) == 2 and len(even) > 2
    for j, (qc, kc, vc, causal, mask, scale) in enumerate(even):
        whole = attention_pieces._flash(qc, kc, vc, 0.0, causal, attn_mask=mask, scale=scale)
        got = [attention_pieces._flash(p[j][0], p[j][1], p[j][2], 0.0, p[j][3], attn_mask=p[j][4], scale=p[j][5])
               for p in parts]
        assert all(p[j][0].shape[0] == qc.shape[0] // 2 for p in parts)
        assert torch.equal(whole[0], torch.cat([o for o, _ in got])) and torch.equal(whole[1], torch.cat([L for _, L in got]))
    assert ft.cut([(x[:3], x[:3], x[:3], False, None, 0.125)], 2) is None


def test_one_thread_puts_the_thread_count_back(ft):
    seen = []
    n = torch.get_num_threads()
    ft.one_thread(lambda: seen.append(torch.get_num_threads()), n)()
    assert seen == [1] and torch.get_num_threads() == n


def test_the_results_name_the_machine_and_every_family(ft, tmp_path):
    before = torch.get_num_threads()
    try:
        assert ft.main(["--length", "512", "--rounds", "1", "--threads", "2", "--encodings", "decay", "alibi",
                        "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(before)
    data = json.loads((tmp_path / "flash_tiles_512_2t.json").read_text())
    md = (tmp_path / "flash_tiles_512_2t.md").read_text()
    assert data["cpu"] and data["threads"] == 2 and data["length"] == 512 and data["dtype"] == "float32"
    res = data["results"]
    for name in ("decay", "alibi"):
        fams = res["_families"]["order"][name]
        assert sum(res[f]["calls"] for f in fams) == res[f"{name}: its flash calls"]["calls"]
        for key in [f"{name}: the call", f"{name}: its flash calls", *fams]:
            assert f"| {key} |" in md and res[key]["speedup"] > 0 and res[key]["one_thread_s"] > 0
        # the rest is a difference of two timed medians per round: present, a number (its sign is the machine's)
        assert f"| {name}: the rest |" in md and isinstance(res[f"{name}: the rest"]["threads_s"], float)
    assert "| sdpa (causal) | 1 |" in md and "2 parts at once, 1 thread each" in md
