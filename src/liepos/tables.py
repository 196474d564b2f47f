"""Position tables: the per-dimension numbers that apply F(t) = A(t)ᵀ and G(s) = A(−s) in O(dim).

For every canonical block the transform factors into commuting parts (Kronecker structure)::

    F(t) = e^{λt} · P(t)ᵀ ⊗ R(ωt)          G(s) = e^{−λs} · P(−s) ⊗ R(ωs)

where ``P(u) = Σ_k u^k/k! N^k`` is the polynomial (nilpotent) part and ``R`` rotates counter-clockwise.
So applying F or G is: a per-dimension *diagonal-plus-partner* step ``z = a ⊙ x + b ⊙ partner(x)``
(scale and rotation), then, for Jordan blocks of size ≥ 2 only, a sparse *coupling* step
``y[dst] += c · z[src]``. A :class:`Plan` holds the structural index arrays of an encoding (built
once); :func:`build_tables` turns positions into the numeric ``a``, ``b`` and ``c`` tables.

Precision: angles ω·t are formed as an exact double-double product and reduced modulo 2π with a
three-part Cody–Waite constant, scales e^{λt} and polynomial coefficients in float64; the tables
are cast once at the end. They never depend on the dtype of the query or key tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from liepos import _angles
from liepos.generator import Generator

__all__ = ["Plan", "Tables", "assemble_tables", "make_plan", "build_tables", "reduced_angle"]

# 2π = _C1 + _C2 + _C3, with _C1 and _C2 holding 26 significant bits each so that k·_C1 and k·_C2
# are exact for |k| < 2^27 (angles up to ~8e8 rad, i.e. positions past 2^31 at ω ≤ 0.4).
_TWO_PI = 2.0 * math.pi


def _split26(x: float) -> float:
    m, e = math.frexp(x)
    return math.ldexp(math.floor(m * 2.0**26) / 2.0**26, e)


_C1 = _split26(_TWO_PI)
_C2 = _split26(_TWO_PI - _C1)
# the remainder of 2π past _C1 + _C2, from the 60-digit value of π
_C3 = float(
    (
        __import__("decimal").Decimal("6.28318530717958647692528676655900576839433879875021164194988918")
        - __import__("decimal").Decimal(_C1)
        - __import__("decimal").Decimal(_C2)
    )
)
_SPLITTER = 134217729.0  # 2^27 + 1 (Veltkamp)


def _two_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's exact product: a·b = hi + lo exactly in float64 (see :mod:`liepos._angles`)."""
    return _angles._two_prod(a, b)


