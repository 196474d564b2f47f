"""Issue 13, the items in the precision area: each found fault stays fixed, and the precision contract
of docs/guide/precision.md holds row by row (the table is parsed from the page, tests/contract.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from contract import contract_rows, measured_error

import liepos as lp
from liepos._jordan import canonical_form
from liepos.classification import DEFAULT_TOL, classify

F64 = torch.float64


# ------------------------------------------------------------------ item 3: far times
@pytest.mark.parametrize("shift", [2.0**40, 2.0**48, 1e18])
def test_item3_rotation_scores_are_shift_invariant_at_far_times(shift):
    enc = lp.rope(32)
    step = 128.0 if shift >= 2.0**53 else 1.0  # consecutive float64 times at 1e18 are 128 apart
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 1, 16, 32, dtype=F64, generator=g) for _ in range(2))
    p = step * torch.arange(16, dtype=F64)
    near = enc.query(q, p) @ enc.key(k, p).transpose(-1, -2)  # (1, 1, 16, 16)
    far = enc.query(q, p + shift) @ enc.key(k, p + shift).transpose(-1, -2)
    assert float((far - near).abs().max() / near.abs().max()) < 1e-12


# ------------------------------------------------------------------ item 5: classify
@pytest.mark.parametrize("scale", [1e150, 1e154, 1e200, 1e300, 1e-300])
def test_item5_damped_rotation_keeps_its_rate_at_any_scale(scale):
    X = scale * np.array([[-0.2, 0.9], [-0.9, -0.2]])
    c = classify(X)
    assert c.names == ["damped_rotation"]
    rate, freq, _ = c.blocks[0]
    assert rate == pytest.approx(-0.2 * scale, rel=1e-12) and freq == pytest.approx(0.9 * scale, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_item5_noisy_jordan_block_is_polynomial_by_default(seed):
    """A 3×3 Jordan block plus 1e-9 noise: one polynomial block under the default tol (relative
    sqrt(eps): an n-fold eigenvalue moved by δ spreads by δ^(1/n)); a tight tol sees the noise."""
    J = np.diag([1.0, 1.0], 1) + 1e-9 * np.random.default_rng(seed).standard_normal((3, 3))
    assert classify(J).names == ["polynomial"] and classify(J).blocks[0][2] == 3
    assert classify(J, tol=1e-15).counts["polynomial"] == 0
    assert classify(1e6 * J).names == ["polynomial"]  # tol is relative to the scale of X
    assert classify(J).tol == DEFAULT_TOL


def test_item5_tolerance_is_relative_to_the_scale():
    X = np.array([[-1e-4, 0.0], [0.0, -1.0]])
    for c in (1.0, 1e-8, 1e8):
        assert classify(c * X, tol=1e-6).names == classify(X, tol=1e-6).names
    assert sorted(classify(X, tol=1e-6).names) == ["decay", "decay"]
    assert sorted(classify(X, tol=1e-2).names) == ["decay", "nope"]


def test_hang_integer_matrices_take_the_numeric_path_past_8():
    """classify of a 20×20 or 32×32 integer matrix took 28 s to > 900 s in sympy; now numeric."""
    rng = np.random.default_rng(0)
    for d in (9, 20, 32):
        c = classify(rng.integers(-3, 4, (d, d)))
        assert not c.exact and c.dim == d
    small = classify([[0, 1, 0], [-1, 0, 0], [0, 0, -2]])  # linear and simple quadratic: exact
    assert small.exact and sorted(small.names) == ["decay", "rotation"]
    assert classify(rng.integers(-3, 4, (4, 4)), exact=False).exact is False


def integer_conjugate(blocks) -> list[list[int]]:
    """B J B⁻¹ with B unimodular (unit triangular factors): an integer matrix with blocks J."""
    J = canonical_form(blocks).astype(np.int64)
    d = J.shape[0]
    rng = np.random.default_rng(1)
    U = np.eye(d, dtype=np.int64) + np.triu(rng.integers(-2, 3, (d, d)), 1)
    L = np.eye(d, dtype=np.int64) + np.tril(rng.integers(-1, 2, (d, d)), -1)
    B = U @ L
    Binv = np.round(np.linalg.inv(B)).astype(np.int64)
    assert (B @ Binv == np.eye(d)).all()
    return (B @ J @ Binv).tolist()


@pytest.mark.parametrize(
    "blocks,exact",
    [
        ([(-1.0, 0.0, 3), (-2.0, 0.0, 3), (0.0, 0.0, 2)], True),  # rational eigenvalues: sympy, fast
        ([(0.0, 1.0, 1), (0.0, 2.0, 1)], True),  # simple square roots at 4×4: sympy
        ([(0.0, 2.0, 4)], False),  # a repeated quadratic factor (45 s in sympy): numeric
        ([(0.0, 3.0, 1), (-1.0, 0.0, 3), (0.0, 0.0, 3)], False),  # square roots at 8×8: numeric
    ],
)
def test_hang_exact_only_where_sympy_is_cheap(blocks, exact):
    c = classify(integer_conjugate(blocks))
    assert c.exact is exact
    want = classify(canonical_form(blocks))
    assert sorted(c.names) == sorted(want.names)
    assert sorted(b[2] for b in c.blocks) == sorted(b[2] for b in blocks)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_classify_of_low_precision_tensors(dtype):
    X = torch.tensor([[-0.25, 1.0], [-1.0, -0.25]], dtype=dtype)  # exact in every dtype
    assert classify(X).names == ["damped_rotation"]
    assert classify(X).blocks == [(-0.25, 1.0, 1)]


def test_classify_tol_is_checked():
    with pytest.raises(ValueError, match="`?tol`? must be"):
        classify(np.eye(2), tol=float("inf"))
    with pytest.raises(TypeError, match="tol"):
        classify(np.eye(2), tol="1e-3")


# ------------------------------------------------------------------ the precision contract
ROWS = contract_rows()


def test_contract_table_covers_every_dtype_and_block():
    seen = {(r["dtype"], r["block"]) for r in ROWS}
    blocks = {"rotation", "damped_rotation", "decay", "polynomial"}
    assert seen == {(d, b) for d in ("float64", "float32", "bfloat16") for b in blocks}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['dtype']}-{r['block']}" for r in ROWS])
def test_precision_contract_row(row):
    assert measured_error(row["block"], row["dtype"], row["kind"], row["limit"]) <= row["bound"]


# ------------------------------------------------------------------ never silently wrong: inputs the fast paths must fit
def _layout(x: torch.Tensor, how: str) -> torch.Tensor:
    """The same values as ``x`` in another memory layout."""
    if how == "channels_last":  # (B, H, S, D) with the heads innermost: last-dim stride H
        return x.contiguous(memory_format=torch.channels_last)
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]  # stepped: last-dim stride 2


PIECES = {
    "decay": (lambda: lp.decay([0.3, 0.1, 0.05, 0.0, 0.2, 0.02, 0.01, 0.1]), {}),
    "xpos": (lambda: lp.xpos(8), {}),
    "alibi": (lambda: lp.alibi(8, num_heads=2), {}),
    "rope+sinks": (lambda: lp.rope(8), {"sinks": torch.tensor([0.5, -1.0], dtype=F64)}),
}


@pytest.mark.parametrize("which,how", [("v", "channels_last"), ("k", "stepped"), ("q", "stepped"),
                                       ("v", "stepped")])
@pytest.mark.parametrize("name", sorted(PIECES))
def test_views_into_the_flash_pieces_are_fitted(name, which, how):
    """The CPU flash kernel reads rows as unit-stride: a channels-last v or a stepped k (same values)
    gave errors of 2–5 on the fused paths; the pieces now copy such a view once."""
    make, kw = PIECES[name]
    enc = make()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=F64, generator=g) for _ in range(3))
    p = torch.arange(40, dtype=F64)
    ref = lp.attention_reference(q, k, v, enc, p, p, **kw)
    args = {"q": q, "k": k, "v": v}
    args[which] = _layout(args[which], how)
    assert args[which].stride(-1) != 1 and torch.equal(args[which], {"q": q, "k": k, "v": v}[which])
    out = lp.attention(args["q"], args["k"], args["v"], enc, p, p, **kw)
    assert float((out - ref).abs().max()) < 1e-10


@pytest.mark.parametrize("make", [lambda: lp.rope(8, layout="half"), lambda: lp.build("jordan", 64),
                                  lambda: lp.rope(8), lambda: lp.xpos(8)], ids=["rope-half", "jordan64", "rope", "xpos"])
@pytest.mark.parametrize("side", ["query", "key"])
def test_in_place_on_a_self_overlapping_view_is_refused(make, side):
    """``inplace=True`` on an expanded tensor: the native kernels wrote through its strides (9.2 off for
    half-layout RoPE, NaN for build("jordan", 64)); now refused by name, as the torch ops refuse it."""
    enc = make()
    D = enc.content_dim
    x = torch.randn(1, 1, 1, D).expand(2, 4, 300, D)  # every element the same memory
    p = torch.arange(300, dtype=F64)
    with pytest.raises(ValueError, match="memory of their own"):
        getattr(enc, side)(x, p, origin=150, inplace=True)
    y = torch.randn(2, 4, 300, D)
    want = getattr(enc, side)(y, p, origin=150)
    assert torch.equal(getattr(enc, side)(y, p, origin=150, inplace=True), want)  # a plain tensor still works


def test_overlap_verdict_where_torch_cannot_say():
    """Strides torch calls too hard to judge: the sorted-extent test decides (an interleaved view whose
    rows overlap is refused, a permuted dense one is not)."""
    from liepos._fast import _overlaps

    base = torch.zeros(64)
    assert _overlaps(base.as_strided((4, 4), (3, 1)))  # rows of 4 every 3 elements: they share memory
    assert not _overlaps(base.as_strided((4, 4), (1, 4)))  # a transposed dense matrix
    assert not _overlaps(torch.zeros(2, 3, 5, 7).transpose(1, 3))
    assert _overlaps(torch.zeros(3, 1).expand(3, 4))


def test_an_alibi_key_window_covers_the_own_key():
    """ALiBi at times 1000 apart: the first query of a block has a large anti-aligned own key, so its row's
    largest score is an earlier key's, which the window used to leave out (3.4 off in float32)."""
    enc = lp.alibi(8, num_heads=4)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=g) for _ in range(3))
    k[:, :, 4] = -1000 * q[:, :, 4]  # blocks (0, 2), (2, 4), (4, 6): query 4 opens the last
    p = 1000.0 * torch.arange(6, dtype=F64)
    ref = lp.attention_reference(q.double(), k.double(), v.double(), enc, p, p)
    assert float((lp.attention(q, k, v, enc, p, p).double() - ref).abs().max()) < 1e-5


