"""Second derivatives: every encoding's apply is twice differentiable (its backward ``Mᵀ g`` is itself a
differentiable op whose backward is ``M``), so is lp.attention's plain SDPA path; the fused kernel (re-centred
encodings, sinks) refuses a second derivative with a named error instead of returning a wrong one."""

from __future__ import annotations

import pytest
import torch

import liepos as lp
from liepos._checks import DoubleBackwardError

from helpers import fast_lane  # noqa: E402

ENCODINGS = {
    "rope": lambda: lp.rope(8),
    "rope_half": lambda: lp.rope(8, layout="half"),
    "xpos": lambda: lp.xpos(8),
    "decay": lambda: lp.build("decay", 8, 2),
    "retnet_half": lambda: lp.retnet(8, num_heads=2, layout="half"),
    "alibi": lambda: lp.alibi(8, num_heads=2),
    "jordan": lambda: lp.build("jordan", 8),
    "mrope": lambda: lp.mrope(8, sections=(1, 1, 2)),
}


def _positions(enc, S):
    t = torch.arange(S) + 3
    return t if enc.num_axes is None else torch.stack([t, t // 2, t % 3][: enc.num_axes], -1)  # (S, axes)


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("side", ["query", "key"])
def test_the_apply_is_twice_differentiable(name, side):
    enc = ENCODINGS[name]()
    x = torch.randn(1, enc.num_heads or 2, 4, enc.content_dim, dtype=torch.float64, requires_grad=True)
    pos = _positions(enc, 4)
    f = (lambda x: enc.query(x, pos)) if side == "query" else (lambda x: enc.key(x, pos))
    assert torch.autograd.gradgradcheck(f, (x,))
    # the second derivative of a non-linear loss through the apply equals the readable reference path's
    ref = (lambda x: enc.query_reference(x, pos)) if side == "query" else (lambda x: enc.key_reference(x, pos))
    w = torch.randn(enc.dim, dtype=torch.float64)
    hess = [torch.autograd.functional.hessian(lambda x, g=g: (g(x) * w).sum().square(), x) for g in (f, ref)]
    assert torch.allclose(hess[0], hess[1], atol=1e-10)


def test_the_plain_attention_path_is_twice_differentiable_with_the_math_sdpa():
    """RoPE's plain path is SDPA on encoded q and k: torch's CPU flash kernel has no second derivative (its
    own error), its math kernel has, and so has the whole call then."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enc = lp.rope(8)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        assert torch.autograd.gradgradcheck(lambda q, k, v: lp.attention(q, k, v, enc), (q, k, v))


@pytest.mark.parametrize("case", fast_lane("alibi", "decay", "rope_sinks"))
def test_the_fused_path_refuses_a_second_derivative_by_name(case):
    enc = lp.rope(8) if case == "rope_sinks" else ENCODINGS[case]()
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.randn(2, dtype=torch.float64, requires_grad=True) if case == "rope_sinks" else None
    out = lp.attention(q, k, v, enc, sinks=sinks)
    with pytest.raises(DoubleBackwardError, match=r"second derivative.*lp\.attention_reference"):
        torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    # the first derivative is untouched, and the named alternative is twice differentiable
    g = torch.autograd.grad(lp.attention(q, k, v, enc, sinks=sinks).square().sum(), q)[0]
    r = torch.autograd.grad(lp.attention_reference(q, k, v, enc, sinks=sinks).square().sum(), q)[0]
    assert torch.allclose(g, r, atol=1e-9)
    assert torch.autograd.gradgradcheck(lambda q: lp.attention_reference(q, k, v, enc, sinks=sinks), (q,))
