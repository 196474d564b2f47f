"""The coverage script's components: a sub-config type counted exact inside its parent only where it is true
of that component (its attention patched by liepos and run, or no position encoding of it at all)."""

from __future__ import annotations

import contextlib

import pytest

pytest.importorskip("transformers")

from test_hf_verify import coverage_script  # noqa: E402

pytestmark = [pytest.mark.upstream, pytest.mark.latest]


def _watched(cov, parent: str, component: str, patch: bool):
    """The parent built tiny, patched (or not), run once with the component's modules watched."""
    import torch
    from transformers import CONFIG_MAPPING

    from liepos.interop import patch_model

    model, _, inputs, _, _, _ = cov._reference(parent)
    if patch:
        patch_model(model)
    cls = CONFIG_MAPPING[component]
    ran: set[int] = set()
    handles = [m.register_forward_hook(lambda mod, *_: ran.add(id(mod))) for _, m in cov._component_modules(model, cls)]
    with torch.no_grad(), contextlib.ExitStack() as stack:
        stack.callback(lambda: [h.remove() for h in handles])
        model(**inputs)
    return model, cls, ran


def test_a_text_component_is_exact_in_its_parent_only_with_its_attention_patched():
    cov = coverage_script()
    model, cls, ran = _watched(cov, "mllama", "mllama_text_model", patch=True)
    ok, why = cov.in_parent(model, cls, ran)
    assert ok and "model.layers.0.self_attn" in why, why
    # the same parent unpatched: its attention keeps upstream's rope, so the component is not promoted
    model, cls, ran = _watched(cov, "mllama", "mllama_text_model", patch=False)
    ok, why = cov.in_parent(model, cls, ran)
    assert not ok and "stay upstream's" in why and "self_attn" in why, why


def test_a_component_whose_modules_did_not_run_is_not_promoted():
    cov = coverage_script()
    model, cls, _ = _watched(cov, "mllama", "mllama_text_model", patch=True)
    ok, why = cov.in_parent(model, cls, set())  # nothing of it ran
    assert not ok and "ran" in why, why


def test_the_coverage_rows_of_components():
    cov = coverage_script()
    row = cov.run_one("mllama_text_model")
    assert row["status"] == cov.IN_PARENT and row["rel"] <= cov.TOL and row["greedy"] is True, row
    assert "patched its attention" in row["reason"], row
    # T5Gemma 2's encoder text model keeps upstream's rope inside t5gemma2 (whose text config is the decoder's);
    # inside its other parent, the encoder alone, liepos patches it: exact there, and named so
    row = cov.run_one("t5gemma2_text")
    assert (row["status"], row["parent"]) == (cov.IN_PARENT, "t5gemma2_encoder"), row
    assert "text_model.layers.0.self_attn" in row["reason"], row
    model, cls, ran = _watched(cov, "t5gemma2", "t5gemma2_text", patch=True)
    ok, why = cov.in_parent(model, cls, ran)
    assert not ok and "encoder.text_model.layers.0.self_attn" in why, why
    # Dia's encoder inside Dia: its rotary module is not hooked by liepos (it records no positions for liepos), so
    # the parent does not show it; built alone with its modeling module's DiaEncoder it is measured itself
    model, cls, ran = _watched(cov, "dia", "dia_encoder", patch=True)
    ok, why = cov.in_parent(model, cls, ran)
    assert not ok and "encoder.rotary_emb" in why, why
    row = cov.run_one("dia_encoder")
    assert row["status"] == "exact" and "built with its modeling module's DiaEncoder" in row["reason"], row
    # a vision tower that the token-only forward never runs: still a component
    row = cov.run_one("idefics_vision")
    assert row["status"] == "component", row
    counts = {s: 0 for s in cov.STATUSES} | {"exact": 3, cov.IN_PARENT: 2}
    assert cov.summary(counts).startswith("5 exact (2 of them components exact in their parent)")
