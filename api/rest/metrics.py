"""``GET /metrics``: the node's counters in the Prometheus text format, on the API port.

It needs no key: the API port is loopback-only unless ``--allow-remote``, the numbers carry
no memory content and no key, and scrapers expect an open endpoint. A request from a
non-loopback ``Origin`` is still refused (DNS-rebinding guard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.metrics import CONTENT_TYPE, NodeMetrics
from web.origins import is_loopback_origin

__all__ = ["metrics_app"]


def metrics_app(metrics: NodeMetrics):
    """``GET /metrics``: the exposition; anything else on that path is a 405."""

    async def app(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        origin = dict(scope.get("headers", ())).get(b"origin")
        if origin is not None and not is_loopback_origin(origin.decode("latin-1")):
            status, body, content_type = 403, b"not a loopback origin\n", b"text/plain; charset=utf-8"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body, content_type = 405, b"use GET\n", b"text/plain; charset=utf-8"
        else:
            status, body, content_type = 200, metrics.exposition(), CONTENT_TYPE.encode()
        await send({
            "type": "http.response.start", "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-store")],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app
