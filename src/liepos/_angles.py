"""Angles ``ω·t mod 2π`` for every finite float64 frequency and time (Payne–Hanek reduction).

The defining identity: for float64 tensors ``freq`` (ω) and ``pos`` (t),

    reduced_angle(ω, t) = ω·t − 2πk   (the exact real product ω·t, k an integer, result in [−π, π])

to within ``ulp(result) + 2⁻⁷⁰`` (a faithful rounding of the exact reduced value), whatever the sizes
of ω and t: ``1e-6 · 1e300`` is as exact as ``1.0 · 3.0``. No float64 rounding of ``ω·t`` ever
happens: the product is split into exact parts first.

How (each step exact unless said):

1. ``ω = m_ω 2^{e_ω}``, ``t = m_t 2^{e_t}`` (``frexp``, mantissas in [½, 1)); Dekker's product
   ``m_ω m_t = h + l`` exactly, so ``ω t = (h + l) 2^E`` with ``E = e_ω + e_t`` (no overflow, even
   when ``ω t`` itself exceeds the float64 range).
2. For each part ``v 2^E`` (``v = h`` and ``v = l``): ``v 2^E = M 2^U`` with ``M`` a 53-bit integer.
   The bits of ``1/(2π)`` above ``2^{−24b}``, ``b = max(0, ⌊U/24⌋)``, contribute an integer to
   ``M 2^U/(2π)`` and are dropped; what is left is ``frac(y · G_b)`` with ``y = v 2^{E−24b}``
   (``|y| < 2⁷⁷``) and ``G_b = frac(2^{24b}/(2π))`` stored as three float64 chunks (159 bits, so
   the truncation error is below ``2⁷⁷·2⁻¹⁵⁹ = 2⁻⁸²``). Products ``y·g`` are split exactly by
   Dekker's algorithm and their integer parts removed exactly (``p − round(p)``).
3. The fractional parts are summed as a double-double, wrapped to [−½, ½], and multiplied by the
   double-double ``2π``; the one rounding to float64 is the last step.

Products with ``|ω t| < 2`` need no reduction and are returned as ``ω t`` rounded once. Two cheaper
reductions give the same bound where they apply: below ``|ω t| < 2²⁷·2π`` (the position tables of a
model) a three-part Cody–Waite reduction; below ``|ω t| < 2⁸⁰·2π`` (timestamps up to 1e18) the
product of ``t`` with ``ω/(2π)`` formed once per frequency to 155 bits (:func:`_per_frequency`).

The reduction has the derivative of ``ω t`` (``∂/∂ω = t``, ``∂/∂t = ω``): the reduced value is
computed without autograd and the gradient flows through ``ω t − stop_gradient(ω t)``, which is 0.

>>> import math, torch
>>> f64 = torch.float64
>>> w, t = torch.tensor([1.0], dtype=f64), torch.tensor([1e22], dtype=f64)
>>> r = float(reduced_angle(w, t))           # sin(1e22) is a classic test of range reduction
>>> abs(math.sin(r) - (-0.8522008497671888)) < 1e-15
True
>>> w = torch.tensor([2 * math.pi], dtype=f64)      # the float64 2π is 2π + δ, δ = sin(fl(2π))
>>> r = float(reduced_angle(w, torch.tensor([2.0**40], dtype=f64)))
>>> math.isclose(r, 2.0**40 * math.sin(2 * math.pi), rel_tol=1e-12)   # 2^40·fl(2π) − 2^40·2π
True

Inside ``torch.compile`` the per-frequency reduction is used for every element (inductor cannot
compile ``frexp``'s exponents), and angles past ``|ω t| ≥ 2⁸⁰·2π`` come out NaN, never wrong.
"""

from __future__ import annotations

import math

import torch

__all__ = ["reduced_angle", "inv_two_pi_bits", "TABLE_BITS"]

