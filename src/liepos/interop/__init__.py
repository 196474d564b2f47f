"""Interoperability: Hugging Face transformers configs (:func:`liepos.interop.hf.from_hf`)."""

from __future__ import annotations

from typing import Any

__all__ = ["from_hf"]


def __getattr__(name: str) -> Any:
    # lazy, so that importing liepos never imports the interop modules
    if name == "from_hf":
        from liepos.interop.hf import from_hf

        return from_hf
    raise AttributeError(f"module 'liepos.interop' has no attribute {name!r}")
