"""The theorem's assumptions tested on a probe, one step each: ``M(t, s) = F(t)ᵀ G(s)`` linear,
translation invariant (``M(t + c, s + c) = M(t, s)``), the identity at equal times and continuous, then
``A(u) = exp(uX)`` recovered and verified.

:class:`Plan` is the probed offsets (per domain: real or integer positions); :class:`Diagnoser` runs the
steps in order over them and gathers the findings into a :class:`~liepos.diagnosis.report.Diagnosis`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from liepos._checks import check_int
from liepos.diagnosis.probes import TINY, Bridge, Linearized, Probe, ProbeError, Side, rel
from liepos.diagnosis.recovery import generator_from_matrix, recover
from liepos.diagnosis.report import (
    GROUP_LAW,
    LENGTH_DEPENDENT,
    LOGIT_TEMPERATURE,
    NORMALIZED,
    NOT_CONTINUOUS,
    NOT_IDENTITY_AT_ZERO,
    NOT_LINEAR,
    NOT_TRANSLATION_INVARIANT,
    PER_CHANNEL_NORM,
    SCORE_BIAS,
    Diagnosis,
    Finding,
)

__all__ = ["Plan", "Diagnoser"]

# the continuity test steps h = 2^-7 and 2^-10 past u: |A(u + h) - A(u)| shrinks 8x when A is smooth,
# so a ratio above this is a jump; u sits just below k/4 (by 2^-12) to straddle a grid of quarter steps
_JUMP_RATIO = 0.5
_H_COARSE, _H_FINE, _BELOW_GRID = 2.0**-7, 2.0**-10, 2.0**-12
# a difference below this (relative to |A(1)|) is round-off, not a step of A
_STILL = 1e-7
# the noise floor of the recovered rates: between these, scaled by the measured residuals
_SNAP_MIN, _SNAP_MAX = 1e-7, 1e-4
# the linearity probe: a x + b y with these weights, on this many random vectors
_A, _B, _N_RANDOM = 0.7, -1.3, 3
# the sequence-length probe compares the scores of this many random vectors
_N_LENGTH = 4
# how much of an encoder's own error message a note quotes (a ProbeError is quoted whole)
_SHOWN_ERROR = 120


@dataclass(frozen=True)
class Plan:
    """The probed offsets: ``base`` (t, s) pairs moved by ``shifts``, the ``diag_t`` of M(t, t), the
    ``ladder`` of δ and the ``verify`` offsets of the recovery, the group-law ``pairs`` and the points
    ``cont_u`` of the continuity test."""

    shifts: list[float]
    base: list[tuple[float, float]]
    diag_t: list[float]
    ladder: list[float]
    verify: list[float]
    pairs: list[tuple[float, float]]
    cont_u: list[float]

    @classmethod
    def for_domain(cls, real: bool, shifts: Sequence[float] | None) -> Plan:
        return cls(
            shifts=list(shifts) if shifts is not None else [1, 5, 17, 64, 251] + ([2.5] if real else []),
            base=[(0, 0), (1, 0), (0, 1), (3, 1), (2, 5), (7, 3)] + ([(0.5, 1.75)] if real else []),
            diag_t=[0, 1, 5, 17, 64, 251] + ([2.5, 0.5] if real else []),
            ladder=[2.0**-6, 2.0**-4, 2.0**-2, 1.0, 4.0, 16.0] if real else [1.0],
            verify=[1.0, 2.0, 3.0, 7.0, 13.0, 40.0] + ([0.3, 2.7] if real else []),
            pairs=[(1, 2), (3, 5), (17, 64)] + ([(0.5, 1.25), (2.5, 3.75)] if real else []),
            cont_u=[k / 4 - _BELOW_GRID for k in range(1, 9)] if real else [],
        )

    def positions(self) -> set[float]:
        """Every position a bridge entry of this plan reads."""
        values = {0.0, 1.0} | set(self.diag_t) | set(self.ladder) | set(self.verify)
        for t, s in self.base:
            for c in [0, *self.shifts]:
                values |= {t + c, s + c}
        for a, b in self.pairs:
            values |= {a, b, a + b}
        for u in self.cont_u:
            values |= {u, u + _H_COARSE, u + _H_FINE}
        return values

    def integers(self) -> Plan:
        """The plan restricted to integer offsets (a rounding encoder is judged there)."""
        whole = lambda *v: all(float(x).is_integer() for x in v)  # noqa: E731
        return replace(self, ladder=[1.0], verify=[v for v in self.verify if whole(v)],
                       base=[(t, s) for t, s in self.base if whole(t, s)],
                       shifts=[c for c in self.shifts if whole(c)],
                       pairs=[(a, b) for a, b in self.pairs if whole(a, b)],
                       diag_t=[t for t in self.diag_t if whole(t)], cont_u=[])


class Diagnoser:
    """One diagnosis of the probes ``pq`` and ``pk``: the steps run in order (:meth:`run`), each tests one
    assumption of the theorem on the bridge ``M(t, s) = F(t)ᵀ G(s)`` and adds its measures and findings."""

    def __init__(self, pq: Probe, pk: Probe, dim: int, domain: str, tol: float,
                 shifts: Sequence[float] | None, lengths: Sequence[int], seed: int, label: str) -> None:
        self.pq, self.pk, self.d, self.domain, self.tol = pq, pk, dim, domain, tol
        self.shifts = shifts
        self.lengths = tuple(check_int(f"lengths[{i}]", n, min=1) for i, n in enumerate(lengths))
        self.gen = torch.Generator().manual_seed(seed)
        self.label = label
        self.findings: list[Finding] = []
        self.measures: dict[str, float] = {}
        self.notes: list[str] = []
        self.offset: float | None = None  # |f(0)| / |f(x)| when the encoder is affine

    def add(self, name: str, message: str, size: float, breaks: bool = True) -> None:
        self.findings.append(Finding(name, message, float(size), breaks))

    def pos(self, values: Sequence[float] | set[float]) -> torch.Tensor:
        vals = sorted({float(v) for v in values})
        if self.domain == "integer":
            return torch.tensor([round(v) for v in vals], dtype=torch.int64)
        return torch.tensor(vals, dtype=torch.float64)

    def run(self) -> Diagnosis:
        self.detect_domain()
        fq, fk = self.linearity()
        plan = Plan.for_domain(self.domain == "real", self.shifts)
        br = Bridge(fq, fk, self.d, self.pos(plan.positions()), "bridge")
        if self.domain == "integer":
            br.index = {float(round(k)): v for k, v in br.index.items()}
        if self.offset is not None:
            self.additive(br, plan)
        B = br.M(0, 0)
        tau = float(np.trace(B)) / self.d
        iso = rel(B, tau * np.eye(self.d)) if tau != 0 else 1.0
        self.measures["identity"] = iso
        invertible = bool(np.linalg.matrix_rank(B) == self.d)
        Binv = np.linalg.inv(B) if invertible else np.linalg.pinv(B)

        def A(u: float) -> np.ndarray:
            return Binv @ br.M(u, 0)  # A(u) = M(0, 0)^-1 M(u, 0)

        if plan.cont_u and self.continuity(A, plan.cont_u):  # first: a rounding encoder is judged on integers
            plan = plan.integers()
        trans = self.translation(br, plan, B)
        temperature = self.temperature(tau, iso, invertible)
        gl = self.group_law(A, plan.pairs, trans, br.Q.shape[-1])
        rec = recover(A, self.domain, self.tol, plan.ladder, plan.verify)
        self.findings += rec.findings
        self.notes += rec.notes
        generator = classification = None
        if rec.matrix is not None:
            from liepos.classification import classify

            fit = rec.fit
            if fit is None:  # recover() measures the fit of every generator it returns
                raise RuntimeError("diagnose: a recovered generator came without its fit")
            self.measures["generator_fit"] = fit
            snap = min(max(_SNAP_MIN, 10 * max(trans, gl, fit, 1e-9) / max(plan.ladder[-1], 1.0)), _SNAP_MAX)
            generator = generator_from_matrix(rec.matrix, snap)
            classification = classify(generator)
        self._lengths(fq, fk)
        relative = not any(f.breaks_relativity for f in self.findings)
        return Diagnosis(relative=relative, generator=generator, classification=classification,
                         violations=self.findings, temperature=temperature, domain=self.domain,
                         matrix=rec.matrix, step=rec.step, measures=self.measures, notes=self.notes, tol=self.tol,
                         label=self.label)

    # ------------------------------------------------------------------ steps
    def detect_domain(self) -> None:
        if self.domain != "auto":
            return
        half = torch.tensor([0.5, 1.25], dtype=torch.float64)
        e0 = torch.eye(self.d, dtype=torch.float64)[:1]
        try:
            self.pq(e0, half, "domain")
            self.pk(e0, half, "domain")
            self.domain = "real"
        except Exception:  # noqa: BLE001 - any refusal of fractional positions means integer-only
            self.domain = "integer"

    def _linear_residual(self, sides: Sequence[Side], x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor) -> float:
        worst = 0.0
        for p in sides:
            fx, fy, fxy = p(x, pos, "linearity"), p(y, pos, "linearity"), p(_A * x + _B * y, pos, "linearity")
            worst = max(worst, float((fxy - _A * fx - _B * fy).norm()) / float((_A * fx).norm() + (_B * fy).norm()))
        return worst

    def linearity(self) -> tuple[Side, Side]:
        """Test f(ax + by) = a f(x) + b f(y); undo an additive part or a per-vector norm if found."""
        pos = self.pos([0, 1, 3, 17, 100] + ([2.5] if self.domain == "real" else []))
        x = torch.randn(_N_RANDOM, pos.shape[0], self.d, generator=self.gen, dtype=torch.float64)
        y = torch.randn(_N_RANDOM, pos.shape[0], self.d, generator=self.gen, dtype=torch.float64)
        zero = torch.zeros(1, self.d, dtype=torch.float64)
        worst = self._linear_residual((self.pq, self.pk), x, y, pos)
        off = max(float(p(zero, pos, "offset").norm()) / float(p(x, pos, "offset").norm()) * math.sqrt(_N_RANDOM)
                  for p in (self.pq, self.pk))
        hom = max(rel(p(2 * x, pos, "homogeneity"), p(x, pos, "homogeneity")) for p in (self.pq, self.pk))
        self.measures["linearity"] = worst
        self.measures["offset"] = off
        if worst <= self.tol:
            return self.pq, self.pk
        for mode, applies in (("affine", off > self.tol), ("normalized", hom <= self.tol)):
            lq, lk = Linearized(self.pq, mode), Linearized(self.pk, mode)
            if not applies or self._linear_residual((lq, lk), x, y, pos) > self.tol:
                continue
            if mode == "affine":
                self.offset = off  # named by additive() once the bridge shows what the added part does
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

    def additive(self, br: Bridge, plan: Plan) -> None:
        """Name what the added parts b(t) (query) and c(s) (key) do to the score.

        ``<F(t)q + b(t), G(s)k + c(s)> = qᵀM(t, s)k + q·u(t, s) + v(t, s)·k + β(t, s)`` with
        ``u = F(t)ᵀc(s)``, ``v = G(s)ᵀb(t)`` and ``β = b(t)·c(s)``: the score stays relative when all
        three depend on t − s only (ALiBi's slots: u = v = 0, β = −m (t − s)); otherwise they are
        absolute cross terms (the sinusoid added to q of Vaswani et al.).
        """
        offset = self.offset
        if offset is None:  # called only for an affine encoder, whose offset was measured
            raise RuntimeError("diagnose: the added parts were examined before the offset was measured")
        zero = torch.zeros(1, self.d, dtype=torch.float64)
        b = self.pq(zero, br.pos, "offset")[0].numpy()  # (P, d_out): b(t)
        c = self.pk(zero, br.pos, "offset")[0].numpy()  # (P, d_out): c(s)
        ix = br.index

        def parts(t: float, s: float) -> tuple[np.ndarray, np.ndarray, float]:
            i, j = ix[float(t)], ix[float(s)]
            return br.Q[i] @ c[j], br.K[j] @ b[i], float(b[i] @ c[j])  # u (d,), v (d,), β

        nb, nc = np.linalg.norm(b, axis=-1).max(), np.linalg.norm(c, axis=-1).max()
        nq, nk = np.linalg.norm(br.Q, axis=(-2, -1)).max(), np.linalg.norm(br.K, axis=(-2, -1)).max()
        scales = (max(nq * nc, TINY), max(nk * nb, TINY), max(nb * nc, TINY))  # Cauchy-Schwarz bounds
        drift = 0.0
        for t, s in plan.base:
            ref = parts(t, s)
            for sh in plan.shifts:
                moved = parts(t + sh, s + sh)
                drift = max(drift, *(float(np.linalg.norm(np.subtract(np.asarray(x), np.asarray(y)))) / sc
                                     for x, y, sc in zip(moved, ref, scales)))
        self.measures["additive_drift"] = drift
        varies = rel(b, np.broadcast_to(b[:1], b.shape))  # (1, d_out) -> (P, d_out)
        if drift > self.tol:
            self.add(NOT_LINEAR,
                     "the encoder is affine, not linear: it adds a vector b(t) that does not depend on the "
                     f"input (|b| / |f(x)| = {offset:.3g}; b varies with position by {varies:.3g}), an "
                     "absolute additive encoding such as the sinusoidal of Vaswani et al. The score then has "
                     "cross terms q.c(s) + b(t).k + b(t).c(s) that depend on t and s separately (by "
                     f"{drift:.3g} under a shift). The rest of this report is about the linear part f(x) - f(0).",
                     offset)
            return
        lags = sorted({float(u) for u in plan.verify} | {0.0})
        beta = np.array([parts(u, 0.0)[2] for u in lags])
        slope, icept = np.polyfit(lags, beta, 1)
        linear = rel(icept + slope * np.array(lags), beta) <= self.tol
        const = f"{icept:.4g} + " if abs(icept) > self.tol * max(float(np.abs(beta).max()), TINY) else ""
        shape = (f"beta(u) = {const}({slope:.6g}) u, linear in the lag as with ALiBi's slots (slope "
                 f"m = {-slope:.6g}; a size-2 Jordan block N = [[0, 1], [0, 0]] on two extra channels)"
                 if linear else f"beta(u) at u = {lags[:4]} is {[round(x, 6) for x in beta[:4]]}")
        self.add(SCORE_BIAS,
                 f"the encoder is affine: it adds b(t) to the query and c(s) to the key, independent of the input "
                 f"(|b| / |f(x)| = {offset:.3g}), and every cross term depends on t - s only (drift "
                 f"{drift:.2g} under a shift): the score is q.A(t - s)k plus a relative bias {shape}. The rest "
                 "of this report is about the linear part f(x) - f(0).",
                 offset, breaks=False)

    def continuity(self, A: Callable[[float], np.ndarray], cont_u: Sequence[float]) -> bool:
        """|A(u + h) − A(u)| must shrink with h; a jump means rounded positions (then judged on integers)."""
        ratio, where, jump = 0.0, 0.0, 0.0
        scale = max(float(np.linalg.norm(A(1.0))), TINY)
        for u in cont_u:
            A0 = A(u)
            d1 = float(np.linalg.norm(A(u + _H_COARSE) - A0))
            d2 = float(np.linalg.norm(A(u + _H_FINE) - A0))
            if d1 > _STILL * scale and d2 / d1 > ratio:
                ratio, where, jump = d2 / d1, u, d2 / scale
        self.measures["continuity"] = ratio
        if ratio <= _JUMP_RATIO:
            return False
        self.add(NOT_CONTINUOUS,
                 f"A(u) jumps near u = {where + _BELOW_GRID:g}: |A(u + h) - A(u)| stays at {jump:.3g} as h "
                 f"shrinks from 2^-7 to 2^-10 (ratio {ratio:.2f}; a smooth A gives 1/8). Positions are "
                 "rounded to a grid; the encoding is diagnosed on integer positions.",
                 jump, breaks=False)
        self.domain = "integer"
        return True

    def translation(self, br: Bridge, plan: Plan, B: np.ndarray) -> float:
        """M(t + c, s + c) = M(t, s); when it fails, look for per-channel weights after a rotation."""
        trans = max((rel(br.M(t + c, s + c), br.M(t, s)) for t, s in plan.base for c in plan.shifts), default=0.0)
        self.measures["translation"] = trans
        if trans > self.tol:
            msg = (f"M(t + c, s + c) differs from M(t, s) by up to {trans:.3g} (relative) over shifts "
                   f"c = {plan.shifts}: the scores depend on absolute positions, not only on t - s.")
            self.add(NOT_TRANSLATION_INVARIANT, msg, trans)
            diag_var = max(rel(br.M(t, t), B) for t in plan.diag_t)
            self._per_channel(br, plan.diag_t, B, diag_var)
        return trans

    def temperature(self, tau: float, iso: float, invertible: bool) -> float:
        """M(t, t) = τ I: τ ≠ 1 is a folded logit temperature; not a multiple of I is named."""
        if iso <= self.tol and abs(tau - 1.0) > self.tol and tau > 0:
            self.add(LOGIT_TEMPERATURE,
                     f"M(t, t) = tau I with tau = {tau:.6g}, not I: every logit is multiplied by tau (a "
                     f"temperature folded into the encoding, e.g. YaRN's attention_factor^2 = {tau:.4g}, "
                     f"attention_factor = {math.sqrt(tau):.6g}). Scores stay relative: A(u) = tau exp(uX).",
                     abs(tau - 1.0), breaks=False)
            return tau
        if iso > self.tol:
            what = "invertible, so it can be absorbed into the keys" if invertible else \
                "singular: the encoder loses channels"
            self.add(NOT_IDENTITY_AT_ZERO,
                     f"M(0, 0) is not a multiple of I (residual {iso:.3g}); it is {what}. The group is "
                     "read from M(0, 0)^-1 M(u, 0).",
                     iso, breaks=not invertible)
        return 1.0

    def group_law(self, A: Callable[[float], np.ndarray], pairs: Sequence[tuple[float, float]],
                  trans: float, d_out: int) -> float:
        """A(a) A(b) = A(a + b)."""
        gl = max(rel(A(a) @ A(b), A(a + b)) for a, b in pairs)
        self.measures["group_law"] = gl
        if gl > self.tol:
            why = ("the scores are relative, but the encoder's output has more channels than its input "
                   f"({d_out} > {self.d}): F(t) is not square, so the theorem's derivation of the group law does "
                   "not apply and A(t - s) is not exp((t - s) X)") if trans <= self.tol and d_out > self.d else \
                "it follows from the failures above"
            self.add(GROUP_LAW,
                     f"A(a) A(b) differs from A(a + b) by up to {gl:.3g} (relative) for (a, b) in {list(pairs)}, "
                     f"with A(u) = M(0, 0)^-1 M(u, 0): the probe is not a one-parameter group; {why}.",
                     gl, breaks=False)
        return gl

    def _per_channel(self, br: Bridge, diag_t: Sequence[float], B: np.ndarray, diag_var: float) -> None:
        """Name a fixed per-channel weight seen through a position-dependent rotation.

        A relative encoding has M(t, t) = M(0, 0) for every t. A per-channel weight W applied after an
        orthogonal R(t) (RMSNorm with a learnable weight after rotary, as in GRAPE) gives
        M(t, t) = R(t)ᵀ W_q W_k R(t): it changes with t, but stays symmetric with a fixed spectrum
        (an orthogonal similarity of one diagonal matrix). That pattern is what is detected here.
        """
        if diag_var <= self.tol:
            return
        sym = max(rel(br.M(t, t), br.M(t, t).T) for t in diag_t)
        ev0 = np.linalg.eigvalsh((B + B.T) / 2)
        spec = max(rel(np.linalg.eigvalsh((br.M(t, t) + br.M(t, t).T) / 2), ev0) for t in diag_t)
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

    def _lengths(self, fq: Side, fk: Side) -> None:
        """The scores at the same (t, s) with positions arange(L1) and arange(L2) must agree."""
        if len(self.lengths) < 2:
            return
        L1, L2 = min(self.lengths), max(self.lengths)
        x = torch.randn(_N_LENGTH, L2, self.d, generator=self.gen, dtype=torch.float64)
        y = torch.randn(_N_LENGTH, L2, self.d, generator=self.gen, dtype=torch.float64)
        scores = []
        for L in (L1, L2):
            pos = torch.arange(L, dtype=torch.float64 if self.domain == "real" else torch.int64)
            try:
                q = fq(x[:, :L], pos, "sequence-length")[:, :L1]  # (n, L1, d_out)
                k = fk(y[:, :L], pos, "sequence-length")[:, :L1]
            except Exception as err:  # noqa: BLE001 - a refusal is reported, not raised
                why = str(err) if isinstance(err, ProbeError) else str(err)[:_SHOWN_ERROR]
                self.notes.append(f"the sequence-length test was skipped: the encoder refused {L} positions "
                                  f"({type(err).__name__}: {why}); pass lengths=(L1, L2).")
                return
            scores.append(q @ k.transpose(-1, -2))  # (n, L1, L1)
        diff = rel(scores[1], scores[0])
        self.measures["length"] = diff
        if diff > self.tol:
            self.add(LENGTH_DEPENDENT,
                     f"the scores at the same (t, s) change by {diff:.3g} (relative) when the sequence is "
                     f"{L2} tokens long instead of {L1}: the generator depends on the sequence length (as "
                     "with dynamic NTK scaling). Keys cached at one length and queries at another are then "
                     "inconsistent. The generator reported is the one seen at short positions.",
                     diff)
