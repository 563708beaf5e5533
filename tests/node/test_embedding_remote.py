"""The remote embedder against a scripted fake service (httpx.MockTransport), then once for real
against a small HTTP server on 127.0.0.1, and once against a port where nothing listens."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import numpy as np
import pytest

from node.embedding import RemoteEmbedder, load_embedder
from node.errors import Unavailable

from .helpers import http_server, reply_json

URL = "http://embeddings.test"


def fake_vector(text: str, dim: int = 4) -> list[float]:
    """A deterministic, deliberately un-normalised vector for a text."""
    return [float(len(text) + 1), 2.0, float(sum(map(ord, text)) % 7), 1.0][:dim]


def openai_reply(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    data = [{"object": "embedding", "index": i, "embedding": fake_vector(t)} for i, t in enumerate(body["input"])]
    return httpx.Response(200, json={"object": "list", "data": data[::-1], "model": body["model"]})


def ollama_reply(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={"model": body["model"], "embeddings": [fake_vector(t) for t in body["input"]]})


class Script:
    """A fake service that answers from a list of canned outcomes, then with ``reply``, and records requests."""

    def __init__(self, reply: Callable[[httpx.Request], httpx.Response], outcomes: list[object] = ()) -> None:
        self.reply = reply
        self.outcomes = list(outcomes)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return httpx.Response(outcome)  # type: ignore[arg-type]
        return self.reply(request)

    def embedder(self, provider: str = "openai", **kwargs: object) -> RemoteEmbedder:
        return RemoteEmbedder(
            provider, URL, "test-model", transport=httpx.MockTransport(self), sleep=self.sleeps.append, **kwargs
        )


def expected(texts: list[str]) -> np.ndarray:
    vectors = np.array([fake_vector(t) for t in texts], dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_openai_format_round_trip() -> None:
    service = Script(openai_reply)
    embedder = service.embedder(api_key="sk-test")
    vectors = embedder.embed(["alpha", "beta", "gamma"])
    np.testing.assert_allclose(vectors, expected(["alpha", "beta", "gamma"]), rtol=1e-6)  # reordered by index
    [request] = service.requests
    assert request.method == "POST" and str(request.url) == f"{URL}/v1/embeddings"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert json.loads(request.content) == {"model": "test-model", "input": ["alpha", "beta", "gamma"]}
    assert embedder.space == "remote/openai/test-model/4" and embedder.dim == 4


def test_openai_url_may_already_end_in_v1() -> None:
    embedder = RemoteEmbedder("openai", "https://api.example.com/v1/", "m")
    assert embedder.endpoint == "https://api.example.com/v1/embeddings"


def test_ollama_format_round_trip() -> None:
    service = Script(ollama_reply)
    vectors = service.embedder("ollama").embed(["one", "two"])
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected(["one", "two"]), rtol=1e-6)
    assert str(service.requests[0].url) == f"{URL}/api/embed"
    assert "authorization" not in service.requests[0].headers


def test_texts_go_out_in_batches() -> None:
    service = Script(openai_reply)
    texts = [f"text {i}" for i in range(5)]
    vectors = service.embedder(batch_size=2).embed(texts)
    assert [len(json.loads(r.content)["input"]) for r in service.requests] == [2, 2, 1]
    np.testing.assert_allclose(vectors, expected(texts), rtol=1e-6)


def test_transient_failures_are_retried_with_backoff() -> None:
    service = Script(openai_reply, [503, httpx.ConnectError("refused")])
    vectors = service.embedder().embed(["survives"])
    assert len(service.requests) == 3
    assert service.sleeps == [0.5, 1.0]
    np.testing.assert_allclose(vectors, expected(["survives"]), rtol=1e-6)


def test_rate_limit_is_retried() -> None:
    service = Script(ollama_reply, [429])
    service.embedder("ollama").embed(["x"])
    assert len(service.requests) == 2


def test_persistent_failure_is_unavailable_naming_the_url() -> None:
    service = Script(openai_reply, [500, 502, 503])
    with pytest.raises(Unavailable, match=f"{URL}/v1/embeddings.*3 attempts.*HTTP 503"):
        service.embedder().embed(["x"])
    assert len(service.requests) == 3


def test_client_errors_are_not_retried() -> None:
    service = Script(openai_reply, [401])
    with pytest.raises(Unavailable, match="HTTP 401"):
        service.embedder().embed(["x"])
    assert len(service.requests) == 1


@pytest.mark.parametrize(
    "body", [{"unexpected": True}, {"data": [{"index": 0}]}, {"data": []}, {"data": [{"index": 0, "embedding": "no"}]}]
)
def test_malformed_replies_are_unavailable(body: dict) -> None:
    service = Script(lambda request: httpx.Response(200, json=body))
    with pytest.raises(Unavailable, match=URL):
        service.embedder().embed(["x"])


def test_dim_is_learned_by_probe_and_then_enforced() -> None:
    service = Script(openai_reply)
    embedder = service.embedder()
    assert embedder.dim == 4  # one probe request
    assert len(service.requests) == 1
    assert embedder.embed([]).shape == (0, 4)
    assert len(service.requests) == 1
    service.reply = lambda request: httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0, 0.0]}]})
    with pytest.raises(Unavailable, match="2-dim vectors, expected 4"):
        embedder.embed(["x"])


def test_configured_dim_needs_no_probe() -> None:
    service = Script(openai_reply)
    embedder = service.embedder(dim=4)
    assert embedder.space == "remote/openai/test-model/4"
    assert service.requests == []


def test_load_embedder_builds_a_remote_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPHAE_TEST_EMBED_KEY", "sk-from-env")
    embedder = load_embedder(
        {
            "provider": "openai",
            "url": "http://127.0.0.1:9",
            "model": "text-embedding-3-small",
            "api_key_env": "HYPHAE_TEST_EMBED_KEY",
            "batch_size": 16,
            "timeout_seconds": 5,
            "dim": 1536,
        }
    )
    assert isinstance(embedder, RemoteEmbedder)
    assert embedder.batch_size == 16
    assert embedder.space == "remote/openai/text-embedding-3-small/1536"


# --- over a real socket ----------------------------------------------------------------------------


class OllamaHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/api/embed":
            self.send_error(404)
            return
        reply_json(self, {"model": body["model"], "embeddings": [fake_vector(t) for t in body["input"]]})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def ollama_server() -> Iterator[str]:
    with http_server(OllamaHandler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


def test_real_http_round_trip(ollama_server: str) -> None:
    embedder = load_embedder(
        {"provider": "ollama", "url": ollama_server, "model": "nomic-embed-text", "batch_size": 2, "timeout_seconds": 5}
    )
    texts = ["first", "second", "third"]
    np.testing.assert_allclose(embedder.embed(texts), expected(texts), rtol=1e-6)
    assert embedder.space == "remote/ollama/nomic-embed-text/4"


def test_nothing_listening_is_unavailable_naming_the_url() -> None:
    with socket.socket() as held:  # bound by this test and never listening: refused, and nobody else's
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        sleeps: list[float] = []
        embedder = RemoteEmbedder("ollama", f"http://127.0.0.1:{port}", "m", timeout_seconds=5, sleep=sleeps.append)
        with pytest.raises(Unavailable, match=f"http://127.0.0.1:{port}/api/embed.*ConnectError"):
            embedder.embed(["x"])
    assert sleeps == [0.5, 1.0]


def test_retry_after_is_honoured_up_to_a_cap() -> None:
    answers = [httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(503, headers={"Retry-After": "3600"})]
    service = Script(lambda request: answers.pop(0) if answers else openai_reply(request))
    service.embedder().embed(["patient"])
    assert service.sleeps == [2.0, 30.0]  # the server's wait when longer than ours, never past 30 s
