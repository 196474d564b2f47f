"""What a diagnosis says: the named findings, the :class:`Diagnosis` record and its report text.

A :class:`Diagnosis` is plain data; ``str()`` of it is the report (the verdict, each assumption with its
measured residual, the findings with their sizes, the recovered blocks) and :meth:`Diagnosis.to_dict`
the same as JSON-ready data.

>>> f = Finding(LOGIT_TEMPERATURE, "M(t, t) = 1.44 I", 0.44, breaks_relativity=False)
>>> d = Diagnosis(relative=True, generator=None, classification=None, violations=[f])
>>> LOGIT_TEMPERATURE in d and d.names() == [LOGIT_TEMPERATURE]
True
>>> d.to_dict()["violations"][0]["breaks_relativity"]
False
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "AXES_DO_NOT_COMMUTE", "DISCRETE_GROUP", "GROUP_LAW", "LENGTH_DEPENDENT", "LOGIT_TEMPERATURE",
    "NORMALIZED", "NOT_CONTINUOUS", "NOT_IDENTITY_AT_ZERO", "NOT_LINEAR", "NOT_TRANSLATION_INVARIANT",
    "NO_GENERATOR", "PER_CHANNEL_NORM", "SCORE_BIAS", "Diagnosis", "Finding",
]

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
SCORE_BIAS = "score_bias"

# the report's line width for a finding's message, and how many blocks it lists before "..."
_WRAP = 92
_SHOWN_BLOCKS = 8


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
    """The result of :func:`liepos.diagnose`.

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
        notes: remarks that are not findings (a skipped test, a branch choice).
        tol: the relative tolerance every residual was compared with.
        label: what was diagnosed, for the report's title.
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

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as JSON-ready data: verdict, temperature, domain, findings, blocks, residuals."""
        one = self.generator is not None and not isinstance(self.generator, list)
        return {
            "relative": self.relative,
            "temperature": self.temperature,
            "domain": self.domain,
            "violations": [{"name": f.name, "size": f.size, "breaks_relativity": f.breaks_relativity,
                            "message": f.message} for f in self.violations],
            "blocks": self.generator.blocks if one else None,
            "measures": self.measures,
            "notes": self.notes,
        }

    def __str__(self) -> str:
        lines = [f"liepos diagnosis of {self.label}", "=" * (21 + len(self.label)), self._verdict()]
        lines.append(f"positions: {self.domain}" + (" (tested at real-valued positions)" if self.domain == "real"
                                                    else " (defined at integer positions only)"))
        if abs(self.temperature - 1.0) > self.tol:
            lines.append(f"logit temperature tau = {self.temperature:.6g} (M(t, t) = tau I)")
        lines += ["", "assumptions (measured relative residuals, tolerance %.0e):" % self.tol]
        lines += [f"  {label:<42} {self.measures[key]:.3g}" for key, label in _MEASURE_LABELS if key in self.measures]
        lines.append("")
        lines += self._findings()
        lines += [f"note: {note}" for note in self.notes]
        lines.append("")
        lines += self._generator_lines()
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Diagnosis(relative={self.relative}, generator={self.generator!r}, "
                f"violations={self.names()})")

    # ------------------------------------------------------------------ report parts
    def _verdict(self) -> str:
        if not self.relative:
            return "NOT RELATIVE: outside the family A(t - s) = exp((t - s) X)"
        verdict = "RELATIVE: the scores depend only on the lag t - s"
        if GROUP_LAW in self or NO_GENERATOR in self:
            return verdict + ", but A(u) is not a one-parameter group exp(uX)"
        if self.generator is not None and not isinstance(self.generator, list):
            return verdict + "; A(u) = " + ("tau * " if abs(self.temperature - 1) > self.tol else "") + "exp(uX)"
        return verdict

    def _findings(self) -> list[str]:
        if not self.violations:
            return ["findings: none; every assumption of the theorem holds"]
        lines = [f"findings ({len(self.violations)}):"]
        for f in self.violations:
            tag = "breaks relativity" if f.breaks_relativity else "relativity kept"
            lines.append(f"  - {f.name} [{tag}; size {f.size:.3g}]")
            lines += [f"      {chunk}" for chunk in _wrap(f.message, _WRAP)]
        return lines

    def _generator_lines(self) -> list[str]:
        if self.axes is not None:
            lines = []
            for k, sub in enumerate(self.axes):
                lines.append(f"axis {k}: generator {sub.generator!r}")
                if sub.classification is not None:
                    lines.append(_indent(str(sub.classification), "  "))
            return lines
        if self.generator is not None:
            blocks = sorted(self.generator.blocks, key=lambda b: (-abs(b[1]), b[0]))
            shown = ", ".join(f"({lam:.4g}, {abs(om):.6g}, {n})" for lam, om, n in blocks[:_SHOWN_BLOCKS])
            more = f", ... ({len(blocks)} blocks)" if len(blocks) > _SHOWN_BLOCKS else ""
            return [f"generator: {self.generator!r}",
                    f"blocks (rate, freq, size), fastest first: {shown}{more}",
                    str(self.classification) if self.classification is not None else _blocks_table(self.generator)]
        if self.step is not None:
            ev = np.linalg.eigvals(self.step)
            return ["no real generator; eigenvalues of the one-step matrix A(1):",
                    "  " + ", ".join(_fmt_complex(z) for z in sorted(ev, key=lambda z: (z.real, z.imag)))]
        return []


_MEASURE_LABELS = [
    ("linearity", "linearity  f(ax+by) = af(x)+bf(y)"),
    ("offset", "no additive part  |f(0)|"),
    ("additive_drift", "added part relative  (shift drift)"),
    ("translation", "translation  M(t+c, s+c) = M(t, s)"),
    ("identity", "identity at zero  M(t, t) = tau I"),
    ("group_law", "group law  A(a) A(b) = A(a+b)"),
    ("continuity", "continuity  (jump ratio, ~1/8 when smooth)"),
    ("generator_fit", "generator  exp(uX) = A(u)"),
    ("length", "sequence length  M_L1(t, s) = M_L2(t, s)"),
    ("commutator", "axes commute  |[X_i, X_j]| / |X_i||X_j|"),
]


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in text.splitlines())


def _fmt_complex(z: complex) -> str:
    # an eigenvalue whose imaginary part is below this is printed as real (it is round-off of a real one)
    if abs(z.imag) < 1e-9:
        return f"{z.real:.6g}"
    return f"{z.real:.6g}{z.imag:+.6g}i"


def _blocks_table(g: Any) -> str:
    rows = ["  rate        freq        size"]
    rows += [f"  {lam:<+11.4g} {om:<11.6g} {n}" for lam, om, n in g.blocks]
    return "\n".join(rows)
