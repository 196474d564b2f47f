"""The algebra: generators, the exponential map, F/G transforms, the catalogue, bad input."""

import math

import pytest
import torch

import liepos as lp
from liepos.apply import dense_transform
from liepos.generator import Generator, direct_sum

F64 = torch.float64


def random_generator(kind: str, seed: int = 0, heads: int | None = None) -> Generator:
    """One generator per block type (and a mixture of all), with random parameters."""
    g = torch.Generator().manual_seed(seed)
    shape = (heads,) if heads else ()

    def r(lo, hi, n=1):
        return lo + (hi - lo) * torch.rand(*shape, n, generator=g, dtype=F64)

    if kind == "nope":
        return Generator(torch.zeros(*shape, 2, dtype=F64), torch.zeros(*shape, 2, dtype=F64), [1, 1])
    if kind == "decay":
        return Generator(r(-1, -0.01, 3), torch.zeros(*shape, 3, dtype=F64), [1, 1, 1])
    if kind == "growth":
        return Generator(r(0.01, 0.5, 2), torch.zeros(*shape, 2, dtype=F64), [1, 1], allow_growth=True)
    if kind == "rotation":
        return Generator(torch.zeros(*shape, 3, dtype=F64), r(0.1, 3, 3), [1, 1, 1])
    if kind == "one_plane":  # a single rotation plane: the smallest table that rotates
        return Generator(torch.zeros(*shape, 1, dtype=F64), r(0.1, 3, 1), [1])
    if kind == "damped_rotation":
        return Generator(r(-0.5, -0.01, 2), r(0.1, 3, 2), [1, 1])
    if kind == "jordan":
        return Generator(r(-0.5, 0.0, 2), torch.zeros(*shape, 2, dtype=F64), [2, 3])
    if kind == "complex_jordan":
        return Generator(r(-0.5, -0.01, 1), r(0.1, 2, 1), [3])
    if kind == "mixed":
        return direct_sum(*(random_generator(k, seed + i, heads) for i, k in enumerate(KINDS[:-1])))
    raise ValueError(kind)


KINDS = ["nope", "decay", "growth", "rotation", "one_plane", "damped_rotation", "jordan", "complex_jordan", "mixed"]


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("kind", KINDS)
def test_group_law_identity_and_matrix_exp(kind):
    g = random_generator(kind, seed=3)
    gen = torch.Generator().manual_seed(1)
    u = (torch.rand(5, generator=gen, dtype=F64) - 0.5) * 6
    v = (torch.rand(5, generator=gen, dtype=F64) - 0.5) * 6
    Au, Av, Auv = g.exp(u), g.exp(v), g.exp(u + v)
    assert rel_err(Au @ Av, Auv) < 1e-10
    assert rel_err(g.exp(torch.zeros((), dtype=F64)), torch.eye(g.dim, dtype=F64)) < 1e-15
    X = g.matrix()
    ref = torch.linalg.matrix_exp(u[:, None, None] * X)
    assert rel_err(Au, ref) < 1e-10
    # inverses: A(u) A(-u) = I
    assert rel_err(Au @ g.exp(-u), torch.eye(g.dim, dtype=F64).expand_as(Au)) < 1e-10


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_F_transpose_G_is_A_of_lag(kind, layout):
    g = random_generator(kind, seed=5)
    if layout == "half" and g.dim % 2:
        g = direct_sum(g, lp.nope(1).generator)
    enc = lp.Encoding(g, layout)
    gen = torch.Generator().manual_seed(2)
    t = (torch.rand(4, generator=gen, dtype=F64) - 0.5) * 8
    s = (torch.rand(4, generator=gen, dtype=F64) - 0.5) * 8
    eye = torch.eye(g.dim, dtype=F64).reshape(g.dim, 1, 1, g.dim)  # basis vectors as a batch
    for ti, si in zip(t.tolist(), s.tolist()):
        Fq = enc.query(eye, [ti])[:, 0, 0, :]  # rows: F(t) e_i in storage order
        Gk = enc.key(eye, [si])[:, 0, 0, :]
        M = Fq @ Gk.T  # M_ij = e_iᵀ F(t)ᵀ G(s) e_j
        A = dense_transform(enc.generator, enc.plan, torch.tensor([ti - si], dtype=F64), "query")[0].T  # A(t - s), storage order
        assert rel_err(M, A) < 1e-10
        # and against the dense matrix exponential of the storage-order generator
        perm = enc.plan.perm
        X = g.matrix()[perm.argsort()][:, perm.argsort()]
        assert rel_err(M, torch.linalg.matrix_exp((ti - si) * X)) < 1e-9


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("batched_positions", [False, True])
def test_fast_path_equals_dense_reference(kind, layout, batched_positions):
    g = random_generator(kind, seed=7, heads=3)
    if layout == "half" and g.dim % 2:
        g = direct_sum(g, lp.nope(1).generator)
    enc = lp.Encoding(g, layout)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, g.dim, dtype=F64)
    pos = torch.rand(2, 6, dtype=F64) * 10 if batched_positions else torch.rand(6, dtype=F64) * 10
    assert rel_err(enc.query(x, pos), enc.query_reference(x, pos)) < 1e-12
    assert rel_err(enc.key(x, pos), enc.key_reference(x, pos)) < 1e-12


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_fast_path_with_slots_equals_reference(layout):
    # rope content + ALiBi slots (a mixture with a slide on the slots)
    g = direct_sum(lp.rope(6).generator, Generator([0.0], [0.0], [2]))
    qs = torch.tensor([[1.0, 0.0]] * 2, dtype=F64)
    ks = torch.tensor([[0.0, -0.5], [0.0, -0.25]], dtype=F64)
    enc = lp.Encoding(g, layout, query_slots=qs, key_slots=ks)
    x = torch.randn(1, 2, 5, 6, dtype=F64)
    pos = torch.arange(5, dtype=F64) * 1.5
    assert enc.query(x, pos).shape == (1, 2, 5, 8)
    assert rel_err(enc.query(x, pos), enc.query_reference(x, pos)) < 1e-12
    assert rel_err(enc.key(x, pos), enc.key_reference(x, pos)) < 1e-12


