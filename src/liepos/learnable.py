"""Moved to :mod:`liepos.nn`; a re-export for old imports."""

from liepos.nn import LearnableEncoding as LearnableEncoding
from liepos.nn import LearnableGenerator as LearnableGenerator

__all__ = ["LearnableEncoding", "LearnableGenerator"]
