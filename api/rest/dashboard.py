"""The dashboard: a static page at ``/`` and the live event stream it reads.

The page is plain HTML, CSS and JavaScript from ``api/rest/static/`` (no build step);
it asks for an API key, keeps it in ``sessionStorage`` and calls the same REST routes
as every other client. The live part is ``GET /v1/events``, a stream of server-sent
events. Browsers' ``EventSource`` cannot send headers, and a long-lived key does not
belong in a URL (it ends up in histories and logs), so the page reads the stream with
``fetch()`` and a ``ReadableStream``, with the key in ``Authorization: Bearer``.

Theory of operation of the stream: one task per connection wakes every ``interval``
seconds, reads what the node already keeps (the mesh status, the metrics, the key's
inbox after the last item sent), and writes an event only for what changed. The key is
authenticated again every few seconds, so a revoked key's stream ends; the stream also
ends when the client goes away or the daemon shuts down.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import trio

from node.errors import HyphaeError, Unauthenticated
from node.service import MemoryService
from .http import HttpError, headers_of, is_loopback_origin, query_of, send_json

__all__ = ["static_apps", "events_app", "mesh_view", "EVENTS_PATH"]

log = logging.getLogger("hyphae.dashboard")

EVENTS_PATH = "/v1/events"
STREAM_INTERVAL = 0.5  # seconds between looks at the node
REAUTH_INTERVAL = 5.0  # seconds between checks that the key still works
KEEPALIVE_INTERVAL = 15.0  # seconds of silence before a comment line keeps proxies from closing
INBOX_PAGE = 200

_CONTENT_TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
                  ".css": b"text/css; charset=utf-8", ".svg": b"image/svg+xml"}  # fmt: skip

# The page loads only its own files, and no other site may frame it (clickjacking).
_PAGE_HEADERS = (
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)  # fmt: skip

ASGIApp = Callable[[dict[str, Any], Callable, Callable], Any]


def static_apps() -> dict[str, ASGIApp]:
    """``{path: app}`` for the page (``/``) and each file under ``/static/``, read once."""
    folder = resources.files("api.rest") / "static"
    apps: dict[str, ASGIApp] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _CONTENT_TYPES:
            continue
        app = _static_app(entry.read_bytes(), _CONTENT_TYPES[suffix])
        apps[f"/static/{entry.name}"] = app
        if entry.name == "index.html":
            apps["/"] = app
    if "/" not in apps:
        raise RuntimeError(f"the dashboard's index.html is missing from {folder}; the package is incomplete")
    return apps


def _static_app(body: bytes, content_type: bytes) -> ASGIApp:
    async def app(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await send_json(send, 405, {"error": {"reason": "method_not_allowed", "message": "use GET"}})
            return
        await send({
            "type": "http.response.start", "status": 200,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-cache"), *_PAGE_HEADERS],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app


def mesh_view(service: MemoryService) -> dict[str, Any]:
    """The mesh as the page shows it: peers with their traffic, and the totals."""
    if service.mesh_status is None:
        return {"enabled": False}
    status = service.mesh_status()
    transport = status.get("transport", {}).get("peers", {})
    runtime = status.get("runtime", {})
    batches = runtime.get("data_frames_sent", {})
    lanes = runtime.get("lanes", {})
    received = status.get("cells_received_from", {})
    peers = []
    for peer in status.get("peers", []):
        address = peer["address"]
        traffic = transport.get(address, {})
        peers.append({
            "node_id": peer["node_id"], "address": address, "state": peer["state"], "heard_at": peer.get("heard_at"),
            "outbox_depth": peer.get("queue_depth", 0), "inflight_batches": peer.get("inflight_batches", 0),
            "send_queue": lanes.get(address, {}).get("queued", 0),
            "frames_sent": traffic.get("sent", 0), "send_failures": traffic.get("failed", 0),
            "data_batches_sent": batches.get(address, 0), "cells_received": received.get(peer["node_id"], 0),
        })  # fmt: skip
    return {
        "enabled": True,
        "team_id": status.get("team_id"),
        "node_id": status.get("node_id"),
        "address": status.get("address"),
        "peers": peers,
        "beacons_known": status.get("beacons_known", 0),
        "data_diffs_sent": status.get("data_diffs_sent", 0),
        "frames_sent": status.get("frames_sent", {}),
        "frames_received": status.get("frames_received", 0),
        "diffs_received": status.get("diffs_accepted", {}),
        "cells_received": status.get("cells_received", 0),
        "drops": {**status.get("drops", {}),
                  **({"send_queue_full": runtime["frames_dropped_queue_full"]}
                     if runtime.get("frames_dropped_queue_full") else {})},
    }  # fmt: skip


def _event(name: str, data: Any) -> bytes:
    # json.dumps never emits a raw newline, so one data line holds the whole event.
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


def events_app(
    service: MemoryService, closing: trio.Event, *, admin_token: str | None = None, interval: float = STREAM_INTERVAL
) -> ASGIApp:
    """``GET /v1/events``: the live stream for one key (see the module docstring).

    ``since`` (ms, optional) starts the inbox after that time. With the data dir's admin
    token in ``x-hyphae-admin`` as well, the inbox events hold every agent's items on this
    node (each naming its agent) instead of the key's own. ``closing`` is set when the
    daemon shuts down, which ends every stream at once instead of holding the drain.
    """

    async def app(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        headers = headers_of(scope)
        try:
            origin = headers.get("origin")
            if origin is not None and not is_loopback_origin(origin):
                raise HttpError(403, "forbidden", f"origin {origin!r} is not a loopback origin")
            if scope["method"] != "GET":
                raise HttpError(405, "method_not_allowed", f"{scope['method']} is not allowed on {EVENTS_PATH}; use GET")
            key = _key_of(headers)
            admin = headers.get("x-hyphae-admin")
            if admin is not None and (not admin_token or not hmac.compare_digest(admin, admin_token)):
                raise HttpError(401, "unauthenticated", "the admin token (x-hyphae-admin) is not this node's")
            since = query_of(scope).get("since", "") or "0"
            # ASCII digits (str.isdigit also takes '²'); 15 digits of ms reach the year 33658.
            if not (since.isascii() and since.isdigit()) or len(since) > 15:
                raise HttpError(400, "invalid_argument", "'since' must be a time in ms since the epoch", field="since")
            try:
                principal = await service.authenticate(key)
            except HyphaeError as exc:
                raise HttpError(exc.http_status, exc.reason, exc.message) from None
        except HttpError as exc:
            await send_json(send, exc.status, exc.body)
            return
        await send({
            "type": "http.response.start", "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
                        (b"x-accel-buffering", b"no")],
        })  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when_gone, receive, nursery.cancel_scope)
            nursery.start_soon(_cancel_when_set, closing, nursery.cancel_scope)
            try:
                await _stream(service, principal, key, int(since), send, interval, node_wide=admin is not None)
            finally:
                nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client is gone; there is no one left to tell
                pass

    return app


def _key_of(headers: dict[str, str]) -> str:
    key = headers.get("x-hyphae-key")
    if key is None:
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    if not key:
        raise HttpError(401, "unauthenticated", "no API key: send it in Authorization: Bearer (or x-hyphae-key)")
    return key


async def _cancel_when_gone(receive: Callable, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _stream(
    service: MemoryService, principal, key: str, since: int, send: Callable, interval: float, *, node_wide: bool
) -> None:
    async def emit(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    await emit(_event("hello", {
        "node_id": service.node_id, "agent_id": principal.agent_id, "name": principal.name,
        "tenant_id": principal.tenant_id, "interval_ms": int(interval * 1000), "node_wide": node_wide,
    }))  # fmt: skip
    last: dict[str, Any] = {}
    checked_at = written_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now - checked_at >= REAUTH_INTERVAL:
            checked_at = now
            try:
                await service.authenticate(key)
            except Unauthenticated as exc:
                await emit(_event("error", {"reason": exc.reason, "message": exc.message}))
                return
            except HyphaeError:  # rate-limited: the key still works, look again later
                pass
        chunks = []
        for name, value in (("mesh", mesh_view(service)), ("counters", service.metrics.snapshot())):
            if value != last.get(name):
                last[name] = value
                chunks.append(_event(name, {**value, "now": int(time.time() * 1000)} if name == "mesh" else value))
        if node_wide:
            page = await service.node_inbox(since=since, limit=INBOX_PAGE)
        else:
            page = await service.inbox(principal, since=since, limit=INBOX_PAGE)
        if page["diffs"]:
            since = page["next_since"]
            chunks.append(_event("inbox", page))
        if chunks:
            await emit(b"".join(chunks))
            written_at = now
        elif now - written_at >= KEEPALIVE_INTERVAL:
            await emit(b": keep-alive\n\n")
            written_at = now
        await trio.sleep(interval)
