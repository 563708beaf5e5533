"""The Hyphae node core: cells, storage, indexes, embedder, energy, and the one facade."""

from .errors import (
    ConfigError,
    Conflict,
    Forbidden,
    HyphaeError,
    InvalidArgument,
    NotFound,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from .principals import Principal

__all__ = [
    "HyphaeError",
    "InvalidArgument",
    "TooLarge",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "Unavailable",
    "ConfigError",
    "Principal",
]
