"""Diagnosis of a black-box positional encoding: recover X, check the assumptions, name violations.

An encoding is given as two callables ``encode_query(x, positions)`` and ``encode_key(x, positions)``
with ``x: (batch, heads, seq, dim)`` and ``positions: (seq,)``. Probing them with the basis vectors
``e_i`` at times ``t`` and ``s`` gives the bridge matrix::

    M(t, s)_ij = <F(t) e_i, G(s) e_j>,   i.e. M(t, s) = F(t)ᵀ G(s)

The theorem says: if the encoding is linear, ``M(t + c, s + c) = M(t, s)`` (translation invariance),
``M(t, t) = I`` and ``M`` is continuous, then ``M(t, s) = A(t − s) = exp((t − s) X)``. Each assumption
is tested on the probe, the generator is recovered as ``X = log A(δ) / δ`` (with a branch-safe
refinement over several δ) and verified by ``exp(uX) ≈ A(u)`` at other ``u``, then classified.

>>> import liepos as lp
>>> enc = lp.rope(8)
>>> d = diagnose(enc.query, enc.key, dim=8)
>>> d.relative, d.violations
(True, [])
>>> d.classification.counts["rotation"]
4
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Diagnosis", "Finding", "diagnose", "hf_rotary_encoder", "hf_encoder"]

Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# ---------------------------------------------------------------------- named findings
NOT_LINEAR = "not_linear"
NORMALIZED = "normalized"
NOT_TRANSLATION_INVARIANT = "not_translation_invariant"
LOGIT_TEMPERATURE = "logit_temperature"
NOT_IDENTITY_AT_ZERO = "not_identity_at_zero"
PER_CHANNEL_NORM = "per_channel_norm"
GROUP_LAW = "group_law"
NOT_CONTINUOUS = "not_continuous"
DISCRETE_GROUP = "discrete_group"
LENGTH_DEPENDENT = "length_dependent"
AXES_DO_NOT_COMMUTE = "axes_do_not_commute"
NO_GENERATOR = "no_generator"


@dataclass
class Finding:
    """One named, human-readable finding with its measured size.

    ``breaks_relativity`` says whether the scores stop depending on ``t − s`` alone (a logit
    temperature, a discrete group or a per-vector norm do not break it; an additive absolute
    position or an untied per-channel weight after rotation do).
    """

    name: str
    message: str
    size: float
    breaks_relativity: bool = True

    def __str__(self) -> str:
        return f"{self.name} (size {self.size:.3g}): {self.message}"


@dataclass
class Diagnosis:
    """The result of :func:`diagnose`.

    Attributes:
        relative: the scores depend only on the lag ``t − s`` (up to the tolerance).
        generator: the recovered :class:`~liepos.Generator` (``None`` when none exists, e.g. a
            discrete group); a list of them, one per axis, when ``axes`` was given.
        classification: ``liepos.classify(generator)`` (``None`` when there is no generator).
        violations: the findings, each with a name, a message and its measured size.
        temperature: τ with ``M(t, t) ≈ τ I`` (1 for a plain group).
        domain: ``"real"`` (continuous positions) or ``"integer"``.
        matrix: the recovered dense generator X (float64 numpy) or ``None``.
        step: ``A(1)`` (numpy) when the domain is integer.
        measures: every measured residual, by name.
        axes: the per-axis diagnoses when ``axes`` was given.
    """

    relative: bool
    generator: Any
    classification: Any
    violations: list[Finding]
    temperature: float = 1.0
    domain: str = "real"
    matrix: np.ndarray | None = None
    step: np.ndarray | None = None
    measures: dict[str, float] = field(default_factory=dict)
    axes: list[Diagnosis] | None = None
    notes: list[str] = field(default_factory=list)
    tol: float = 1e-3
    label: str = "encoder"

    def names(self) -> list[str]:
        return [f.name for f in self.violations]

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def __str__(self) -> str:
        lines = [f"liepos diagnosis of {self.label}", "=" * (21 + len(self.label))]
        if self.relative:
            verdict = "RELATIVE: the scores depend only on the lag t - s"
            if GROUP_LAW in self.names() or NO_GENERATOR in self.names():
                verdict += ", but A(u) is not a one-parameter group exp(uX)"
            elif self.generator is not None and not isinstance(self.generator, list):
                verdict += "; A(u) = " + ("tau * " if abs(self.temperature - 1) > self.tol else "") + "exp(uX)"
        else:
            verdict = "NOT RELATIVE: outside the family A(t - s) = exp((t - s) X)"
        lines.append(verdict)
        lines.append(f"positions: {self.domain}" + (" (tested at real-valued positions)" if self.domain == "real"
                                                    else " (defined at integer positions only)"))
        if abs(self.temperature - 1.0) > self.tol:
            lines.append(f"logit temperature tau = {self.temperature:.6g} (M(t, t) = tau I)")
        lines.append("")
        lines.append("assumptions (measured relative residuals, tolerance %.0e):" % self.tol)
        for key, label in _MEASURE_LABELS:
            if key in self.measures:
                lines.append(f"  {label:<42} {self.measures[key]:.3g}")
        lines.append("")
        if self.violations:
            lines.append(f"findings ({len(self.violations)}):")
            for f in self.violations:
                tag = "breaks relativity" if f.breaks_relativity else "relativity kept"
                lines.append(f"  - {f.name} [{tag}; size {f.size:.3g}]")
                for chunk in _wrap(f.message, 92):
                    lines.append(f"      {chunk}")
        else:
            lines.append("findings: none; every assumption of the theorem holds")
        for note in self.notes:
            lines.append(f"note: {note}")
        lines.append("")
        if self.axes is not None:
            for k, sub in enumerate(self.axes):
                lines.append(f"axis {k}: generator {sub.generator!r}")
                if sub.classification is not None:
                    lines.append(_indent(str(sub.classification), "  "))
        elif self.generator is not None:
            lines.append(f"generator: {self.generator!r}")
            blocks = sorted(self.generator.blocks, key=lambda b: (-abs(b[1]), b[0]))
            shown = ", ".join(f"({lam:.4g}, {abs(om):.6g}, {n})" for lam, om, n in blocks[:8])
            more = f", ... ({len(blocks)} blocks)" if len(blocks) > 8 else ""
            lines.append(f"blocks (rate, freq, size), fastest first: {shown}{more}")
            if self.classification is not None:
                lines.append(str(self.classification))
            else:
                lines.append(_blocks_table(self.generator))
        elif self.step is not None:
            ev = np.linalg.eigvals(self.step)
            lines.append("no real generator; eigenvalues of the one-step matrix A(1):")
            lines.append("  " + ", ".join(_fmt_complex(z) for z in sorted(ev, key=lambda z: (z.real, z.imag))))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Diagnosis(relative={self.relative}, generator={self.generator!r}, "
                f"violations={self.names()})")


_MEASURE_LABELS = [
    ("linearity", "linearity  f(ax+by) = af(x)+bf(y)"),
    ("offset", "no additive part  |f(0)|"),
    ("translation", "translation  M(t+c, s+c) = M(t, s)"),
    ("identity", "identity at zero  M(t, t) = tau I"),
    ("group_law", "group law  A(a) A(b) = A(a+b)"),
    ("continuity", "continuity  (jump ratio, ~1/8 when smooth)"),
    ("generator_fit", "generator  exp(uX) = A(u)"),
    ("length", "sequence length  M_L1(t, s) = M_L2(t, s)"),
    ("commutator", "axes commute  |[X_i, X_j]| / |X_i||X_j|"),
]


def _wrap(text: str, width: int) -> list[str]:
    words, out, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        out.append(cur)
    return out


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in text.splitlines())


def _fmt_complex(z: complex) -> str:
    if abs(z.imag) < 1e-9:
        return f"{z.real:.6g}"
    return f"{z.real:.6g}{z.imag:+.6g}i"


def _blocks_table(g: Any) -> str:
    rows = ["  rate        freq        size"]
    for lam, om, n in g.blocks:
        rows.append(f"  {lam:<+11.4g} {om:<11.6g} {n}")
    return "\n".join(rows)


# ---------------------------------------------------------------------- probing
class _Probe:
    """Calls an encoder on vectors placed at every position of one positions tensor."""

    def __init__(self, fn: Encoder, dim: int, dtype: torch.dtype, heads: int, head: int) -> None:
        self.fn, self.dim, self.dtype, self.heads, self.head = fn, dim, dtype, heads, head

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x``: (n, P, d) vectors (or (n, d): the same vector at every position) -> (n, P, d_out)."""
        P = positions.shape[0]
        if x.dim() == 2:
            x = x[:, None, :].expand(-1, P, -1)  # (n, d) -> (n, P, d)
        # (n, P, d) -> (n, heads, P, d)
        xx = x.to(self.dtype)[:, None].expand(-1, self.heads, -1, -1).contiguous()
        y = self.fn(xx, positions)
        if isinstance(y, tuple | list):
            y = y[0]
        if not isinstance(y, torch.Tensor) or y.dim() != 4 or y.shape[:3] != xx.shape[:3]:
            shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(
                f"the encoder must return a tensor (batch, heads, seq, dim_out) for an input of shape "
                f"{tuple(xx.shape)}; got {shape}"
            )
        return y[:, self.head].detach().to(torch.float64)  # (n, P, d_out)


