"""Embeddings from an HTTP service: an OpenAI-compatible API or a local Ollama.

Two wire formats, one behaviour::

    openai   POST {url}/v1/embeddings  {"model", "input": [...]}  -> {"data": [{"index", "embedding"}]}
    ollama   POST {url}/api/embed      {"model", "input": [...]}  -> {"embeddings": [[...], ...]}

Texts go out in batches of ``batch_size``. Connection failures, timeouts, 429 and 5xx are retried
with exponential backoff (3 attempts in all; a ``Retry-After`` of up to 30 s is honoured); when
the service still fails, or answers with something that is not embeddings, the caller gets one
:class:`Unavailable` naming the url. The client is synchronous: ``embed`` runs in worker threads,
and ``httpx.Client`` is thread-safe.

The space is ``remote/{provider}/{model}/{dim}``. When ``dim`` is not configured it is learned from
the first response; reading ``dim`` or ``space`` before any call sends one probe request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np

from node.embedding.base import check_texts, l2_normalise
from node.errors import Unavailable

__all__ = ["PROVIDERS", "RemoteEmbedder"]

PROVIDERS = ("openai", "ollama")
ATTEMPTS = 3
MAX_RETRY_AFTER = 30.0  # seconds: a server asking for longer is treated as down
_PATHS = {"openai": "/v1/embeddings", "ollama": "/api/embed"}


def _is_retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _retry_after(response: httpx.Response) -> float:
    """The wait a 429/503 asks for in ``Retry-After`` (seconds form), capped; 0 if none."""
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(response.headers.get("retry-after", "0"))))
    except ValueError:  # the HTTP-date form: fall back to our own backoff
        return 0.0


class RemoteEmbedder:
    """Embeds through a remote service; thread-safe, one pooled HTTP client per instance."""

    def __init__(
        self,
        provider: str,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        timeout_seconds: float = 30.0,
        dim: int | None = None,
        backoff_interval: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"remote embedder provider must be one of {PROVIDERS}, got {provider!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"embedder url must start with http:// or https://, got {url!r}")
        if not model:
            raise ValueError(f"embedder provider {provider!r} needs a model name")
        if batch_size < 1 or timeout_seconds <= 0 or (dim is not None and dim < 1):
            raise ValueError("embedder batch_size, timeout_seconds and dim must be positive")
        base = url.rstrip("/")
        if provider == "openai" and base.endswith("/v1"):  # accept the usual "https://host/v1" spelling
            base = base[: -len("/v1")]
        self.provider = provider
        self.model = model
        self.endpoint = base + _PATHS[provider]
        self.batch_size = batch_size
        self._dim = dim
        self._dim_lock = threading.Lock()
        self._backoff_interval = backoff_interval
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_seconds, headers=headers, transport=transport)

    @property
    def dim(self) -> int:
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    @property
    def space(self) -> str:
        return f"remote/{self.provider}/{self.model}/{self.dim}"

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text; :class:`Unavailable` if the service fails."""
        texts = check_texts(texts)
        batches = [self._embed_batch(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        if not batches:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(batches)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        body = self._post({"model": self.model, "input": texts})
        try:
            if self.provider == "openai":
                rows = [item["embedding"] for item in sorted(body["data"], key=lambda item: item["index"])]
            else:
                rows = body["embeddings"]
            vectors = np.array(rows, dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            raise Unavailable(f"embedding service at {self.endpoint} sent an unexpected response") from None
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise Unavailable(
                f"embedding service at {self.endpoint} returned {len(vectors)} vectors for {len(texts)} texts"
            )
        with self._dim_lock:
            if self._dim is None:
                self._dim = vectors.shape[1]
        if vectors.shape[1] != self._dim:
            raise Unavailable(
                f"embedding service at {self.endpoint} returned {vectors.shape[1]}-dim vectors, expected {self._dim}"
            )
        return l2_normalise(vectors)

    def _post(self, payload: dict[str, Any]) -> Any:
        problem = ""
        asked_wait = 0.0
        for attempt in range(ATTEMPTS):
            if attempt:
                self._sleep(max(self._backoff_interval * 2 ** (attempt - 1), asked_wait))
            try:
                response = self._client.post(self.endpoint, json=payload)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
                asked_wait = 0.0
                continue
            if _is_retryable(response.status_code):
                problem = f"HTTP {response.status_code}"
                asked_wait = _retry_after(response)
                continue
            if response.status_code != 200:
                raise Unavailable(
                    f"embedding service at {self.endpoint} refused the request: "
                    f"HTTP {response.status_code} {response.text[:200]}"
                )
            try:
                return response.json()
            except ValueError:
                raise Unavailable(f"embedding service at {self.endpoint} sent a body that is not JSON") from None
        raise Unavailable(f"embedding service at {self.endpoint} is unavailable after {ATTEMPTS} attempts ({problem})")
