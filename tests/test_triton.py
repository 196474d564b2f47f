"""The Triton kernels of the fused apply (liepos._triton) on the CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` is set per test (the kernels are decorated on first use, when the flag is read),
so they run on CPU tensors exactly as on a GPU, against the float64 reference path and the torch fast
path. Skipped only where triton is not installed (under ``CI=true`` that skip is a failure).
"""

from __future__ import annotations

import pytest
import torch

import liepos as lp
from liepos import _fast, _triton

pytest.importorskip("triton", reason="triton is not installed (pip install 'liepos[test]')")

ENCODINGS = {
    "rope": lambda: lp.rope(16),
    "rope_half": lambda: lp.rope(16, layout="half"),
    "xpos": lambda: lp.xpos(16),
    "xpos_half": lambda: lp.xpos(16, layout="half"),
    "retnet": lambda: lp.retnet(16, num_heads=2),
    "decay": lambda: lp.build("decay", 16, 2),
    "damped": lambda: lp.jordan(2, -0.1, 0.5),
    "jordan": lambda: lp.build("jordan", 16),
    "alibi": lambda: lp.alibi(16, num_heads=2),
    "partial": lambda: lp.Encoding(lp.direct_sum(lp.rope(8).generator, lp.nope(8).generator)),
    "runs": lambda: lp.Encoding(_runs_generator()),  # rotation, decay and NoPE runs side by side
    "runs_half": lambda: lp.Encoding(_runs_generator(), layout="half"),
}


def _runs_generator() -> lp.Generator:
    return lp.direct_sum(lp.rope(6).generator, lp.decay([0.02, 0.1, 0.0, 0.3, 0.05]).generator,
                         lp.nope(5).generator)

# the run kinds each encoding must put through the kernels (so a case cannot pass on copies alone)
KINDS = {"rope": {"complex"}, "rope_half": {"halves"}, "xpos": {"complex"}, "xpos_half": {"halves"},
         "retnet": {"complex"}, "decay": {"real"}, "partial": {"complex", "copy"},
         "runs": {"complex", "real", "copy"}, "runs_half": {"halves", "real", "copy"}}


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _case(name: str, side: str, S: int = 5, dtype=torch.float32, p0: float = 3.0):
    enc = ENCODINGS[name]()
    H = enc.num_heads or 2
    torch.manual_seed(0)
    x = torch.randn(2, H, S, enc.content_dim, dtype=torch.float64)
    pos = torch.arange(S, dtype=torch.float64) + p0
    work = torch.float64 if dtype == torch.float64 else torch.float32
    ft = enc._fast_tables(pos, side, work, True)
    ref = (enc.query_reference if side == "query" else enc.key_reference)(x, pos)
    return enc, x.to(dtype), pos, ft, ref


def _terms(ft, conj=False):
    return None if ft.terms is None else (_fast._transposed_terms(ft) if conj else ft.terms)


@pytest.mark.parametrize("side", ["query", "key"])
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_kernel_matches_float64_reference_and_torch_path(name, side):
    enc, x, pos, ft, ref = _case(name, side)
    if name in KINDS:
        assert {r.kind for r in ft.runs} == KINDS[name]
    y = _triton.apply(x, ft, terms=_terms(ft))
    assert y is not None, "the kernels refused a case they cover"
    assert y.shape == ref.shape and y.dtype == x.dtype
    scale = ref.abs().amax().clamp_min(1.0)
    assert (y.double() - ref).abs().amax() <= 4e-6 * scale
    torch_path = _fast.transform(x, ft, False)
    assert (y - torch_path).abs().amax() <= 2e-6 * scale


@pytest.mark.parametrize("name", ["rope", "rope_half", "xpos_half", "retnet", "jordan", "alibi"])
def test_float64_is_exact_to_the_reference(name):
    enc, x, pos, ft, ref = _case(name, "query", dtype=torch.float64)
    y = _triton.apply(x, ft, terms=_terms(ft))
    assert (y - ref).abs().amax() <= 1e-12 * ref.abs().amax().clamp_min(1.0)


@pytest.mark.parametrize("name", ["rope", "rope_half", "xpos", "damped", "jordan", "alibi"])
def test_transpose_is_the_backward(name):
    """``Mᵀ g`` (conj) equals the torch path's transpose and satisfies ⟨M x, g⟩ = ⟨x, Mᵀ g⟩."""
    enc, x, pos, ft, ref = _case(name, "key", dtype=torch.float64)
    g = torch.randn(*x.shape[:-1], ft.width, dtype=torch.float64)
    gt = _triton.apply(g[..., : ft.content], ft, conj=True, terms=_terms(ft, True))
    torch_gt = _fast.transform(g[..., : ft.content], ft, False, conj=True)
    assert torch.allclose(gt, torch_gt, rtol=1e-12, atol=1e-12)
    mx = _triton.apply(x, ft, terms=_terms(ft))
    lhs = (mx[..., : ft.content] * g[..., : ft.content]).sum()
    assert torch.allclose(lhs, (x * gt).sum(), rtol=1e-10)