@pytest.mark.parametrize("make", [lambda: lp.rope(8), lambda: lp.decay([0.1] * 8), lambda: lp.rope(64, layout="half")],
                         ids=["rope", "decay", "rope-half"])
def test_in_place_on_rows_that_overlap_is_refused(make):
    """Rows of D elements every D − 1: torch cannot tell (its overlap check answers 'too hard') and its
    own ops wrote them wrong too (5.8 off for RoPE, 1e26 for a decay); now refused by name."""
    enc = make()
    D = enc.content_dim
    base = torch.randn(2 * 4 * 300 * D)
    view = base.as_strided((2, 4, 300, D), (4 * 300 * D, 300 * D, D - 1, 1))
    with pytest.raises(ValueError, match="memory of their own"):
        enc.query(view, torch.arange(300, dtype=F64), origin=150, inplace=True)


@pytest.mark.parametrize("layout", ["channels_last", "stepped"])
@pytest.mark.parametrize("venc", [lambda: lp.xpos(8), lambda: lp.decay([0.2] * 8)], ids=["xpos", "decay"])
def test_values_carried_by_a_generator_in_any_layout(venc, layout):
    """A channels-last v with a value encoding reached the flash kernel as the caller's view (2.6–3.0 off)."""
    venc = venc()
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 16, 8, dtype=F64, generator=g) for _ in range(3))
    p = torch.arange(16, dtype=F64) + 50
    out = lp.attention(q, k, _layout(v, layout), lp.rope(8), p, p, value_encoding=venc)
    ref = lp.attention_reference(q, k, v, lp.rope(8), p, p, value_encoding=venc)
    assert float((out - ref).abs().max()) < 1e-10
