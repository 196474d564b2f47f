"""real_jordan: X = P J P^{-1} with J the canonical real Jordan form of docs/guide/conventions.md."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
import torch
from helpers import conjugated
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from liepos import Generator
from liepos._jordan import canonical_form, real_jordan

from helpers import SEED_ROWS  # one block per row of the six
ROPE16 = [(0.0, 10000.0 ** (-2 * k / 16), 1) for k in range(8)]
MIXTURE = (
    list(SEED_ROWS.values())
    + ROPE16
    + [(0.0, 0.0, 3), (-0.3, 0.0, 3), (-0.1, 0.7, 2)]
)


def _key(b):
    return (b[2], round(b[1], 4), round(b[0], 4))


def assert_blocks_close(got, want, atol=1e-5):
    got, want = sorted(got, key=_key), sorted(want, key=_key)
    assert [n for _, _, n in got] == [n for _, _, n in want], (got, want)
    assert len(got) == len(want), (got, want)
    for (r1, w1, n1), (r2, w2, n2) in zip(got, want):
        assert n1 == n2, (got, want)
        assert abs(r1 - r2) <= atol and abs(w1 - w2) <= atol, (got, want)


def assert_decomposes(X, blocks, P, rtol=1e-8):
    """X P = P J, and Generator(blocks, basis=P).matrix() reproduces X."""
    X = np.asarray(X, dtype=np.float64)
    J = canonical_form(blocks)
    scale = max(np.linalg.norm(X), 1.0) * np.linalg.norm(P)
    assert np.linalg.norm(X @ P - P @ J) <= rtol * scale
    assert all(w >= 0 for _, w, _ in blocks)
    g = Generator(
        [b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks],
        basis=torch.as_tensor(P), allow_growth=True,
    )
    Xg = g.matrix().numpy()
    assert np.linalg.norm(Xg - X) <= rtol * max(np.linalg.norm(X), 1.0) * np.linalg.cond(P)


# ------------------------------------------------------------------ the six rows
@pytest.mark.parametrize("name", list(SEED_ROWS))
def test_seed_rows_canonical(name):
    block = SEED_ROWS[name]
    X = canonical_form([block])
    blocks, P = real_jordan(X)
    assert blocks == [block]
    np.testing.assert_array_equal(P, np.eye(X.shape[0]))
    assert_decomposes(X, blocks, P)


@pytest.mark.parametrize("name", list(SEED_ROWS))
@pytest.mark.parametrize("seed", [0, 1])
def test_seed_rows_in_a_random_basis(name, seed):
    block = SEED_ROWS[name]
    # pad with a decay block so that the change of basis is not trivial for 1x1 rows
    want = [block, (-1.7, 0.0, 1)]
    X = conjugated(want, cond=10.0, seed=seed)
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, want)
    assert_decomposes(X, blocks, P)
    # zero rates and freqs come out exactly zero
    (got,) = [b for b in blocks if b[0] > -1.0]
    if block[0] == 0.0:
        assert got[0] == 0.0
    if block[1] == 0.0:
        assert got[1] == 0.0


def test_rope_behind_orthogonal_basis():
    J = canonical_form(ROPE16)
    Q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((16, 16)))
    X = Q @ J @ Q.T
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, ROPE16, atol=1e-12)
    assert all(r == 0.0 for r, _, _ in blocks)
    assert_decomposes(X, blocks, P)


@pytest.mark.parametrize("rate", [0.0, -0.3])
def test_jordan_block_3x3(rate):
    want = [(rate, 0.0, 3)]
    X = conjugated(want, cond=10.0, seed=7)
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, want)
    assert blocks[0][1] == 0.0
    if rate == 0.0:
        assert blocks[0][0] == 0.0
    assert_decomposes(X, blocks, P)


def test_complex_jordan_block():
    want = [(-0.1, 0.7, 2)]
    X = conjugated(want, cond=10.0, seed=8)
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, want)
    assert_decomposes(X, blocks, P)


def test_complex_block_sign_convention():
    """C = [[λ, ω], [-ω, λ]] with ω > 0, whichever way the input matrix turns."""
    X = np.array([[-0.1, -0.7], [0.7, -0.1]])  # the clockwise one: ω = 0.7 in a flipped basis
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, [(-0.1, 0.7, 1)], atol=1e-14)
    np.testing.assert_allclose(X @ P, P @ canonical_form(blocks), atol=1e-14)
    assert np.linalg.det(P) < 0  # a reflection turns clockwise into counter-clockwise


@pytest.mark.parametrize("cond,seed", [(10.0, 0), (100.0, 1), (100.0, 2), (100.0, 3)])
def test_mixture_of_everything(cond, seed):
    X = conjugated(MIXTURE, cond=cond, seed=seed)
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, MIXTURE)
    assert_decomposes(X, blocks, P)
    zero_rates = [b for b in MIXTURE if b[0] == 0.0]
    assert sum(b[0] == 0.0 for b in blocks) == len(zero_rates)


@pytest.mark.parametrize(
    "want",
    [
        [(0.0, 0.0, 1), (0.0, 0.0, 1), (0.0, 0.0, 2)],
        [(0.0, 0.0, 2), (0.0, 0.0, 2)],
        [(0.0, 0.0, 3), (0.0, 0.0, 1)],
        [(0.0, 0.0, 3), (0.0, 0.0, 2), (0.0, 0.0, 1)],
        [(-0.4, 0.0, 1), (-0.4, 0.0, 1), (-0.4, 0.0, 1)],
        [(-0.2, 1.1, 2), (-0.2, 1.1, 1)],
        [(0.0, 0.5, 1), (0.0, 0.5, 1)],
    ],
)
def test_repeated_eigenvalues_partition(want):
    X = conjugated(want, cond=10.0, seed=11)
    blocks, P = real_jordan(X)
    assert_blocks_close(blocks, want)
    assert_decomposes(X, blocks, P)


def test_generic_matrices_round_trip():
    rng = np.random.default_rng(0)
    for d in (1, 2, 5, 12):
        X = rng.standard_normal((d, d))
        blocks, P = real_jordan(X)
        assert all(n == 1 for _, _, n in blocks)
        assert_decomposes(X, blocks, P)


def test_special_matrices():
    for X, want in [
        (np.zeros((3, 3)), [(0.0, 0.0, 1)] * 3),
        (np.eye(2), [(1.0, 0.0, 1)] * 2),
        (np.array([[0.0, 1.0], [1.0, 0.0]]), [(1.0, 0.0, 1), (-1.0, 0.0, 1)]),
        (np.eye(3)[[1, 2, 0]], [(1.0, 0.0, 1), (-0.5, np.sqrt(3) / 2, 1)]),
    ]:
        blocks, P = real_jordan(X)
        assert_blocks_close(blocks, want, atol=1e-12)
        assert_decomposes(X, blocks, P)


def test_from_matrix_uses_it():
    X = conjugated([(0.0, 0.0, 2), (-0.1, 0.7, 1)], cond=5.0, seed=4)
    g = Generator.from_matrix(X)
    np.testing.assert_allclose(g.matrix().numpy(), X, atol=1e-10)


# ------------------------------------------------------------------ property-based
@st.composite
def canonical_forms(draw):
    n_eigs = draw(st.integers(1, 3))
    eigs: list[tuple[float, float]] = []
    for _ in range(n_eigs):
        rate = draw(st.one_of(st.just(0.0), st.floats(-1.0, -0.05)))
        freq = draw(st.one_of(st.just(0.0), st.floats(0.1, 3.0)))
        eigs.append((rate, freq))
    # distinct eigenvalues are well separated; equal ones are repeated exactly
    for i in range(len(eigs)):
        for j in range(i):
            gap = abs(eigs[i][0] - eigs[j][0]) + abs(eigs[i][1] - eigs[j][1])
            assume(eigs[i] == eigs[j] or gap >= 0.1)
    blocks = []
    for rate, freq in eigs:
        for n in draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)):
            blocks.append((rate, freq, n))
    return blocks


@settings(max_examples=30, deadline=None)
@given(blocks=canonical_forms(), cond=st.floats(1.0, 30.0), seed=st.integers(0, 2**31 - 1))
def test_conjugated_canonical_forms_round_trip(blocks, cond, seed):
    X = conjugated(blocks, cond=cond, seed=seed)
    got, P = real_jordan(X)
    assert_blocks_close(got, blocks)
    assert_decomposes(X, got, P)
    for r, w, _ in got:  # zero rates and frequencies are exactly zero
        assert r == 0.0 or r <= -0.04
        assert w == 0.0 or w >= 0.09


# ------------------------------------------------------------------ the exact path
def test_exact_rotation_from_ints():
    blocks, P = real_jordan([[0, 1], [-1, 0]])
    assert blocks == [(0.0, 1.0, 1)]
    assert blocks[0][1] == 1.0 and blocks[0][0] == 0.0
    np.testing.assert_array_equal(P, np.eye(2))


@pytest.mark.parametrize(
    "X,want",
    [
        ([[1, 1], [0, 1]], [(1.0, 0.0, 2)]),
        ([[Fraction(-1, 2), 1], [0, Fraction(-1, 2)]], [(-0.5, 0.0, 2)]),
        ([[sp.Rational(1, 3), 0], [0, sp.Integer(-2)]], [(1 / 3, 0.0, 1), (-2.0, 0.0, 1)]),
        (np.array([[-1, 2], [-2, -1]]), [(-1.0, 2.0, 1)]),
        (torch.tensor([[0, 1, 0], [0, 0, 1], [0, 0, 0]]), [(0.0, 0.0, 3)]),
        ([[0, 1, 1, 0], [-1, 0, 0, 1], [0, 0, 0, 1], [0, 0, -1, 0]], [(0.0, 1.0, 2)]),
        ([[1, 2, 0], [0, 1, 3], [4, 0, 1]], None),  # cubic eigenvalues in radicals
    ],
)
def test_exact_path(X, want):
    blocks, P = real_jordan(X)
    rows = X.tolist() if hasattr(X, "tolist") else X
    A = np.array([[float(v) for v in row] for row in rows])
    if want is not None:
        assert_blocks_close(blocks, want, atol=1e-15)
        assert all(isinstance(r, float) and isinstance(w, float) for r, w, _ in blocks)
    assert_decomposes(A, blocks, P, rtol=1e-12)


def test_exact_zero_is_exact_and_sizes_are_exact():
    # a nilpotent 2x2 block with a tiny coupling: exact sizes whatever the scale
    blocks, _ = real_jordan([[0, Fraction(1, 10**30)], [0, 0]])
    assert blocks == [(0.0, 0.0, 2)]
    # a tiny but non-zero exact rate stays non-zero
    blocks, _ = real_jordan([[Fraction(-1, 10**20)]])
    assert blocks == [(-1e-20, 0.0, 1)]


def test_exact_flag():
    # exact=False forces the numeric path on ints, exact=True the sympy path on floats
    b1, _ = real_jordan([[0, 1], [-1, 0]], exact=False)
    b2, _ = real_jordan([[0.5, 1.0], [0.0, 0.5]], exact=True)
    assert b1 == [(0.0, 1.0, 1)]
    assert b2 == [(0.5, 0.0, 2)]
    # eigenvalues sympy cannot write in radicals: exact=None falls back to the numeric path
    quintic = [[0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [1, 1, 0, 0, 0]]
    blocks, P = real_jordan(quintic)
    assert_decomposes(quintic, blocks, P)
    with pytest.raises(ValueError, match="exact=True"):
        real_jordan(quintic, exact=True)


# ------------------------------------------------------------------ tolerance
def test_tol_merges_and_snaps():
    X = conjugated([(0.0, 0.0, 1), (-1e-4, 0.0, 1), (-1.0, 0.0, 1)], cond=2.0, seed=5)
    default, _ = real_jordan(X)
    assert sorted(r for r, _, _ in default)[1] == pytest.approx(-1e-4, rel=1e-6)
    merged, P = real_jordan(X, tol=1e-3)  # 0 and -1e-4 are one eigenvalue, snapped to 0
    assert_blocks_close(merged, [(0.0, 0.0, 1), (0.0, 0.0, 1), (-1.0, 0.0, 1)], atol=1e-9)
    assert sorted(r for r, _, _ in merged)[1:] == [0.0, 0.0]
    np.testing.assert_allclose(P @ canonical_form(merged) @ np.linalg.inv(P), X, atol=1e-3)
    # a slow rotation is a rotation by default, two NoPE dimensions with a coarse tol
    R = np.array([[0.0, 1e-4], [-1e-4, 0.0]])
    assert real_jordan(R).blocks == [(0.0, 1e-4, 1)]
    assert real_jordan(R, tol=1e-3).blocks == [(0.0, 0.0, 1), (0.0, 0.0, 1)]


def test_tol_validation():
    with pytest.raises(ValueError, match="tol"):
        real_jordan(np.eye(2), tol=-1.0)
    with pytest.raises(ValueError, match="tol"):
        real_jordan(np.eye(2), tol=float("nan"))


# ------------------------------------------------------------------ input errors
@pytest.mark.parametrize(
    "X,err,match",
    [
        (np.zeros((2, 3)), ValueError, r"square.*\(2, 3\)"),
        (np.zeros((2, 2, 2)), ValueError, r"\(2, 2, 2\)"),
        ([1.0, 2.0], ValueError, r"\(2,\)"),
        (3.0, ValueError, r"shape \(\)"),
        (np.zeros((0, 0)), ValueError, "non-empty"),
        ([], ValueError, "non-empty"),
        ([[1.0, 2.0], [3.0]], ValueError, "lengths"),
        (
            np.array([[np.nan, 0.0], [0.0, np.inf]]),
            ValueError,
            r"finite.*\(0, 0\)=nan.*\(1, 1\)=inf",
        ),
        (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), ValueError, r"\(0, 1\)"),
        (np.eye(2, dtype=complex), TypeError, "complex"),
        (torch.eye(2, dtype=torch.complex64), TypeError, "complex"),
        ([[1j, 0], [0, 0]], TypeError, "complex"),
        ([["a", "b"], ["c", "d"]], TypeError, "real numbers"),
        ([[sp.Symbol("x"), 0], [0, 0]], TypeError, "numbers"),
        ("matrix", TypeError, "matrix"),
        (None, TypeError, "matrix"),
    ],
)
def test_input_errors(X, err, match):
    with pytest.raises(err, match=match):
        real_jordan(X)


def test_accepts_tensors_and_lists():
    X = np.array([[-0.2, 0.9], [-0.9, -0.2]])
    ref = real_jordan(X).blocks
    assert real_jordan(torch.tensor(X)).blocks == ref
    assert_blocks_close(real_jordan(torch.tensor(X, dtype=torch.float32)).blocks, ref, atol=1e-6)
    assert real_jordan(X.tolist()).blocks == ref


def test_core_import_does_not_load_scipy_or_sympy():
    """scipy and sympy are imported inside functions only (they are optional dependencies)."""
    import ast
    import inspect

    import liepos._jordan
    import liepos.classification

    for mod in (liepos._jordan, liepos.classification):
        tree = ast.parse(inspect.getsource(mod))
        for node in tree.body:  # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("scipy", "sympy") for n in names), (mod, names)