@pytest.mark.parametrize("name", ["rope", "rope_half", "retnet", "jordan"])
def test_bfloat16_rounds_once(name):
    """Half precision is upcast in registers and rounded once, in the store: within one bfloat16 ulp
    (2⁻⁷ relative) of the exact transform of the bfloat16 input and of the torch path's float32 scratch.
    One ulp, not half: Triton's interpreter truncates float32 → bfloat16 (its ``cast_impl`` passes no
    rounding mode), where a GPU rounds to nearest even."""
    enc, x, pos, ft, ref = _case(name, "query", dtype=torch.bfloat16)
    ref = enc.query_reference(x.double(), pos)  # the exact transform of the rounded input
    y = _triton.apply(x, ft, terms=_terms(ft))
    assert y.dtype == torch.bfloat16
    floor = 1e-6 * ref.abs().amax()  # float32 rounding of the products
    assert ((y.double() - ref).abs() <= 2.0**-7 * ref.abs() + floor).all()
    t = _fast.transform(x, ft, False).double()
    assert ((y.double() - t).abs() <= 2.0**-7 * t.abs() + floor).all()


def test_strided_input_and_output_order():
    """A (B, S, H, D) input viewed as (B, H, S, D) is read through its strides; the output keeps its order."""
    enc = lp.rope(16, layout="half")
    xs = torch.randn(2, 5, 3, 16)  # (B, S, H, D)
    x = xs.transpose(1, 2)  # (B, S, H, D) -> (B, H, S, D), not contiguous
    ft = enc._fast_tables(torch.arange(5, dtype=torch.float64), "query", torch.float32, True)
    y = _triton.apply(x, ft)
    assert y.stride() == x.stride()
    assert torch.allclose(y, enc.query(x.contiguous()), atol=1e-6)


def test_refuses_what_it_does_not_cover(monkeypatch):
    enc, x, pos, ft, ref = _case("rope", "query")
    assert _triton.apply(x, ft, inplace=True) is None  # in place: the torch path
    assert _triton.apply(x.to(torch.int32), ft) is None  # not a float
    jenc, jx, _, jft, _ = _case("jordan", "query")
    assert _triton.apply(jx, jft, terms=None) is None  # coupled without its terms
    monkeypatch.setenv("LIEPOS_TRITON", "0")
    assert _triton.apply(x, ft) is None  # turned off
    monkeypatch.delenv("LIEPOS_TRITON")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _triton.apply(x, ft) is None  # CPU tensors without the interpreter


def test_long_positions_stay_exact():
    """Tables come from the precise angles: far positions are as exact as near ones."""
    enc, x, pos, ft, ref = _case("rope", "query", p0=1e6)
    y = _triton.apply(x, ft)
    assert (y.double() - ref).abs().amax() <= 4e-6 * ref.abs().amax()


@pytest.mark.parametrize("name", ["rope_half", "xpos", "jordan", "alibi"])
def test_the_fast_path_calls_the_kernels_forward_and_backward(name, monkeypatch):
    """Through ``enc.query`` / ``enc.key`` (liepos._fast dispatches to the kernels on CUDA, and on the CPU under
    the interpreter): the same values and gradients as the torch ops (``LIEPOS_TRITON=0``), and the kernels ran."""
    enc = ENCODINGS[name]()
    H = enc.num_heads or 2
    x = torch.randn(1, H, 4, enc.content_dim, dtype=torch.float64)
    calls = []
    real = _triton.apply

    def counted(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(_triton, "apply", counted)

    def run():
        xs = x.clone().requires_grad_(True)
        y = enc.query(xs, [5, 6, 7, 8]) + 2 * enc.key(xs, [1, 2, 3, 4])
        (y * torch.linspace(-1, 1, y.shape[-1], dtype=torch.float64)).sum().backward()
        return y.detach(), xs.grad

    y, g = run()
    assert calls == [True] * 4  # query, key, and their transposes in the backward, each by the kernels
    monkeypatch.setenv("LIEPOS_TRITON", "0")
    y0, g0 = run()
    assert torch.allclose(y, y0, rtol=1e-12, atol=1e-12) and torch.allclose(g, g0, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_import_liepos_does_not_import_triton():
    """Triton is imported on the first kernel call only: ``import liepos`` works where it is not installed."""
    import os
    import pathlib
    import subprocess
    import sys
    code = "import sys, liepos, liepos._fast, liepos._triton; print('triton' in sys.modules)"
    src = str(pathlib.Path(lp.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": src}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.stdout.strip() == "False", r.stderr[-2000:]
