"""A member still on the previous release, heard by a real ``hyphae up``: named, never quiet.

The previous release's engine (``c4ab4d7``, mesh protocol 1; vendored in
``tests/mesh/data/mesh_c4ab4d7.zip``, see ``tests/mesh/test_mixed_versions.py`` for how it
was made and the engine-level story both ways) is given the daemon's mesh address as a peer,
and its frames are posted to the daemon's mesh port as its runtime would. The daemon must
drop them under ``old_version``, log once "peer X ... speaks mesh protocol 1, this node 2:
upgrade it" however many come, list the member in ``/v1/admin/peers``, and ``hyphae doctor``
must say the same on its peers line.
"""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from mesh.team import Team
from node.teams import adopt_team
from tests.e2e.conftest import DEADLINE, HYPHAE, make_home, start_daemon, stop_process
from tests.mesh.test_engine import ENERGY

OLD_RELEASE_ZIP = Path(__file__).parents[1] / "mesh" / "data" / "mesh_c4ab4d7.zip"
NOW = 1_780_000_000_000  # the old engine's clock: its frames are refused before any clock is read


def old_release_mesh():
    sys.path.insert(0, str(OLD_RELEASE_ZIP))
    try:
        importlib.import_module("mesh_c4ab4d7.testing")
        return importlib.import_module("mesh_c4ab4d7")
    finally:
        sys.path.remove(str(OLD_RELEASE_ZIP))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_member_of_the_previous_release_is_dropped_by_name_logged_once_and_shown_by_doctor(tmp_path):
    old_mesh = old_release_mesh()
    team = Team.create()
    home = make_home(tmp_path / "home")
    adopt_team(home, team)
    mesh_address = f"127.0.0.1:{free_port()}"

    old = old_mesh.testing.make_engine(
        "127.0.0.1:1", old_mesh.team.Team.from_join_token(team.join_token()), ENERGY
    )  # its own release's engine, in the team through the same join token
    frames = [e.frame for e in old.handle(old_mesh.events.Started(), NOW)
              if type(e).__name__ == "SendFrame"]  # fmt: skip
    frames += [e.frame for e in old.handle(old_mesh.events.PeerDiscovered(mesh_address), NOW)
               if type(e).__name__ == "SendFrame"]  # fmt: skip
    assert frames and all(f[0] == 1 for f in frames)  # protocol 1 on the wire

    daemon = start_daemon(home, "--mesh", mesh_address, "--no-discovery")
    try:
        admin = {"x-hyphae-admin": (home / "admin.token").read_text().strip()}
        sent = 0
        with httpx.Client(timeout=DEADLINE, trust_env=False) as http:
            for _ in range(3):
                for frame in frames:
                    response = http.post(f"http://{mesh_address}/mesh/v1/frames", content=frame,
                                         headers={"content-type": "application/octet-stream"})  # fmt: skip
                    assert response.status_code in (200, 202), response.text
                    sent += 1
            deadline = time.monotonic() + DEADLINE
            while True:  # the endpoint queues a frame for the engine; its verdict follows
                status = http.get(f"{daemon.url}/v1/admin/peers", headers=admin).json()
                if status["drops"].get("old_version", 0) >= sent or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        assert status["drops"] == {"old_version": sent}, status["drops"]
        (outdated,) = status["outdated_peers"]
        assert (outdated["node_id"], outdated["protocol"], outdated["ours"], outdated["frames"]) == (old.node_id, 1, 2, sent)

        doctor = subprocess.run([*HYPHAE, "--home", str(home), "doctor"], capture_output=True, text=True, timeout=DEADLINE)
        (line,) = [line for line in doctor.stdout.splitlines() if " peers " in line]
        assert line.startswith("warn"), line
        assert f"peer {old.node_id}" in line and "speaks mesh protocol 1, this node 2: upgrade it" in line, line
    finally:
        assert stop_process(daemon.process) == 0, daemon.log.read_text()
    log = daemon.log.read_text()
    assert log.count("speaks mesh protocol 1, this node 2: upgrade it") == 1, log
    assert f"peer {old.node_id}" in log
