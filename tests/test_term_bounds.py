"""The between tiles of an encoding applied as shifted terms (Jordan blocks, coupled planes) clear their encoded q
and k in the pass that encodes them: the tables' largest row sum bounds every encoded entry by the raw data's
largest, so the clearing thresholds are known before the encoding runs and no tile takes a pass of its own to find
its largest entry or to clear."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import liepos as lp
from liepos import _kernels, attention_pieces, causal_tiling
from liepos._fast import term_growth

F64 = torch.float64
CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(_kernels._missing() is not None,
                                reason=f"the native kernels cannot be built here: {_kernels._missing()}")


def _coupled() -> lp.Encoding:
    """Damped rotating Jordan blocks of sizes 2, 3 and 2 (complex: their terms reach seven offsets)."""
    return lp.Encoding(lp.Generator([-0.02, -0.3, -0.001], [0.4, 1.1, 0.05], [2, 3, 2]), name="coupled")


ENCODINGS = {"jordan": lambda: lp.build("jordan", 64), "coupled": _coupled}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("side", ["query", "key"])
def test_growth_is_the_largest_row_sum_of_the_encoding_itself(name, side):
    """``term_growth`` of a tile's tables is ``max_u max_d Σ_r |M(u)[d, r]|`` of the encoding's own matrices at
    the tile's times (the images of the unit vectors, float64): the smallest ``g`` with ``‖M(u) x‖_∞ ≤ g ‖x‖_∞``."""
    enc = ENCODINGS[name]()
    S, D = 200, enc.dim
    p0, fade = (0, True) if side == "query" else (-S, False)
    g = term_growth(enc._span_tables(p0, S, side, torch.float32, fade, CPU))
    eye = torch.eye(D, dtype=F64).view(1, D, 1, D).expand(1, D, S, D)  # (1, D rows e_r as heads, S times, D)
    pos = torch.arange(p0, p0 + S, dtype=F64)
    with torch.no_grad():
        images = enc._query_after(eye, pos) if side == "query" else enc.key(eye, pos)  # (1, D, S, D): M(u) e_r
    want = float(images.abs().sum(1).amax())  # Σ_r |M(u)[d, r]|, largest over u and d
    assert g is not None and abs(g - want) <= 1e-5 * want


@given(name=st.sampled_from(sorted(ENCODINGS)), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), spike=st.booleans(), seed=st.integers(0, 2**16),
       T=st.sampled_from([256, 1000]))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_bounds_hold_every_entry_of_every_between_tile(name, dtype, scale, spike, seed, T):
    """For every off-diagonal tile of the plan, every entry of the encoded q and k (as the tiles encode them, in
    the data's dtype) is at most the bound, on data of any scale, one spike included."""
    enc = ENCODINGS[name]()
    g = torch.Generator().manual_seed(seed)
    q, k = ((torch.randn(1, 3, T, enc.dim, generator=g, dtype=F64) * scale).to(dtype) for _ in range(2))
    if spike:
        q[0, seed % 3, seed % T, seed % enc.dim] = 40 * scale
    call = types.SimpleNamespace(enc=enc, q=q, k=k)
    raw = (float(q.abs().max()), float(k.abs().max()))
    _, off = causal_tiling.tile_plan(T, 32)
    assert off
    with torch.no_grad():
        for rq, rk in off:
            b = causal_tiling.term_bounds(call, rq, rk, raw)
            assert b is not None
            qe = enc._span(rq.gather(q), 0, "query", fade=True)
            ke = enc._span(rk.gather(k), -rk.width, "key")
            assert float(qe.abs().max()) <= b[0] and float(ke.abs().max()) <= b[1], (rq, rk, b)


def test_no_bound_where_the_tables_are_not_the_whole_encoding():
    """Decay (no terms), a query scale, slots: no bound from terms (the tile finds its own)."""
    q = torch.randn(1, 2, 64, 64)
    _, off = causal_tiling.tile_plan(64, 32)
    for enc in (lp.build("decay", 64), lp.alibi(64, num_heads=2)):
        call = types.SimpleNamespace(enc=enc, q=q, k=q)
        assert causal_tiling.term_bounds(call, *off[0], (1.0, 1.0)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_jordan_tiles_find_no_bound_of_their_own(dtype, monkeypatch):
    """The catalogue Jordan at T = 2048: two absmax passes (the raw q and k) for the whole call, none per tile, every
    between tile cleared as it is encoded (the terms op with a threshold), and no clear pass."""
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiling (a CPU with AMX takes the native kernel)
    monkeypatch.setattr(_kernels, "_ran", set())
    passes, real = [], attention_pieces.absmax
    monkeypatch.setattr(causal_tiling, "absmax", lambda x: passes.append(tuple(x.shape)) or real(x))
    monkeypatch.setattr(attention_pieces, "absmax", lambda x: passes.append(("tile", *x.shape)) or real(x))
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, 2048, 64, generator=g).to(dtype) for _ in range(3))
    with torch.no_grad():
        out = lp.attention(q, k, v, lp.build("jordan", 64))
    ran = set(_kernels.status()["native"])
    assert passes == [(1, 4, 2048, 64)] * 2, passes
    assert "terms torch.float32 cleared" in ran and not any(r.startswith("clear_") for r in ran), ran
    assert bool(out.isfinite().all())


def test_data_too_large_for_normal_products_falls_back_to_each_tile_clearing(monkeypatch):
    """Raw entries so large that the bound's thresholds would allow a subnormal product: every tile finds and
    clears its own (absmax per tile), and the output is the same as with the bound taken away."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 2048, 64, generator=g) for _ in range(3))
    q, k = q * 3e3, k * 3e3
    enc = lp.build("jordan", 64)
    monkeypatch.setattr(causal_tiling, "pays", lambda *a: False)  # the tiling (a CPU with AMX takes the native kernel)
    tiles = []
    real = attention_pieces.absmax
    monkeypatch.setattr(attention_pieces, "absmax", lambda x: tiles.append(1) or real(x))
    with torch.no_grad():
        got = lp.attention(q, k, v, enc)
        assert tiles  # the tiles' own bounds
        monkeypatch.setattr(causal_tiling, "term_bounds", lambda *a: None)
        assert torch.equal(got, lp.attention(q, k, v, enc))


def test_growths_are_kept_beside_the_tables_and_not_pickled():
    """A long Jordan call keeps every tile's growth without pushing its table rows out of the span cache, and an
    encoding pickled or copied carries neither."""
    import copy
    import pickle

    enc = lp.build("jordan", 64)
    q = torch.randn(1, 1, 16384, 64)
    _, off = causal_tiling.tile_plan(16384, 32)
    call = types.SimpleNamespace(enc=enc, q=q, k=q)
    for rq, rk in off:
        causal_tiling.term_bounds(call, rq, rk, (1.0, 1.0))
    # every growth kept; every table too but the widest level's (above SPAN_TABLE_BYTES: never kept)
    assert len(enc.__dict__["_growths"]) == 2 * len(off) and len(enc.__dict__["_spans"]) == 2 * (len(off) - 1)
    looked = []
    enc.__dict__["_span_tables"] = lambda *a: looked.append(a)  # a second pass reads no table
    for rq, rk in off:
        causal_tiling.term_bounds(call, rq, rk, (1.0, 1.0))
    del enc.__dict__["_span_tables"]
    assert looked == []
    for other in (pickle.loads(pickle.dumps(enc)), copy.deepcopy(enc), copy.copy(enc)):
        assert "_growths" not in other.__dict__ and "_spans" not in other.__dict__
