"""A very small ASGI toolkit: requests, JSON responses, the loopback-origin guard.

The REST surface has a couple of dozen routes with JSON in and out; a framework would
add more than it saves. Limits and checks live here once: bodies over 1 MiB are
refused while reading, a non-loopback ``Origin`` is refused (DNS-rebinding guard).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import parse_qs

from ..origins import is_loopback_origin

__all__ = ["Request", "HttpError", "MAX_BODY_BYTES", "send_json", "read_body", "is_loopback_origin", "header"]

MAX_BODY_BYTES = 1024 * 1024


class HttpError(Exception):
    """An error that becomes an HTTP response with a JSON body."""

    def __init__(self, status: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"reason": reason, "message": message, **details}}


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    query: dict[str, str]
    body: bytes
    path_params: dict[str, str] = dataclasses.field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        if not self.body:
            return {}
        try:
            data = json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, "invalid_argument", f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HttpError(400, "invalid_argument", "the body must be a JSON object")
        return data


def header(scope: dict[str, Any], name: str) -> str | None:
    wanted = name.lower().encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def headers_of(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def query_of(scope: dict[str, Any]) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}


async def read_body(receive, limit: int = MAX_BODY_BYTES) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "invalid_argument", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, "too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_json(send, status: int, data: Any, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    await send_bytes(send, status, body, b"application/json", headers)


async def send_bytes(send, status: int, body: bytes, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
