"""The quarantine: diffs from the mesh this node keeps aside instead of storing, each with why.

Two kinds of diff end here, and neither may ever stop the node:

* a row of the diff log that today's decoder refuses (a cell that breaks the cell rules,
  logged by a version that did not check them): it is *moved* here, out of the log, so no
  reader meets it again and repair never sends it on; its signed bytes are kept;
* a remote cell that decodes but fails to be stored (another tenant's, or a write that
  fails for a reason of its own): it is *marked* here and its log row stays, so the start
  that closes the log's gaps does not try it again.

A diff here still counts as held (:class:`~node.store.diff_log.SqliteDiffLog` loads these
``(origin, seq)`` too), so peers' repair does not offer it again and again. ``hyphae
doctor`` reads :func:`~node.store.maintenance.quarantined` (a warning with the count and
the reasons) and the metrics read :meth:`Quarantine.count`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mesh.errors import WireError
from mesh.wire import Diff, DiffKind, decode_signed

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["Quarantine", "STORE_FAILED", "OTHER_TENANT"]

log = logging.getLogger("hyphae.mesh")

STORE_FAILED = "store_failed"  # a remote cell that decoded but could not be written
OTHER_TENANT = "other_tenant"  # a remote cell of another tenant than this node's


class Quarantine:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._refused: set[tuple[str, int]] = set()  # moved out of the log, or about to be

    # -- diffs the log holds that no longer decode ------------------------------------------

    def decode_logged(self, origin: str, seq: int, signed: bytes, signature: bytes, hops: int, ttl: int) -> Diff | None:
        """A row of the diff log decoded, or None: a row today's decoder refuses is moved
        here (in a write job of its own) and never read again."""
        if (origin, seq) in self._refused:
            return None
        try:
            return decode_signed(signed, signature, hops, ttl)
        except WireError as exc:
            reason, detail = exc.reason, exc.message
        self._refused.add((origin, seq))
        log.warning("quarantined diff %s/%d of the mesh log: %s (%s)", origin[:12], seq, reason, detail)
        self.db.submit(lambda tx: self._move(tx, origin, seq, reason, detail))
        return None

    @staticmethod
    def _move(tx: Transaction, origin: str, seq: int, reason: str, detail: str) -> None:
        tx.execute(
            "INSERT OR REPLACE INTO mesh_quarantine (origin, seq, kind, cell_id, reason, detail, signed, signature) "
            "SELECT origin, seq, kind, cell_id, ?, ?, signed, signature FROM mesh_log WHERE origin = ? AND seq = ?",
            (reason, detail, origin, seq),
        )
        tx.execute("DELETE FROM mesh_log WHERE origin = ? AND seq = ?", (origin, seq))

    # -- remote cells that could not be stored -------------------------------------------------

    @staticmethod
    def mark_cell(tx: Transaction, origin: str, cell_id: str, reason: str, detail: str) -> bool:
        """Set aside the logged diff that carried ``cell_id`` from ``origin`` (its log row
        stays); False when the log does not hold it (yet: the next start tries it again)."""
        return tx.execute(
            "INSERT OR REPLACE INTO mesh_quarantine (origin, seq, kind, cell_id, reason, detail) "
            "SELECT origin, seq, kind, cell_id, ?, ? FROM mesh_log WHERE origin = ? AND cell_id = ? AND kind = ?",
            (reason, detail, origin, cell_id, int(DiffKind.CELL)),
        ).rowcount > 0

    # -- what is in it ---------------------------------------------------------------------------

    def held(self) -> list[tuple[str, int]]:
        """``(origin, seq)`` of every diff set aside: held, as far as the mesh is concerned."""
        return self.db.query("SELECT origin, seq FROM mesh_quarantine")

    def count(self) -> int:
        (count,) = self.db.query_one("SELECT COUNT(*) FROM mesh_quarantine")
        return count

