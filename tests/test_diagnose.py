"""lp.diagnose: each named violation is found on a deliberately broken encoder and absent on a correct one.

The encoders below are deliberately small (head dim 8-16) except Hugging Face's Llama (64).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import liepos as lp
from liepos.diagnosis import Diagnosis, ProbeError, diagnose, hf_encoder

D = 8


# ---------------------------------------------------------------------- encoders
def rotate_half_layout(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate planes (k, k + d/2) of x (..., seq, d) by angles (seq, d/2), counter-clockwise."""
    h = x.shape[-1] // 2
    c, s = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


FREQS = 1.0 / (100.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))  # (D/2,)


def rope_enc(x, positions):
    return rotate_half_layout(x, positions.to(torch.float64)[:, None] * FREQS)  # (seq, D/2)


def sinusoid_added(x, positions):
    """Vaswani et al.: an absolute sinusoid added to the vector (affine, not linear)."""
    ang = positions.to(torch.float64)[:, None] * FREQS  # (seq, D/2)
    pe = torch.cat((ang.sin(), ang.cos()), dim=-1)  # (seq, D)
    return x + pe.to(x.dtype)


def quadratic_phase(x, positions):
    """Rotation angle ω t²: linear, identity at zero offset, but not translation invariant."""
    p = positions.to(torch.float64)
    return rotate_half_layout(x, (p * p / 10.0)[:, None] * FREQS)


def temperature(x, positions):
    return 1.2 * rope_enc(x, positions)  # logits scale by 1.44


def grape(weight):
    """GRAPE-M: rotate, then RMSNorm with an elementwise weight (after rotation)."""

    def encode(x, positions):
        y = rope_enc(x, positions)
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-12) * weight

    return encode


