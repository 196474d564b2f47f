"""Drift of transformers against the family table, re-run on the newest release by scripts/check_latest.sh.

patch_model relies on facts of each modeling file (the attention class, the module-level rope
functions it calls, ``ALL_ATTENTION_FUNCTIONS``); a release that renames one of them would make
the patch fall back or fail. These tests say which fact moved, family by family, before a user
meets it; the parity itself is re-run by the ``latest`` tests of test_hf_families.py and
test_to_hf.py.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

transformers = pytest.importorskip("transformers")

from liepos.interop.families import FAMILIES  # noqa: E402
from liepos.interop.hf_config import ROPE_TYPES  # noqa: E402

pytestmark = [pytest.mark.upstream, pytest.mark.latest]
PATCHED = [f for f in FAMILIES.values() if f.attention]


@pytest.mark.parametrize("family", PATCHED, ids=lambda f: f.model_type)
def test_the_modeling_file_still_has_what_the_row_names(family):
    mod = importlib.import_module(family.modeling)
    for cls in family.attention:
        assert hasattr(mod, cls), f"{family.modeling} has no {cls}"
    if family.positions != "rope" or family.model_type == "falcon":
        return  # their own attention (ALiBi) or their own attention code (Falcon): no dispatcher
    source = inspect.getsource(getattr(mod, family.attention[0]).forward)
    for name in family.apply:
        assert hasattr(mod, name), f"{family.modeling} has no {name}"
        assert f"{name}(" in source, f"{family.attention[0]}.forward no longer calls {name}"
    if family.raw_keys:
        assert "ALL_ATTENTION_FUNCTIONS.get_interface" in source, "the attention interface lookup moved"


def test_every_rope_type_upstream_is_a_row():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(ROPE_INIT_FUNCTIONS) <= set(ROPE_TYPES), sorted(set(ROPE_INIT_FUNCTIONS) - set(ROPE_TYPES))
