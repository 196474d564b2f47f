"""``diagnose``: a black-box encoding probed with basis vectors, each assumption of the theorem tested, the
generator recovered (per axis for several position axes, then the commutators of the axes' generators).

The identity checked, for a relative encoding: ``F(t)ᵀ G(s) = τ · exp((t − s) X)`` for every probed
``t, s``; the steps are :class:`~liepos.diagnosis.assumptions.Diagnoser`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from liepos._checks import check_choice, check_int, check_real, describe
from liepos.diagnosis.assumptions import Diagnoser
from liepos.diagnosis.probes import TINY, Encoder, Probe
from liepos.diagnosis.report import AXES_DO_NOT_COMMUTE, Diagnosis, Finding

__all__ = ["diagnose"]


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
        label: what the report's title calls the encoder (default: its name).

    Returns:
        a :class:`Diagnosis` (``print`` it for the report).

    Raises:
        ProbeError: the encoder returned something that is not a finite (batch, heads, seq, dim_out)
            tensor (the message names the probe, the positions and what came back).

    The defining identity checked, for a relative encoding::

        F(t)ᵀ G(s) = τ · exp((t − s) X)   for every probed t, s
    """
    try:
        import scipy.linalg  # noqa: F401
    except ImportError as err:  # pragma: no cover
        raise ImportError("liepos.diagnose needs scipy (matrix logarithms): pip install 'liepos[algebra]'") from err
    encode_key = encode_query if encode_key is None else encode_key
    for name, fn in (("encode_query", encode_query), ("encode_key", encode_key)):
        if not callable(fn):
            hint = "; for an encoding pass its .query and .key" if hasattr(fn, "query") and hasattr(fn, "key") else ""
            raise TypeError(f"`{name}` must be callable ((batch, heads, seq, dim), positions) -> tensor, "
                            f"got {describe(fn)}{hint}")
    if dim is None:
        dim = getattr(encode_query, "dim", None) or getattr(getattr(encode_query, "__self__", None), "dim", None)
    if dim is None:
        raise ValueError("diagnose needs dim (the head dim of the probe vectors); pass dim=...")
    dim = check_int("dim", dim, min=1)
    check_choice("domain", domain, ("auto", "real", "integer"))
    tol = check_real("tol", tol, positive=True)
    heads = check_int("heads", heads, min=1)
    head = check_int("head", head, min=0, max=heads - 1)
    label = label or getattr(encode_query, "__qualname__", None) or type(encode_query).__name__
    if axes is not None:
        axes = check_int("axes", axes, min=1)
        return _diagnose_axes(encode_query, encode_key, dim, axes, domain=domain, tol=tol, shifts=shifts,
                              lengths=lengths, heads=heads, head=head, dtype=dtype, seed=seed, label=label)
    pq = Probe(encode_query, dim, "query", dtype=dtype, heads=heads, head=head)
    pk = Probe(encode_key, dim, "key", dtype=dtype, heads=heads, head=head)
    return Diagnoser(pq, pk, dim, domain, tol, shifts, lengths, seed, label).run()


def _diagnose_axes(fq: Encoder, fk: Encoder, dim: int, axes: int, **kw: Any) -> Diagnosis:
    """Each axis diagnosed alone (the others at 0), then the commutators of the recovered generators."""
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
    pairs = []
    for i in range(axes):
        for j in range(i + 1, axes):
            Xi, Xj = subs[i].matrix, subs[j].matrix
            if Xi is not None and Xj is not None:
                den = max(float(np.linalg.norm(Xi)) * float(np.linalg.norm(Xj)), TINY)
                pairs.append((i, j, float(np.linalg.norm(Xi @ Xj - Xj @ Xi) / den)))
    comm = max((c for _, _, c in pairs), default=0.0)
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
                     domain=subs[0].domain, measures={"commutator": comm}, axes=subs, tol=tol, label=label)