W_UNTIED = torch.linspace(0.5, 1.5, D, dtype=torch.float64)  # w_k != w_{k + D/2}
W_TIED = torch.cat([torch.linspace(0.5, 1.5, D // 2, dtype=torch.float64)] * 2)  # w_k == w_{k + D/2}


def alternating(x, positions):
    """(−1)^n on channel 0, defined on integers only: a discrete group."""
    if positions.is_floating_point():
        raise TypeError("integer positions only")
    sign = torch.ones(positions.shape[0], x.shape[-1], dtype=x.dtype)
    sign[:, 0] = 1 - 2 * (positions % 2).to(x.dtype)
    return x * sign


def integer_rope(x, positions):
    if positions.is_floating_point():
        raise TypeError("integer positions only")
    return rope_enc(x, positions)


def floored_rope(x, positions):
    """Accepts real positions but rounds them down (a table lookup): not continuous."""
    return rope_enc(x, torch.floor(positions.to(torch.float64)))


def lifted_cosine(x, positions):
    """q -> [cos(ωt) q; sin(ωt) q] in 2d channels: M(t, s) = diag(cos ω(t − s)), relative but not a group."""
    w = torch.linspace(0.1, 1.0, x.shape[-1], dtype=torch.float64)
    ang = positions.to(torch.float64)[:, None] * w  # (seq, d)
    return torch.cat((x * ang.cos(), x * ang.sin()), dim=-1)


def axes_encoder(X1, X2, commuting_order=False):
    """LieRE-style: F(t) = exp(t1 X1 + t2 X2)^T applied as q -> exp(-(t·X)) q... (relative per axis)."""

    def encode(x, positions):  # positions: (seq, 2)
        p = positions.to(torch.float64)
        gen = p[:, 0, None, None] * X1 + p[:, 1, None, None] * X2  # (seq, d, d)
        R = torch.linalg.matrix_exp(gen)  # (seq, d, d), orthogonal for skew X
        return torch.einsum("sij,bhsj->bhsi", R, x.to(torch.float64)).to(x.dtype)

    return encode


def skew(seed, d=4):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a - a.T


# ---------------------------------------------------------------------- the correct encoders
def test_correct_encoder_has_no_findings_and_recovers_its_freqs():
    d = diagnose(rope_enc, dim=D)
    assert isinstance(d, Diagnosis)
    assert d.relative and d.violations == [] and d.domain == "real"
    freqs = sorted(b[1] for b in d.generator.blocks)
    assert np.allclose(freqs, sorted(FREQS.tolist()), rtol=1e-8, atol=1e-10)
    assert all(b[0] == 0 for b in d.generator.blocks)
    assert "every assumption of the theorem holds" in str(d)


def test_catalogue_encodings_are_relative_with_the_same_blocks():
    for enc in (lp.rope(D), lp.xpos(D, scale_base=64.0), lp.decay([0.1, 0.5, 1.0])):
        d = diagnose(enc.query, enc.key, dim=enc.content_dim)
        assert d.relative and d.violations == [], (enc, d.violations)
        got = sorted((round(r, 6), round(abs(w), 6)) for r, w, _ in d.generator.blocks)
        want = sorted((round(r, 6), round(abs(w), 6)) for r, w, _ in enc.generator.blocks)
        assert got == want


def test_hf_llama_rotary_recovers_inv_freq():
    pytest.importorskip("transformers")
    enc, rotary = hf_encoder("llama", head_dim=64)
    d = diagnose(enc, dim=64)
    assert d.relative and d.violations == []
    freqs = np.sort([abs(b[1]) for b in d.generator.blocks])
    inv_freq = np.sort(rotary.inv_freq.double().numpy())
    assert len(freqs) == 32
    assert np.allclose(freqs, inv_freq, rtol=1e-6, atol=1e-9)
    assert all(b[0] == 0 and b[2] == 1 for b in d.generator.blocks)


# ---------------------------------------------------------------------- each violation
def test_additive_sinusoid_is_not_linear():
    d = diagnose(sinusoid_added, dim=D)
    assert "not_linear" in d and not d.relative
    assert "affine" in str(d)
    assert "not_linear" not in diagnose(rope_enc, dim=D)


@pytest.mark.parametrize("head", [0, 1])
def test_alibi_slots_are_a_relative_score_bias_with_its_slope(head):
    """ALiBi appends slots: affine, yet every cross term depends on t - s only (beta(u) = -m u)."""
    enc = lp.alibi(D, num_heads=2)
    d = diagnose(enc.query, enc.key, dim=D, heads=2, head=head)
    assert d.names() == ["score_bias"] and d.relative
    m = float(lp.alibi_slopes(2)[head])
    assert f"m = {m:.6g}" in d.violations[0].message and "Jordan block" in d.violations[0].message
    assert d.classification.counts["nope"] == D  # the linear part is the identity


def test_an_added_bias_that_depends_on_absolute_time_breaks_relativity():
    """b(t).c(s) = t * s: affine like ALiBi's slots, but the bias is not a function of the lag."""

    def q_side(x, positions):
        t = positions.to(x.dtype)[:, None]  # (seq, 1)
        return torch.cat((x, t.expand(*x.shape[:-1], 1)), dim=-1)  # (..., seq, d) -> (..., seq, d + 1)

    d = diagnose(q_side, dim=D)
    assert "not_linear" in d and "score_bias" not in d and not d.relative


def test_quadratic_phase_is_not_translation_invariant():
    d = diagnose(quadratic_phase, dim=D)
    assert "not_translation_invariant" in d and not d.relative
    assert "per_channel_norm" not in d


def test_logit_temperature_is_named_and_keeps_relativity():
    d = diagnose(temperature, dim=D)
    assert d.names() == ["logit_temperature"]
    assert d.relative and math.isclose(d.temperature, 1.44, rel_tol=1e-9)
    assert sorted(b[1] for b in d.generator.blocks) == pytest.approx(sorted(FREQS.tolist()))


def test_hf_yarn_temperature_is_attention_factor_squared():
    pytest.importorskip("transformers")
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    enc, rotary = hf_encoder("llama", rope, head_dim=16)
    d = diagnose(enc, dim=16)
    assert "logit_temperature" in d and d.relative
    assert math.isclose(d.temperature, rotary.attention_scaling**2, rel_tol=1e-5)
    freqs = np.sort([abs(b[1]) for b in d.generator.blocks])
    assert np.allclose(freqs, np.sort(rotary.inv_freq.double().numpy()), rtol=1e-5)


def test_grape_rmsnorm_after_rotation():
    untied = diagnose(grape(W_UNTIED), dim=D)
    assert "per_channel_norm" in untied and "normalized" in untied and not untied.relative
    tied = diagnose(grape(W_TIED), dim=D)
    assert "per_channel_norm" not in tied and "not_translation_invariant" not in tied
    assert tied.relative
    assert sorted(b[1] for b in tied.generator.blocks) == pytest.approx(sorted(FREQS.tolist()))


def test_axes_that_do_not_commute():
    X1, X2 = skew(1), skew(2)
    d = diagnose(axes_encoder(X1, X2), dim=4, axes=2, lengths=(8, 32))
    assert "axes_do_not_commute" in d and not d.relative
    assert d.measures["commutator"] > 0.1
    # the generator of each axis is recovered
    assert np.allclose(d.axes[0].matrix, X1.numpy().T, atol=1e-6) or np.allclose(
        d.axes[0].matrix, -X1.numpy(), atol=1e-6)
    Y1 = torch.zeros(4, 4, dtype=torch.float64)
    Y1[0, 1], Y1[1, 0] = 1.0, -1.0
    Y2 = torch.zeros(4, 4, dtype=torch.float64)
    Y2[2, 3], Y2[3, 2] = 0.3, -0.3
    ok = diagnose(axes_encoder(Y1, Y2), dim=4, axes=2, lengths=(8, 32))
    assert "axes_do_not_commute" not in ok and ok.relative
    assert ok.measures["commutator"] < 1e-9


def test_dynamic_ntk_depends_on_sequence_length():
    pytest.importorskip("transformers")
    enc, _ = hf_encoder("llama", {"rope_type": "dynamic", "factor": 2.0}, head_dim=16,
                        max_position_embeddings=1024)
    d = diagnose(enc, dim=16, lengths=(32, 4096))
    assert "length_dependent" in d and not d.relative
    plain, _ = hf_encoder("llama", head_dim=16, max_position_embeddings=1024)
    assert "length_dependent" not in diagnose(plain, dim=16, lengths=(32, 4096))


def test_alternating_sign_is_a_discrete_group():
    d = diagnose(alternating, dim=4)
    assert d.domain == "integer"
    assert "discrete_group" in d and d.generator is None and d.relative
    assert np.allclose(np.diag(d.step), [-1, 1, 1, 1])
    assert "discrete group" in str(d)
    ok = diagnose(integer_rope, dim=D)
    assert ok.domain == "integer" and ok.violations == [] and ok.generator is not None
    assert sorted(b[1] for b in ok.generator.blocks) == pytest.approx(sorted(FREQS.tolist()))


def test_rounded_positions_are_not_continuous():
    d = diagnose(floored_rope, dim=D)
    assert d.names() == ["not_continuous"] and d.domain == "integer" and d.relative
    assert sorted(b[1] for b in d.generator.blocks) == pytest.approx(sorted(FREQS.tolist()))
    assert "not_continuous" not in diagnose(rope_enc, dim=D)


def test_relative_scores_without_a_group_break_the_group_law():
    d = diagnose(lifted_cosine, dim=D)
    assert "group_law" in d and "not_translation_invariant" not in d
    assert d.relative  # the scores do depend on t - s only; A(u) is just not exp(uX)
    assert "not a one-parameter group" in str(d)
    assert "group_law" not in diagnose(rope_enc, dim=D)


def test_report_lists_findings_with_sizes():
    text = str(diagnose(sinusoid_added, dim=D))
    assert "NOT RELATIVE" in text and "not_linear" in text and "size" in text


def test_cli_diagnoses_hf_yarn(capsys):
    pytest.importorskip("transformers")
    from liepos.cli import main

    rope = json.dumps({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048})
    assert main(["diagnose", "hf:llama", "--rope", rope, "--head-dim", "16"]) == 0
    out = capsys.readouterr().out
    assert "logit_temperature" in out and "RELATIVE" in out
    assert main(["diagnose", "hf:llama", "--rope", "{bad"]) == 2


def test_argument_errors():
    with pytest.raises(ValueError, match="dim"):
        diagnose(rope_enc)
    with pytest.raises(ValueError, match="domain"):
        diagnose(rope_enc, dim=D, domain="complex")
    with pytest.raises(ValueError, match="`tol`"):
        diagnose(rope_enc, dim=D, tol=0.0)
    with pytest.raises(TypeError, match="`dim`"):
        diagnose(rope_enc, dim=8.0)
    with pytest.raises(ValueError, match="`head`"):
        diagnose(rope_enc, dim=D, heads=2, head=2)


@pytest.mark.parametrize("bad,what", [(math.nan, "NaN"), (math.inf, "inf")])
def test_an_encoder_returning_nan_or_inf_is_a_named_error(bad, what):
    """Was "SVD did not converge" from deep inside numpy: now the probe, the side and what came back."""

    def broken(x, positions):
        y = rope_enc(x, positions).clone()
        y[..., positions >= 17, 0] = bad  # (batch, heads, seq, dim): wrong from position 17 on
        return y

    with pytest.raises(ProbeError, match=rf"the query encoder, asked by the linearity probe.*{what}.*positions \[17"):
        diagnose(broken, dim=D)
    with pytest.raises(ProbeError, match="the key encoder"):
        diagnose(rope_enc, broken, dim=D)
    assert issubclass(ProbeError, ValueError)


def test_an_encoder_returning_the_wrong_shape_is_a_named_error():
    with pytest.raises(ProbeError, match=r"must return a tensor \(batch, heads, seq, dim_out\).*got shape \(3, 5, 8\)"):
        diagnose(lambda x, p: x[:, 0], dim=D)
    with pytest.raises(ProbeError, match="real floating"):
        diagnose(lambda x, p: x.to(torch.complex128), dim=D)


def test_nan_only_past_the_short_length_skips_the_length_test_with_a_note():
    def overflowing(x, positions):
        y = rope_enc(x, positions).clone()
        y[..., positions >= 1000, :] = math.inf  # only the long sequence of the length test reaches it
        return y

    d = diagnose(overflowing, dim=D, lengths=(32, 2048))
    assert d.relative and d.violations == [] and "length" not in d.measures
    assert any("sequence-length test was skipped" in n and "inf" in n for n in d.notes)


def test_to_dict_is_json_and_matches_the_report():
    d = diagnose(temperature, dim=D)
    data = json.loads(json.dumps(d.to_dict()))
    assert data["relative"] and [v["name"] for v in data["violations"]] == d.names()
    assert data["temperature"] == pytest.approx(1.44)
    assert sorted(b[1] for b in data["blocks"]) == pytest.approx(sorted(FREQS.tolist()))


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_hf_families_come_from_transformers_own_table(family):
    pytest.importorskip("transformers")
    enc, rotary = hf_encoder(family, head_dim=16)
    assert type(rotary).__name__.lower() == f"{family}rotaryembedding"
    d = diagnose(enc, dim=16, lengths=(8, 64))
    assert d.relative and d.violations == []
    assert np.allclose(np.sort([abs(b[1]) for b in d.generator.blocks]), np.sort(rotary.inv_freq.double().numpy()),
                       rtol=1e-6)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(model="nosuch"), ValueError, "transformers model type"),
    (dict(model="bert"), ValueError, "BertRotaryEmbedding"),
    (dict(model=3), TypeError, "`model`"),
    (dict(head_dim=3), ValueError, "`head_dim` must be even"),
    (dict(rope={"rope_type": "bogus"}), ValueError, "'bogus'"),
    (dict(rope={"rope_type": "yarn"}), ValueError, "factor"),
    (dict(rope={"rope_type": "yarn", "factor": 4.0, "fator": 2.0}), ValueError, "fator"),
    (dict(rope=[1]), TypeError, "`rope`"),
])
def test_hf_encoder_refuses_what_upstream_would_run_on(kwargs, error, match):
    pytest.importorskip("transformers")
    with pytest.raises(error, match=match):
        hf_encoder(**kwargs)


