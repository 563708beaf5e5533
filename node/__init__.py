"""The Hyphae node core: cells, storage, indexes, embedder, energy, and the one facade."""

import os as _os

# One BLAS thread per operation: a node runs many small matrix products from several
# worker threads at once, and multi-threaded BLAS on top of that thrashes the cores
# (measured: 15 ms vs 23-66 ms per embedded text on 2 busy cores). Set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

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