_TWO_PI = 2.0 * math.pi
_SPLITTER = 134217729.0  # 2^27 + 1: Veltkamp's splitter for 53-bit significands
_SPLIT_LIMIT = 2.0**995  # below this, _SPLITTER · x does not overflow
_CHUNK_BITS = 24  # the exponent step between consecutive entries of the table of 1/(2π)
_G_PARTS = 3  # float64 chunks per table entry: 3·53 = 159 bits past the dropped integer bits
# float64 exponents run from −1074 to 1023, so E = e_ω + e_t lies in [−2148, 2048]; the largest
# table index needed is ⌊(2048 − 53)/24⌋ = 83. A few spare entries keep the slicing simple.
_MAX_EXPONENT = 2 * 1024
_TABLE_SIZE = (_MAX_EXPONENT - 53) // _CHUNK_BITS + 2
TABLE_BITS = _TABLE_SIZE * _CHUNK_BITS + _G_PARTS * 53 + 64  # bits of 1/(2π) the table is cut from
# Cody–Waite: 2π = _C1 + _C2 + _C3 with _C1 of 25 and _C2 of 24 significant bits, so k·_C1, k·_C2 are exact
# for |k| < 2^27: every |ω t| below 2^27·2π (≈ 8.4e8) reduces exactly with three products.
_CODY_WAITE_LIMIT = 2.0**27 * _TWO_PI
# the per-frequency path: ω/(2π) to 155 bits, so |ω t/(2π)| < 2^80 keeps the error below 2^-75 turns
# (t up to 1e18 at ω up to 7e6); frequencies below 2^-800 would make its third part subnormal
_TURNS_LIMIT = 2.0**80
_MIN_FREQ = 2.0**-800