def test_fast_path_with_basis_equals_conjugated_dense():
    torch.manual_seed(1)
    g = random_generator("mixed", seed=2)
    P = torch.linalg.qr(torch.randn(g.dim, g.dim, dtype=F64))[0] + 0.1 * torch.randn(g.dim, g.dim, dtype=F64)
    gb = g.with_basis(P)
    assert rel_err(gb.matrix(), P @ g.matrix() @ torch.linalg.inv(P)) < 1e-12
    enc = lp.Encoding(gb)
    q, k = torch.randn(1, 1, 1, g.dim, dtype=F64), torch.randn(1, 1, 1, g.dim, dtype=F64)
    s = (enc.query(q, [2.5]) * enc.key(k, [1.0])).sum()
    ref = q.reshape(-1) @ torch.linalg.matrix_exp(1.5 * gb.matrix()) @ k.reshape(-1)
    assert abs(float(s - ref)) < 1e-10 * max(1.0, abs(float(ref)))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_seeds_worked_example(layout):
    """RoPE d=16, base 10000, every plane (1, 0): 5.5431 at gap 3, invariant, different at gap 7."""
    enc = lp.rope(16, base=10000.0, layout=layout)
    q = torch.zeros(1, 1, 1, 16, dtype=F64)
    if layout == "interleaved":
        q[..., 0::2] = 1.0
    else:
        q[..., :8] = 1.0

    def score(t, s):
        return float((enc.query(q, [t]) * enc.key(q, [s])).sum())

    w = [10000.0 ** (-k / 8) for k in range(8)]
    closed = sum(math.cos(wk * 3) for wk in w)
    assert score(5, 2) == pytest.approx(5.5431, abs=1e-4)
    assert score(5, 2) == pytest.approx(closed, abs=1e-12)
    assert abs(score(13, 10) - score(5, 2)) < 1e-6
    assert abs(score(103, 100) - score(5, 2)) < 1e-6
    assert abs(score(9, 2) - score(5, 2)) > 0.1


@pytest.mark.parametrize("shift", [1e3, 1e5])
def test_rope_translation_invariance_float32(shift):
    torch.manual_seed(0)
    enc = lp.rope(64)
    q, k = torch.randn(1, 4, 16, 64), torch.randn(1, 4, 16, 64)
    pos = torch.arange(16, dtype=torch.float32)
    base = enc.query(q, pos) @ enc.key(k, pos).transpose(-1, -2)
    moved = enc.query(q, pos + shift) @ enc.key(k, pos + shift).transpose(-1, -2)
    assert float((moved - base).abs().max() / base.abs().max()) < 1e-4


def test_heads_axis_broadcasts():
    g = random_generator("damped_rotation", seed=1, heads=4)
    enc = lp.Encoding(g)
    x = torch.randn(2, 4, 3, g.dim, dtype=F64)
    y = enc.query(x, [0.0, 1.0, 2.0])
    for h in range(4):
        gh = Generator(g.rates[h], g.freqs[h], g.sizes)
        yh = lp.Encoding(gh).query(x[:, h : h + 1], [0.0, 1.0, 2.0])
        assert rel_err(y[:, h : h + 1], yh) < 1e-14
    # dense exp carries the heads axis after the offsets
    assert g.exp(torch.zeros(5, dtype=F64)).shape == (5, 4, g.dim, g.dim)


def test_exp_is_differentiable_in_u_and_parameters():
    rates = torch.tensor([-0.3, -0.1], dtype=F64, requires_grad=True)
    freqs = torch.tensor([0.7], dtype=F64, requires_grad=True)
    u = torch.tensor([0.4, 1.3], dtype=F64, requires_grad=True)

    def f(rates, freqs, u):
        w = torch.cat((freqs, torch.zeros(1, dtype=F64)))  # the second block is real
        return Generator(rates, w, [2, 2], complex=[True, False]).exp(u)

    assert torch.autograd.gradcheck(f, (rates, freqs, u))


