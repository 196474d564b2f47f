"""Moved to :mod:`liepos.nn`; a re-export for old imports."""

from liepos.nn import Clock as Clock

__all__ = ["Clock"]
