"""The dashboard's server side on a real daemon: the page, the live stream, the read routes.

``run_daemon`` serves the API (our h11 server) on an ephemeral loopback port in this process (hashed
embedder, no team); the client is httpx, reading the event stream line by line the way
the page's ``fetch()`` reader does. The browser itself is exercised in
``tests/e2e/test_dashboard_browser.py``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from api.rest import dashboard
from app.daemon import run_daemon
from app.home import init_home
from tests.e2e_mesh.cluster import edit_config

DEADLINE = 30
QUESTION = "which database do we use for storage"


@asynccontextmanager
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """A daemon and a client for it; yields ``(http, admin_headers)``."""
    home = tmp_path / "node"
    init_home(home)
    edit_config(home, "hashed")
    async with trio.open_nursery() as nursery:
        info = await nursery.start(functools.partial(run_daemon, home, discovery=False, announce=lambda *_: None))
        admin = {"x-hyphae-admin": (home / "admin.token").read_text().strip()}
        async with httpx.AsyncClient(base_url=info["api_url"], trust_env=False, timeout=DEADLINE) as http:
            yield http, admin
        nursery.cancel_scope.cancel()


async def agent(http: httpx.AsyncClient, admin: dict[str, str], name: str, projects: list[str] | None = None) -> dict[str, str]:
    created = await http.post("/v1/admin/agents", json={"name": name, "projects": projects or []}, headers=admin)
    assert created.status_code == 201, created.text
    return {"authorization": f"Bearer {created.json()['api_key']}"}


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """``(name, data)`` for each server-sent event; comment lines are skipped."""
    name, data = "message", []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield name, json.loads("\n".join(data))
            name, data = "message", []


async def next_event(stream: AsyncIterator[tuple[str, Any]], wanted: str) -> Any:
    async for name, data in stream:
        if name == wanted:
            return data
    raise AssertionError(f"the stream ended before a {wanted!r} event")


async def test_the_page_and_its_files_are_served_with_a_strict_policy(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, _):
            page = await http.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert '<script src="/static/dashboard.js"' in page.text
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
            assert page.headers["x-frame-options"] == "DENY"
            script = await http.get("/static/dashboard.js")
            assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
            assert (await http.get("/static/dashboard.css")).status_code == 200
            assert (await http.post("/")).status_code == 405
            assert (await http.get("/static/missing.js")).status_code == 404


@pytest.mark.parametrize(
    ("headers", "query", "status", "reason"),
    [
        ({}, "", 401, "unauthenticated"),
        ({"authorization": "Bearer hy_not-a-key"}, "", 401, "unauthenticated"),
        ({"key": True}, "?since=yesterday", 400, "invalid_argument"),
        ({"key": True}, "?since=99999999999999999999999", 400, "invalid_argument"),
        ({"key": True}, "?since=%C2%B2", 400, "invalid_argument"),
        ({"key": True, "origin": "https://evil.example"}, "", 403, "forbidden"),
        ({"key": True, "x-hyphae-admin": "guess"}, "", 401, "unauthenticated"),
    ],
)
async def test_the_stream_refuses_bad_requests_with_a_clear_error(tmp_path: Path, headers, query, status, reason) -> None:
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, admin):
            if headers.pop("key", False):
                headers = {**headers, **await agent(http, admin, "alice")}
            response = await http.get(f"/v1/events{query}", headers=headers)
            assert response.status_code == status, response.text
            assert response.json()["error"]["reason"] == reason


async def test_the_stream_pushes_a_new_inbox_item_and_the_counters(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, admin):
            alice, bob = await agent(http, admin, "alice"), await agent(http, admin, "bob")
            assert (await http.post("/v1/beacons", json={"query": QUESTION}, headers=bob)).status_code == 201
            async with http.stream("GET", "/v1/events", headers=bob) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                stream = events(response)
                hello = await next_event(stream, "hello")
                assert hello["name"] == "bob" and hello["node_wide"] is False
                assert (await next_event(stream, "mesh")) == {"enabled": False, "now": pytest.approx(0, abs=1e13)}
                counters = await next_event(stream, "counters")
                assert counters["hyphae_stores_total"] == 0

                stored = await http.post("/v1/cells", json={"content": QUESTION, "cell_type": "Decision"}, headers=alice)
                seen: dict[str, Any] = {}
                async for name, data in stream:  # one look at the node may carry both, in either order
                    seen[name] = data
                    if "inbox" in seen and seen.get("counters", {}).get("hyphae_stores_total") == 1:
                        break
                (item,) = seen["inbox"]["diffs"]
                assert item["node_id"] == stored.json()["node_id"] and item["content"] == QUESTION
                assert "agent" not in item  # the key's own inbox


async def test_the_admin_stream_shows_every_agents_inbox_naming_the_agent(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, admin):
            alice, bob, carol = [await agent(http, admin, n) for n in ("alice", "bob", "carol")]
            for owner in (bob, carol):
                assert (await http.post("/v1/beacons", json={"query": QUESTION}, headers=owner)).status_code == 201
            await http.post("/v1/cells", json={"content": QUESTION, "cell_type": "Decision"}, headers=alice)
            async with http.stream("GET", "/v1/events", headers={**alice, **admin}) as response:
                stream = events(response)
                assert (await next_event(stream, "hello"))["node_wide"] is True
                inbox = await next_event(stream, "inbox")
                assert sorted(d["agent"] for d in inbox["diffs"]) == ["bob", "carol"]
            # The same view over REST, for the data dir's owner only.
            listed = await http.get("/v1/admin/inbox", headers=admin)
            assert [d["agent"] for d in listed.json()["diffs"]] == [d["agent"] for d in inbox["diffs"]]
            assert (await http.get("/v1/admin/inbox", headers=alice)).status_code == 401


async def test_a_revoked_key_ends_its_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "REAUTH_INTERVAL", 0.2)
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, admin):
            alice = await agent(http, admin, "alice")
            async with http.stream("GET", "/v1/events", headers=alice) as response:
                stream = events(response)
                await next_event(stream, "hello")
                assert (await http.delete("/v1/admin/agents/alice", headers=admin)).status_code == 200
                error = await next_event(stream, "error")
                assert error["reason"] == "unauthenticated"
                assert [name async for name, _ in stream] == []  # and the stream is over


async def test_recent_cells_page_newest_first_within_the_read_scope(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path) as (http, admin):
            alice = await agent(http, admin, "alice")
            web = await agent(http, admin, "web-only", projects=["web"])
            ids = []
            for n, project in enumerate(["web", "infra", "web", None, "infra"]):
                body = {"content": f"memory {n}", "cell_type": "Fact", **({"project": project} if project else {})}
                ids.append((await http.post("/v1/cells", json=body, headers=alice)).json()["node_id"])
            first = (await http.get("/v1/cells?limit=2", headers=alice)).json()
            assert [c["node_id"] for c in first["cells"]] == [ids[4], ids[3]]
            rest = (await http.get(f"/v1/cells?limit=10&cursor={first['next_cursor']}", headers=alice)).json()
            assert [c["node_id"] for c in rest["cells"]] == [ids[2], ids[1], ids[0]]
            assert rest["next_cursor"] is None
            scoped = (await http.get("/v1/cells", headers=web)).json()
            assert [c["node_id"] for c in scoped["cells"]] == [ids[3], ids[2], ids[0]]
            for cursor in ("abc", "%C2%B2", "9" * 30):
                bad = await http.get(f"/v1/cells?cursor={cursor}", headers=alice)
                assert bad.status_code == 400 and bad.json()["error"]["field"] == "cursor", cursor
            # The inbox's since takes ms or RFC 3339; a digit that is not ASCII is neither.
            bad = await http.get("/v1/inbox?since=%C2%B2", headers=alice)
            assert bad.status_code == 400 and bad.json()["error"]["field"] == "since"
            refused = await http.get("/v1/cells")
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == 'Bearer realm="hyphae"'  # as /mcp's 401 says


async def test_every_stream_ends_at_once_when_the_daemon_closes(service, make_agent) -> None:
    """``closing`` (the daemon's shutdown event) ends a stream cleanly instead of holding the drain."""
    _, key = await make_agent("alice")
    closing = trio.Event()
    app = dashboard.events_app(service, closing)
    sent: list[dict[str, Any]] = []
    started = trio.Event()

    async def receive() -> dict[str, Any]:
        await trio.sleep_forever()  # the client never goes away on its own

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body", b"").startswith(b"event: hello"):
            started.set()

    scope = {"type": "http", "method": "GET", "path": "/v1/events", "query_string": b"",
             "headers": [(b"authorization", f"Bearer {key}".encode())]}  # fmt: skip
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(app, scope, receive, send)
            await started.wait()
            closing.set()
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
