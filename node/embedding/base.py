"""What every embedder promises, and the two chores they all share.

The node only ever talks to an :class:`Embedder`: a batch of texts in, a float32 matrix of unit rows
out, plus ``space``, a fingerprint of everything that decides where a text lands (model, precision,
weights, implementation). Vectors are only comparable within one space, so the index stores the
fingerprint next to them and re-embeds when it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from node.errors import InvalidArgument

__all__ = ["Embedder", "check_texts", "l2_normalise"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors; ``embed`` must be safe to call from several threads at once."""

    dim: int
    space: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list, or :class:`InvalidArgument` if they are not a sequence of strings."""
    # A bare string is a sequence of one-character strings: almost always a caller's slip.
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise InvalidArgument("texts must be a sequence of strings, not a single value", field="texts")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidArgument(f"texts[{i}] is {type(text).__name__}, not str", field="texts")
    return list(texts)


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32; all-zero rows stay zero instead of becoming NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
