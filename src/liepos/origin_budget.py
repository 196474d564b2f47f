"""The origin budget: how far from one origin the times of a query block (or a cache store) may lie.

Around an origin ``o`` the factors ``F(t − o)`` and ``G(s − o)`` of ``F(t − o)ᵀ G(s − o) = A(t − s)`` grow
like ``e^{|λ| |t − o|}`` and, for polynomial parts (Jordan blocks, slots), their binomial terms cancel with a
rounding of about ``span^n · eps``. A budget ``(max |λ|, exponent budget, polynomial span)`` bounds both:
:func:`budget` of an attention call, :func:`origin_span` of an encoding (a cache store's span),
:func:`allowed` the distance it allows, :func:`within` whether times keep to it.
"""

from __future__ import annotations

import math

import torch

from liepos.attention_call import LOW, Call
from liepos.encoding import Encoding

__all__ = ["MAX_EXPONENT", "POLY_SPAN", "POLY_ROUNDING", "budget", "origin_span", "poly_span", "allowed", "within"]

# largest |λ|·(time span of a query block) allowed, so e^{|λ| span} stays far from overflow
MAX_EXPONENT = 30.0
# largest time span of the polynomial parts (Jordan blocks, slots) around one origin: binomial terms
# of (t - o) and (s - o) cancel, so the span bounds the rounding of near-lag scores; 512 is where
# ALiBi's degree-one slots in float32 meet POLY_ROUNDING (span · eps = 2^9 · 2^-23)
POLY_SPAN = 512.0
# relative rounding allowed from that cancellation: a Jordan block of degree n (size n + 1) computed in
# a dtype of unit roundoff eps loses about span^n · eps, so the span is at most (POLY_ROUNDING / eps)^(1/n)
POLY_ROUNDING = 2.0**-14


def _max_rate(enc: Encoding | None) -> float:
    if enc is None:
        return 0.0
    with torch.no_grad():
        r = enc.generator.rates
        return float(r.detach().abs().max()) if r.numel() else 0.0


def _limit(dtype: torch.dtype) -> float:
    """The exponent budget for inputs of ``dtype``: e^{±budget} factors on both sides stay far inside its range."""
    work = torch.float32 if dtype in LOW else dtype
    return min(MAX_EXPONENT, math.log(torch.finfo(dtype if dtype == torch.float16 else work).max) / 3)


def budget(call: Call) -> tuple[float, float, float]:
    """(max |λ|, exponent budget, time span allowed for polynomial parts) of the call's encodings."""
    rate = max(_max_rate(call.enc), _max_rate(call.venc))
    dtype = call.q.dtype
    work = torch.float32 if dtype in LOW else dtype
    return rate, _limit(dtype), poly_span(call.enc, work) if call.venc is None else min(
        poly_span(call.enc, work), poly_span(call.venc, work))


def origin_span(enc: Encoding, dtype: torch.dtype) -> float:
    """The largest ``|t − o|`` of a query or key around one origin for ``enc`` on inputs of ``dtype``:
    ``min(limit / max |λ|, poly span)``, the :func:`budget` of a call with this encoding as one number
    (a cache store's span, :class:`liepos.cache.EncodedKeys`)."""
    work = torch.float32 if dtype in LOW else dtype
    return allowed((enc.generator.bounds()[0], _limit(dtype), poly_span(enc, work)))


def poly_span(enc: Encoding, work: torch.dtype) -> float:
    """The time span one origin may cover for the polynomial parts of ``enc`` computed in ``work``:
    ``min(POLY_SPAN, (POLY_ROUNDING / eps)^(1/n))`` for a largest Jordan block of degree ``n`` (slots: degree
    one) in a dtype of unit roundoff ``eps``, where the cancelling binomial terms of ``(t − o)`` and ``(s − o)``
    keep near-lag scores within ``POLY_ROUNDING``; infinite when ``enc`` has neither coupling nor slots."""
    if not (enc.plan.has_coupling or enc.num_slots):
        return math.inf
    degree = max(enc.generator.sizes) - 1
    return min(POLY_SPAN, (POLY_ROUNDING / torch.finfo(work).eps) ** (1.0 / max(degree, 1)))


def within(times: torch.Tensor, origin: torch.Tensor, b: tuple[float, float, float]) -> bool:
    """Whether every time is close enough to its row's origin for F/G factors to stay finite and exact."""
    if times.numel() == 0:
        return True
    rate, limit, poly_span = b
    d = float((times - origin.unsqueeze(-1)).detach().abs().max())
    return rate * d <= limit and d <= poly_span



def allowed(b: tuple[float, float, float]) -> float:
    """How far from its origin a time may lie under the budget ``b`` = (max |λ|, exponent budget, polynomial
    span): ``min(limit / rate, span)``, the exponent budget over the rate and the polynomial span (a cache
    store's span)."""
    rate, limit, poly_span = b
    return min(limit / rate if rate > 0 else math.inf, poly_span)
