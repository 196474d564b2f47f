"""Position tables: the per-dimension numbers that apply F(t) = A(t)ᵀ and G(s) = A(−s) in O(dim).

For every canonical block the transform factors into commuting parts (Kronecker structure)::

    F(t) = e^{λt} · P(t)ᵀ ⊗ R(ωt)          G(s) = e^{−λs} · P(−s) ⊗ R(ωs)

where ``P(u) = Σ_k u^k/k! N^k`` is the polynomial (nilpotent) part and ``R`` rotates counter-clockwise.
So applying F or G is: a per-dimension *diagonal-plus-partner* step ``z = a ⊙ x + b ⊙ partner(x)``
(scale and rotation), then, for Jordan blocks of size ≥ 2 only, a sparse *coupling* step
``y[dst] += c · z[src]``. A :class:`Plan` holds the structural index arrays of an encoding (built
once); :func:`build_tables` turns positions into the numeric ``a``, ``b`` and ``c`` tables.

Precision: angles ω·t are reduced modulo 2π exactly for every finite float64 ω and t
(:mod:`liepos._angles`: Cody–Waite near 0, a per-frequency split and Payne–Hanek far out), scales
e^{λt} and polynomial coefficients are computed in float64; the tables are cast once at the end. They
never depend on the dtype of the query or key tensors.

Several position axes (a generator with ``axes=m``, positions ``(…, seq, m)``) use the same tables with
the exponent ``Σ_a λ_a t_a``, the angle ``Σ_a ω_a t_a`` (each axis term reduced exactly) and the
polynomial time ``Σ_a ν_a t_a``: the blocks of one structure commute, so nothing else changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from liepos._angles import reduced_angle as _exact_reduced_angle
from liepos.generator import Generator
from liepos.structure import Structure

__all__ = ["LAYOUTS", "Plan", "Tables", "build_tables", "check_range", "check_span", "make_plan", "reduced_angle", "storage_order"]

# the two storage orders of a rotation plane's two columns: adjacent (interleaved, GPT-J) or one in each half
# of the head (half, GPT-NeoX and Llama)
LAYOUTS = ("interleaved", "half")

def reduced_angle(freq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``freq · pos`` reduced to [−π, π] in float64, exactly for every finite float64 ω and t.

    :func:`liepos._angles.reduced_angle` (kept here for its callers): ``ω t − 2πk`` of the exact
    product, within one ulp of the result.

    >>> import math, torch
    >>> w, t = torch.tensor([1.0], dtype=torch.float64), torch.tensor([1e18], dtype=torch.float64)
    >>> abs(math.sin(float(reduced_angle(w, t))) - (-0.99296932074040507621)) < 1e-15  # mpmath's sin(1e18)
    True
    """
    return _exact_reduced_angle(freq, pos)


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
        pair_block: the block of every coupling pair (its polynomial time is that block's).
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
    pair_block: torch.Tensor

    @property
    def has_coupling(self) -> bool:
        return int(self.dst.numel()) > 0


def storage_order(plane_starts: list[int], dim: int, content: int, layout: str) -> list[int]:
    """``perm[c]``: the storage index of canonical dim ``c`` in ``layout`` — the one layout permutation.

    ``plane_starts`` are the canonical first dims of the rotation planes (plane k is ``(c_k, c_k + 1)``);
    ``"interleaved"`` stores canonically; ``"half"`` stores the planes' first components in dims
    ``0 … P−1`` and their second in ``P … 2P−1`` (Hugging Face, NeoX), then the real content dims, then
    the ``dim − content`` slot dims in place.

    >>> storage_order([0, 2, 4, 6], 8, 8, "half")
    [0, 4, 1, 5, 2, 6, 3, 7]
    >>> x = list("abcdefgh")
    >>> [x[i] for i in sorted(range(8), key=storage_order([0, 2, 4, 6], 8, 8, "half").__getitem__)]
    ['a', 'c', 'e', 'g', 'b', 'd', 'f', 'h']
    """
    if layout == "interleaved":
        return list(range(dim))
    if layout != "half":
        raise ValueError(f"`layout` must be one of {LAYOUTS}, got {layout!r}")
    xs = [c for c in plane_starts if c < content]
    if any(c + 1 >= content for c in xs):
        raise ValueError("a rotation plane straddles the content/slot boundary")
    P = len(xs)
    perm = [-1] * dim
    for k, c in enumerate(xs):
        perm[c], perm[c + 1] = k, k + P
    nxt = 2 * P
    for c in range(content):
        if perm[c] < 0:
            perm[c], nxt = nxt, nxt + 1
    for c in range(content, dim):
        perm[c] = c
    return perm


def _partner_mode(partner: list[int], planes: int, dim: int) -> str:
    if planes == 0:
        return "none"
    if dim % 2 == 0 and all(partner[i] == (i ^ 1) for i in range(dim) if partner[i] != i):
        return "pairs"
    if all(partner[i] == i + planes for i in range(planes)) and all(partner[i] == i for i in range(2 * planes, dim)):
        return "halves"
    return "gather"


def make_plan(generator: Generator | Structure, layout: str, num_slots: int = 0) -> Plan:
    """Index arrays for applying ``generator`` (or its structure) in ``layout`` (slots are the last canonical dims)."""
    s = generator.structure if isinstance(generator, Generator) else generator
    d = s.dim
    block_of, sign, plane_x = [], [], []
    for i, (n, cplx, off) in enumerate(zip(s.sizes, s.complex, s.offsets)):
        block_of += [i] * (n * (2 if cplx else 1))
        sign += [-1, 1] * n if cplx else [0] * n
        plane_x += [off + 2 * j for j in range(n)] if cplx else []
    perm = storage_order(plane_x, d, d - num_slots, layout)
    inv = [0] * d
    for c, p in enumerate(perm):
        inv[p] = c
    partner = list(range(d))  # in storage indices
    for c in plane_x:
        partner[perm[c]], partner[perm[c + 1]] = perm[c + 1], perm[c]
    # coupling pairs (canonical dst <- src at power k), stored for the query (lower triangular);
    # the key uses the transposed pairs (src <-> dst) with (−s)^k
    dst, src, power, pair_block = [], [], [], []
    for i, (n, cplx, off) in enumerate(zip(s.sizes, s.complex, s.offsets)):
        w = 2 if cplx else 1
        for j in range(n):
            for k in range(1, j + 1):
                for comp in range(w):
                    dst.append(perm[off + w * j + comp])
                    src.append(perm[off + w * (j - k) + comp])
                    power.append(k)
                    pair_block.append(i)
    long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return Plan(
        dim=d, perm=long(perm), inv=long(inv), block_of=long(block_of), sign=torch.tensor(sign, dtype=torch.float64),
        partner=_partner_mode(partner, len(plane_x), d), partner_index=long(partner), planes=len(plane_x),
        dst=long(dst), src=long(src), power=long(power), pair_block=long(pair_block),
    )


@dataclass
class Tables:
    """Numeric tables for one side (query or key) at given positions, in storage order.

    ``a``, ``b``: (..., seq, dim), ``None`` when no dimension scales or rotates (``b`` is ``None`` when
    none rotates); ``coef``: (..., seq, pairs) or ``None``; ``dst``/``src`` index the coupling;
    ``partner``/``partner_index`` select the plane partner.
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
        move = lambda t: t if device is None else t.to(device)  # noqa: E731
        return Tables(cast(self.a), cast(self.b), cast(self.coef), move(self.dst), move(self.src), self.partner,
                      move(self.partner_index), self.planes)


def _per_block(generator: Generator, pos: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Positions as ``pp`` of shape ``(…, seq, axes, 1)``, and the generator's per-axis parameters
    (:meth:`Generator.axis_params`), which :func:`_heads` lifts to ``(*heads, 1, axes, n)`` to meet it."""
    pos = pos.to(torch.float64)
    if generator.num_axes is None:
        pos = pos.unsqueeze(-1)  # (…, seq) -> (…, seq, 1): one axis
    pp = pos.unsqueeze(-1)  # (…, seq, axes, 1)
    if pos.dim() == 3:
        pp = pp.unsqueeze(1)  # (batch, 1, seq, axes, 1): heads broadcast
    rates, freqs, nus = generator.axis_params()
    return pp, (rates, freqs, nus)


def _heads(generator: Generator, t: torch.Tensor) -> torch.Tensor:
    """A per-axis parameter ``(*heads, axes, n)`` as ``(*heads, 1, axes, n)`` to meet ``(…, seq, axes, 1)``."""
    return t.unsqueeze(-3) if generator.num_heads is not None else t


def build_tables(generator: Generator, plan: Plan, pos: torch.Tensor, side: str) -> Tables:
    """Float64 tables of F (``side="query"``) or G (``side="key"``) at positions ``pos``.

    ``pos`` is float64 of shape ``(seq,)`` or ``(batch, seq)`` (one axis) or ``(seq, axes)`` /
    ``(batch, seq, axes)`` (already re-centred). Output tables broadcast against
    ``(batch, heads, seq, dim)``: ``(seq, d)``, ``(heads, seq, d)``, ``(batch, 1, seq, d)`` or
    ``(batch, heads, seq, d)``.

    Query: ``a = e^{λt} cos ωt``, ``b = ∓e^{λt} sin ωt``, ``c_k = τ^k/k!``; key: ``e^{−λs}``, the same
    angle, ``(−τ)^k/k!`` on the transposed pairs.
    """
    if side not in ("query", "key"):
        raise ValueError(f"`side` must be 'query' or 'key', got {side!r}")
    dev = pos.device
    pp, (rates, freqs, nus) = _per_block(generator, pos)
    # the generator's parameters meet the positions on their device (an encoding built on the CPU
    # applied to CUDA inputs: its float64 tables are computed there, once per window, then cast)
    rates, freqs = rates.to(device=dev, dtype=torch.float64), freqs.to(device=dev, dtype=torch.float64)
    order = plan.block_of.to(dev).index_select(0, plan.inv.to(dev))  # storage dim -> block
    with torch.no_grad():
        # inside torch.compile the scale is always built (e^0 = 1 exactly): no data-dependent branch
        any_rate = True if torch.compiler.is_compiling() else bool((rates != 0).any())
    scale = angle = None
    if any_rate:
        exponent = (_heads(generator, rates.index_select(-1, order)) * pp).sum(-2)  # (…, seq, d)
        scale = torch.exp(exponent if side == "query" else -exponent)
    if plan.planes > 0:
        angle = reduced_angle(_heads(generator, freqs.index_select(-1, order)), pp).sum(-2)  # each axis exact
    sign = plan.sign.to(dev).index_select(-1, plan.inv.to(dev))
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
        tau = (nus.to(device=dev, dtype=torch.float64).index_select(-1, plan.pair_block.to(dev)) * pp).sum(-2)
        k = plan.power.to(dev).to(torch.float64)  # tau: (…, seq, pairs)
        coef = (tau if side == "query" else -tau) ** k / torch.exp(torch.lgamma(k + 1.0))
        if side == "key":
            dst, src = src, dst
    return Tables(a, b, coef, dst, src, plan.partner, plan.partner_index.to(dev), plan.planes)


def _range_terms(generator: Generator) -> tuple[float, float, list[int]]:
    """Least and greatest rate over every block and head, and the degree ``n − 1`` of every Jordan block."""
    with torch.no_grad():
        r = generator.rates.detach()
        return float(r.min()), float(r.max()), [n - 1 for n in generator.sizes if n > 1]


def _check_one_axis(generator: Generator, lo: float, hi: float, side: str, fade: bool, top: float,
                    bottom: float, fail) -> None:
    """:func:`check_range` over one axis from the least and the greatest time ``lo ≤ hi``: ``λt`` is
    bilinear, so its extremes over blocks, heads and times are at the corners; ``τ^k/k!`` (one axis: ν = 1)
    is largest at the largest ``|t|``."""
    rmin, rmax, degrees = generator._memo("range_terms", lambda: _range_terms(generator))
    sign = 1.0 if side == "query" else -1.0
    E = [sign * r * t for r in (rmin, rmax) for t in (lo, hi)]
    sym = "λt" if side == "query" else "−λs"
    if max(E) >= top:
        raise fail(f"scale e^({sym}) overflows")
    if side == "query" and not fade and min(E) <= bottom:
        raise fail(f"scale e^({sym}) underflows")
    reach = max(abs(lo), abs(hi))
    if reach > 0 and any(k * math.log(reach) - math.lgamma(k + 1.0) >= top for k in degrees):
        raise fail("coupling table τ^k/k! overflows")


def _failure(side: str, work: torch.dtype, reach: Callable[[], float]) -> Callable[[str], OverflowError]:
    def fail(what: str) -> OverflowError:
        return OverflowError(
            f"the {side} {what} {work} at positions up to {reach():.6g}: re-centre with "
            f"origin= (scores do not change) or use liepos.attention, which re-centres per query block"
        )

    return fail


def check_span(generator: Generator, lo: float, hi: float, side: str, dtype: torch.dtype, fade: bool = False) -> None:
    """:func:`check_range` at every time of ``[lo, hi]`` on one axis, from the two ends alone (no tensor: the
    extremes of ``λt`` and ``τ^k/k!`` over the span are at its ends)."""
    if generator.num_axes is not None:
        raise ValueError(f"check_span takes times on one axis; the generator has {generator.num_axes} axes")
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if not work.is_floating_point or torch.compiler.is_compiling() or generator.is_orthogonal:
        return
    info = torch.finfo(work)
    fail = _failure(side, work, lambda: max(abs(lo), abs(hi)))
    _check_one_axis(generator, lo, hi, side, fade, math.log(info.max), math.log(info.tiny), fail)


def check_range(generator: Generator, pos: torch.Tensor, side: str, dtype: torch.dtype, fade: bool = False) -> None:
    """OverflowError when the tables of ``generator`` at ``pos`` leave the range of ``dtype`` (float32 for half).

    The only range check: the scale ``e^{±Σλt}`` must not overflow on either side, and must not underflow
    on the query side (a query scaled to 0 would score 0 against every key, silently); a key scaled to 0
    has faded and is kept. Jordan couplings ``τ^k/k!`` must not overflow. Computed per block in float64.
    ``fade=True``: a query factor may underflow too — the caller's keys all lie at or before the origin
    and its queries at or after it, so every score ``A(t − s)`` is at most the query factor (past the
    peak of ``e^{−λu} u^k``, where an underflowing factor is), below the dtype's smallest normal.

    >>> import torch, liepos as lp
    >>> g = lp.xpos(8).generator
    >>> check_range(g, torch.tensor([1e18], dtype=torch.float64), "query", torch.float32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    OverflowError: the query scale e^(λt) underflows torch.float32 at positions up to 1e+18: re-centre with origin=...
    """
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if not work.is_floating_point or torch.compiler.is_compiling() or not pos.numel() or generator.is_orthogonal:
        return
    info = torch.finfo(work)
    top, bottom = math.log(info.max), math.log(info.tiny)
    fail = _failure(side, work, lambda: float(pos.detach().abs().max()))

    with torch.no_grad():
        if generator.num_axes is None:
            # one axis: every λt and |t| is extreme at the least or the greatest time, so those two decide
            lo, hi = (float(x) for x in torch.aminmax(pos.detach().reshape(-1)))
            _check_one_axis(generator, lo, hi, side, fade, top, bottom, fail)
            return
        # a cheap bound first: |Σ_a λ_a t_a| ≤ max|λ| · Σ_a max|t_a| (and the same for ν): most calls stop here
        axes = generator.num_axes
        reach = float(pos.detach().abs().reshape(-1, axes).amax(0).sum())  # (…, seq[, axes]) -> (rows, axes)
        r_max, nu_max = generator.bounds()
        n_max = max(generator.sizes)
        safe = r_max * reach < min(top, -bottom)
        if safe and n_max > 1:
            safe = (n_max - 1) * math.log(max(nu_max * reach, 1.0)) < top
        if safe:
            return
        pp, (rates, _, nus) = _per_block(generator, pos.detach())
        rates = _heads(generator, rates.detach().to(torch.float64))
        if bool((rates != 0).any()):
            E = (rates * pp).sum(-2)  # (…, seq, blocks)
            E = E if side == "query" else -E
            sym = "λt" if side == "query" else "−λs"
            if float(E.max()) >= top:
                raise fail(f"scale e^({sym}) overflows")
            if side == "query" and not fade and float(E.min()) <= bottom:
                raise fail(f"scale e^({sym}) underflows")
        big = [i for i, n in enumerate(generator.sizes) if n > 1]
        if big:
            idx = torch.tensor(big, dtype=torch.long, device=pp.device)
            tau = (nus.detach().to(device=pp.device, dtype=torch.float64).index_select(-1, idx) * pp).sum(-2).abs()
            k = torch.tensor([generator.sizes[i] - 1 for i in big], dtype=torch.float64, device=pp.device)
            log_coef = k * torch.log(tau) - torch.lgamma(k + 1.0)  # the largest power's log-coefficient
            if float(log_coef.max()) >= top:
                raise fail("coupling table τ^k/k! overflows")
