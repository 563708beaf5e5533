"""Text embeddings: the :class:`Embedder` interface and :func:`load_embedder`, which picks one.

Providers, chosen by the ``[embedder]`` table of config.toml::

    builtin  all-MiniLM-L6-v2 in numpy (minilm.py); the default, offline, needs the weights package
    hashed   hashed word and character n-grams (hashed.py); no model, no meaning, always available
    openai   an OpenAI-compatible /v1/embeddings service (remote.py)
    ollama   an Ollama /api/embed service (remote.py)

When the builtin weights are not installed, ``load_embedder`` still returns an embedder (the hashed
one, in its own space) so a fresh node starts, and logs a WARNING saying how to install them.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node.embedding import minilm
from node.embedding.base import Embedder
from node.embedding.hashed import HashedEmbedder
from node.embedding.minilm import INSTALL_HINT, MiniLMEmbedder, builtin_weights_status
from node.embedding.remote import PROVIDERS as REMOTE_PROVIDERS
from node.embedding.remote import RemoteEmbedder

__all__ = [
    "Embedder",
    "HashedEmbedder",
    "MiniLMEmbedder",
    "RemoteEmbedder",
    "builtin_weights_status",
    "load_embedder",
]

logger = logging.getLogger("hyphae.embedding")

_SETTINGS = {
    "provider": str,
    "url": str,
    "model": str,
    "api_key_env": str,
    "batch_size": int,
    "timeout_seconds": (int, float),
    "dim": int,
}


def load_embedder(settings: Mapping[str, Any] | None = None) -> Embedder:
    """The embedder the ``[embedder]`` settings ask for; ValueError if they are wrong."""
    settings = dict(settings or {})
    for key, value in settings.items():
        expected = _SETTINGS.get(key)
        if expected is None:
            raise ValueError(f"unknown [embedder] setting {key!r}; known settings: {', '.join(_SETTINGS)}")
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"[embedder] {key} has the wrong type: {value!r}")
    provider = settings.get("provider", "builtin")
    if provider == "builtin":
        return _builtin_or_fallback()
    if provider == "hashed":
        return HashedEmbedder()
    if provider in REMOTE_PROVIDERS:
        return _remote(provider, settings)
    raise ValueError(f"unknown [embedder] provider {provider!r}; use builtin, hashed, {' or '.join(REMOTE_PROVIDERS)}")


def _builtin_or_fallback() -> Embedder:
    directory = minilm.locate_builtin_weights()
    if directory is None:
        fallback = HashedEmbedder()
        logger.warning(
            "all-MiniLM-L6-v2 weights are not installed, so embeddings fall back to %s, which matches "
            "wording but not meaning and cannot be compared with vectors from other nodes. "
            "Install the weights with: %s",
            fallback.space,
            INSTALL_HINT,
        )
        return fallback
    return _load_minilm(directory)


@functools.lru_cache(maxsize=None)
def _load_minilm(directory: Path) -> MiniLMEmbedder:
    # ~90 MB of read-only weights: one copy per process, however many nodes it runs.
    return MiniLMEmbedder.from_directory(directory)


def _remote(provider: str, settings: Mapping[str, Any]) -> RemoteEmbedder:
    for key in ("url", "model"):
        if not settings.get(key):
            raise ValueError(f"[embedder] provider {provider!r} needs {key!r}")
    api_key = None
    if "api_key_env" in settings:
        api_key = os.environ.get(settings["api_key_env"])
        if not api_key:
            raise ValueError(f"[embedder] api_key_env names {settings['api_key_env']!r}, which is not set")
    return RemoteEmbedder(
        provider,
        settings["url"],
        settings["model"],
        api_key=api_key,
        batch_size=settings.get("batch_size", 64),
        timeout_seconds=float(settings.get("timeout_seconds", 30.0)),
        dim=settings.get("dim"),
    )
