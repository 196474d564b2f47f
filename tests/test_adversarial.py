"""Issue 13, the items in the precision area: each found fault stays fixed, and the precision contract
of docs/guide/precision.md holds row by row (the table is parsed from the page, tests/contract.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from contract import contract_rows, measured_error

import liepos as lp
from liepos._jordan import canonical_form
from liepos.classify import DEFAULT_TOL, classify

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
