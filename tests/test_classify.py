"""classify: each block named by its row of the seeds' table (matrix, Generator or Encoding)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import conjugated
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from liepos import Generator
from liepos._jordan import canonical_form
from liepos.classification import NAMES, Classification, classify

from helpers import SEED_ROWS  # one block per row of the six


def generator_of(blocks) -> Generator:
    return Generator(
        [b[0] for b in blocks], [b[1] for b in blocks], [b[2] for b in blocks], allow_growth=True
    )


def only(name: str, k: int = 1) -> dict[str, int]:
    return {n: (k if n == name else 0) for n in NAMES}


# ------------------------------------------------------------------ the six rows
@pytest.mark.parametrize("name", list(SEED_ROWS))
def test_each_row_from_a_matrix(name):
    block = SEED_ROWS[name]
    c = classify(conjugated([block], cond=5.0, seed=1))
    assert c.counts == only(name)
    assert list(c.counts) == list(NAMES)
    assert c.names == [name]
    assert c.is_relative_safe == (name != "growth")
    assert c.dominant == name


@pytest.mark.parametrize("name", list(SEED_ROWS))
def test_each_row_from_a_generator(name):
    block = SEED_ROWS[name]
    c = classify(generator_of([block]))
    assert c.counts == only(name)
    assert c.blocks == [block]
    assert c.source == "generator"
    assert c.dim == canonical_form([block]).shape[0]


def test_polynomial_covers_defective_complex_and_decaying_chains():
    c = classify(generator_of([(-0.3, 0.0, 3), (-0.1, 0.7, 2), (0.0, 0.0, 2)]))
    assert c.counts == only("polynomial", 3)
    # growth wins over polynomial for a growing Jordan block
    assert classify(generator_of([(0.2, 0.0, 2)])).counts == only("growth")


def test_rope_behind_orthogonal_basis_is_all_rotation():
    blocks = [(0.0, 10000.0 ** (-2 * k / 16), 1) for k in range(8)]
    Q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((16, 16)))
    c = classify(Q @ canonical_form(blocks) @ Q.T)
    assert c.counts == only("rotation", 8)
    assert c.dims["rotation"] == 16
    assert all(r == 0.0 for r, _, _ in c.blocks)
    np.testing.assert_allclose(sorted(w for _, w, _ in c.blocks), sorted(b[1] for b in blocks),
                               rtol=1e-10)


def test_all_six_rows_together_and_the_table():
    blocks = list(SEED_ROWS.values())
    c = classify(conjugated(blocks, cond=20.0, seed=2))
    assert c.counts == dict.fromkeys(NAMES, 1)
    text = str(c)
    for name in NAMES:
        assert name in text
    for word in ("explodes", "nothing", "fades", "spins", "spins + fades", "slide", "circle",
                 "spiral", "RoPE", "xPos/RetNet", "ALiBi", "NoPE"):
        assert word in text
    lines = text.splitlines()
    rows = [ln for ln in lines if ln.split(" ")[0] in NAMES]
    assert [r.split()[0] for r in rows] == list(NAMES)  # one row per name, in order
    assert not c.is_relative_safe


def test_str_of_an_empty_row_and_fixed_width():
    c = classify(generator_of([(0.0, 1.0, 1)]))
    lines = str(c).splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("name"))
    # the "blocks" column is aligned in every row
    col = lines[header].index("blocks") + len("blocks")
    for ln in lines[header + 2: header + 8]:
        assert ln[col - 1].isdigit()


def test_to_dict_is_json():
    c = classify(conjugated(list(SEED_ROWS.values()), cond=3.0, seed=3))
    d = json.loads(json.dumps(c.to_dict()))
    assert d["counts"] == c.counts
    assert list(d["counts"]) == list(NAMES)
    assert d["dim"] == 9
    assert len(d["blocks"]) == len(d["names"]) == 6


# ------------------------------------------------------------------ exact and tolerance
def test_exact_rational_rotation():
    c = classify([[0, 1], [-1, 0]])
    assert c.exact and c.tol == 0.0
    assert c.counts == only("rotation")
    assert c.blocks == [(0.0, 1.0, 1)]
    assert c.blocks[0][1] == 1.0


def test_exact_tiny_rate_is_not_zero():
    from fractions import Fraction

    c = classify([[Fraction(-1, 10**18), 0], [0, 0]])
    assert c.exact
    assert c.counts["decay"] == 1 and c.counts["nope"] == 1


def test_numeric_zero_tolerance():
    # a rate of 1e-17 is 0 for float input
    c = classify(generator_of([(-1e-17, 0.0, 1), (1e-17, 0.7, 1)]))
    assert c.counts == {**only("nope"), "rotation": 1}
    assert c.blocks[0] == (0.0, 0.0, 1)
    c = classify(np.array([[1e-17, 0.0], [0.0, -0.5]]))
    assert c.counts["nope"] == 1 and c.counts["decay"] == 1
    # ...and a coarse tol makes a slow decay NoPE: tol is relative to the generator's scale
    g = generator_of([(-1e-4, 0.0, 1), (0.0, 1.0, 1)])
    assert classify(g).counts == {**only("decay"), "rotation": 1}
    assert classify(g, tol=1e-3).counts == {**only("nope"), "rotation": 1}
    alone = generator_of([(-1e-4, 0.0, 1)])  # its own scale: a decay at every tol < 1
    assert classify(alone, tol=0.99).counts == only("decay")


def test_complex_block_with_zero_freq_is_two_real_blocks():
    g = Generator([0.0], [0.0], [1], complex=[True])
    c = classify(g)
    assert c.counts == only("nope", 2)
    assert c.dims["nope"] == 2 == c.dim


def test_heads_are_counted_head_major():
    g = Generator([[0.0, -0.1], [0.0, -0.2]], [[1.0, 0.0], [2.0, 0.0]], [1, 1])
    c = classify(g)
    assert c.num_heads == 2 and c.dim == 3
    assert c.names == ["rotation", "decay", "rotation", "decay"]
    assert "2 heads" in str(c)


class FakeEncoding:
    def __init__(self, generator, num_slots=0):
        self.generator = generator
        self.num_slots = num_slots


def test_encoding_duck_typed_with_slots():
    enc = FakeEncoding(generator_of([(0.0, 0.0, 2)]), num_slots=2)
    c = classify(enc)
    assert c.source == "encoding" and c.num_slots == 2
    assert c.counts == only("polynomial")
    assert "slots" in str(c)
    assert "slots" not in str(classify(FakeEncoding(generator_of([(0.0, 0.0, 2)]))))


# ------------------------------------------------------------------ errors
def test_non_square_matrix_raises_with_shape():
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        classify(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        classify(torch.zeros(3, 2))


def test_bad_inputs():
    with pytest.raises(TypeError):
        classify("not a matrix")
    with pytest.raises(TypeError):
        classify(FakeEncoding("not a generator"))
    with pytest.raises(ValueError, match="tol"):
        classify(np.eye(2), tol=-1)


# ------------------------------------------------------------------ property-based
@st.composite
def canonical_forms(draw):
    eigs: list[tuple[float, float]] = []
    for _ in range(draw(st.integers(1, 3))):
        rate = draw(st.one_of(st.just(0.0), st.floats(-1.0, -0.05)))
        freq = draw(st.one_of(st.just(0.0), st.floats(0.1, 3.0)))
        eigs.append((rate, freq))
    for i in range(len(eigs)):
        for j in range(i):
            gap = abs(eigs[i][0] - eigs[j][0]) + abs(eigs[i][1] - eigs[j][1])
            assume(eigs[i] == eigs[j] or gap >= 0.1)
    sizes = st.lists(st.integers(1, 3), min_size=1, max_size=2)
    return [(r, w, n) for r, w in eigs for n in draw(sizes)]


@settings(max_examples=30, deadline=None)
@given(blocks=canonical_forms(), cond=st.floats(1.0, 30.0), seed=st.integers(0, 2**31 - 1))
def test_classification_is_basis_independent(blocks, cond, seed):
    want = classify(generator_of(blocks))
    got = classify(conjugated(blocks, cond=cond, seed=seed))
    assert got.counts == want.counts
    assert got.dims == want.dims
    assert sorted(got.names) == sorted(want.names)


def test_classification_dataclass_fields():
    c = classify(generator_of([(0.0, 1.0, 1)]))
    assert isinstance(c, Classification)
    assert c.num_blocks == 1 and c.blocks == [(0.0, 1.0, 1)] and c.names == ["rotation"]


# ------------------------------------------------------------------ the table of rows, once
def test_rows_are_one_public_table():
    import re

    from liepos.classification import ROW_COLORS, ROWS, row_of

    assert tuple(r.name for r in ROWS) == NAMES
    assert list(ROW_COLORS) == list(NAMES)
    assert all(re.fullmatch(r"#[0-9A-F]{6}", r.color) for r in ROWS)
    assert len({r.color for r in ROWS}) == 6  # one distinct colour per row
    # the condition of each row names the block SEED_ROWS gives it
    for name, (rate, freq, n) in SEED_ROWS.items():
        assert row_of(int(np.sign(rate)), freq != 0, n) == name
    # the rendered table carries the seeds' words of every row
    text = str(classify(generator_of(list(SEED_ROWS.values()))))
    for r in ROWS:
        assert r.behaviour in text and r.known_as in text


def test_several_axes_are_classified_per_block_jointly():
    """A block of a several-axes generator is one block: its rates and frequencies per axis decide
    its row together (axial RoPE: every block rotates; decay + axial RoPE: every block fades and rotates)."""
    import liepos as lp

    axial = lp.classify(lp.axial_rope(8))
    assert axial.counts["rotation"] == 4 and sum(axial.counts.values()) == 4
    mixed = lp.classify(lp.decay_axial_rope(12))
    assert mixed.counts["damped_rotation"] == sum(mixed.counts.values()) == 6
    # one axis alone is a one-axis generator of the same rows
    one = lp.classify(lp.axial_rope(8).generator.axis(0))
    assert one.counts["rotation"] + one.counts["nope"] == sum(one.counts.values())
