"""A data dir that lost its database but kept its node key is refused, never silently re-created.

SQLite takes a zero-length file for a new, empty database: a node started on one became a
brand-new node under its old identity, its agents' keys and its memories gone, its diff log
empty. Every command that opens the data dir refuses it instead: one line that names the file
and says what to do, exit 3 (no usable data dir), and the file left as it was.
"""

from __future__ import annotations

import pytest

from .test_cli import hyphae


@pytest.mark.parametrize("damage", ["empty", "missing"])
@pytest.mark.parametrize("command", [("up", "--no-discovery", "--api", "127.0.0.1:0"), ("agent", "list"), ("init",)])
def test_a_lost_database_beside_a_node_key_is_refused_with_exit_3(home, damage, command):
    db = home / "hyphae.db"
    for leftover in (home / "hyphae.db-wal", home / "hyphae.db-shm"):
        leftover.unlink(missing_ok=True)
    if damage == "empty":
        db.write_bytes(b"")
    else:
        db.unlink()
    result = hyphae(home, *command, timeout=120)
    assert result.returncode == 3, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert str(db) in line and "node.key" in line and "restore" in line.lower(), line
    assert "Traceback" not in result.stderr
    if damage == "empty":
        assert db.exists() and db.stat().st_size == 0  # not re-created behind the user's back
    else:
        assert not db.exists()


@pytest.mark.parametrize("damage", ["empty", "missing"])
def test_the_doctor_fails_a_lost_database_beside_a_node_key_and_says_what_to_do(home, damage):
    from app.doctor import FAIL, run_doctor

    db = home / "hyphae.db"
    if damage == "empty":
        db.write_bytes(b"")
    else:
        db.unlink()
    check = next(c for c in run_doctor(home, open_zeroconf=lambda: None) if c.name == "database")
    assert check.status == FAIL and str(db) in check.message
    assert "restore hyphae.db" in check.fix and "node.key" in check.fix
