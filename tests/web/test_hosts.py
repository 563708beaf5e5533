"""The Host check (DNS-rebinding guard): which names the API port answers, and what the others get."""

from __future__ import annotations

import json

import httpx
import pytest

from web.hosts import HostCheck, guard_hosts, split_host


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:7777", ("127.0.0.1", 7777)),
        ("LocalHost:7777", ("localhost", 7777)),
        ("localhost", ("localhost", None)),
        ("[::1]:7777", ("::1", 7777)),
        ("[::1]", ("::1", None)),
        ("hyphae.internal:443", ("hyphae.internal", 443)),
        ("::1", None),  # an IPv6 address must be bracketed
        ("host:", None),
        ("host:0", None),
        ("host:99999", None),
        ("host:7a", None),
        ("[::1]x", None),
        ("", None),
    ],
)
def test_split_host(value, parsed):
    assert split_host(value) == parsed


def test_the_names_a_loopback_daemon_answers():
    check = HostCheck("127.0.0.1", 7777)
    for good in ("127.0.0.1:7777", "localhost:7777", "[::1]:7777", "localhost", "127.0.0.1", "127.0.0.2:7777", None):
        assert check.accepts(good), good
    for bad in ("evil.example:7777", "evil.example", "localhost:8080", "127.0.0.1:80", "[::1]:1", "a b", "::1:7777"):
        assert not check.accepts(bad), bad


def test_allowed_hosts_add_names_with_or_without_a_port():
    check = HostCheck("0.0.0.0", 7777, ["hyphae.internal", "box.lan:7777"])
    assert check.accepts("hyphae.internal") and check.accepts("hyphae.internal:443")
    assert check.accepts("box.lan:7777") and not check.accepts("box.lan:7778") and not check.accepts("box.lan")
    assert check.accepts("0.0.0.0:7777")  # the bound address itself
    with pytest.raises(ValueError, match="not a host name"):
        HostCheck("127.0.0.1", 7777, ["bad:port"])


async def test_a_refused_host_gets_421_with_a_clear_body_and_never_reaches_the_app():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guarded = guard_hosts(app, HostCheck("127.0.0.1", 7777))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url="http://127.0.0.1:7777") as http:
        assert (await http.get("/healthz")).status_code == 200
        for path in ("/healthz", "/mcp", "/v1/cells", "/metrics", "/"):
            response = await http.get(path, headers={"host": "rebound.example:7777"})
            assert response.status_code == 421, path
            error = response.json()["error"]
            assert error["reason"] == "misdirected"
            assert "rebound.example:7777" in error["message"] and "allowed_hosts" in error["message"]
    assert reached == ["/healthz"]
    assert json.loads(response.content)  # a JSON body, not an empty one