def test_branch_handling_recovers_frequencies_beyond_pi():
    fast = torch.tensor([5.0, 12.0, 0.3, 0.01], dtype=torch.float64)  # 5 and 12 rad per step: beyond π

    def enc(x, positions):
        return rotate_half_layout(x, positions.to(torch.float64)[:, None] * fast)

    d = diagnose(enc, dim=8)
    assert d.violations == []
    assert sorted(abs(b[1]) for b in d.generator.blocks) == pytest.approx(sorted(fast.tolist()), rel=1e-9)


@pytest.mark.slow
def test_import_liepos_loads_none_of_the_heavy_dependencies_of_diagnose():
    code = ("import sys, liepos, liepos.diagnosis, liepos.cli; liepos.cli.build_parser(); "
            "print(sorted(m for m in ('transformers', 'scipy', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_hf_encoder_refuses_even_when_transformers_is_silenced_and_every_time():
    """The refusal reads transformers' validation warnings: not lost to set_verbosity_error, nor to warning_once."""
    transformers = pytest.importorskip("transformers")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with pytest.raises(ValueError, match="fator"):
            hf_encoder(rope={"rope_type": "yarn", "factor": 4.0, "fator": 2.0}, head_dim=16)
        mismatch = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}  # implicit 8
        for _ in range(2):
            with pytest.raises(ValueError, match="implicit factor"):
                hf_encoder(rope=mismatch, head_dim=16, max_position_embeddings=8192)
    finally:
        transformers.logging.set_verbosity(verbosity)
    hf_encoder(rope={"rope_type": "yarn", "factor": 4.0}, head_dim=16)  # a valid one still builds