def _pi_scaled(bits: int) -> int:
    """⌊π · 2^bits⌋ in integer arithmetic (Machin: π = 16 atan(1/5) − 4 atan(1/239))."""
    guard = 32
    one = 1 << (bits + guard)

    def atan_inv(x: int) -> int:  # atan(1/x) · one, by its Taylor series
        total = term = one // x
        x2, n, sign = x * x, 1, 1
        while term:
            term //= x2
            n += 2
            sign = -sign
            total += sign * (term // n)
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> guard


def inv_two_pi_bits(bits: int) -> int:
    """⌊2^bits / (2π)⌋ exactly (the first ``bits`` fractional bits of 1/(2π), as an integer).

    >>> abs(inv_two_pi_bits(60) / 2**60 - 1 / (2 * 3.141592653589793)) < 1e-16
    True
    """
    pi = _pi_scaled(bits + 8)  # π·2^(bits+8), the extra bits absorb the floor of the division
    return (1 << (2 * bits + 8)) // (2 * pi)


def _leading_floats(value: int, scale: int, widths: list[int]) -> list[float]:
    """``value · 2^-scale`` as float64 numbers of the given significant widths, each the leading bits
    of what the previous ones left, exactly (their sum is the value, truncated after the last)."""
    out = []
    for keep in widths:
        drop = max(value.bit_length() - keep, 0)
        lead = (value >> drop) << drop
        out.append(math.ldexp(float(lead >> drop), drop - scale) if lead else 0.0)
        value -= lead
    return out


def _table() -> torch.Tensor:
    """``G[:, b] = frac(2^{24b} / (2π))`` as three float64 chunks: shape (3, _TABLE_SIZE)."""
    inv = inv_two_pi_bits(TABLE_BITS)  # 1/(2π) = inv · 2^-TABLE_BITS (to 2^-TABLE_BITS)
    rows = []
    for b in range(_TABLE_SIZE):
        shift = TABLE_BITS - _CHUNK_BITS * b  # frac(2^{24b}/(2π)) = (inv mod 2^shift) · 2^-shift
        rows.append(_leading_floats(inv & ((1 << shift) - 1), shift, [53] * _G_PARTS))
    return torch.tensor(rows, dtype=torch.float64).T.contiguous()  # (_G_PARTS, _TABLE_SIZE)


_G = _table()
_INV_TWO_PI = tuple(_G[:, 0].tolist())  # 1/(2π) in three float64 chunks (row b = 0)
_TWO_PI_SCALE = 200  # bits of 2π past the binary point that its splits are cut from
_TWO_PI_INT = 2 * _pi_scaled(_TWO_PI_SCALE)  # 2π · 2^200
_TWO_PI_HI, _TWO_PI_LO = _leading_floats(_TWO_PI_INT, _TWO_PI_SCALE, [53, 53])  # a double-double
_C1, _C2, _C3 = _leading_floats(_TWO_PI_INT, _TWO_PI_SCALE, [26, 26, 53])  # the Cody–Waite split
_TWO_PI_HI_HALVES = (  # Veltkamp's halves of _TWO_PI_HI, as _two_prod splits every operand
    _SPLITTER * _TWO_PI_HI - (_SPLITTER * _TWO_PI_HI - _TWO_PI_HI),
    _TWO_PI_HI - (_SPLITTER * _TWO_PI_HI - (_SPLITTER * _TWO_PI_HI - _TWO_PI_HI)),
)


def _two_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's exact product: ``a·b = p + e`` exactly in float64, without fma (|a|, |b| < 2^995)."""
    p = a * b
    ca = _SPLITTER * a
    ah = ca - (ca - a)
    al = a - ah
    cb = _SPLITTER * b
    bh = cb - (cb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's exact sum: ``a + b = s + e`` exactly in float64."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _frac_part(p: torch.Tensor) -> torch.Tensor:
    """``p − round(p)`` in [−½, ½], exact for every float64 ``p``."""
    return p - torch.round(p)


def _frac_sum(p0: torch.Tensor, e0: torch.Tensor, p1: torch.Tensor, tail: torch.Tensor):
    """``frac(p0 + e0 + p1 + tail)`` as a double-double ``(hi, lo)``, ``hi`` in [−½, ½]: the integer
    parts of the exact ``p0``, ``e0``, ``p1`` are removed exactly, ``tail`` is below 2^-28."""
    s, err = _two_sum(_frac_part(p0), _frac_part(e0))
    s, err2 = _two_sum(_frac_part(s), _frac_part(p1))
    return _frac_part(s), err + err2 + tail


def _turns(v: torch.Tensor, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``frac(v · 2^E / (2π))`` as a double-double ``(hi, lo)``, for float64 ``v`` and an integer
    exponent ``E`` (held in float64)."""
    m, ev = torch.frexp(v)  # v = m · 2^ev, |m| in [½, 1) (m = 0 for v = 0)
    # exponents are small integers, exact in float64 (inductor cannot vectorise int32 → int64)
    shift = ev.to(torch.float64) + E
    units = shift - 53  # v · 2^E = (m · 2^53) · 2^units, an integer times 2^units
    b = torch.floor(units / _CHUNK_BITS).clamp(0, _TABLE_SIZE - 1)
    y = torch.ldexp(m, shift - _CHUNK_BITS * b)  # |y| < 2^77 once b > 0
    index = b.to(torch.int64)
    g0, g1, g2 = (_G[j].to(v.device).take(index) for j in range(_G_PARTS))  # frac(2^{24b}/(2π))
    p0, e0 = _two_prod(y, g0)  # |p0| < 2^77
    p1, e1 = _two_prod(y, g1)  # |p1| < 2^24
    return _frac_sum(p0, e0, p1, e1 + y * g2)  # |e1 + y g2| < 2^-28; its rounding is below 2^-80


def _radians(turns: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """``2π · (turns + lo)`` wrapped to [−π, π], from a double-double number of turns."""
    k = torch.round(turns)
    s, lo = _two_sum(turns - k, lo)
    p = s * _TWO_PI_HI  # Dekker's product with the halves of the constant split once
    sh = _SPLITTER * s
    sh = sh - (sh - s)
    sl = s - sh
    e = ((sh * _TWO_PI_HI_HALVES[0] - p) + sh * _TWO_PI_HI_HALVES[1] + sl * _TWO_PI_HI_HALVES[0]) \
        + sl * _TWO_PI_HI_HALVES[1]
    return p + (e + s * _TWO_PI_LO + lo * _TWO_PI_HI)


def _payne_hanek(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``ω t mod 2π`` in [−π, π] for any finite float64 ω, t of one shape (no autograd)."""
    mw, ew = torch.frexp(freq)
    mt, et = torch.frexp(pos)
    h, l = _two_prod(mw, mt)  # m_ω m_t = h + l exactly; |h| in [¼, 1)
    E = ew.to(torch.float64) + et.to(torch.float64)
    hi1, lo1 = _turns(h, E)
    hi2, lo2 = _turns(l, E)
    s, err = _two_sum(hi1, hi2)
    small = E <= 1  # |ω t| < 2: no reduction needed; ω t rounded once (its tiny values kept)
    return torch.where(small, freq * pos, _radians(s, lo1 + lo2 + err))


def _per_frequency(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``ω t mod 2π`` when every ``|ω t / 2π| < _TURNS_LIMIT`` (broadcasting, no autograd).

    ``ω/(2π)`` is formed once per frequency as a triple-double ``c₀ + c₁ + c₂`` (relative error
    2⁻¹⁵⁵); then ``frac(t c₀) + frac(t c₁) + t c₂`` with exact products: an error below
    ``2⁸⁰·2⁻¹⁵⁵ = 2⁻⁷⁵`` turns, at a third of the work of :func:`_payne_hanek` (the splitting of
    each operand happens before the broadcast).
    """
    g0, g1, g2 = _INV_TWO_PI
    q0, e0 = _two_prod(freq, torch.full_like(freq, g0))
    q1, e1 = _two_prod(freq, torch.full_like(freq, g1))
    c1, r = _two_sum(e0, q1)
    c2 = (r + e1) + freq * g2
    p0, f0 = _two_prod(pos, q0)  # (…, seq, planes) from (…, seq, 1) and (…, 1, planes)
    p1, f1 = _two_prod(pos, c1)
    # every error is relative to |ω t| or below 2^-75 turns: small products need no special case
    return _radians(*_frac_sum(p0, f0, p1, f1 + pos * c2))


def _cody_waite(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """``hi + lo mod 2π`` for ``|hi| < _CODY_WAITE_LIMIT`` (``hi + lo`` the exact product)."""
    k = torch.round(hi / _TWO_PI)
    return (((hi - k * _C1) - k * _C2) - k * _C3) + lo


def _products_below(w: torch.Tensor, t: torch.Tensor, limit: float) -> bool:
    """Whether every ``|ω t|`` is below ``limit`` and both operands split without overflow, from
    the inputs' largest magnitudes (``max|ω| · max|t|`` bounds every product; NaN answers no)."""
    wmax, tmax = w.abs().max(), t.abs().max()
    return bool((wmax * tmax < limit) & (wmax < _SPLIT_LIMIT) & (tmax < _SPLIT_LIMIT))


def _reduce(w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The cheapest exact reduction for these operands (eager mode: one host sync per choice)."""
    if w.numel() == 0 or t.numel() == 0 or _products_below(w, t, _CODY_WAITE_LIMIT):
        return _cody_waite(*_two_prod(w, t))
    tiny = (w != 0) & (w.abs() < _MIN_FREQ)
    if _products_below(w, t, _TURNS_LIMIT * _TWO_PI) and not bool(tiny.any()):
        return _per_frequency(w, t)
    return _payne_hanek(*torch.broadcast_tensors(w, t))


def _compiled_reduction(w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The reduction inside ``torch.compile``: :func:`_per_frequency` (inductor cannot compile the
    exponent arithmetic of ``frexp`` that Payne–Hanek needs), NaN — loudly, never a wrong angle —
    where it does not apply: ``|ω t| ≥ 2^80·2π`` (past 7.6e24 at ω = 1), or ``0 < |ω| < 2^-800``."""
    x = w * t
    bad = ~(x.abs() < _TURNS_LIMIT * _TWO_PI) | ((w != 0) & (w.abs() < _MIN_FREQ) & (x.abs() >= 2.0))
    return torch.where(bad, torch.nan, _per_frequency(w, t))


def reduced_angle(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``freq · pos`` reduced to [−π, π] in float64, the product taken exactly (broadcasting).

    ``reduced_angle(ω, t) = ω t − 2πk`` for the exact real product, to ``ulp(result) + 2⁻⁷⁰``, for
    every finite float64 ω and t (see the module docstring); differentiable as ``ω t``.

    >>> import torch
    >>> w = torch.tensor([1e-6, 1.0, 1e3], dtype=torch.float64)
    >>> t = torch.tensor([3.0, 2.0**31 - 1, 1e300], dtype=torch.float64)
    >>> r = reduced_angle(w, t)
    >>> bool(r[0] == 3e-6) and bool(r.abs().max() <= torch.pi)
    True
    """
    freq = freq.to(torch.float64)
    pos = pos.to(torch.float64)
    with torch.no_grad():
        w, t = freq.detach(), pos.detach()
        if torch.compiler.is_compiling():
            r = _compiled_reduction(w, t)  # no data-dependent branch when compiled
        else:
            r = _reduce(w, t)
    if not (freq.requires_grad or pos.requires_grad):
        return r
    x = freq * pos
    return r + (x - x.detach())  # the value r, the derivative of ω t
