"""Crashes (issue 7, item 3): SIGKILL the real daemon during a store burst, round after round.

Each round, 8 agents store through ``hyphae up`` over MCP as fast as it answers, every
store with its own idempotency key; what the node acknowledged is recorded. After a
random number of acknowledgements the daemon gets SIGKILL (no ``finally`` runs, no index
save); the requests in flight at that moment are *in doubt*. The daemon is started again
on the same data dir, and then:

- every store acknowledged in any round so far is in the database with its content;
- the in-doubt stores are retried with their own keys, and so are some acknowledged ones:
  a retry answers the original ``node_id`` when the first attempt committed, and no
  content is ever stored twice;
- the index agrees with the database: ``/v1/stats`` counts exactly the live L0 members,
  and every cell written this round (the last round: every live cell) is found by
  ``recall`` with its own content as the query.

The in-process version of "an acknowledged store survives SIGKILL" is
``tests/node/test_durability.py``; this one goes through every layer a user's agent does
(HTTP, MCP dispatch, the facade, group commit) and adds restarts, retries and repetition.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from tests.e2e.conftest import DEADLINE, Daemon, make_home, prepare_agents, start_daemon

from .conftest import McpCallFailed, McpClient

WRITERS = 8


class Ledger:
    """What the clients know: acknowledged stores, and stores whose outcome they never saw."""

    def __init__(self) -> None:
        self.acked: dict[str, tuple[str, str, str]] = {}  # idempotency key -> (agent key, node_id, content)
        self.in_doubt: dict[str, tuple[str, str]] = {}  # idempotency key -> (agent key, content)
        self.errors: list[str] = []


async def _burst_then_kill(daemon: Daemon, keys: list[str], ledger: Ledger, round_no: int, kill_after: int) -> list[str]:
    """Store from every agent until ``kill_after`` acks this round, then SIGKILL; keys stored this round."""
    killed = trio.Event()
    this_round: list[str] = []

    async def writer(agent_key: str, index: int) -> None:
        mcp = McpClient(daemon.url, agent_key, timeout=DEADLINE)
        try:
            await mcp.initialize()
            n = 0
            while not killed.is_set():
                n += 1
                idem = uuid.uuid4().hex
                content = f"round {round_no} writer {index} store {n} {uuid.uuid4().hex}"
                try:
                    answer = await mcp.call("store", {"content": content, "cell_type": "Fact", "idempotency_key": idem})
                except (httpx.HTTPError, McpCallFailed) as exc:
                    if killed.is_set():
                        ledger.in_doubt[idem] = (agent_key, content)
                        this_round.append(idem)
                        return
                    ledger.errors.append(f"round {round_no} writer {index}: {exc!r}"[:400])
                    return
                ledger.acked[idem] = (agent_key, answer["node_id"], content)
                this_round.append(idem)
                if sum(1 for k in this_round if k in ledger.acked) >= kill_after and not killed.is_set():
                    os.kill(daemon.process.pid, signal.SIGKILL)
                    killed.set()
        except (httpx.HTTPError, McpCallFailed) as exc:
            if not killed.is_set():
                ledger.errors.append(f"round {round_no} writer {index} setup: {exc!r}"[:400])
        finally:
            await mcp.aclose()

    with trio.fail_after(4 * DEADLINE):
        async with trio.open_nursery() as nursery:
            for index, agent_key in enumerate(keys):
                nursery.start_soon(writer, agent_key, index)
    code = await trio.to_thread.run_sync(daemon.process.wait, DEADLINE)
    assert ledger.errors == [], ledger.errors
    assert code == -signal.SIGKILL, f"the daemon exited {code} before it was killed:\n{daemon.log.read_text()}"
    return this_round


def _database(home: Path) -> tuple[dict[str, str], list[tuple[str, int]], int]:
    """(node_id -> content of live cells, contents stored more than once, live L0 members)."""
    with contextlib.closing(sqlite3.connect(f"file:{home / 'hyphae.db'}?mode=ro", uri=True)) as db:
        cells = dict(db.execute("SELECT node_id, content FROM cells WHERE forgotten_at IS NULL"))
        twice = db.execute("SELECT content, COUNT(*) FROM cells GROUP BY content HAVING COUNT(*) > 1").fetchall()
        (l0,) = db.execute(
            "SELECT COUNT(*) FROM layer_members m JOIN cells c ON c.rowid = m.cell_rowid "
            "WHERE m.layer = 'L0' AND c.forgotten_at IS NULL"
        ).fetchone()
    return cells, twice, l0


async def _verify(daemon: Daemon, ledger: Ledger, this_round: list[str], rng: random.Random, *, every_cell: bool) -> int:
    """The checks after a restart; returns how many in-doubt stores had committed."""
    home = daemon.home
    cells, twice, _ = _database(home)
    lost = [node_id for _, node_id, content in ledger.acked.values() if cells.get(node_id) != content]
    assert lost == [], f"{len(lost)} of {len(ledger.acked)} acknowledged stores lost after SIGKILL"

    clients: dict[str, McpClient] = {}

    def client(agent_key: str) -> McpClient:
        if agent_key not in clients:
            clients[agent_key] = McpClient(daemon.url, agent_key)
        return clients[agent_key]

    committed_in_doubt = 0
    try:
        # Retry what was in doubt, with the same key; and replay some acknowledged stores.
        retried: dict[str, str] = {}
        for idem, (agent_key, content) in list(ledger.in_doubt.items()):
            existed = content in cells.values()
            answer = await client(agent_key).call("store", {"content": content, "cell_type": "Fact", "idempotency_key": idem})
            committed_in_doubt += existed
            if existed:
                assert cells.get(answer["node_id"]) == content, "a retry did not answer the original node_id"
            ledger.acked[idem] = (agent_key, answer["node_id"], content)
            retried[idem] = answer["node_id"]
            del ledger.in_doubt[idem]
        for idem in rng.sample(sorted(ledger.acked), min(10, len(ledger.acked))):
            agent_key, node_id, content = ledger.acked[idem]
            answer = await client(agent_key).call("store", {"content": content, "cell_type": "Fact", "idempotency_key": idem})
            assert answer["node_id"] == node_id, "an idempotent replay stored a second cell"

        cells, twice, l0_members = _database(home)
        assert twice == [], f"contents stored more than once: {twice[:5]}"
        assert len(cells) == len(ledger.acked), "the database holds cells nobody was told about, or lost some"

        # The index agrees with the database.
        any_agent = next(iter(ledger.acked.values()))[0]
        stats = (await client(any_agent).http.get("/v1/stats")).json()
        assert stats["layers"]["L0"] == l0_members == len(cells), (stats, l0_members, len(cells))
        probe = sorted(ledger.acked) if every_cell else [k for k in this_round if k in ledger.acked]
        unrecallable = []
        for idem in probe:
            agent_key, node_id, content = ledger.acked[idem]
            hits = (await client(agent_key).call("recall", {"query": content, "k": 5}))["results"]
            if node_id not in [hit["node_id"] for hit in hits]:
                unrecallable.append(node_id)
        assert unrecallable == [], f"{len(unrecallable)} of {len(probe)} cells not found by their own content"
    finally:
        for mcp in clients.values():
            await mcp.aclose()
    return committed_in_doubt


async def _crash_rounds(tmp_path: Path, rounds: int) -> dict[str, int]:
    home = make_home(tmp_path / "home")
    keys = await trio.to_thread.run_sync(lambda: list(prepare_agents(home, *(f"writer{i}" for i in range(WRITERS))).values()))
    ledger = Ledger()
    rng = random.Random(20261202)
    figures = {"rounds": 0, "acknowledged": 0, "in_doubt": 0, "in_doubt_committed": 0}
    daemon = await trio.to_thread.run_sync(start_daemon, home)
    try:
        for round_no in range(1, rounds + 1):
            kill_after = rng.randint(20, 150)
            this_round = await _burst_then_kill(daemon, keys, ledger, round_no, kill_after)
            figures["in_doubt"] += len(ledger.in_doubt)
            daemon = await trio.to_thread.run_sync(start_daemon, home)
            figures["in_doubt_committed"] += await _verify(daemon, ledger, this_round, rng, every_cell=round_no == rounds)
            figures["rounds"] = round_no
    finally:
        code = await trio.to_thread.run_sync(daemon.stop)
    assert code in (0, -signal.SIGKILL), daemon.log.read_text()
    figures["acknowledged"] = len(ledger.acked)
    print(f"crash rounds: {figures}")
    return figures


async def test_sigkill_during_a_store_burst_loses_and_duplicates_nothing(tmp_path):
    figures = await _crash_rounds(tmp_path, rounds=3)
    assert figures["rounds"] == 3 and figures["acknowledged"] >= 60


@pytest.mark.slow
async def test_twenty_sigkill_rounds(tmp_path):
    figures = await _crash_rounds(tmp_path, rounds=20)
    assert figures["rounds"] == 20 and figures["acknowledged"] >= 400