def reduced_angle(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``freq · pos`` reduced to [−π, π] in float64, exactly for every finite float64 ω and t.

    :func:`liepos._angles.reduced_angle` (kept here for its callers): ``ω t − 2πk`` of the exact
    product, within one ulp of the result.

    >>> import math, torch
    >>> w, t = torch.tensor([1.0], dtype=torch.float64), torch.tensor([1e18], dtype=torch.float64)
    >>> abs(math.sin(float(reduced_angle(w, t))) - (-0.99296932074040507621)) < 1e-15  # mpmath's sin(1e18)
    True
    """
    return _angles.reduced_angle(freq, pos)


@dataclass(frozen=True)
class Plan:
    """Structural index arrays for one encoding (canonical → storage layout), built once.

    Attributes:
        dim: total width (content + slots).
        perm: ``perm[c]`` is the storage index of canonical dimension ``c``.
        inv: ``inv[i]`` is the canonical dimension stored at index ``i``.
        block_of: canonical dim → block index.
        sign: canonical dim → −1 (x of a plane), +1 (y of a plane), 0 (real dim).
        partner: "none" (no rotation), "pairs" (storage planes (2k, 2k+1)), "halves" (planes
            (k, k + P)) or "gather" (``partner_index``).
        partner_index: storage dim → storage dim of its plane partner (itself for real dims).
        planes: number of rotation planes P.
        dst, src, power: coupling pairs in storage indices (y[dst] += c_power · z[src]).
    """

    dim: int
    perm: torch.Tensor
    inv: torch.Tensor
    block_of: torch.Tensor
    sign: torch.Tensor
    partner: str
    partner_index: torch.Tensor
    planes: int
    dst: torch.Tensor
    src: torch.Tensor
    power: torch.Tensor

    @property
    def has_coupling(self) -> bool:
        return int(self.dst.numel()) > 0


def make_plan(generator: Generator, layout: str, num_slots: int = 0) -> Plan:
    """Index arrays for applying ``generator`` in ``layout`` (slots are the last canonical dims)."""
    d = generator.dim
    content = d - num_slots
    block_of, sign, chain, plane_x = [], [], [], []
    for i, (n, cplx, off) in enumerate(zip(generator.sizes, generator.complex, generator.offsets)):
        for j in range(n):
            if cplx:
                block_of += [i, i]
                sign += [-1, 1]
                chain += [j, j]
                plane_x.append(off + 2 * j)
            else:
                block_of.append(i)
                sign.append(0)
                chain.append(j)
    # the storage permutation
    if layout == "interleaved":
        perm = list(range(d))
    elif layout == "half":
        xs = [c for c in plane_x if c < content]
        if any(c + 1 >= content for c in xs):
            raise ValueError("a rotation plane straddles the content/slot boundary")
        P = len(xs)
        perm = [-1] * d
        for k, c in enumerate(xs):
            perm[c] = k
            perm[c + 1] = k + P
        nxt = 2 * P
        for c in range(content):
            if perm[c] < 0:
                perm[c] = nxt
                nxt += 1
        for c in range(content, d):
            perm[c] = c
    else:
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    inv = [0] * d
    for c, s in enumerate(perm):
        inv[s] = c
    # partner in storage indices
    partner = list(range(d))
    for c in plane_x:
        partner[perm[c]] = perm[c + 1]
        partner[perm[c + 1]] = perm[c]
    P = len(plane_x)
    if P == 0:
        mode = "none"
    elif d % 2 == 0 and all(partner[i] == (i ^ 1) for i in range(d) if partner[i] != i):
        mode = "pairs"
    elif all(partner[i] == i + P for i in range(P)) and all(
        partner[i] == i for i in range(2 * P, d)
    ):
        mode = "halves"
    else:
        mode = "gather"
    # coupling pairs (canonical dst <- src at power k), stored for the query (lower triangular);
    # the key uses the transposed pairs (src <-> dst) with (−s)^k
    dst, src, power = [], [], []
    for i, (n, cplx, off) in enumerate(zip(generator.sizes, generator.complex, generator.offsets)):
        if n < 2:
            continue
        w = 2 if cplx else 1
        for j in range(n):
            for k in range(1, j + 1):
                for comp in range(w):
                    dst.append(perm[off + w * j + comp])
                    src.append(perm[off + w * (j - k) + comp])
                    power.append(k)
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return Plan(
        dim=d,
        perm=as_long(perm),
        inv=as_long(inv),
        block_of=as_long(block_of),
        sign=torch.tensor(sign, dtype=torch.float64),
        partner=mode,
        partner_index=as_long(partner),
        planes=P,
        dst=as_long(dst),
        src=as_long(src),
        power=as_long(power),
    )


@dataclass
class Tables:
    """Numeric tables for one side (query or key) at given positions, in storage order.

    ``a``, ``b``: (..., seq, dim); ``coef``: (..., seq, pairs) or ``None``; ``dst``/``src`` index
    the coupling; ``partner``/``partner_index`` select the plane partner; ``identity`` when the
    transform is the identity (NoPE) and ``b`` is ``None`` when no dimension rotates.
    """

    a: torch.Tensor | None
    b: torch.Tensor | None
    coef: torch.Tensor | None
    dst: torch.Tensor
    src: torch.Tensor
    partner: str
    partner_index: torch.Tensor
    planes: int

    def to(self, dtype: torch.dtype, device: torch.device | None = None) -> Tables:
        cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
        return Tables(
            cast(self.a), cast(self.b), cast(self.coef),
            self.dst.to(device) if device is not None else self.dst,
            self.src.to(device) if device is not None else self.src,
            self.partner,
            self.partner_index.to(device) if device is not None else self.partner_index,
            self.planes,
        )


def build_tables(generator: Generator, plan: Plan, pos: torch.Tensor, side: str) -> Tables:
    """Float64 tables of F (``side="query"``) or G (``side="key"``) at positions ``pos``.

    ``pos`` is float64 of shape ``(seq,)`` or ``(batch, seq)`` (already re-centred). Output tables
    broadcast against ``(batch, heads, seq, dim)``: ``(seq, d)``, ``(heads, seq, d)``,
    ``(batch, 1, seq, d)`` or ``(batch, heads, seq, d)``.
    """
    if side not in ("query", "key"):
        raise ValueError(f"side must be 'query' or 'key', got {side!r}")
    pos = pos.to(torch.float64)
    pp = pos.unsqueeze(-1)  # (..., seq, 1)
    if pos.dim() == 2:
        pp = pp.unsqueeze(1)  # (batch, 1, seq, 1)
    rates = generator.rates.to(torch.float64)
    freqs = generator.freqs.to(torch.float64)
    dev = pos.device
    block_of = plan.block_of.to(dev)
    # per canonical dim parameters: (*heads, d) -> (*heads, 1, d) to meet (…, seq, 1)
    rate_d = rates.index_select(-1, block_of)
    freq_d = freqs.index_select(-1, block_of)
    if generator.num_heads is not None:
        rate_d, freq_d = rate_d.unsqueeze(-2), freq_d.unsqueeze(-2)
    inv = plan.inv.to(dev)
    # storage order
    rate_d = rate_d.index_select(-1, inv)
    freq_d = freq_d.index_select(-1, inv)
    with torch.no_grad():
        # inside torch.compile the scale is always built (e^0 = 1 exactly): no data-dependent branch
        any_rate = True if torch.compiler.is_compiling() else bool((rates != 0).any())
    return assemble_tables(
        plan, side, dev,
        exponent=rate_d * pp if any_rate else None,
        angle=reduced_angle(freq_d, pp) if plan.planes > 0 else None,
        tau=pp if plan.has_coupling else None,
    )


def assemble_tables(
    plan: Plan, side: str, dev: torch.device, *, exponent: torch.Tensor | None, angle: torch.Tensor | None,
    tau: torch.Tensor | None,
) -> Tables:
    """Tables from per-dimension float64 exponents ``λt`` and angles ``ωt`` (storage order) and the
    polynomial time ``τ`` of the Jordan couplings (``None`` where absent).

    Query: ``a = e^{λt} cos ωt``, ``b = ∓e^{λt} sin ωt``, ``c_k = τ^k/k!``; key: ``e^{−λs}``, the same
    angle, ``(−τ)^k/k!`` on the transposed pairs. Shared by one and several position axes.
    """
    sign = plan.sign.to(dev).index_select(-1, plan.inv.to(dev))
    scale = None if exponent is None else torch.exp(exponent if side == "query" else -exponent)
    a = b = None
    if angle is not None:
        cos, sin = torch.cos(angle), torch.sin(angle)
        a = cos if scale is None else scale * cos
        b = sign * sin if scale is None else scale * sign * sin
    elif scale is not None:
        a = scale
    coef = None
    dst, src = plan.dst.to(dev), plan.src.to(dev)
    if plan.has_coupling:
        k = plan.power.to(dev).to(torch.float64)
        base = tau if side == "query" else -tau
        coef = base**k / torch.exp(torch.lgamma(k + 1.0))  # (…, seq, pairs)
        if side == "key":
            dst, src = src, dst
    return Tables(a, b, coef, dst, src, plan.partner, plan.partner_index.to(dev), plan.planes)
