"""The old home of :func:`from_hf` and :func:`patch_model`, kept importable (a plain re-export).

Reading configs is :mod:`liepos.interop.hf_config`; patching models is :mod:`liepos.interop.hf_model`.
"""

from liepos.interop.hf_config import PRECISIONS, ROPE_TYPES, from_hf, read_hf
from liepos.interop.hf_model import SUPPORTED_FAMILIES, patch_model, unpatch_model

__all__ = ["from_hf", "read_hf", "patch_model", "unpatch_model", "SUPPORTED_FAMILIES", "ROPE_TYPES", "PRECISIONS"]
