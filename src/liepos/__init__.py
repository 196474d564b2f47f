"""liepos: every relative positional encoding is a one-parameter group A(u) = exp(uX).

RoPE, xPos, RetNet, ALiBi, NoPE, decay, Jordan blocks, several position axes and every
context-extension trick are points of one space, chosen by one generator X. See the README for a
tour and ARCHITECTURE.md for the map of the package. ``import liepos`` loads nothing heavy: each public name loads
its module (torch and numpy) on first use, the Hugging Face bridge and the diagnosis likewise.

>>> import torch, liepos as lp
>>> enc = lp.rope(8)
>>> q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
>>> s = (enc.query(q, [7]) * enc.key(k, [3])).sum()
>>> bool(torch.allclose(s, (q[0, 0, 0] @ enc.generator.exp(4.0) @ k[0, 0, 0])))  # qᵀ A(t − s) k
True
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from liepos._version import __version__ as __version__  # the installed distribution's

# Every public name is loaded on first use, so that ``import liepos.cli`` (the command line's help)
# loads no torch; ``import liepos`` then ``lp.rope`` loads what the name needs. The table (name -> the
# module that defines it; None: the submodule of that name) is what runs; the imports below it are
# what type checkers and the API reference read, and tests/test_public_api.py holds the two equal.
_LAZY: dict[str, str | None] = {
    **dict.fromkeys(["Generator", "direct_sum"], "liepos.generator"),
    **dict.fromkeys(["Classification", "classify"], "liepos.classification"),
    "Encoding": "liepos.encoding",
    **dict.fromkeys(["nope", "decay", "rope", "xpos", "retnet", "alibi", "jordan", "growth", "axial_rope",
                     "rope_mixed", "mrope", "decay_axial_rope", "CATALOGUE", "build", "alibi_slopes", "rope_freqs",
                     "p_rope", "rope_id", "cope_clipped", "string_google", "mrope_interleaved", "rope_directions",
                     "mhrope"],
                    "liepos.catalogue"),
    "Mapped": "liepos.coordinates",
    **dict.fromkeys(["attention", "attention_reference", "KVCache"], "liepos.attend"),
    **dict.fromkeys(["ScalableSoftmax", "Llama4Temperature"], "liepos.temperature"),
    **dict.fromkeys(["Schedule", "LayerSpec", "build_schedule"], "liepos.schedule"),
    "PerRequest": "liepos.per_request",
    **dict.fromkeys(["Clock", "LearnableGenerator", "LearnableEncoding"], "liepos.nn"),
    "scaling": None,
    # the ecosystem and the analysis (transformers, the diagnosis' probes)
    "from_hf": "liepos.interop", "to_hf": "liepos.interop", "interop": None,
    **dict.fromkeys(["diagnose", "Diagnosis"], "liepos.diagnosis"),
}

if TYPE_CHECKING:
    # the algebra
    from liepos.generator import Generator as Generator
    from liepos.generator import direct_sum as direct_sum
    from liepos.classification import Classification as Classification
    from liepos.classification import classify as classify

    # the catalogue
    from liepos.encoding import Encoding as Encoding
    from liepos.catalogue import nope as nope
    from liepos.catalogue import decay as decay
    from liepos.catalogue import rope as rope
    from liepos.catalogue import xpos as xpos
    from liepos.catalogue import retnet as retnet
    from liepos.catalogue import alibi as alibi
    from liepos.catalogue import jordan as jordan
    from liepos.catalogue import growth as growth
    from liepos.catalogue import axial_rope as axial_rope
    from liepos.catalogue import rope_mixed as rope_mixed
    from liepos.catalogue import mrope as mrope
    from liepos.catalogue import decay_axial_rope as decay_axial_rope
    from liepos.catalogue import CATALOGUE as CATALOGUE
    from liepos.catalogue import build as build
    from liepos.catalogue import alibi_slopes as alibi_slopes
    from liepos.catalogue import rope_freqs as rope_freqs
    from liepos.catalogue import p_rope as p_rope
    from liepos.catalogue import rope_id as rope_id
    from liepos.catalogue import cope_clipped as cope_clipped
    from liepos.catalogue import string_google as string_google
    from liepos.catalogue import mrope_interleaved as mrope_interleaved
    from liepos.catalogue import rope_directions as rope_directions
    from liepos.catalogue import mhrope as mhrope
    from liepos.coordinates import Mapped as Mapped

    # attention
    from liepos.attend import attention as attention
    from liepos.attend import attention_reference as attention_reference
    from liepos.attend import KVCache as KVCache
    from liepos.temperature import ScalableSoftmax as ScalableSoftmax
    from liepos.temperature import Llama4Temperature as Llama4Temperature
    from liepos.schedule import Schedule as Schedule
    from liepos.schedule import LayerSpec as LayerSpec
    from liepos.schedule import build_schedule as build_schedule
    from liepos.per_request import PerRequest as PerRequest

    # learned time and generators
    from liepos.nn import Clock as Clock
    from liepos.nn import LearnableGenerator as LearnableGenerator
    from liepos.nn import LearnableEncoding as LearnableEncoding

    # context extension
    from liepos import scaling as scaling

def _register_ops() -> None:
    """Register liepos' torch ops (``torch.ops.liepos.*``) once torch is loaded: a program saved by
    ``torch.export`` then loads after a bare ``import liepos``, and every encoding compiles."""
    if "torch" in sys.modules and "liepos.attend" not in sys.modules and not _registering:
        _registering.append(True)
        try:
            importlib.import_module("liepos.attend")  # the ops, and the eager call the attention op runs
        finally:
            _registering.clear()


_registering: list[bool] = []


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'liepos' has no attribute {name!r}")
    where = _LAZY[name]
    value = importlib.import_module(f"liepos.{name}") if where is None else getattr(importlib.import_module(where), name)
    globals()[name] = value
    _register_ops()
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_register_ops()  # torch already loaded (``import torch, liepos``): the ops now; otherwise on first use


__all__ = [
    # the algebra
    "Generator", "direct_sum", "classify", "Classification",
    # the catalogue
    "Encoding", "nope", "decay", "rope", "xpos", "retnet", "alibi", "jordan", "growth",
    "axial_rope", "rope_mixed", "mrope", "decay_axial_rope", "CATALOGUE", "build", "alibi_slopes", "rope_freqs",
    "p_rope", "rope_id", "cope_clipped", "string_google", "mrope_interleaved", "rope_directions", "mhrope",
    "Mapped",
    # attention
    "attention", "attention_reference", "KVCache",
    "ScalableSoftmax", "Llama4Temperature", "Schedule", "LayerSpec", "build_schedule", "PerRequest",
    # learned time and generators
    "Clock", "LearnableGenerator", "LearnableEncoding",
    # the ecosystem
    "from_hf", "to_hf", "interop", "scaling",
    # the analysis
    "diagnose", "Diagnosis",
    "__version__",
]
