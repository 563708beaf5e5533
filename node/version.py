"""The installed package's version, as every surface and the CLI report it."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


@lru_cache(maxsize=1)
def package_version() -> str:
    """``hyphae``'s version, or ``0+unknown`` when run from a tree that was never installed."""
    try:
        return version("hyphae")
    except PackageNotFoundError:
        return "0+unknown"
