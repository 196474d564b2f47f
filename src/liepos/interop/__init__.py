"""Interoperability: Hugging Face transformers configs and models, q/k weight layouts.

* :func:`from_hf` — the encoding a transformers config describes (:func:`read_hf`: every fact apart);
* :func:`to_hf` — back: the ``rope_parameters`` that make transformers compute an encoding;
* :func:`patch_model` / :func:`unpatch_model` — run a transformers model of the family table on liepos;
* :func:`permute_qk_weights` / :func:`layout_permutation` — layouts as a change of basis.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_hf", "to_hf", "read_hf", "patch_model", "unpatch_model", "permute_qk_weights", "layout_permutation"]

_WHERE = {
    "from_hf": "liepos.interop.hf_config",
    "read_hf": "liepos.interop.hf_config",
    "to_hf": "liepos.interop.hf_export",
    "patch_model": "liepos.interop.hf_model",
    "unpatch_model": "liepos.interop.hf_model",
    "permute_qk_weights": "liepos.interop.layouts",
    "layout_permutation": "liepos.interop.layouts",
}


def __getattr__(name: str) -> Any:
    # lazy, so that importing liepos never imports the interop modules
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'liepos.interop' has no attribute {name!r}")
