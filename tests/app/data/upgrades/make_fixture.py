"""Write the upgrade fixture of one schema version with the code of the commit where it was current.

Each ``vN/`` here is a data dir (``home/``) written by the Hyphae of a commit whose schema was
version N, and ``expected.json``: what that Hyphae answered, for the upgrade test to ask again
(``tests/app/test_upgrades.py``). Made with that commit's own ``hyphae init``, ``team create``
and ``hyphae up`` daemons, driven over their REST API, never by writing rows by hand:

    git worktree add --detach OLD COMMIT
    python tests/app/data/upgrades/make_fixture.py --source OLD --version N
    git worktree remove OLD

where (``git log -p node/store/schema.py``, and before the move ``node/schema.py``):

    v1  b050094^  the node core; no mesh yet (one node: a local inbox entry)
    v2  0c50f89^  + the diff log (mesh_log)
    v3  c4ab4d7   + members' keys (mesh_keys); the previous release
    v4  4cae8b4   + the quarantine (mesh_quarantine)
    v5  a07b934   + the lexical index (cells_fts)
    v6  65861c6   + the inbox's score and reason (why an entry was admitted)

The interpreter is this checkout's (its venv has every dependency those commits used); the
old code is imported from ``--source`` because ``python -m`` puts the working directory first.

What a fixture holds: node ``home`` with agents alice and bob; bob's beacon; alice's three
cells (one matching bob's beacon, so bob's inbox has it; one forgotten). From v2 on, a second
node ``other`` in the same team (made with ``team create`` / ``team join``) whose agent carol
stores a cell matching bob's beacon: it crosses the mesh into ``home``'s diff log and bob's
inbox, and ``home`` learns ``other``'s key. Only ``home`` is kept, as its daemon left it at a
clean stop (SIGTERM). Its config asks for the hashed embedder (no model to load, nothing that
depends on meaning); the API and mesh addresses are left at their defaults, and tests pass their
own (``hyphae up --api 127.0.0.1:0 --mesh 127.0.0.1:0 --no-discovery``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
DEADLINE = 60.0
BEACON_QUERY = "the connection pool of the orders database is exhausted under load"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OldNode:
    def __init__(self, source: Path, root: Path, name: str) -> None:
        self.source = source
        self.home = root / name
        self.cli_module = "app.cli" if (source / "app" / "cli").exists() or (source / "app" / "cli.py").exists() else "node.cli"
        self.api = f"127.0.0.1:{free_port()}"
        self.mesh = f"127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None
        self.log = root / f"{name}.log"

    def cli(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPHAE_")}
        result = subprocess.run([sys.executable, "-m", self.cli_module, "--home", str(self.home), *args],
                                cwd=self.source, env=env, capture_output=True, text=True, timeout=DEADLINE)
        if result.returncode != 0:
            raise RuntimeError(f"hyphae {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
        return result.stdout

    def has_team_command(self) -> bool:
        return "team" in self.cli("--help")

    def use_hashed_embedder(self) -> None:
        config = self.home / "config.toml"
        text = config.read_text()
        assert 'provider = "builtin"' in text
        config.write_text(text.replace('provider = "builtin"', 'provider = "hashed"'))

    def up(self, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPHAE_")}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.cli_module, "--home", str(self.home), "up", "--api", self.api, *extra],
                cwd=self.source, env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        end = time.monotonic() + DEADLINE
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.home.name} exited {self.process.returncode}:\n{self.log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://{self.api}/healthz", timeout=2).status_code == 200:
                    return
            if time.monotonic() > end:
                raise RuntimeError(f"{self.home.name} not serving\n{self.log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise RuntimeError(f"{self.home.name} did not stop on SIGTERM") from None
            if code != 0:
                raise RuntimeError(f"{self.home.name} exited {code} on SIGTERM:\n{self.log.read_text()}")

    def rest(self, method: str, path: str, key: str | None = None, *, admin: bool = False, **kwargs):
        headers = {}
        if key:
            headers["x-hyphae-key"] = key
        if admin:
            headers["x-hyphae-admin"] = (self.home / "admin.token").read_text().strip()
        response = httpx.request(method, f"http://{self.api}{path}", headers=headers, timeout=30, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def add_agent(self, name: str) -> str:
        return self.rest("POST", "/v1/admin/agents", admin=True, json={"name": name})["api_key"]


def wait_for(what: str, check) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.3)


def make(source: Path, version: int, out: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix="hyphae-fixture-"))
    home, other = OldNode(source, root, "home"), OldNode(source, root, "other")
    try:
        home.cli("init")
        home.use_hashed_embedder()
        meshed = home.has_team_command()
        mesh_args: tuple[str, ...] = ()
        if meshed:
            other.cli("init")
            other.use_hashed_embedder()
            token = home.cli("team", "create").strip().splitlines()[-1].strip()
            other.cli("team", "join", token)
            mesh_args = ("--no-discovery", "--mesh", home.mesh, "--peer", other.mesh)
            other.up("--no-discovery", "--mesh", other.mesh, "--peer", home.mesh)
        home.up(*mesh_args)

        alice, bob = home.add_agent("alice"), home.add_agent("bob")
        beacon = home.rest("POST", "/v1/beacons", bob, json={"query": BEACON_QUERY, "threshold": 0.3})
        cells = {}
        for name, body in {
            "matching": {"content": BEACON_QUERY + " (seen at 09:00)", "cell_type": "Lesson", "project": "orders",
                         "salience": 0.9, "metadata": {"ticket": "OPS-7"}},
            "plain": {"content": "releases are cut from main every Tuesday", "cell_type": "Decision", "project": "orders"},
            "forgotten": {"content": "the staging password is in the vault", "cell_type": "Fact", "project": "orders"},
        }.items():
            cells[name] = home.rest("POST", "/v1/cells", alice, json=body)["node_id"]
        home.rest("DELETE", f"/v1/cells/{cells['forgotten']}", alice)
        if meshed:
            carol = other.add_agent("carol")
            # bob's beacon has reached ``other`` once one of its cells on the topic gets to bob.
            remote_text = BEACON_QUERY + " (seen on the other node)"

            def arrived() -> bool:
                items = home.rest("GET", "/v1/inbox", bob, params={"since": 0, "limit": 50})["diffs"]
                return any(i.get("content") == remote_text or i.get("node_id") == cells.get("remote") for i in items)

            end = time.monotonic() + DEADLINE
            cells["remote"] = other.rest("POST", "/v1/cells", carol, json={
                "content": remote_text, "cell_type": "Risk", "project": "orders", "salience": 0.9})["node_id"]
            while not arrived():
                if time.monotonic() > end:
                    raise RuntimeError("the remote cell did not reach bob's inbox")
                time.sleep(0.5)
        inbox = home.rest("GET", "/v1/inbox", bob, params={"since": 0, "limit": 50})["diffs"]
        stats = home.rest("GET", "/v1/stats", alice)
        got = {name: home.rest("GET", f"/v1/cells/{node_id}", alice) for name, node_id in cells.items()}
        tombstone = got.pop("forgotten")
        expected = {
            "schema_version": version,
            "source_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True,
                                            text=True).stdout.strip(),
            "node_id": stats["node_id"],
            "tenant_id": stats["tenant_id"],
            "keys": {"alice": alice, "bob": bob},
            "cells": {name: {"node_id": c["node_id"], "content": c["content"], "cell_type": c["cell_type"],
                             "project": c.get("project"), "metadata": c.get("metadata")} for name, c in got.items()},
            "forgotten": {"node_id": tombstone["node_id"], "content": tombstone["content"],
                          "forgotten_at": tombstone.get("forgotten_at")},
            "beacon": {"beacon_id": beacon["beacon_id"], "query": BEACON_QUERY, "owner": "bob"},
            "inbox": sorted(item["node_id"] for item in inbox),
            "live_cells": stats["cells"],
        }
    finally:
        for node in (home, other):
            node.stop()
    for transient in ("daemon.json", "hyphae.lock", "node.lock"):
        (home.home / transient).unlink(missing_ok=True)
    conn = sqlite3.connect(home.home / "hyphae.db")
    (at,) = conn.execute("PRAGMA user_version").fetchone()
    conn.close()
    assert at == version, f"{source} writes schema v{at}, not v{version}"
    target = out / f"v{version}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(home.home, target / "home", ignore=shutil.ignore_patterns("*.log", "daemon.json", "*.lock"))
    (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    return expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="a checkout of the commit (git worktree add)")
    parser.add_argument("--version", type=int, required=True, help="the schema version that commit writes")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    print(json.dumps(make(args.source.resolve(), args.version, args.out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
