"""Helpers the facade tests share."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trio

from node.errors import HyphaeError
from node.principals import hash_api_key, new_api_key


async def rejected(call, reason: str, field: str | None = None) -> HyphaeError:
    """Await ``call`` and demand it fails with ``reason`` (and names ``field``)."""
    with pytest.raises(HyphaeError) as info:
        with trio.fail_after(10):
            await call
    assert info.value.reason == reason, f"{info.value!r}: {info.value.message}"
    if field is not None:
        assert info.value.field == field, info.value.message
    return info.value


async def store(service, principal, content: str, cell_type: str = "Fact", **fields) -> str:
    with trio.fail_after(10):
        return (await service.store(principal, content=content, cell_type=cell_type, **fields))["node_id"]


def second_tenant_key(service, name: str = "outsider", projects: list[str] | None = None) -> str:
    """An API key of a principal in a *second* tenant of this data dir.

    ``add_agent`` always uses the node's own tenant (one node hosts one team), so a second
    tenant can only be written into ``principals`` directly. The key is hashed exactly as
    the product hashes keys, and the test then goes through ``authenticate`` like any caller.
    """
    api_key = new_api_key()
    service.db.write_sync(
        lambda tx: tx.execute(
            "INSERT INTO principals (agent_id, tenant_id, name, key_hash, projects, created_at) VALUES (?,?,?,?,?,?)",
            (str(uuid.uuid4()), str(uuid.uuid4()), name, hash_api_key(api_key), json.dumps(projects or []), 0),
        )
    )
    return api_key


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """A real HTTP server on an ephemeral 127.0.0.1 port, in a thread, closed on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def reply_json(handler: BaseHTTPRequestHandler, document: object) -> None:
    """Answer 200 with ``document`` as JSON."""
    payload = json.dumps(document).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
