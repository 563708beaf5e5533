"""Upgrades: a data dir written by any earlier Hyphae opens, migrates and serves what it held.

Each ``data/upgrades/vN/`` is a data dir written by the Hyphae of a commit whose schema was
version N, through that commit's own CLI and daemons (``data/upgrades/make_fixture.py`` says
how), beside ``expected.json``: what that Hyphae answered. Today's ``hyphae up`` is started on
a copy and must answer the same: the node keeps its id and tenant, the agents' keys still work,
the cells read back as they were (the forgotten one stays forgotten), bob's beacon is still his
and still matches, his inbox holds the same items, and the database is at ``SCHEMA_VERSION``
after. Every fixture is tested, and a test asks for one per earlier version, so the change that
adds a migration adds the fixture of the version it leaves behind.

A database from a newer Hyphae (a downgrade) is refused with one line naming both versions,
and left as it was.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from node.store import SCHEMA_VERSION
from tests.e2e.conftest import DEADLINE, HYPHAE, start_daemon, stop_process

FIXTURES = Path(__file__).parent / "data" / "upgrades"
PORTS = ("--api", "127.0.0.1:0", "--mesh", "127.0.0.1:0", "--no-discovery")  # the fixtures keep the default ports


def fixture_versions() -> list[int]:
    return sorted(int(d.name[1:]) for d in FIXTURES.glob("v*") if (d / "expected.json").is_file())


def schema_version(db_path: Path) -> int:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def copy_of(version: int, tmp_path: Path) -> tuple[Path, dict]:
    """The fixture's data dir copied out, with the modes a real one has (git keeps none)."""
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / f"v{version}" / "home", home)
    home.chmod(0o700)
    for secret in ("node.key", "team.json"):
        if (home / secret).exists():
            (home / secret).chmod(0o600)
    return home, json.loads((FIXTURES / f"v{version}" / "expected.json").read_text())


def test_every_earlier_schema_version_has_a_fixture():
    missing = sorted(set(range(1, SCHEMA_VERSION)) - set(fixture_versions()))
    assert not missing, (
        f"no upgrade fixture for schema version(s) {missing}: write one with "
        "tests/app/data/upgrades/make_fixture.py at the last commit where that version was current"
    )


@pytest.mark.parametrize("version", [v for v in fixture_versions() if v <= SCHEMA_VERSION])
def test_a_data_dir_of_an_earlier_schema_opens_migrated_and_serves_what_it_held(tmp_path, version):
    home, expected = copy_of(version, tmp_path)
    assert expected["schema_version"] == version == schema_version(home / "hyphae.db")  # the fixture is what it says
    alice, bob = expected["keys"]["alice"], expected["keys"]["bob"]

    daemon = start_daemon(home, *PORTS)  # fails if `up` exits
    try:
        with httpx.Client(base_url=daemon.url, timeout=DEADLINE) as http:

            def get(path: str, key: str, **params) -> httpx.Response:
                return http.get(path, headers={"x-hyphae-key": key}, params=params)

            def post(path: str, key: str, body: dict) -> dict:
                response = http.post(path, headers={"x-hyphae-key": key}, json=body)
                assert response.status_code < 300, response.text
                return response.json()

            stats = get("/v1/stats", alice).json()
            assert (stats["node_id"], stats["tenant_id"]) == (expected["node_id"], expected["tenant_id"])
            assert stats["cells"] == expected["live_cells"]
            assert get("/v1/whoami", bob).json()["name"] == "bob"

            for name, cell in expected["cells"].items():
                served = get(f"/v1/cells/{cell['node_id']}", alice)
                assert served.status_code == 200, (name, served.text)
                assert {k: served.json().get(k) for k in cell} == cell, name
            tombstone = expected["forgotten"]  # a tombstone: its record kept, its content and vector erased
            served = get(f"/v1/cells/{tombstone['node_id']}", alice)
            assert {k: served.json().get(k) for k in tombstone} == tombstone

            plain = expected["cells"]["plain"]
            found = post("/v1/recall", alice, {"query": plain["content"], "k": 3})["results"]
            assert found and found[0]["node_id"] == plain["node_id"]  # the index and the embedding space carried over
            assert tombstone["node_id"] not in {r["node_id"] for r in found}

            beacons = get("/v1/beacons", bob).json()["beacons"]
            assert [(b["beacon_id"], b["query"]) for b in beacons] == [
                (expected["beacon"]["beacon_id"], expected["beacon"]["query"])
            ]
            inbox = get("/v1/inbox", bob, since=0, limit=100).json()["diffs"]
            assert sorted(item["node_id"] for item in inbox) == expected["inbox"]

            # The upgraded node keeps working: a new cell on bob's topic reaches his inbox.
            fresh = post("/v1/cells", alice, {"content": expected["beacon"]["query"] + " again, after the upgrade",
                                              "cell_type": "Lesson", "project": "orders"})["node_id"]  # fmt: skip
            inbox = get("/v1/inbox", bob, since=0, limit=100).json()["diffs"]
            assert fresh in {item["node_id"] for item in inbox}
    finally:
        assert stop_process(daemon.process) == 0, daemon.log.read_text()
    assert schema_version(home / "hyphae.db") == SCHEMA_VERSION
    log = daemon.log.read_text()
    assert "Traceback" not in log, log
    if (home / "team.json").exists():  # the team's key carried over: the mesh came up in the same team
        team_id = json.loads((home / "team.json").read_text()).get("team_id")
        assert "Mesh: team" in log and (team_id is None or team_id in log), log

    doctor = subprocess.run([*HYPHAE, "--home", str(home), "doctor"], capture_output=True, text=True, timeout=DEADLINE)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_a_data_dir_from_a_newer_hyphae_is_refused_by_hyphae_up_and_left_as_it_was(tmp_path):
    home, _ = copy_of(max(fixture_versions()), tmp_path)
    conn = sqlite3.connect(home / "hyphae.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = (home / "hyphae.db").read_bytes()

    result = subprocess.run([*HYPHAE, "--home", str(home), "up", *PORTS], capture_output=True, text=True,
                            timeout=DEADLINE, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip()
    assert f"schema version {SCHEMA_VERSION + 1}" in message and f"({SCHEMA_VERSION})" in message, message
    assert "upgrade Hyphae" in message, message
    assert (home / "hyphae.db").read_bytes() == before
