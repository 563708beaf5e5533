"""A model-free embedder: word unigrams and character trigrams hashed into 384 signed buckets.

It exists so that a node without the MiniLM weights still starts, stores and finds exact or
near-exact wording. It knows nothing of meaning (paraphrases rarely match: see
benchmarks/results/embedding.md), so it lives in its own embedding space and the loader warns loudly
whenever it stands in for the builtin model.

Each feature is hashed with blake2b (stable across processes and machines, unlike ``hash()``); one
bit of the digest picks the sign, so unrelated features cancel out on average instead of piling up.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

import numpy as np

from node.embedding.base import check_texts, l2_normalise

__all__ = ["HashedEmbedder"]

_WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=65536)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    value = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return (value >> 1) % dim, (1.0 if value & 1 else -1.0)


def _features(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    features = [f"w:{word}" for word in words]
    for word in words:
        padded = f"<{word}>"  # so prefixes and suffixes are trigrams of their own
        features.extend(f"c:{padded[i:i + 3]}" for i in range(len(padded) - 2))
    return features or ["empty"]  # one fixed direction, so even "" gets a unit vector


class HashedEmbedder:
    """Deterministic bag-of-n-grams vectors; stateless, so trivially thread-safe."""

    def __init__(self, dim: int = 384) -> None:
        if dim < 1:
            raise ValueError(f"hashed embedder dim must be positive, got {dim}")
        self.dim = dim
        self.space = f"hashed-ngrams/{dim}/v1"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text."""
        texts = check_texts(texts)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature in _features(text):
                column, sign = _bucket(feature, self.dim)
                vectors[row, column] += sign
        return l2_normalise(vectors)
