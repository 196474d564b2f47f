"""Vision towers whose rotary module reads one (h, w) pair per patch, patched with liepos' 2-axis rotation:
exact against the unpatched tower built tiny from its own config, refused where the probe or proof fails."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf_verify import coverage_script  # noqa: E402

from liepos.interop import patch_model, unpatch_model  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.upstream, pytest.mark.latest]


def _tower(model_type: str):
    """A tiny tower of ``model_type`` and the first inputs its unpatched forward runs on."""
    cov = coverage_script()
    model, _, inputs, want, _, _ = cov._reference(model_type)
    return cov, model, inputs, want


def _run(cov, model, inputs):
    with torch.no_grad():
        return cov._output(model(**inputs)).float()


@pytest.mark.parametrize("model_type", ["qwen2_5_vl_vision", "qwen3_vl_vision", "glm4v_vision"])
def test_a_patch_tower_is_exact_and_runs_on_liepos(model_type):
    cov, model, inputs, want = _tower(model_type)
    patch_model(model)
    attention = [m for m in model.modules() if "_liepos_vision" in m.__dict__ and m._liepos_vision is not None]
    assert attention, "no attention module of the tower was patched"
    got = _run(cov, model, inputs)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5
    # the rotation is liepos': the same encoding with its two axes swapped gives another output
    enc, batched = attention[0]._liepos_vision
    g = enc.generator
    swapped = enc.replace(generator=type(g)(g.rates.flip(0), g.freqs.flip(0), g.sizes, complex=g.complex, axes=2))
    for m in attention:
        m._liepos_vision = (swapped, batched)
    assert float((_run(cov, model, inputs) - want).abs().max() / want.abs().max()) > 1e-3
    unpatch_model(model)
    assert not any("_liepos_vision" in m.__dict__ for m in model.modules())
    assert torch.equal(_run(cov, model, inputs), want)


def test_the_probe_reads_qwen_s_axes_and_frequencies():
    """Qwen2.5-VL's rotary module: h on the first quarter of the planes' frequencies, w on the next, each
    ``theta^(-4k/d)``, rotate_half pairs (k, k + d/2)."""
    _, model, _, _ = _tower("qwen2_5_vl_vision")
    patch_model(model)
    enc, _ = next(m._liepos_vision for m in model.modules() if getattr(m, "_liepos_vision", None) is not None)
    d = enc.content_dim
    freqs = enc.generator.freqs  # (2, d/2)
    rotary = next(m for m in model.modules() if type(m).__name__.endswith("VisionRotaryEmbedding"))
    inv = rotary.inv_freq.to(torch.float64)  # (d/4,)
    assert enc.layout == "half" and freqs.shape == (2, d // 2)
    assert torch.equal(freqs[0], torch.cat((inv, torch.zeros_like(inv))))
    assert torch.equal(freqs[1], torch.cat((torch.zeros_like(inv), inv)))
    unpatch_model(model)


def test_a_tower_whose_apply_scales_is_refused(monkeypatch):
    _, model, _, _ = _tower("qwen2_5_vl_vision")
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    upstream = modeling.apply_rotary_pos_emb_vision
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb_vision",
                        lambda q, k, cos, sin: tuple(1.01 * x for x in upstream(q, k, cos, sin)))
    with pytest.raises(ValueError, match="scales by 1.01.*liepos refuses"):
        patch_model(model)
    assert not any("_liepos_vision" in m.__dict__ for m in model.modules())


def test_a_tower_whose_rope_is_not_its_inv_freq_is_refused(monkeypatch):
    """An apply that turns by other angles than the rotary module's frequencies (here: twice them) is refused."""
    _, model, _, _ = _tower("qwen2_5_vl_vision")
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    upstream = modeling.apply_rotary_pos_emb_vision

    def doubled(q, k, cos, sin):  # cos 2x, sin 2x of the same angles
        return upstream(q, k, cos * cos - sin * sin, 2 * sin * cos)

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb_vision", doubled)
    with pytest.raises(ValueError, match="none of the rotary module's inv_freq|scores differ"):
        patch_model(model)
