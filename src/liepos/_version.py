"""``__version__``: the installed distribution's version, read from its metadata (pyproject.toml is its
one source); a source tree that was never installed says ``0+unknown``. Its own module, so that the
package's modules read the version without importing the facade."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]


def _installed() -> str:
    try:
        return version("liepos")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _installed()