class _Linearized:
    """The encoder with a detected additive part removed or a per-vector norm undone."""

    def __init__(self, probe: _Probe, mode: str) -> None:
        self.probe, self.mode = probe, mode

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        y = self.probe(x, positions)
        if self.mode == "affine":
            zero = torch.zeros(1, self.probe.dim, dtype=torch.float64)
            return y - self.probe(zero, positions)
        if self.mode == "normalized":
            xx = x if x.dim() == 3 else x[:, None, :]
            rms = xx.to(torch.float64).pow(2).mean(-1, keepdim=True).sqrt()  # (n, P or 1, 1)
            return y * rms
        return y


def _rel(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    a = np.asarray(a.detach() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b = np.asarray(b.detach() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.inf
    den = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), 1e-300)
    return float(np.linalg.norm(a - b)) / den


class _Bridge:
    """All M(t, s) for t, s in one positions tensor: one query call and one key call."""

    def __init__(self, fq: Callable, fk: Callable, dim: int, positions: torch.Tensor) -> None:
        eye = torch.eye(dim, dtype=torch.float64)
        self.pos = positions
        # (d, P, d_out) -> (P, d, d_out): row i of Q[p] is F(p) e_i (numpy: small matmuls are fast there)
        self.Q = np.ascontiguousarray(fq(eye, positions).permute(1, 0, 2).numpy())
        self.K = np.ascontiguousarray(fk(eye, positions).permute(1, 0, 2).numpy())
        self.index = {float(p): i for i, p in enumerate(positions.tolist())}

    def M(self, t: float, s: float) -> np.ndarray:
        i, j = self.index[float(t)], self.index[float(s)]
        return self.Q[i] @ self.K[j].T  # (d, d): M_ij = <F(t) e_i, G(s) e_j>


# ---------------------------------------------------------------------- generator recovery
def _logm_real(A: np.ndarray) -> np.ndarray | None:
    import warnings

    from scipy.linalg import logm

    if not np.isfinite(A).all():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns when the result is inaccurate; the fit checks it
        try:
            L = np.asarray(logm(A))
        except (ValueError, np.linalg.LinAlgError):
            return None
    if not np.isfinite(L).all():
        return None
    if np.iscomplexobj(L):
        if np.abs(L.imag).max(initial=0.0) > 1e-6 * max(1.0, np.abs(L.real).max(initial=0.0)):
            return None
        L = L.real
    return L


def _expm(X: np.ndarray, u: float) -> np.ndarray:
    import warnings

    from scipy.linalg import expm

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # an overflowing candidate is rejected by its fit
        return expm(u * X)


def _negative_eigen(A: np.ndarray, tol: float) -> list[tuple[float, int]]:
    """Real negative eigenvalues of A with their multiplicities (clustered)."""
    ev = np.linalg.eigvals(A)
    scale = max(np.abs(ev).max(initial=0.0), 1e-300)
    neg = sorted(float(z.real) for z in ev if abs(z.imag) <= tol * scale and z.real < -tol * scale)
    out: list[tuple[float, int]] = []
    for v in neg:
        if out and abs(v - out[-1][0]) <= max(tol, 1e-6) * scale * 10:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def _generator_from_matrix(X: np.ndarray, snap: float):
    """``Generator.from_matrix`` with rates and freqs below ``snap`` (measurement noise) set to 0."""
    from liepos.generator import Generator

    Xs = np.where(np.abs(X) < snap * 1e-3, 0.0, X)  # clean round-off entries
    g = Generator.from_matrix(torch.as_tensor(Xs), tol=max(snap, 1e-9), exact=False)
    rates = g.rates.detach().clone()
    freqs = g.freqs.detach().clone()
    rates[rates.abs() < snap] = 0.0
    # a complex block whose frequency is noise stays complex (its basis was built that way)
    return g.with_params(rates=rates, freqs=freqs)


# ---------------------------------------------------------------------- the diagnosis
def diagnose(
    encode_query: Encoder,
    encode_key: Encoder | None = None,
    dim: int | None = None,
    *,
    axes: int | None = None,
    domain: str = "auto",
    tol: float = 1e-3,
    shifts: Sequence[float] | None = None,
    lengths: Sequence[int] = (32, 8192),
    heads: int = 1,
    head: int = 0,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    label: str | None = None,
) -> Diagnosis:
    """Probe an encoding and say which point of the design space it is, or which assumption fails.

    Args:
        encode_query: ``(x: (batch, heads, seq, dim), positions: (seq,)) -> tensor`` (the query side;
            the output may have more channels than the input, e.g. slots).
        encode_key: the key side; default: the query encoder.
        dim: the head dim of the inputs; default: ``encode_query.dim`` when it has one.
        axes: number of position axes; positions then have shape ``(seq, axes)`` and each axis is
            diagnosed alone, then the generators' commutators are measured.
        domain: ``"real"``, ``"integer"`` or ``"auto"`` (real if the encoder accepts fractional
            positions and is continuous there).
        tol: relative tolerance of every residual (the encoder's own rounding must be below it;
            Hugging Face computes angles in float32, about 1e-6).
        shifts: the translations c of the invariance test; default ``(1, 5, 17, 64, 251)`` (plus 2.5
            on the real domain).
        lengths: two total sequence lengths ``(L1, L2)`` probed with positions ``arange(L)``; the
            scores at the shared (t, s) must agree (a dynamic NTK changes them).
        heads, head: the number of heads of the probe input and the head that is read.
        dtype: the dtype of the probe vectors.
        seed: the seed of the random vectors of the linearity and length tests.

    Returns:
        a :class:`Diagnosis` (``print`` it for the report).

    The defining identity checked, for a relative encoding::

        F(t)ᵀ G(s) = τ · exp((t − s) X)   for every probed t, s
    """
    try:
        import scipy.linalg  # noqa: F401
    except ImportError as err:  # pragma: no cover
        raise ImportError("liepos.diagnose needs scipy (matrix logarithms): pip install 'liepos[algebra]'") from err
    encode_key = encode_query if encode_key is None else encode_key
    if dim is None:
        dim = getattr(encode_query, "dim", None) or getattr(getattr(encode_query, "__self__", None), "dim", None)
    if dim is None:
        raise ValueError("diagnose needs dim (the head dim of the probe vectors); pass dim=...")
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim}")
    if domain not in ("auto", "real", "integer"):
        raise ValueError(f"domain must be 'auto', 'real' or 'integer', got {domain!r}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    label = label or getattr(encode_query, "__qualname__", None) or type(encode_query).__name__
    if axes is not None:
        return _diagnose_axes(encode_query, encode_key, dim, int(axes), domain=domain, tol=tol, shifts=shifts,
                              lengths=lengths, heads=heads, head=head, dtype=dtype, seed=seed, label=label)
    pq = _Probe(encode_query, dim, dtype, heads, head)
    pk = _Probe(encode_key, dim, dtype, heads, head)
    return _Diagnoser(pq, pk, dim, domain, tol, shifts, lengths, seed, label).run()


class _Diagnoser:
    def __init__(self, pq: _Probe, pk: _Probe, dim: int, domain: str, tol: float,
                 shifts: Sequence[float] | None, lengths: Sequence[int], seed: int, label: str) -> None:
        self.pq, self.pk, self.d, self.domain, self.tol = pq, pk, dim, domain, tol
        self.shifts = shifts
        self.lengths = tuple(int(n) for n in lengths)
        self.gen = torch.Generator().manual_seed(seed)
        self.label = label
        self.findings: list[Finding] = []
        self.measures: dict[str, float] = {}
        self.notes: list[str] = []

    def add(self, name: str, message: str, size: float, breaks: bool = True) -> None:
        self.findings.append(Finding(name, message, float(size), breaks))

    def pos(self, values: Sequence[float]) -> torch.Tensor:
        vals = sorted({float(v) for v in values})
        if self.domain == "integer":
            return torch.tensor([round(v) for v in vals], dtype=torch.int64)
        return torch.tensor(vals, dtype=torch.float64)

    # ------------------------------------------------------------------ steps
    def detect_domain(self) -> None:
        if self.domain != "auto":
            return
        try:
            self.pq(torch.eye(self.d, dtype=torch.float64)[:1], torch.tensor([0.5, 1.25], dtype=torch.float64))
            self.pk(torch.eye(self.d, dtype=torch.float64)[:1], torch.tensor([0.5, 1.25], dtype=torch.float64))
            self.domain = "real"
        except Exception:  # noqa: BLE001 - any refusal of fractional positions means integer-only
            self.domain = "integer"

    def linearity(self) -> tuple[Callable, Callable]:
        """Test f(ax + by) = a f(x) + b f(y); undo an additive part or a per-vector norm if found."""
        pos = self.pos([0, 1, 3, 17, 100] + ([2.5] if self.domain == "real" else []))
        P = pos.shape[0]
        n = 3
        x = torch.randn(n, P, self.d, generator=self.gen, dtype=torch.float64)
        y = torch.randn(n, P, self.d, generator=self.gen, dtype=torch.float64)
        a, b = 0.7, -1.3
        worst, off, hom = 0.0, 0.0, 0.0
        for p in (self.pq, self.pk):
            fx, fy, fxy = p(x, pos), p(y, pos), p(a * x + b * y, pos)
            worst = max(worst, float((fxy - a * fx - b * fy).norm()) / float((a * fx).norm() + (b * fy).norm()))
            f0 = p(torch.zeros(1, self.d, dtype=torch.float64), pos)
            off = max(off, float(f0.norm()) / float(fx.norm()) * math.sqrt(n))
            hom = max(hom, _rel(p(2 * x, pos), fx))
        self.measures["linearity"] = worst
        self.measures["offset"] = off
        if worst <= self.tol:
            return self.pq, self.pk
        for mode in ("affine", "normalized"):
            if mode == "affine" and off <= self.tol:
                continue
            if mode == "normalized" and hom > self.tol:
                continue
            lq, lk = _Linearized(self.pq, mode), _Linearized(self.pk, mode)
            res = 0.0
            for p in (lq, lk):
                fx, fy, fxy = p(x, pos), p(y, pos), p(a * x + b * y, pos)
                res = max(res, float((fxy - a * fx - b * fy).norm()) / float((a * fx).norm() + (b * fy).norm()))
            if res > self.tol:
                continue
            if mode == "affine":
                f0 = self.pq(torch.zeros(1, self.d, dtype=torch.float64), pos)[0]  # (P, d_out)
                varies = _rel(f0, f0[:1].expand_as(f0))
                self.add(NOT_LINEAR,
                         "the encoder is affine, not linear: it adds a vector b(t) that does not depend on the "
                         f"input (|b| / |f(x)| = {off:.3g}; b varies with position by {varies:.3g}), an absolute "
                         "additive encoding such as the sinusoidal of Vaswani et al. The score then has cross "
                         "terms q.b(s) + b(t).k + b(t).b(s) that depend on t and s separately. The rest of "
                         "this report is about the linear part f(x) - f(0).",
                         off)
            else:
                self.add(NORMALIZED,
                         "the output is scale invariant (f(2x) = f(x)): a per-vector norm (RMSNorm / L2 "
                         f"normalisation) is applied (linearity residual {worst:.3g}). Undoing it "
                         "(f(x) * rms(x)) leaves a linear encoder, analysed below; since a rotation keeps "
                         "the norm, the scores stay relative in the normalised vectors unless a per-channel "
                         "weight breaks it (see per_channel_norm).",
                         worst, breaks=False)
            return lq, lk
        self.add(NOT_LINEAR,
                 f"f(ax + by) differs from a f(x) + b f(y) by {worst:.3g} (relative): the encoder is not linear "
                 "in the query/key (it is neither affine nor linear after a per-vector norm). The rest of this "
                 "report describes its response to basis vectors only.",
                 worst)
        return self.pq, self.pk

    def run(self) -> Diagnosis:
        self.detect_domain()
        fq, fk = self.linearity()
        real = self.domain == "real"
        shifts = list(self.shifts) if self.shifts is not None else [1, 5, 17, 64, 251] + ([2.5] if real else [])
        base = [(0, 0), (1, 0), (0, 1), (3, 1), (2, 5), (7, 3)] + ([(0.5, 1.75)] if real else [])
        diag_t = [0, 1, 5, 17, 64, 251] + ([2.5, 0.5] if real else [])
        ladder = [2.0**-6, 2.0**-4, 2.0**-2, 1.0, 4.0, 16.0] if real else [1.0]
        verify = [1.0, 2.0, 3.0, 7.0, 13.0, 40.0] + ([0.3, 2.7] if real else [])
        pairs = [(1, 2), (3, 5), (17, 64)] + ([(0.5, 1.25), (2.5, 3.75)] if real else [])
        cont_u = [k / 4 - 2.0**-12 for k in range(1, 9)] if real else []
        values = {0.0, 1.0}
        for t, s in base:
            for c in [0] + shifts:
                values |= {t + c, s + c}
        values |= set(diag_t) | set(ladder) | set(verify)
        for a, b in pairs:
            values |= {a, b, a + b}
        for u in cont_u:
            values |= {u, u + 2.0**-7, u + 2.0**-10}
        pos = self.pos(values)
        br = _Bridge(fq, fk, self.d, pos)
        if self.domain == "integer":
            br.index = {float(round(k)): v for k, v in br.index.items()}

        # ---- identity at zero offset; A(u) = M(0, 0)^-1 M(u, 0)
        B = br.M(0, 0)
        tau = float(np.trace(B)) / self.d
        iso = _rel(B, tau * np.eye(self.d)) if tau != 0 else 1.0
        self.measures["identity"] = iso
        invertible = bool(np.linalg.matrix_rank(B) == self.d)
        Binv = np.linalg.inv(B) if invertible else np.linalg.pinv(B)

        def A(u: float, v: float = 0.0) -> np.ndarray:
            return Binv @ br.M(u, v)

        # ---- continuity (first: a rounding encoder is then judged on integers only)
        if real:
            ratio, where, jump = 0.0, 0.0, 0.0
            scale = max(float(np.linalg.norm(A(1.0))), 1e-300)
            for u in cont_u:
                A0 = A(u)
                d1 = float(np.linalg.norm(A(u + 2.0**-7) - A0))
                d2 = float(np.linalg.norm(A(u + 2.0**-10) - A0))
                if d1 > 1e-7 * scale and d2 / d1 > ratio:
                    ratio, where, jump = d2 / d1, u, d2 / scale
            self.measures["continuity"] = ratio
            if ratio > 0.5:
                self.add(NOT_CONTINUOUS,
                         f"A(u) jumps near u = {where + 2.0**-12:g}: |A(u + h) - A(u)| stays at {jump:.3g} as h "
                         f"shrinks from 2^-7 to 2^-10 (ratio {ratio:.2f}; a smooth A gives 1/8). Positions are "
                         "rounded to a grid; the encoding is diagnosed on integer positions.",
                         jump, breaks=False)
                self.domain = "integer"
                integral = lambda *v: all(float(x).is_integer() for x in v)  # noqa: E731
                ladder, verify = [1.0], [v for v in verify if integral(v)]
                base = [(t, s) for t, s in base if integral(t, s)]
                shifts = [c for c in shifts if integral(c)]
                pairs = [(a, b) for a, b in pairs if integral(a, b)]
                diag_t = [t for t in diag_t if integral(t)]

        # ---- translation invariance; per-channel weights after a rotation
        trans = 0.0
        for t, s in base:
            M0 = br.M(t, s)
            for c in shifts:
                trans = max(trans, _rel(br.M(t + c, s + c), M0))
        self.measures["translation"] = trans
        if trans > self.tol:
            msg = (f"M(t + c, s + c) differs from M(t, s) by up to {trans:.3g} (relative) over shifts "
                   f"c = {shifts}: the scores depend on absolute positions, not only on t - s.")
            self.add(NOT_TRANSLATION_INVARIANT, msg, trans)
            diag_var = max(_rel(br.M(t, t), B) for t in diag_t)
            self._per_channel(br, diag_t, B, diag_var)

        # ---- temperature
        temperature = 1.0
        if iso <= self.tol and abs(tau - 1.0) > self.tol and tau > 0:
            temperature = tau
            self.add(LOGIT_TEMPERATURE,
                     f"M(t, t) = tau I with tau = {tau:.6g}, not I: every logit is multiplied by tau (a "
                     f"temperature folded into the encoding, e.g. YaRN's attention_factor^2 = {tau:.4g}, "
                     f"attention_factor = {math.sqrt(tau):.6g}). Scores stay relative: A(u) = tau exp(uX).",
                     abs(tau - 1.0), breaks=False)
        elif iso > self.tol:
            what = "invertible, so it can be absorbed into the keys" if invertible else \
                "singular: the encoder loses channels"
            self.add(NOT_IDENTITY_AT_ZERO,
                     f"M(0, 0) is not a multiple of I (residual {iso:.3g}); it is {what}. The group is "
                     "read from M(0, 0)^-1 M(u, 0).",
                     iso, breaks=not invertible)

        # ---- group law
        gl = max(_rel(A(a) @ A(b), A(a + b)) for a, b in pairs)
        self.measures["group_law"] = gl
        if gl > self.tol:
            d_out = br.Q.shape[-1]
            why = ("the scores are relative, but the encoder's output has more channels than its input "
                   f"({d_out} > {self.d}): F(t) is not square, so the theorem's derivation of the group law does "
                   "not apply and A(t - s) is not exp((t - s) X)") if trans <= self.tol and d_out > self.d else \
                "it follows from the failures above"
            self.add(GROUP_LAW,
                     f"A(a) A(b) differs from A(a + b) by up to {gl:.3g} (relative) for (a, b) in {pairs}, "
                     f"with A(u) = M(0, 0)^-1 M(u, 0): the probe is not a one-parameter group; {why}.",
                     gl, breaks=False)

        # ---- generator
        with np.errstate(all="ignore"):
            X, step, fit = self._generator(A, ladder, verify)
        generator = classification = None
        if X is not None:
            self.measures["generator_fit"] = fit
            snap = max(1e-7, 10 * max(trans, gl, fit, 1e-9) / max(ladder[-1], 1.0))
            snap = min(snap, 1e-4)
            generator = _generator_from_matrix(X, snap)
            from liepos.classify import classify

            classification = classify(generator)

        # ---- sequence length
        self._lengths(fq, fk)

        relative = not any(f.breaks_relativity for f in self.findings)
        return Diagnosis(relative=relative, generator=generator, classification=classification,
                         violations=self.findings, temperature=temperature, domain=self.domain,
                         matrix=X, step=step, measures=self.measures, notes=self.notes, tol=self.tol,
                         label=self.label)

    def _per_channel(self, br: _Bridge, diag_t: Sequence[float], B: np.ndarray, diag_var: float) -> None:
        """Name a fixed per-channel weight seen through a position-dependent rotation.

        A relative encoding has M(t, t) = M(0, 0) for every t. A per-channel weight W applied after an
        orthogonal R(t) (RMSNorm with a learnable weight after rotary, as in GRAPE) gives
        M(t, t) = R(t)ᵀ W_q W_k R(t): it changes with t, but stays symmetric with a fixed spectrum
        (an orthogonal similarity of one diagonal matrix). That pattern is what is detected here.
        """
        if diag_var <= self.tol:
            return
        sym = max(_rel(br.M(t, t), br.M(t, t).T) for t in diag_t)
        ev0 = np.linalg.eigvalsh((B + B.T) / 2)
        spec = max(_rel(np.linalg.eigvalsh((br.M(t, t) + br.M(t, t).T) / 2), ev0) for t in diag_t)
        self.measures["diagonal_variation"] = diag_var
        if sym <= self.tol and spec <= self.tol:
            w = np.sqrt(np.clip(ev0, 0, None))
            self.add(PER_CHANNEL_NORM,
                     f"M(t, t) changes with t (by {diag_var:.3g}) while staying symmetric with a fixed spectrum "
                     f"(spectral change {spec:.2g}): M(t, t) = R(t)^T S R(t) with R(t) orthogonal and S fixed, the "
                     "signature of a per-channel weight (a norm's elementwise affine, e.g. GRAPE's RMSNorm "
                     "after rotation) applied after the rotation. Relativity needs the weights tied within each "
                     f"rotated pair; here sqrt(spec S) spans [{float(w.min()):.3g}, {float(w.max()):.3g}].",
                     diag_var)

    def _generator(self, A: Callable, ladder: Sequence[float], verify: Sequence[float]):
        """X from logm(A(δ))/δ, refined along a ladder of δ; verified on exp(uX) = A(u)."""
        tol = self.tol
        if self.domain == "integer":
            A1 = A(1.0)
            neg = _negative_eigen(A1, max(tol, 1e-6))
            odd = [(v, m) for v, m in neg if m % 2 == 1]
            if odd or neg:
                vals = ", ".join(f"{v:.4g} (multiplicity {m})" for v, m in neg)
                why = ("a negative real eigenvalue of odd multiplicity has no real logarithm" if odd else
                       "a negative real eigenvalue (a half-turn) has no principal real logarithm")
                self.add(DISCRETE_GROUP,
                         f"the encoding is defined at integer positions and its one-step matrix A(1) has the "
                         f"eigenvalue(s) {vals}: {why}, so A(n) = A(1)^n is a discrete group (like the "
                         "alternating sign (-1)^n), outside the continuous family exp(uX). No generator is "
                         "forced.",
                         float(min(v for v, _ in neg)), breaks=False)
                return None, A1, None
            L = _logm_real(A1)
            if L is not None:
                self.notes.append("integer positions determine each frequency only modulo 2*pi: the principal "
                                  "logarithm of A(1) is reported (|freq| <= pi)")
            if L is None:
                self.add(DISCRETE_GROUP, "A(1) has no real logarithm: a discrete group, no generator.",
                         1.0, breaks=False)
                return None, A1, None
            fit = max(_rel(_expm(L, u), A(u)) for u in verify)
            if fit > tol:
                self.add(NO_GENERATOR, f"exp(n log A(1)) differs from A(n) by {fit:.3g}: no generator fits.",
                         fit, breaks=False)
            return L, A1, fit
        X = None
        best, best_fit = None, math.inf
        quick = [verify[2], verify[-3], verify[-1]]  # the ladder compares candidates on three offsets
        for delta in ladder:
            Ad = A(delta)
            if X is None:
                L = _logm_real(Ad)
                if L is None:
                    continue
                Xn = L / delta
            else:
                # branch-safe: the residual exp(-δX)A(δ) is near I, its principal log is the correction
                R = _logm_real(_expm(X, -delta) @ Ad)
                if R is None:
                    continue
                Xn = X + R / delta
            fit = max(_rel(_expm(Xn, u), A(u)) for u in quick)
            if fit <= best_fit * 1.5 or best is None:
                X = Xn
                if fit < best_fit:
                    best, best_fit = Xn, fit
        if best is None:
            self.add(NO_GENERATOR, "no real logarithm of A(δ) was found at any δ.", 1.0)
            return None, None, None
        best_fit = max(_rel(_expm(best, u), A(u)) for u in verify)
        if best_fit > tol:
            self.add(NO_GENERATOR,
                     f"the best generator X = log A(δ)/δ misses A(u) = exp(uX) by {best_fit:.3g} at u in "
                     f"{list(verify)}: the probe is not a one-parameter group; X is shown for reference.",
                     best_fit, breaks=False)
        return best, None, best_fit

    def _lengths(self, fq: Callable, fk: Callable) -> None:
        if len(self.lengths) < 2:
            return
        L1, L2 = min(self.lengths), max(self.lengths)
        n = 4
        x = torch.randn(n, L2, self.d, generator=self.gen, dtype=torch.float64)
        y = torch.randn(n, L2, self.d, generator=self.gen, dtype=torch.float64)
        scores = []
        for L in (L1, L2):
            pos = torch.arange(L, dtype=torch.float64 if self.domain == "real" else torch.int64)
            try:
                q = fq(x[:, :L], pos)[:, :L1]  # (n, L1, d_out)
                k = fk(y[:, :L], pos)[:, :L1]
            except Exception as err:  # noqa: BLE001 - a refusal is reported, not raised
                self.notes.append(f"the sequence-length test was skipped: the encoder refused {L} positions "
                                  f"({type(err).__name__}: {str(err)[:120]}); pass lengths=(L1, L2).")
                return
            scores.append(q @ k.transpose(-1, -2))  # (n, L1, L1)
        diff = _rel(scores[1], scores[0])
        self.measures["length"] = diff
        if diff > self.tol:
            self.add(LENGTH_DEPENDENT,
                     f"the scores at the same (t, s) change by {diff:.3g} (relative) when the sequence is "
                     f"{L2} tokens long instead of {L1}: the generator depends on the sequence length (as "
                     "with dynamic NTK scaling). Keys cached at one length and queries at another are then "
                     "inconsistent. The generator reported is the one seen at short positions.",
                     diff)


def _diagnose_axes(fq: Encoder, fk: Encoder, dim: int, axes: int, **kw: Any) -> Diagnosis:
    if axes < 1:
        raise ValueError(f"axes must be a positive integer, got {axes}")
    label = kw.pop("label")

    def on_axis(fn: Encoder, k: int) -> Encoder:
        def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            pos = torch.zeros(*positions.shape, axes, dtype=positions.dtype)
            pos[..., k] = positions  # (seq,) -> (seq, axes), the other axes at 0
            return fn(x, pos)

        return encode

    subs = [diagnose(on_axis(fq, k), on_axis(fk, k), dim, label=f"{label} axis {k}", **kw) for k in range(axes)]
    findings = [Finding(f.name, f"axis {k}: {f.message}", f.size, f.breaks_relativity)
                for k, s in enumerate(subs) for f in s.violations]
    measures: dict[str, float] = {}
    comm = 0.0
    pairs = []
    for i in range(axes):
        for j in range(i + 1, axes):
            Xi, Xj = subs[i].matrix, subs[j].matrix
            if Xi is None or Xj is None:
                continue
            den = max(np.linalg.norm(Xi) * np.linalg.norm(Xj), 1e-300)
            c = float(np.linalg.norm(Xi @ Xj - Xj @ Xi) / den)
            pairs.append((i, j, c))
            comm = max(comm, c)
    measures["commutator"] = comm
    tol = kw["tol"]
    if comm > tol:
        bad = ", ".join(f"|[X_{i}, X_{j}]| = {c:.3g}" for i, j, c in pairs if c > tol)
        findings.append(Finding(
            AXES_DO_NOT_COMMUTE,
            f"the generators of different axes do not commute ({bad}, relative to |X_i||X_j|): "
            "exp(t1 X1) exp(t2 X2) depends on the order of the moves, so a 2-D offset is not one group "
            "element and the scores are not relative in the joint position.", comm))
    relative = not any(f.breaks_relativity for f in findings)
    return Diagnosis(relative=relative, generator=[s.generator for s in subs],
                     classification=[s.classification for s in subs], violations=findings,
                     domain=subs[0].domain if subs else "real", measures=measures, axes=subs,
                     tol=tol, label=label)


# ---------------------------------------------------------------------- Hugging Face
_HF_MODELS = {
    "llama": ("LlamaConfig", "transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"),
    "mistral": ("MistralConfig", "transformers.models.mistral.modeling_mistral", "MistralRotaryEmbedding"),
    "qwen2": ("Qwen2Config", "transformers.models.qwen2.modeling_qwen2", "Qwen2RotaryEmbedding"),
}


def hf_rotary_encoder(rotary: Any, apply: Callable | None = None) -> Encoder:
    """Wrap a Hugging Face rotary module (``forward(x, position_ids) -> (cos, sin)``) as an encoder.

    The positions ``(seq,)`` become ``position_ids`` ``(1, seq)``; the tensor is rotated by
    ``apply_rotary_pos_emb`` (Llama's unless ``apply`` is given).
    """
    if apply is None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as apply

    def encode(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ids = positions.reshape(1, -1) if positions.dim() == 1 else positions
        cos, sin = rotary(x, ids)
        q, _ = apply(x, x, cos, sin)
        return q

    config = getattr(rotary, "config", None)
    encode.dim = getattr(config, "head_dim", None)  # type: ignore[attr-defined]
    return encode


def hf_encoder(model: str = "llama", rope: dict | None = None, head_dim: int = 64,
               max_position_embeddings: int = 2048, rope_theta: float = 10000.0) -> tuple[Encoder, Any]:
    """Build Hugging Face's own rotary embedding for a model family and rope parameters.

    Returns ``(encoder, rotary_module)``; ``rope`` goes into the config's ``rope_parameters``
    (transformers ≥ 5; ``rope_scaling`` on older versions).
    """
    import importlib

    import transformers

    if model not in _HF_MODELS:
        raise ValueError(f"unknown Hugging Face model {model!r}; known: {sorted(_HF_MODELS)}")
    cfg_name, mod_name, rot_name = _HF_MODELS[model]
    params = {"rope_type": "default", "rope_theta": rope_theta}
    params.update(rope or {})
    if "type" in params and "rope_type" not in (rope or {}):
        params["rope_type"] = params.pop("type")
    heads = 2
    kw: dict[str, Any] = dict(head_dim=head_dim, hidden_size=head_dim * heads, num_attention_heads=heads,
                              num_key_value_heads=heads, max_position_embeddings=max_position_embeddings)
    Config = getattr(transformers, cfg_name)
    if int(transformers.__version__.split(".")[0]) >= 5:
        config = Config(rope_parameters=params, **kw)
    else:  # pragma: no cover - older transformers
        theta = params.pop("rope_theta")
        config = Config(rope_scaling=params if params.get("rope_type") != "default" else None,
                        rope_theta=theta, **kw)
    mod = importlib.import_module(mod_name)
    rotary = getattr(mod, rot_name)(config)
    apply = getattr(mod, "apply_rotary_pos_emb", None)
    enc = hf_rotary_encoder(rotary, apply)
    enc.dim = head_dim  # type: ignore[attr-defined]
    return enc, rotary


# ---------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET",
                        help="what to probe: hf:llama, hf:mistral, hf:qwen2 (Hugging Face's own rotary code), "
                             "or lp:NAME (a liepos catalogue entry)")
    parser.add_argument("--rope", default=None,
                        help="JSON rope parameters for hf:*, e.g. '{\"rope_type\": \"yarn\", \"factor\": 4.0}'")
    parser.add_argument("--head-dim", type=int, default=64, help="head dim of the probe (default 64)")
    parser.add_argument("--max-position", type=int, default=2048,
                        help="the config's max_position_embeddings (default 2048)")
    parser.add_argument("--tol", type=float, default=1e-3, help="relative tolerance of every test (default 1e-3)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def run(args: argparse.Namespace) -> int:
    target = args.target
    try:
        if target.startswith("hf:"):
            rope = None
            if args.rope:
                try:
                    rope = json.loads(args.rope)
                except json.JSONDecodeError as err:
                    print(f"liepos diagnose: --rope is not valid JSON ({err.msg}): {args.rope!r}", file=sys.stderr)
                    return 2
                if not isinstance(rope, dict):
                    print(f"liepos diagnose: --rope must be a JSON object, got {args.rope!r}", file=sys.stderr)
                    return 2
            enc, _ = hf_encoder(target[3:], rope, head_dim=args.head_dim,
                                max_position_embeddings=args.max_position)
            d = diagnose(enc, dim=args.head_dim, tol=args.tol, label=f"{target} {json.dumps(rope or {})}")
        elif target.startswith("lp:"):
            from liepos.catalogue import build

            e = build(target[3:], args.head_dim)
            d = diagnose(e.query, e.key, dim=args.head_dim, tol=args.tol, label=target)
        else:
            print(f"liepos diagnose: unknown target {target!r}; use hf:llama, hf:mistral, hf:qwen2 or lp:NAME",
                  file=sys.stderr)
            return 2
    except (ValueError, TypeError, KeyError, ImportError) as err:
        print(f"liepos diagnose: {err}", file=sys.stderr)
        return 2
    if args.json:
        out = {
            "relative": d.relative,
            "temperature": d.temperature,
            "domain": d.domain,
            "violations": [{"name": f.name, "size": f.size, "breaks_relativity": f.breaks_relativity,
                            "message": f.message} for f in d.violations],
            "blocks": None if d.generator is None else d.generator.blocks,
            "measures": d.measures,
        }
        print(json.dumps(out, indent=2))
    else:
        print(d)
    return 0