def test_direct_sum_exp_is_block_diagonal():
    a, b = random_generator("rotation", 1), random_generator("jordan", 2)
    s = direct_sum(a, b)
    u = torch.tensor(1.7, dtype=F64)
    assert rel_err(s.exp(u), torch.block_diag(a.exp(u), b.exp(u))) < 1e-15


# ---------------------------------------------------------------------- catalogue
def test_catalogue_entries_build_and_satisfy_the_identity():
    for name, entry in lp.CATALOGUE.items():
        enc = entry.build(8, 4)
        assert isinstance(enc, lp.Encoding), name
        q = torch.randn(1, 4, 3, 8, dtype=F64)
        k = torch.randn(1, 4, 3, 8, dtype=F64)
        t = torch.tensor([2.0, 3.0, 4.5], dtype=F64)
        if enc.num_axes is not None:  # several position axes: a different time on each axis
            t = t[:, None] * torch.arange(1.0, enc.num_axes + 1, dtype=F64)  # (seq,) -> (seq, axes)
        s1 = enc.query(q, t) @ enc.key(k, t).transpose(-1, -2)
        s2 = enc.query(q, t + 17.25) @ enc.key(k, t + 17.25).transpose(-1, -2)
        assert rel_err(s2, s1) < 1e-10, name


def test_alibi_slots_give_the_linear_bias():
    enc = lp.alibi(4, num_heads=5)
    q, k = torch.randn(1, 5, 3, 4, dtype=F64), torch.randn(1, 5, 4, 4, dtype=F64)
    t, s = torch.tensor([10.0, 11.0, 12.0], dtype=F64), torch.tensor([0.0, 3.0, 7.0, 12.0], dtype=F64)
    scores = enc.query(q, t) @ enc.key(k, s).transpose(-1, -2)
    m = lp.alibi_slopes(5).reshape(1, 5, 1, 1)
    ref = q @ k.transpose(-1, -2) - m * (t[:, None] - s[None, :])
    assert rel_err(scores, ref) < 1e-12


def press_slopes(n):
    """Press et al.'s reference get_slopes, transcribed from the paper's repository (ofirpress/attention_with_linear_biases)."""

    def p2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return p2(n)
    c = 2 ** math.floor(math.log2(n))
    return p2(c) + press_slopes(2 * c)[0::2][: n - c]


@pytest.mark.parametrize("n", list(range(1, 65)))
def test_alibi_slopes_match_press(n):
    assert lp.alibi_slopes(n).tolist() == press_slopes(n)


def test_xpos_and_retnet_parameters():
    enc = lp.xpos(8, scale_base=512.0)
    k = torch.arange(4, dtype=F64)
    zeta = (2 * k + 0.4 * 8) / (1.4 * 8)
    assert torch.allclose(enc.generator.rates, torch.log(zeta) / 512.0)
    assert torch.allclose(enc.generator.freqs, 10000.0 ** (-2 * k / 8))
    r = lp.retnet(8, num_heads=3)
    gamma = 1 - 2.0 ** (-5 - torch.arange(3, dtype=F64))
    assert torch.allclose(r.generator.rates, torch.log(gamma)[:, None].expand(3, 4))
    assert torch.allclose(r.generator.freqs[0], 10000.0 ** -torch.linspace(0, 1, 4, dtype=F64))


# ---------------------------------------------------------------------- bad input
def test_errors_name_the_argument_and_value():
    with pytest.raises(ValueError, match="`dim` must be even, got 7"):
        lp.rope(7)
    with pytest.raises(ValueError, match=r"`rates` must be >= 0.*-0.5"):
        lp.decay([0.1, -0.5])
    lp.decay([0.1, -0.5], allow_growth=True)  # explicit opt-in
    with pytest.raises(ValueError, match="`rates` must be <= 0"):
        Generator([0.2], [0.0], [1])
    with pytest.raises(ValueError, match="`layout`.*'diagonal'"):
        lp.rope(8, layout="diagonal")
    enc = lp.rope(8)
    with pytest.raises(ValueError, match="positions has length 3 but the sequence has 4"):
        enc.query(torch.randn(1, 1, 4, 8), torch.arange(3))
    with pytest.raises(ValueError, match="positions must be finite"):
        enc.query(torch.randn(1, 1, 2, 8), torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="has 3 heads but the encoding has per-head parameters for 2"):
        lp.retnet(8, num_heads=2).query(torch.randn(1, 3, 2, 8), torch.arange(2))
    with pytest.raises(ValueError, match="last dim 6 but the encoding expects 8"):
        enc.query(torch.randn(1, 1, 2, 6), torch.arange(2))
    with pytest.raises(ValueError, match="`rates` must be finite"):
        Generator([float("inf")], [0.0], [1])
    with pytest.raises(ValueError, match="`sizes` has 2 entries"):
        Generator([0.0], [0.0], [1, 1])


def test_matrix_input_errors():
    pytest.importorskip("scipy")
    with pytest.raises(ValueError, match=r"square.*\(2, 3\)"):
        Generator.from_matrix([[0.0, 1.0, 2.0], [0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="finite"):
        Generator.from_matrix([[0.0, float("nan")], [0.0, 0.0]])
