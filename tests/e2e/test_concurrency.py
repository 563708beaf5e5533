"""Many agent sessions, one node: four ``hyphae mcp`` at once on a data dir nobody serves.

DESIGN §1: any number of ``hyphae mcp`` processes share one node, and no write is lost
or blocked. Here all four race to start the daemon (a spawn lock lets exactly one do
it), then each pipelines 100 stores through its stdio. Afterwards the database holds
exactly the 400 cells, once each, and exactly one daemon ever ran.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

from .conftest import DEADLINE, StdioSession, pid_alive, prepare_agents, read_daemon_json, stop_pid, tool_payload

SESSIONS = 4
STORES = 100


def test_four_sessions_start_one_daemon_and_lose_nothing(e2e_home, spawned_daemons) -> None:
    home = spawned_daemons.watch(e2e_home)
    keys = prepare_agents(home, *(f"agent{i}" for i in range(SESSIONS)))

    pids_seen: set[int] = set()
    watching = threading.Event()

    def watch_daemon_json() -> None:  # every pid that ever appears in daemon.json
        while not watching.is_set():
            info = read_daemon_json(home)
            if info:
                pids_seen.add(info["pid"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_daemon_json, daemon=True)
    watcher.start()
    sessions = [StdioSession(home, key) for key in keys.values()]  # all at once, no daemon yet
    try:
        for index, session in enumerate(sessions):
            session.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": "2025-11-25", "capabilities": {}}})
            for n in range(1, STORES + 1):  # pipelined: no waiting between requests
                session.send({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                    "name": "store",
                    # No idempotency_key: a duplicated write must show up as a second row.
                    "arguments": {"content": f"session {index} memory {n}", "cell_type": "Fact"},
                }})
        node_ids: list[str] = []
        for session in sessions:
            responses = {}
            for _ in range(STORES + 1):
                response = session.recv(timeout=DEADLINE * 2)
                responses[response["id"]] = response
            assert set(responses) == set(range(STORES + 1))
            assert responses[0]["result"]["protocolVersion"] == "2025-11-25"
            node_ids += [tool_payload(responses[n])["node_id"] for n in range(1, STORES + 1)]
            session.close_stdin()
        for session in sessions:
            assert session.wait() == 0, session.stderr
        spawned_daemons.remember()
    finally:
        for session in sessions:
            session.stop()
        watching.set()
        watcher.join(DEADLINE)

    assert len(set(node_ids)) == SESSIONS * STORES
    urls = {session.stderr.split(" through ")[-1].split()[0] for session in sessions}
    assert len(urls) == 1, urls  # every session relayed to the same daemon

    # Exactly one daemon ran, and it is the one still serving.
    assert len(pids_seen) == 1, pids_seen
    (pid,) = pids_seen
    assert pid_alive(pid)
    log = (home / "daemon.log").read_text()
    assert sum("serving" in line for line in log.splitlines()) == 1, log
    assert "already runs" not in log, log

    stop_pid(pid, grace=DEADLINE)  # SIGTERM: drain, save, release; then read the database directly
    assert not pid_alive(pid) and read_daemon_json(home) is None
    with contextlib.closing(sqlite3.connect(home / "hyphae.db")) as db:
        rows = db.execute("SELECT content, node_id FROM cells WHERE forgotten_at IS NULL").fetchall()
    contents = [content for content, _ in rows]
    assert len(rows) == SESSIONS * STORES
    assert len(set(contents)) == SESSIONS * STORES  # no duplicates
    assert set(contents) == {f"session {i} memory {n}" for i in range(SESSIONS) for n in range(1, STORES + 1)}
    assert {node_id for _, node_id in rows} == set(node_ids)
