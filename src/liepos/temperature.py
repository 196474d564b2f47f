"""Logit temperatures per query row: ``score_ij ↦ τ_h(t_i, n_i) · score_ij``, outside the group, beside it.

A temperature that depends on the query's time ``t`` or on the number ``n`` of keys it sees is not a
generator: no ``A(u)`` makes a score's scale grow with the key count. It is still exact through a
:class:`~liepos.KVCache` and through re-centring, because it multiplies the *query* row before the
encoding (``τ · F(t) q = F(t) (τ q)``: the encoding is linear), and ``t`` and ``n`` are read from the
call's absolute times and visibility, never from an origin. :func:`liepos.attention` takes it as
``temperature=``:

    attention(q, k, v, enc, temperature=T)[i] = Σ_j softmax_j(τ_i · c · q_iᵀ A(t_i − s_j) k_j) v_j

with ``τ_i = T.factor(t_i, n_i)``, ``n_i`` the number of keys query i sees (causality, padding,
documents and ``attn_mask`` included). Three are built in (:data:`TEMPERATURES`):

* :class:`ScalableSoftmax` (Nakanishi, arXiv 2501.19399): ``τ = s_h · log n``, ``s`` per head;
* :class:`Llama4Temperature` (Hugging Face ``attn_temperature_tuning``):
  ``τ = log1p(⌊(t + 1)/floor_scale⌋) · attn_scale + 1``;
* :class:`SwanLengthScaling` (SWAN-GPT's inference-time scaling, arXiv 2504.08719):
  ``τ = 1 + α · log(max(1, (t + 1)/L_train))``.

>>> import torch, liepos as lp
>>> T = Llama4Temperature(floor_scale=4, attn_scale=0.5)
>>> tau = T.factor(torch.tensor([[0.0, 3.0, 7.0]], dtype=torch.float64), None).flatten()  # t + 1 = 1, 4, 8
>>> bool(torch.allclose(tau, 1 + 0.5 * torch.log1p(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))))
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from liepos._checks import check_int, check_real, check_real_tensor, describe
from liepos.attention_call import half_holds, in_float32
from liepos.masks import visible

__all__ = ["Temperature", "ScalableSoftmax", "Llama4Temperature", "SwanLengthScaling", "TEMPERATURES",
           "check_temperature", "visible_counts", "scaled_queries"]


class Temperature:
    """A per-row logit temperature. Subclasses set :attr:`uses_counts` and implement :meth:`factor`.

    ``factor(t, n)`` takes the query times ``t`` ``(B, Sq)`` (float64) and, when :attr:`uses_counts`,
    the visible-key counts ``n`` ``(B, H|1, Sq)`` (else ``None``), and returns ``(B, H|1, Sq)``.
    """

    uses_counts: bool = False
    num_heads: int | None = None

    def factor(self, t: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class ScalableSoftmax(Temperature):
    """Scalable-Softmax (SSMax, Nakanishi 2025, arXiv 2501.19399): ``softmax(s · log n · z)``.

    ``s`` is one positive scalar or one per head ``(heads,)``; ``n`` is the number of keys the query
    sees, so a causal row at time t with every earlier key visible has ``n = t + 1``. A row that sees
    one key (``log 1 = 0``) puts all its weight on it, as the softmax of a single logit does.

    >>> import torch
    >>> T = ScalableSoftmax([0.5, 1.0])
    >>> T.factor(torch.zeros(1, 2, dtype=torch.float64), torch.tensor([[[1.0, 8.0]]])).squeeze(0)
    tensor([[0.0000, 1.0397],
            [0.0000, 2.0794]], dtype=torch.float64)
    """

    uses_counts = True

    def __init__(self, s: Any = 0.43) -> None:
        t = check_real_tensor("s", s, ndim=(0, 1), positive=True)
        self.s = t
        self.num_heads = None if t.dim() == 0 else int(t.shape[0])

    def factor(self, t: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:
        if n is None:
            raise ValueError("ScalableSoftmax needs the visible-key counts n")
        s = self.s.to(device=n.device).reshape(1, -1, 1)  # () or (H,) -> (1, 1|H, 1)
        # a row that sees no key returns zeros whatever its factor: log of 1 there, not of 0
        return s * torch.log(n.to(torch.float64).clamp_min(1.0))

    def __repr__(self) -> str:
        return f"ScalableSoftmax(s={self.s.tolist()})"


class Llama4Temperature(Temperature):
    """Llama 4's ``attn_temperature_tuning`` (its NoPE layers): ``τ(t) = log1p(⌊(t + 1)/floor_scale⌋)·attn_scale + 1``.

    As transformers' ``Llama4TextAttention`` computes it: on the layers without rope only
    (``no_rope_layers[ℓ] = 0``), multiplying the query states after the (absent) rope and before the
    softmax, at ``t`` = the token index ``past_seen_tokens + i`` (the time under default positions;
    transformers ignores ``position_ids`` here), evaluated in **float32** (``positions.float()``) and
    returned as float64 (exact), so ``q · τ`` in float32 or bfloat16 is transformers' product bit for bit.
    Meta's values: ``floor_scale = 8192``, ``attn_scale = 0.1``; τ is 1 until ``t + 1`` reaches ``floor_scale``.

    >>> import torch
    >>> T = Llama4Temperature()
    >>> T.factor(torch.tensor([[8190.0, 8191.0]], dtype=torch.float64), None).flatten().tolist()
    [1.0, 1.06931471824646]
    """

    def __init__(self, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> None:
        self.floor_scale = check_real("floor_scale", floor_scale, positive=True)
        self.attn_scale = check_real("attn_scale", attn_scale)

    def factor(self, t: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:
        t32 = t.to(torch.float32)  # transformers' positions.float(): the same roundings, in the same order
        tau = torch.log1p(torch.floor((t32 + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
        return tau.to(torch.float64).unsqueeze(1)  # (B, Sq) -> (B, 1, Sq)

    def __repr__(self) -> str:
        return f"Llama4Temperature(floor_scale={self.floor_scale:g}, attn_scale={self.attn_scale:g})"


class SwanLengthScaling(Temperature):
    """SWAN-GPT's length scaling (Puvvada et al., NVIDIA, arXiv 2504.08719): ``τ(t) = 1 + α · log(max(1, (t + 1)/L_train))``.

    SWAN-GPT interleaves NoPE global layers with sliding-window RoPE layers and, at inference, scales the
    attention logits with the length of the context beyond the training length ``L_train``, logarithmically.
    liepos implements exactly the formula above (reimplemented from the paper's description; there is no
    reference package): ``t + 1`` is the length of the context the query at time ``t`` closes (the number of
    keys it sees on a causal global layer), ``log`` is the natural logarithm, and the factor is 1 — the
    trained model unchanged — up to ``t + 1 = L_train`` and grows as ``α log`` of the extrapolation ratio
    after it (continuous at ``L_train``). ``α ≥ 0``; ``α = 0`` is no scaling; a logarithm to another base
    is the same factor with ``α / ln(base)``. Computed in float64 from the
    query's absolute time, never from a cache origin, so it is exact through a :class:`~liepos.KVCache` and
    through re-centring.

    >>> import torch, math
    >>> T = SwanLengthScaling(alpha=0.5, train_length=4)
    >>> tau = T.factor(torch.tensor([[0.0, 3.0, 7.0]], dtype=torch.float64), None).flatten()  # t + 1 = 1, 4, 8
    >>> tau.tolist() == [1.0, 1.0, 1 + 0.5 * math.log(2.0)]
    True
    """

    def __init__(self, *, alpha: float, train_length: int) -> None:  # both the model's own: no default
        self.alpha = check_real("alpha", alpha, nonnegative=True)
        self.train_length = check_int("train_length", train_length, min=1)

    def factor(self, t: torch.Tensor, n: torch.Tensor | None) -> torch.Tensor:
        ratio = (t.to(torch.float64) + 1.0) / self.train_length  # (B, Sq) the extrapolation ratio
        tau = 1.0 + self.alpha * torch.log(ratio.clamp_min(1.0))  # the clip: 1 inside the training length
        return tau.unsqueeze(1)  # (B, Sq) -> (B, 1, Sq)

    def __repr__(self) -> str:
        return f"SwanLengthScaling(alpha={self.alpha:g}, train_length={self.train_length})"


TEMPERATURES: dict[str, Callable[..., Temperature]] = {
    "ssmax": ScalableSoftmax,
    "llama4": Llama4Temperature,
    "swan": SwanLengthScaling,
}
"""Every temperature by name: ``TEMPERATURES[name](**params) -> Temperature``."""


def check_temperature(temperature: Any, enc: Any, heads: int) -> Temperature | None:
    """``temperature`` if :func:`liepos.attention` can apply it to this call, else a named error."""
    if temperature is None:
        return None
    if not isinstance(temperature, Temperature):
        raise TypeError(f"`temperature` must be a liepos.temperature.Temperature or None, got {describe(temperature)}")
    if temperature.num_heads not in (None, heads):
        raise ValueError(f"`temperature` has {temperature.num_heads} heads but q has {heads}")
    if getattr(enc, "num_slots", 0):
        raise ValueError(
            f"`temperature` with {enc!r}: its slots add a bias (ALiBi's -m(t - s)) that a query-side "
            f"temperature would leave unscaled; scale the logits of a slot-free encoding only"
        )
    return temperature


def visible_counts(call: Any) -> torch.Tensor:
    """``(B, H|1, Sq)`` float64: how many keys each query of an attention call sees (its softmax's n)."""
    B, _, Sq, _ = call.q.shape
    Sk = call.kpos.shape[1]
    if call.simple:  # causal over strictly increasing times, every key plain: row i sees Sk − Sq + i + 1 keys
        n = torch.arange(Sk - Sq + 1, Sk + 1, dtype=torch.float64, device=call.q.device)
        return n.expand(B, 1, Sq)  # (Sq,) -> (B, 1, Sq)
    parts = []
    for i in range(0, Sq, call.block_size):
        rows = slice(i, min(i + call.block_size, Sq))
        n = visible(*call.mask_args(rows)).sum(-1).to(torch.float64)  # (B, 1|H, rows|1): 1 when no mask has rows
        parts.append(n.expand(*n.shape[:2], rows.stop - rows.start))  # (B, 1|H, rows)
    return torch.cat(parts, dim=-1)


def scaled_queries(call: Any, temperature: Temperature | None) -> Any:
    """The call with every query row multiplied by its temperature: ``q_i ↦ τ_i q_i`` (exact: F(t) is linear)."""
    if temperature is None:
        return call
    n = visible_counts(call) if temperature.uses_counts else None
    if not temperature.uses_counts and call.qpos.dim() != 2:
        raise ValueError(f"{temperature!r} reads one time per query; the positions have several axes")
    tau = temperature.factor(call.qpos.to(torch.float64), n)  # (B, H|1, Sq)
    if not bool(torch.isfinite(tau).all()):
        raise ValueError(f"{temperature!r} gave a non-finite factor (e.g. log of a row that sees no key)")
    if call.q.dtype == torch.float16 and not half_holds(call.enc, call.venc, call.q, call.k, call.v,
                                                        float(tau.abs().max()) if tau.numel() else 1.0):
        call = in_float32(call)  # τ q would overflow float16
    q = call.q
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q = (q.to(work) * tau.unsqueeze(-1).to(device=q.device, dtype=work)).to(q.dtype)  # (B, H, Sq, D)
    return replace(call, q=q)
