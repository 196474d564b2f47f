"""Diagnosis of a black-box positional encoding: recover X, check the assumptions, name violations.

An encoding is given as two callables ``encode_query(x, positions)`` and ``encode_key(x, positions)``
with ``x: (batch, heads, seq, dim)`` and ``positions: (seq,)``. Probing them with the basis vectors
``e_i`` at times ``t`` and ``s`` gives the bridge matrix (:mod:`liepos.diagnosis.probes`)::

    M(t, s)_ij = <F(t) e_i, G(s) e_j>,   i.e. M(t, s) = F(t)ᵀ G(s)

The theorem says: if the encoding is linear, ``M(t + c, s + c) = M(t, s)`` (translation invariance),
``M(t, t) = I`` and ``M`` is continuous, then ``M(t, s) = A(t − s) = exp((t − s) X)``. Each assumption
is tested on the probe, the generator is recovered as ``X = log A(δ) / δ`` with a branch-safe
refinement over several δ (:mod:`liepos.diagnosis.recovery`) and verified by ``exp(uX) ≈ A(u)`` at other
``u``, then classified. The findings and the report text are in :mod:`liepos.diagnosis.report`;
Hugging Face's own rotary code, built from a small config, in :mod:`liepos.diagnosis.hf`; the steps in
:mod:`liepos.diagnosis.assumptions`, the entry point :func:`diagnose` in :mod:`liepos.diagnosis.black_box`.

>>> import liepos as lp
>>> enc = lp.rope(8)
>>> d = diagnose(enc.query, enc.key, dim=8)
>>> d.relative, d.violations
(True, [])
>>> d.classification.counts["rotation"]
4
"""

from __future__ import annotations

from liepos.diagnosis.black_box import diagnose
from liepos.diagnosis.hf import hf_encoder, hf_rotary_encoder
from liepos.diagnosis.probes import ProbeError
from liepos.diagnosis.report import Diagnosis, Finding

__all__ = ["Diagnosis", "Finding", "ProbeError", "diagnose", "hf_encoder", "hf_rotary_encoder"]
