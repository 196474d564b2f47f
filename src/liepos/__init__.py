"""liepos: every relative positional encoding is a one-parameter group A(u) = exp(uX).

RoPE, xPos, RetNet, ALiBi, NoPE, decay, Jordan blocks, several position axes and every
context-extension trick are points of one space, chosen by one generator X. See the README for a
tour and ARCHITECTURE.md for the map of the package. ``import liepos`` loads torch and numpy only:
the Hugging Face bridge and the diagnosis load on first use.

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
import types
from typing import Any

# the algebra
from liepos.generator import Generator as Generator
from liepos.generator import direct_sum as direct_sum
from liepos.classify import Classification as Classification
from liepos.classify import classify as classify

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
from liepos.catalogue import p_rope as p_rope
from liepos.catalogue import rope_id as rope_id
from liepos.catalogue import cope_clipped as cope_clipped
from liepos.catalogue import string_google as string_google
from liepos.catalogue import mrope_interleaved as mrope_interleaved
from liepos.catalogue import rope_directions as rope_directions
from liepos.catalogue import mhrope as mhrope
from liepos.coordinates import Mapped as Mapped
from liepos.catalogue import CATALOGUE as CATALOGUE
from liepos.catalogue import build as build
from liepos.catalogue import alibi_slopes as alibi_slopes
from liepos.catalogue import rope_freqs as rope_freqs

# attention
from liepos.attention import attention as attention
from liepos.attention import attention_reference as attention_reference
from liepos.attention import KVCache as KVCache
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

def _version() -> str:
    """The installed distribution's version (pyproject.toml is its one source); a bare source tree says so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liepos")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

# the ecosystem and the analysis, loaded on first use (transformers, the diagnosis' probes)
_LAZY = {"from_hf": "liepos.interop", "to_hf": "liepos.interop", "interop": None, "Diagnosis": "liepos.diagnose"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'liepos' has no attribute {name!r}")
    where = _LAZY[name]
    value = importlib.import_module(f"liepos.{name}") if where is None else getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"diagnose"})


class _Package(types.ModuleType):
    """``liepos.diagnose`` names both a submodule and its function: the attribute is always the function.

    (Importing the submodule makes the import system set the package attribute to the module; this
    property keeps ``lp.diagnose(...)`` callable whatever was imported first.)
    """

    @property
    def diagnose(self) -> Any:
        return importlib.import_module("liepos.diagnose").diagnose

    @diagnose.setter
    def diagnose(self, module: Any) -> None:  # the import system recording the submodule: the function wins
        pass


sys.modules[__name__].__class__ = _Package


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
