"""Trust no member: a diff no node can store never stops a node from starting.

An older Hyphae decoded and logged any cell a member signed. A cell whose type is not one
of the nine, whose ``created_at`` is past SQLite's integers or whose metadata holds bytes
then failed where it was stored, and at every start the link re-stored each logged but
missing remote cell without catching the error: ``hyphae up`` exited 1, every time, while
``hyphae doctor`` said all was well. Here such rows are written into a data dir's diff log
as that version would have, and the real ``hyphae up`` must come up, store the sound cell
logged beside them, and set the others aside where ``hyphae doctor`` and the metrics show
them; and so again at the next start, with nothing set aside twice.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import uuid
from pathlib import Path

import httpx

from app.mesh_link import MeshLink
from mesh.identity import NodeIdentity
from mesh.team import Team
from mesh.wire import CellPayload, sign_diff
from node.config import load_config
from node.embedding import HashedEmbedder
from node.store import Store
from node.teams import adopt_team
from tests.e2e.conftest import HYPHAE, make_home, start_daemon, stop_process

NOW = 1_780_000_000_000
MEMBER = NodeIdentity.generate()


def remote_cell(tenant: str, text: str, **changes) -> CellPayload:
    embedder = HashedEmbedder()
    payload = CellPayload(
        str(uuid.uuid4()), tenant, "their-agent", text, "Decision", 0.8, NOW,
        embedding=embedder.embed([text])[0], embedding_space=embedder.space,
    )  # fmt: skip
    return dataclasses.replace(payload, **changes)


def log_as_an_older_version_did(db_path: Path, payloads: list[CellPayload]) -> None:
    """Each payload signed by a genuine member and put in the diff log, no decoder asked."""
    store = Store.open(db_path)
    try:
        diff_log = store.diff_log()
        for seq, payload in enumerate(payloads, 1):
            diff_log.put(sign_diff(payload, origin=MEMBER.node_id, seq=seq, ts=NOW, sign=MEMBER.sign, hops=1), NOW)
    finally:
        store.close()  # drains the log's write job


def poisoned_home(tmp_path: Path) -> tuple[Path, str]:
    """A node in a team whose diff log holds three poison cells and one sound cell, none stored."""
    home = make_home(tmp_path / "home")
    adopt_team(home, Team.create())
    config = load_config(home)
    sound = remote_cell(config.tenant_id, "the connection pool holds 20")
    log_as_an_older_version_did(config.db_path, [
        remote_cell(config.tenant_id, "a rumour", cell_type="Gossip"),
        remote_cell(config.tenant_id, "from the far future", created_at=2**63 + 5),
        remote_cell(config.tenant_id, "with a blob", metadata={"blob": b"\x00\x01"}),
        sound,
    ])  # fmt: skip
    return home, sound.node_id


def stored_ids(db_path: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {node_id for (node_id,) in conn.execute("SELECT node_id FROM cells")}
    finally:
        conn.close()


def test_poison_in_the_diff_log_never_stops_hyphae_up_and_doctor_shows_it(tmp_path):
    home, sound_id = poisoned_home(tmp_path)
    for start in (1, 2):
        daemon = start_daemon(home, "--mesh", "127.0.0.1:0", "--no-discovery")  # fails if `up` exits
        try:
            doctor = subprocess.run([*HYPHAE, "--home", str(home), "doctor"], capture_output=True, text=True, timeout=60)
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            (line,) = [line for line in doctor.stdout.splitlines() if " quarantine " in line]
            assert line.startswith("warn") and "3 diff(s) from the mesh set aside, not stored" in line, line
            assert "invalid_cell 3" in line, line
            metrics = httpx.get(f"{daemon.url}/metrics", timeout=10).text
            assert "hyphae_mesh_quarantined 3.0" in metrics, start
        finally:
            assert stop_process(daemon.process) == 0, daemon.log.read_text()
        assert sound_id in stored_ids(home / "hyphae.db"), f"start {start}: the sound logged cell was not stored"
    log = daemon.log.read_text()
    assert "Traceback" not in log, log
    assert log.count("quarantined diff") == 3, log  # the first start set them aside; the second met none


async def test_the_start_up_repair_sets_aside_what_fails_and_stores_the_rest(service):
    """In process, the link's start: the same poison, and a sound cell of another tenant."""
    tenant = service.config.tenant_id
    sound = remote_cell(tenant, "the retry budget is 3")
    log_rows = [
        remote_cell(tenant, "a rumour", cell_type="Gossip"),
        remote_cell(tenant, "from the far future", created_at=2**63 + 5),
        remote_cell(tenant, "with a blob", metadata={"blob": b"\x00\x01"}),
        remote_cell("another-team", "not ours"),
        sound,
    ]
    diff_log = service.storage.diff_log()
    for seq, payload in enumerate(log_rows, 1):
        diff_log.put(sign_diff(payload, origin=MEMBER.node_id, seq=seq, ts=NOW, sign=MEMBER.sign, hops=1), NOW)
    await service.db.write(lambda tx: None)  # the log's rows are committed

    await MeshLink(service, lambda event: None).start()  # must not raise
    await service.db.write(lambda tx: None)  # the quarantine's moves are committed
    assert service.cell_record(sound.node_id).content == "the retry budget is 3"
    assert service.inbound.quarantined() == 4
    assert service.inbound.logged_cells_not_stored() == []  # nothing left to try at the next start
    held = service.storage.diff_log()  # as the next start's engine sees the log
    assert all(held.has(MEMBER.node_id, seq) for seq in range(1, 6))
