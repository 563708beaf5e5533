"""The REST surface's requests and errors: JSON in, JSON out, over :mod:`web.asgi`.

Limits and checks live here once: bodies over 1 MiB are refused while reading, and every
failure is an :class:`HttpError` that becomes a JSON body with a stable ``reason``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from web import asgi
from web.asgi import header, headers_of, query_of
from web.origins import is_loopback_origin

__all__ = [
    "Request", "HttpError", "MAX_BODY_BYTES", "send_json", "send_bytes", "read_body", "is_loopback_origin",
    "header", "headers_of", "query_of",
]  # fmt: skip

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


async def read_body(receive, limit: int = MAX_BODY_BYTES) -> bytes:
    try:
        return await asgi.read_body(receive, limit)
    except asgi.ClientGone:
        raise HttpError(400, "invalid_argument", "the client went away") from None
    except asgi.BodyTooLarge:
        raise HttpError(413, "too_large", f"the body is larger than {limit} bytes") from None


async def send_json(send, status: int, data: Any, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    await send_bytes(send, status, body, b"application/json", headers)


async def send_bytes(send, status: int, body: bytes, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A whole response that no cache keeps (every answer here is a memory or a live figure)."""
    await asgi.send_bytes(send, status, body, content_type, ((b"cache-control", b"no-store"), *headers))
