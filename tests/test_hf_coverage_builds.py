"""Rows of the coverage script that a correct tiny config builds: each exact against its own unpatched model,
or refused by patch_model with its reason (never a build error)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from test_hf_verify import coverage_script  # noqa: E402

pytestmark = [pytest.mark.upstream, pytest.mark.latest]


@pytest.mark.parametrize("model_type, model_class", [
    ("qwen2_5_omni", "Qwen2_5OmniThinkerForConditionalGeneration"),  # the thinker of a top config no class runs
    ("qwen3_omni_moe", "Qwen3OmniMoeThinkerForConditionalGeneration"),
    ("t5gemma2_encoder", "T5Gemma2Encoder"),  # the dropout_rate its parent hands its text config
    ("voxtral_realtime_text", "VoxtralRealtimeTextModel"),  # a class the package does not export, with t_cond
    ("evolla", "EvollaModel"),  # a config class AutoModel does not recognise
    ("granite4_vision", "Granite4VisionModel"),  # a deepstack map for the shrunk depths
])
def test_rows_that_a_correct_tiny_config_builds_are_exact(model_type, model_class):
    cov = coverage_script()
    row = cov.run_one(model_type)
    assert (row["status"], row["class"]) == ("exact", model_class), row
    assert row["rel"] <= cov.TOL and row["greedy"] is not False, row


@pytest.mark.slow
@pytest.mark.parametrize("model_type, why", [
    ("dots3_note", "model_type 'dots3_note_text' is not a family"),  # per-layer expert counts shrunk
    ("esmfold2", "carries no rope parameters"),  # a head wide enough for its 3-D rope pairs
])
def test_rows_that_build_and_are_refused(model_type, why):
    cov = coverage_script()
    row = cov.run_one(model_type)
    assert row["status"] == "refused" and why in row["reason"], row
