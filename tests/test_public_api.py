"""The public surface is pinned: every curated name resolves from ``import liepos as lp`` and has a
docstring, ``__all__`` lists exactly the curated names in their order (algebra, catalogue,
attention, learned, ecosystem, analysis), and the old import paths of moved names still work."""

from __future__ import annotations

import importlib
import types

import pytest

import liepos as lp

# the public API, in its order
PUBLIC = [
    "Generator", "direct_sum", "classify", "Classification",
    "Encoding", "nope", "decay", "rope", "xpos", "retnet", "alibi", "jordan", "growth",
    "axial_rope", "rope_mixed", "mrope", "decay_axial_rope", "CATALOGUE", "build", "alibi_slopes", "rope_freqs",
    "p_rope", "rope_id", "cope_clipped", "string_google", "mrope_interleaved", "rope_directions", "mhrope",
    "Mapped",
    "attention", "attention_reference", "KVCache",
    "ScalableSoftmax", "Llama4Temperature", "Schedule", "LayerSpec", "build_schedule", "PerRequest",
    "Clock", "LearnableGenerator", "LearnableEncoding",
    "from_hf", "to_hf", "interop", "scaling",
    "diagnose", "Diagnosis",
]
SCALING_MAPS = ["linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional", "clipped", "factors"]


def test_all_is_the_curated_list_in_design_order():
    assert lp.__all__ == [*PUBLIC, "__version__"]


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_design_name_resolves_and_is_documented(name):
    obj = getattr(lp, name)
    doc = getattr(obj, "__doc__", None) if not isinstance(obj, dict) else "a registry"
    assert doc and doc.strip(), f"lp.{name} has no docstring"


def test_the_hugging_face_names_are_lazy():
    """`from_hf` / `to_hf` resolve through liepos.interop on first use (import liepos loads no transformers)."""
    for name in ("from_hf", "to_hf"):
        assert lp._LAZY[name] == "liepos.interop" and getattr(lp, name) is getattr(lp.interop, name)


@pytest.mark.parametrize("name", SCALING_MAPS)
def test_every_scaling_map_is_public_and_documented(name):
    fn = getattr(lp.scaling, name)
    assert fn is lp.scaling.SCALINGS[name] and fn.__doc__ and ">>>" in fn.__doc__


def test_design_methods_exist():
    g = lp.rope(8).generator
    for attr in ("matrix", "exp", "dim", "from_matrix", "from_matrices", "along", "axis"):
        assert hasattr(g, attr), attr
    enc = lp.rope(8)
    for attr in ("generator", "query", "key", "tables", "at_length", "num_axes", "num_heads"):
        assert hasattr(enc, attr), attr
    assert lp.diagnose.__name__ == "diagnose" and callable(lp.diagnose)


@pytest.mark.parametrize("name, module", [("diagnose", "liepos.diagnosis"), ("classify", "liepos.classification"),
                                          ("attention", "liepos.attend")])
def test_a_function_stays_the_function_after_its_module_is_imported(name, module):
    """The modules are named apart from the functions they define, so the package is a plain module (no
    class of its own) and importing a module never replaces a facade name."""
    importlib.import_module(module)
    assert type(lp) is types.ModuleType
    fn = getattr(lp, name)
    assert callable(fn) and fn.__name__ == name and fn is getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("old, name", [
    ("liepos.encoding", "as_positions"), ("liepos.apply", "apply_tables"), ("liepos.apply", "apply_in_basis"),
    ("liepos.tables", "Tables"), ("liepos.tables", "Plan"), ("liepos.tables", "make_plan"),
    ("liepos.tables", "build_tables"), ("liepos.tables", "reduced_angle"),
    ("liepos.catalogue", "rope_freqs"), ("liepos.catalogue", "alibi_slopes"),
    ("liepos.catalogue", "default_decay_rates"),
])
def test_old_import_paths_still_work(old, name):
    assert getattr(importlib.import_module(old), name) is not None


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'AxesEncoding'"):
        lp.AxesEncoding  # noqa: B018 - the parallel copy is gone
