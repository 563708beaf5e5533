"""The quarantine: what the mesh sent that this node sets aside, with why, instead of storing.

Rows of the diff log that today's decoder refuses (logged by an older version) are moved
out of the log the first time a reader meets them and still count as held; a remote cell
that fails to be stored for a reason of its own is marked, its batch goes on; a local
failure (a full disk) sets nothing aside.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from app.mesh_link import MeshLink
from mesh import events as ev
from mesh.identity import NodeIdentity
from mesh.wire import CellPayload, PeerPayload, sign_diff
from node.errors import DiskFull
from node.store.diff_log import SqliteDiffLog

NOW = 1_780_000_000_000
MEMBER = NodeIdentity.generate()


def payload(service, text: str, **changes) -> CellPayload:
    fields = dict(
        node_id=str(uuid.uuid4()), tenant_id=service.config.tenant_id, source_agent="their-agent", content=text,
        cell_type="Decision", salience=0.8, created_at=NOW, embedding=service.embedder.embed([text])[0],
        embedding_space=service.embedder.space,
    )  # fmt: skip
    fields.update(changes)
    return CellPayload(**fields)


def put_all(diff_log: SqliteDiffLog, payloads: list) -> list:
    diffs = [sign_diff(p, origin=MEMBER.node_id, seq=seq, ts=NOW, sign=MEMBER.sign, hops=1)
             for seq, p in enumerate(payloads, 1)]  # fmt: skip
    for diff in diffs:
        diff_log.put(diff, NOW)
    return diffs


async def settled(service) -> None:
    with trio.fail_after(10):
        await service.db.write(lambda tx: None)


async def test_a_logged_row_the_decoder_refuses_is_moved_aside_and_still_held(service):
    diff_log = service.storage.diff_log()
    diffs = put_all(diff_log, [
        payload(service, "one"), payload(service, "a rumour", cell_type="Gossip"), payload(service, "two"),
        payload(service, "later", created_at=2**63 + 1), payload(service, "three"), PeerPayload("10.0.0.9:7979"),
    ])  # fmt: skip
    await settled(service)

    # A repair answer's page is made up past the refused rows: a short page still means the end.
    page = diff_log.scan(0, 3)
    assert [d.payload.content for _, _, d in page] == ["one", "two", "three"]
    assert diff_log.scan(page[-1][0], 3) == []
    assert diff_log.cell(diffs[1].payload.node_id) is None
    assert [d.payload for d in diff_log.control_diffs()] == [PeerPayload("10.0.0.9:7979")]
    await settled(service)

    assert service.inbound.quarantined() == 2
    rows = service.db.query("SELECT seq, reason, detail, signed FROM mesh_quarantine ORDER BY seq")
    assert [(seq, reason) for seq, reason, _, _ in rows] == [(2, "invalid_cell"), (4, "invalid_cell")]
    assert "'cell_type' must be one of" in rows[0][2] and bytes(rows[0][3]) == diffs[1].signed
    assert service.db.query("SELECT seq FROM mesh_log WHERE origin = ? ORDER BY seq", (MEMBER.node_id,)) == [
        (1,), (3,), (5,), (6,)
    ]
    reopened = service.storage.diff_log()  # what the next start's engine sees
    assert all(reopened.has(MEMBER.node_id, seq) for seq in range(1, 7))
    assert not reopened.put(diffs[1], NOW)  # a peer's repair offering it again changes nothing


async def test_a_remote_cell_that_fails_alone_is_set_aside_and_its_batch_stored(service, monkeypatch):
    cells = [payload(service, "first"), payload(service, "cursed"), payload(service, "last")]
    put_all(service.storage.diff_log(), cells)
    await settled(service)
    write = service.writes.write

    def failing_write(tx, cell, **kwargs):
        if cell.content == "cursed":
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return write(tx, cell, **kwargs)

    monkeypatch.setattr(service.writes, "write", failing_write)
    link = MeshLink(service, lambda event: None)
    with trio.fail_after(10):
        await link.apply_many([ev.StoreRemoteCell(c, MEMBER.node_id, 1, b"\x01" * 64, seq) for seq, c in
                               enumerate(cells, 1)])  # fmt: skip
    assert link.status()["cells_received"] == 2
    assert service.inbound.quarantined() == 1
    ((reason, detail),) = service.db.query("SELECT reason, detail FROM mesh_quarantine")
    assert reason == "store_failed" and "OverflowError" in detail
    assert service.inbound.logged_cells_not_stored() == []  # the next start does not try it again


async def test_a_full_disk_sets_nothing_aside(service, monkeypatch):
    cells = [payload(service, "one"), payload(service, "two")]
    put_all(service.storage.diff_log(), cells)
    await settled(service)

    def full(tx, cell, **kwargs):
        raise DiskFull("the node's disk is full")

    monkeypatch.setattr(service.writes, "write", full)
    with pytest.raises(DiskFull), trio.fail_after(10):
        await MeshLink(service, lambda event: None)._store_remote(cells[0], MEMBER.node_id, 1, b"\x01" * 64)
    assert service.inbound.quarantined() == 0
    with trio.fail_after(10):
        await MeshLink(service, lambda event: None).start()  # logs, and starts all the same
    assert service.inbound.quarantined() == 0
    assert len(service.inbound.logged_cells_not_stored()) == 2  # both wait for the next start
