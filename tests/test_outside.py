"""Outside the family, named: each published method's reference score function (reimplemented from its paper:
none ships a package) against its own formula written out pair by pair, and diagnose's verdict for it."""

from __future__ import annotations

import math

import pytest
import torch

import liepos as lp
from liepos.diagnosis.outside import OUTSIDE, fope_encoders
from liepos.diagnosis.report import GROUP_LAW, NOT_TRANSLATION_INVARIANT
from liepos.diagnosis.scores import CONTENT_DEPENDENT, diagnose_scores

F64 = torch.float64
D = 8


def rope_pair(q, k, r):
    """qᵀ A(r) k through liepos' own dense matrix exp(rX) of RoPE at base 100 (an independent path)."""
    return float(q @ lp.rope(D, base=100.0).generator.exp(float(r)) @ k)


def inputs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, D, generator=g, dtype=F64), torch.randn(n, D, generator=g, dtype=F64)
    t = torch.tensor([3.0, 9.0, 14.0, 20.0, 31.0, 40.0], dtype=F64)[:n]
    s = torch.tensor([0.0, 2.0, 5.0, 11.0, 17.0, 30.0], dtype=F64)[:n]
    return q, k, t, s


@pytest.mark.parametrize("name, lag", [
    ("string_hkunlp", lambda t, s: (t - s) - 12 + 4 if t - s >= 12 else t - s),  # shift 12, window 4
    ("rerope", lambda t, s: min(t - s, 8.0)),
    ("self_extend", lambda t, s: t - s if t - s < 8 else math.floor(t / 4) - math.floor(s / 4) + 8 - 8 // 4),
])
def test_piecewise_lag_methods_are_their_formulas(name, lag):
    q, k, t, s = inputs()
    got = OUTSIDE[name].build(D)(q, k, t, s)
    for i in range(len(t)):
        for j in range(len(s)):
            want = rope_pair(q[i], k[j], lag(float(t[i]), float(s[j])))
            assert abs(float(got[i, j]) - want) < 1e-10 * max(1.0, abs(want)), (name, i, j)


def test_stick_breaking_is_its_product_formula():
    q, k, t, s = inputs()
    got = OUTSIDE["stick_breaking"].build(D)(q, k, t, s)
    beta = lambda i, j: 1 / (1 + math.exp(-float(q[i] @ k[j]) / math.sqrt(D)))  # noqa: E731
    for i in range(len(t)):
        for j in range(len(s)):
            w = beta(i, j) * math.prod(1 - beta(i, m) for m in range(len(s)) if s[j] < s[m] < t[i])
            assert abs(math.exp(float(got[i, j])) - w) < 1e-12


def test_contextual_cope_is_its_gate_count_formula():
    from liepos.diagnosis.outside import cope_contextual

    q, k, t, s = inputs()
    E = torch.randn(17, D, generator=torch.Generator().manual_seed(0), dtype=F64)  # the table cope_contextual draws
    got = cope_contextual(D)(q, k, t, s)
    for i in range(len(t)):
        for j in range(len(s)):
            if s[j] > t[i]:
                assert got[i, j] == -math.inf
                continue
            p = min(sum(float(torch.sigmoid(q[i] @ k[m])) for m in range(j, len(s)) if s[m] <= t[i]), 16.0)
            e = E[math.floor(p)] * (1 - (p - math.floor(p))) + E[min(math.floor(p) + 1, 16)] * (p - math.floor(p))
            assert abs(float(got[i, j]) - float(q[i] @ k[j] + q[i] @ e)) < 1e-10


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_diagnose_names_the_failing_property(name):
    m = OUTSIDE[name]
    v = diagnose_scores(m.build(D), D, label=name)
    assert not v.in_family and v.names() == [m.fails], str(v)
    assert m.fails in str(v) and name in str(v)


def test_the_evidence_names_where_it_breaks():
    """Piecewise methods break exactly at their own boundary: STRING at the shift, ReRoPE at the window."""
    v = diagnose_scores(OUTSIDE["string_hkunlp"].build(D), D)
    assert v.relative and "fails at u = 11" in str(v)  # A(12) ≠ A(11) A(1): the lag 12 is shifted
    v = diagnose_scores(OUTSIDE["rerope"].build(D), D)
    assert v.relative and "fails at u = 8" in str(v)


@pytest.mark.parametrize("enc", [lp.rope(D), lp.xpos(D), lp.p_rope(D, 0.5), lp.cope_clipped(D), lp.string_google(D),
                                 lp.scaling.factors(lp.rope(D), factors=torch.linspace(1, 4, 4, dtype=F64))],
                         ids=["rope", "xpos", "p_rope", "cope_clipped", "string_google", "factors"])
def test_members_of_the_family_pass_every_probe(enc):
    def score(q, k, t, s):
        return enc.query(q[None, None], t)[0, 0] @ enc.key(k[None, None], s)[0, 0].T

    v = diagnose_scores(score, D)
    assert v.in_family and v.names() == [], str(v)


def test_fope_through_the_encoder_diagnosis_too():
    """FoPE factors into query and key maps, so lp.diagnose itself probes it: not translation invariant."""
    fq, fk = fope_encoders(D)
    d = lp.diagnose(fq, fk, dim=D, domain="integer")
    assert not d.relative and NOT_TRANSLATION_INVARIANT in d.names()


def test_clashing_names_are_namespaced():
    assert {"cope_clipped", "string_google"} <= set(lp.CATALOGUE)
    assert {"cope_contextual", "string_hkunlp"} <= set(OUTSIDE)
    assert not set(OUTSIDE) & set(lp.CATALOGUE)
    assert {m.fails for m in OUTSIDE.values()} == {CONTENT_DEPENDENT, NOT_TRANSLATION_INVARIANT, GROUP_LAW}


def test_the_temperatures_are_named_outside_the_group():
    """Scalable-Softmax's s·log n depends on the other keys; Llama 4's τ(t) on the absolute query position."""
    from liepos.temperature import Llama4Temperature, ScalableSoftmax

    def ssmax(q, k, t, s):
        n = (s[None, :] <= t[:, None]).sum(-1, keepdim=True).double()  # (Sq, 1) visible keys
        return ScalableSoftmax(0.5).factor(t[None], n.T[None])[0, 0][:, None] * (q @ k.T)

    T = Llama4Temperature(floor_scale=4, attn_scale=0.5)

    def llama4(q, k, t, s):
        return T.factor(t[None], None)[0, 0][:, None] * (q @ k.T)

    v = diagnose_scores(ssmax, D)
    assert v.names() == [CONTENT_DEPENDENT] and "depends on the other keys" in str(v)
    assert diagnose_scores(llama4, D).names() == [NOT_TRANSLATION_INVARIANT]
