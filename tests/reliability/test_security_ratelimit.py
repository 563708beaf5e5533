"""A rate limit per API key: a token bucket per agent, with a clear error on every surface.

The bucket itself is driven by a fake clock; then a real daemon configured with a tiny
limit (``[api] rate_limit = 1``, ``rate_burst = 3``) shows the three answers: MCP over
HTTP gets JSON-RPC error -32029 with ``data.reason`` ``rate_limited`` and the request's
own id (HTTP 429, ``Retry-After``), ``hyphae mcp`` over stdio the same error, REST a 429
with ``Retry-After``. Another key is not slowed down, and the limited key works again
once its bucket refills.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.config import load_config
from node.errors import ConfigError, HyphaeError
from node.ratelimit import DEFAULT_BURST, DEFAULT_RATE, RateLimited, RateLimiter
from tests.e2e.conftest import DEADLINE, Daemon, StdioSession, make_home, prepare_agents, start_daemon

# -- the bucket --------------------------------------------------------------------------


def test_a_bucket_grants_its_burst_then_refills_at_the_rate() -> None:
    limiter = RateLimiter(rate=10, burst=3)
    assert [limiter.take("alice", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.take("alice", 100.0)
    assert wait == pytest.approx(0.1)  # one token takes 1/rate seconds
    assert limiter.take("alice", 100.05) == pytest.approx(0.05)  # half a token is not enough
    assert limiter.take("alice", 100.1) == 0.0
    assert limiter.take("alice", 1000.0) == 0.0  # a long quiet spell refills up to the burst only
    assert [limiter.take("alice", 1000.0) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("alice", 1000.0) > 0.0


def test_each_key_has_its_own_bucket_and_zero_means_no_limit() -> None:
    limiter = RateLimiter(rate=1, burst=1)
    assert limiter.take("alice", 5.0) == 0.0
    assert limiter.take("alice", 5.0) > 0.0
    assert limiter.take("bob", 5.0) == 0.0  # alice's loop does not slow bob down
    unlimited = RateLimiter(rate=0, burst=1)
    assert all(unlimited.take("alice", 5.0) == 0.0 for _ in range(10_000))


async def test_revoking_an_agent_drops_its_bucket(service, make_agent) -> None:
    principal, key = await make_agent("loop")
    await service.authenticate(key)
    assert principal.agent_id in service.rate_limiter._buckets
    await service.revoke_agent("loop")
    assert principal.agent_id not in service.rate_limiter._buckets  # a revoked key never calls again


def test_the_error_says_what_the_limit_is_and_when_to_come_back() -> None:
    now = [50.0]
    limiter = RateLimiter(rate=2, burst=1, clock=lambda: now[0])
    limiter.check("alice")
    with pytest.raises(RateLimited) as info:
        limiter.check("alice", "the API key of agent 'alice'")
    error = info.value
    assert isinstance(error, HyphaeError) and error.http_status == 429
    assert error.to_dict()["reason"] == "rate_limited"
    assert error.details["retry_after_ms"] == 500 and error.retry_after_s == 1
    assert "2 calls/s" in error.message and "'alice'" in error.message
    now[0] += 0.5
    limiter.check("alice")  # refilled


def test_config_defaults_and_validation(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    config = load_config(home)
    assert (config.rate_limit, config.rate_burst) == (DEFAULT_RATE, DEFAULT_BURST)
    assert DEFAULT_RATE >= 500 and DEFAULT_BURST >= DEFAULT_RATE  # never in a normal agent's way
    text = (home / "config.toml").read_text()
    assert "# rate_limit = " in text and "# rate_burst = " in text  # the file documents the knob
    for bad in ("rate_limit = -1", "rate_limit = \"fast\"", "rate_burst = 0", "rate_burst = 2.5", "rate_limit = inf"):
        (home / "config.toml").write_text(text.replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:0"\n{bad}'))
        with pytest.raises(ConfigError, match=r"\[api\] rate_"):
            load_config(home)
    (home / "config.toml").write_text(text.replace('listen = "127.0.0.1:0"', 'listen = "127.0.0.1:0"\nrate_limit = 0'))
    assert load_config(home).rate_limit == 0


# -- a real daemon with a tiny limit -------------------------------------------------------

RATE, BURST = 1, 3


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    home = make_home(tmp_path_factory.mktemp("ratelimit") / "home")
    config = home / "config.toml"
    config.write_text(config.read_text().replace(
        'listen = "127.0.0.1:0"', f'listen = "127.0.0.1:0"\nrate_limit = {RATE}\nrate_burst = {BURST}', 1,
    ))  # fmt: skip
    keys = prepare_agents(home, "looper", "bystander", "rester", "stdio")
    daemon = start_daemon(home)
    try:
        yield daemon, keys
    finally:
        daemon.stop()


def _ping(request_id: int) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "ping"}


def _wait_refilled(attempt, deadline: float = DEADLINE):
    """Poll ``attempt()`` until it is not rate limited (the bucket refills at RATE/s)."""
    end = time.monotonic() + deadline
    while True:
        response = attempt()
        if response.status_code != 429:
            return response
        assert time.monotonic() < end, "the bucket never refilled"
        time.sleep(float(response.headers["retry-after"]) / 4)


def test_mcp_over_http_answers_rate_limited_with_the_request_id(limited) -> None:
    daemon, keys = limited
    headers = {"content-type": "application/json"}
    with daemon.client(keys["looper"]) as http, daemon.client(keys["bystander"]) as other:
        answers = [http.post("/mcp", json=_ping(n), headers=headers) for n in range(1, BURST + 3)]
        statuses = [a.status_code for a in answers]
        assert statuses[0] == 200 and 429 in statuses, statuses
        refused = answers[statuses.index(429)]
        body = refused.json()
        assert body["id"] == statuses.index(429) + 1  # paired with its request
        assert body["error"]["code"] == -32029
        assert body["error"]["data"]["reason"] == "rate_limited"
        assert body["error"]["data"]["retry_after_ms"] > 0
        assert "calls/s" in body["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1

        assert other.post("/mcp", json=_ping(1), headers=headers).status_code == 200  # per key
        again = _wait_refilled(lambda: http.post("/mcp", json=_ping(99), headers=headers))
        assert again.status_code == 200 and again.json() == {"jsonrpc": "2.0", "id": 99, "result": {}}


def test_rest_answers_429_with_retry_after(limited) -> None:
    daemon, keys = limited
    with daemon.client(keys["rester"]) as http:
        answers = [http.get("/v1/whoami") for _ in range(BURST + 2)]
        statuses = [a.status_code for a in answers]
        assert statuses[0] == 200 and 429 in statuses, statuses
        refused = answers[statuses.index(429)]
        assert refused.json()["error"]["reason"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        assert _wait_refilled(lambda: http.get("/v1/whoami")).json()["name"] == "rester"
        assert http.get("/healthz").status_code == 200  # no key, no bucket


def test_stdio_gets_the_same_json_rpc_error(limited) -> None:
    daemon, keys = limited
    session = StdioSession(daemon.home, keys["stdio"])
    try:
        errors = []
        for _ in range(BURST + 3):
            response = session.request("ping")
            if "error" in response:
                errors.append(response["error"])
        assert errors, "the limit never answered"
        assert errors[0]["code"] == -32029 and errors[0]["data"]["reason"] == "rate_limited"
        assert session.process.poll() is None  # still serving
    finally:
        session.stop()
