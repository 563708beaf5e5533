"""Schemathesis against ``/openapi.json`` of a real daemon: no 5xx, ever.

The daemon is ``hyphae up`` on an ephemeral loopback port (hashed embedder). Schemathesis
reads the document the daemon serves and, for every operation it lists (the REST route
table, admin routes included), generates requests from the operation's parameters and
body schema: valid ones and ones that break the schema. Each request carries a real key
(or the admin token for admin routes, but for export and import: see ``FILE_ROUTES``), so
it reaches the facade. For every response:

* the status is below 500;
* an error (4xx) has the documented body ``{"error": {"reason", "message"}}`` with a
  stable reason, and changed nothing: cells, beacons, sessions, scenes and agents are
  counted in the database (read-only, beside the daemon) before and after;

and after the run the daemon still answers ``/healthz`` and stores a cell for a new agent.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import given

from tests.e2e.conftest import DEADLINE, Daemon, make_home, prepare_agents, start_daemon

from .fuzz import REASONS, count, fuzz_report, fuzz_settings  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("fuzz_report")

CI_EXAMPLES_PER_OPERATION = 10
# Export and import name a file anywhere the daemon's user may write or read: with the
# admin token, a fuzzer would make the daemon write exports to random absolute paths
# (a long run once left one in /). They are fuzzed without the token (401 every time).
FILE_ROUTES = ("/v1/admin/export", "/v1/admin/import")
REST_REASONS = REASONS | {"method_not_allowed"}
COUNTED = ("cells", "beacons", "sessions", "scenes", "principals")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    home = make_home(tmp_path_factory.mktemp("openapi") / "home")
    config = home / "config.toml"
    config.write_text(config.read_text().replace('listen = "127.0.0.1:0"', 'listen = "127.0.0.1:0"\nrate_limit = 0', 1))
    keys = prepare_agents(home, "alice", "scoped")
    running = start_daemon(home)
    try:
        yield running, keys
    finally:
        running.stop()


def snapshot(daemon: Daemon) -> tuple[int, ...]:
    with contextlib.closing(sqlite3.connect(f"file:{daemon.home / 'hyphae.db'}?mode=ro", uri=True)) as db:
        return tuple(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in COUNTED)


def test_no_request_the_openapi_document_allows_gets_a_5xx(daemon) -> None:
    node, keys = daemon
    schema = schemathesis.openapi.from_url(f"{node.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]  # every route, admin ones included
    admin = {"x-hyphae-admin": (node.home / "admin.token").read_text().strip()}
    failures: list[str] = []

    for operation in operations:
        if operation.path in FILE_ROUTES:
            headers = {"x-hyphae-key": keys["alice"]}
        else:
            headers = admin if "/admin/" in operation.path else {"x-hyphae-key": keys["alice"]}

        @fuzz_settings(CI_EXAMPLES_PER_OPERATION)
        @given(operation.as_strategy())
        def run(case) -> None:
            before = snapshot(node)
            response = case.call(base_url=node.url, headers=headers, timeout=DEADLINE)
            count("openapi requests")
            count(f"openapi {operation.label} {response.status_code}")
            assert response.status_code < 500, f"{operation.label}: {response.status_code} {response.text[:300]}"
            if response.status_code >= 400:
                error = response.json()["error"]
                assert error["reason"] in REST_REASONS and error["message"], error
                assert snapshot(node) == before, f"{operation.label} {response.status_code} changed the database"

        try:
            run()
        except AssertionError as exc:  # gather every operation's failure, not only the first
            failures.append(str(exc)[:2000])
    assert not failures, "\n\n".join(failures)

    assert httpx.get(f"{node.url}/healthz", timeout=DEADLINE).status_code == 200
    name = f"after-fuzz-{uuid.uuid4().hex[:8]}"
    agent = httpx.post(f"{node.url}/v1/admin/agents", json={"name": name}, headers=admin, timeout=DEADLINE).json()
    stored = httpx.post(f"{node.url}/v1/cells", json={"content": "Still serving.", "cell_type": "Fact"},
                        headers={"x-hyphae-key": agent["api_key"]}, timeout=DEADLINE)  # fmt: skip
    assert stored.status_code == 201, stored.text
