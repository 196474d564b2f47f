"""Encoding's own contracts: the output dtype with slots, meta tensors, per-batch origins, origins that
do not fit, and integer times float64 cannot hold."""

from __future__ import annotations

import pytest
import torch

import liepos as lp

F64 = torch.float64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_slots_of_half_precision_inputs_stay_float32_as_the_readable_path(dtype):
    """ALiBi's slot values need more than 8 bits: with slots, a half-precision query comes back float32 on
    the fast path, the dtype and the values of the readable path (``query_reference`` in float64)."""
    enc = lp.alibi(8, num_heads=2)
    q = torch.randn(1, 2, 5, 8).to(dtype)
    pos = torch.arange(5, dtype=F64) + 100.0
    got = enc.query(q, pos)
    assert got.dtype == torch.float32 and got.shape[-1] == 8 + enc.num_slots
    want = enc.query_reference(q.to(F64), pos)
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-4)
    assert enc.key(q, pos).dtype == torch.float32


def test_meta_inputs_give_shapes_without_data():
    """A meta query (FSDP's meta initialisation, shape propagation) comes back a meta tensor of the real
    output's shape and dtype, slots included, without reading positions' data."""
    for enc in (lp.rope(8), lp.alibi(8, num_heads=2)):
        q = torch.empty(2, 2, 5, 8, device="meta")
        real = enc.query(torch.zeros(2, 2, 5, 8), torch.arange(5.0))
        out = enc.query(q, torch.arange(5.0))
        assert out.is_meta and out.shape == real.shape and out.dtype == real.dtype


def test_one_origin_per_batch_element_is_subtracted_per_row():
    """``origin`` of shape (batch,) re-centres each batch element's positions by its own origin."""
    enc = lp.xpos(8)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 1, 4, 8, dtype=F64, generator=g)
    pos = torch.arange(4, dtype=F64) + torch.tensor([[10.0], [200.0], [3000.0]], dtype=F64)  # (3, 4)
    o = torch.tensor([9.0, 190.0, 2990.0], dtype=F64)
    assert torch.allclose(enc.query(q, pos, origin=o), enc.query(q, pos - o[:, None]), rtol=1e-12, atol=1e-12)


def test_an_origin_that_adds_dimensions_is_refused():
    """An origin that broadcasts the positions to more dimensions than (batch, seq[, axes]) is named."""
    one, axial = lp.rope(8), lp.axial_rope(8, axes=2)
    with pytest.raises(ValueError, match="origin"):
        one.query(torch.randn(1, 1, 3, 8), torch.arange(3.0), origin=torch.zeros(2, 2, 3))
    with pytest.raises(ValueError, match="origin"):
        axial.query(torch.randn(1, 1, 3, 8), torch.zeros(3, 2), origin=torch.zeros(2, 2, 3, 2))


def test_integer_times_past_two_to_the_53_are_refused_on_both_sides():
    """2^53 ± 1 has no float64: refused (never rounded to a neighbour's time); 2^53 itself is one."""
    enc = lp.rope(8)
    q = torch.randn(1, 1, 1, 8, dtype=F64)
    for t in (2**53 + 1, -(2**53 + 1), 2**54 + 2 + 1):
        with pytest.raises(ValueError, match="exactly representable"):
            enc.query(q, torch.tensor([t], dtype=torch.int64))
    exact = enc.query(q, torch.tensor([2**53], dtype=torch.int64))
    assert torch.equal(exact, enc.query(q, torch.tensor([2.0**53], dtype=F64)))


@pytest.mark.parametrize("name", ["alibi", "xpos"])
def test_per_batch_positions_equal_each_batch_element_alone(name):
    """Positions of shape (batch, seq): each batch element is encoded at its own times, slot values included
    (ALiBi's slots move with the position), as if it were alone."""
    enc = lp.alibi(8, num_heads=2) if name == "alibi" else lp.xpos(8)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 5, 8, dtype=F64, generator=g)
    pos = torch.arange(5, dtype=F64) + torch.tensor([[0.0], [40.0], [7.5]], dtype=F64)  # (3, 5)
    for fn in (enc.query, enc.key):
        got = fn(q, pos)
        alone = torch.cat([fn(q[i : i + 1], pos[i]) for i in range(3)])
        assert torch.allclose(got, alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("start", [0, 1000])
def test_a_window_of_tables_is_cached_exactly_when_four_such_windows_fit_the_cache(start, monkeypatch):
    """Integer positions ``p0 … p0 + S − 1`` read rows of a cached window ``[base, end)`` when the window's
    size bound ``rows · (2·dim + couplings) · bytes`` is at most a quarter of the cache, and are built for
    exactly the positions asked otherwise (no cache entry, no miss counted): the cache stays within its bound."""
    from liepos import _fast

    enc = lp.rope(16)
    q = torch.randn(1, 1, 16, 16)
    pos = torch.arange(start, start + 16, dtype=F64)
    base, end = _fast.table_window(start, 16)
    bound = (end - base) * (2 * enc.dim + int(enc.plan.dst.numel())) * 4  # float32 tables
    want = enc.query_reference(q.to(F64), pos)
    for max_bytes, cached in [(4 * bound, True), (4 * bound - 1, False)]:
        monkeypatch.setattr(_fast.CACHE, "max_bytes", max_bytes)
        _fast.CACHE.clear()
        outs = [enc.query(q, pos) for _ in range(2)]
        assert (_fast.CACHE.hits, _fast.CACHE.misses) == ((1, 1) if cached else (0, 0)), (max_bytes, cached)
        for out in outs:
            assert torch.allclose(out.double(), want, atol=1e-5)
    _fast.CACHE.clear()
