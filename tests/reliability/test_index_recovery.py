"""Index recovery (issue 7, item 3): damaged index files are rebuilt on a real daemon start.

The HNSW files are a cache of what SQLite holds. Each case fills a data dir through a
real daemon, stops it cleanly (the files are saved), damages the files in one way, and
starts ``hyphae up`` again. The daemon must say why it rebuilds (one warning per layer
with the reason: missing, corrupt: checksum mismatch, corrupt: meta unreadable, stale),
show the rebuild's progress (percent log lines when stderr is a file; a bar on a
terminal), answer every recall as before, and save the rebuilt files, so the start after
that loads them without a word.

The in-process equivalents (identical answers after a rebuild, a corrupt file is never
parsed) are in ``tests/node/test_durability.py`` and ``tests/node/test_index.py``.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.e2e.conftest import HYPHAE, Daemon, make_home, prepare_agents, start_daemon, stop_process, wait_for_daemon

CELLS = 60
BACKUP_AT = 40  # the "restored from a backup" case keeps the database as it was after this many


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, str, list[tuple[str, str]]]:
    """A data dir with CELLS cells stored through a daemon, stopped cleanly; a database backup
    taken (daemon stopped) after BACKUP_AT of them sits beside it. Each test works on a copy."""
    tmp_path = tmp_path_factory.mktemp("filled")
    home = make_home(tmp_path / "home")
    key = prepare_agents(home, "alice")["alice"]
    stored: list[tuple[str, str]] = []
    for first, last in ((0, BACKUP_AT), (BACKUP_AT, CELLS)):
        daemon = start_daemon(home)
        try:
            with daemon.client(key) as http:
                for n in range(first, last):
                    content = f"memory {n}: " + os.urandom(48).hex()
                    response = http.post("/v1/cells", json={"content": content, "cell_type": "Decision", "salience": 0.9})
                    assert response.status_code == 201, response.text
                    stored.append((response.json()["node_id"], content))
        finally:
            assert daemon.stop() == 0, daemon.log.read_text()
        if last == BACKUP_AT:
            shutil.copy(home / "hyphae.db", tmp_path / "backup.db")
    return home, key, stored


def _copy(filled, tmp_path: Path) -> tuple[Path, str, list[tuple[str, str]]]:
    template, key, stored = filled
    home = tmp_path / "home"
    shutil.copytree(template, home)
    shutil.copy(template.parent / "backup.db", tmp_path / "backup.db")
    return home, key, stored


def _flip_index_bytes(home: Path) -> None:
    (target,) = (home / "index").glob("L0-*.hnsw")
    data = bytearray(target.read_bytes())
    for offset in range(200, len(data), max(1, len(data) // 40)):
        data[offset] ^= 0xFF
    target.write_bytes(bytes(data))


def _delete_index_files(home: Path) -> None:
    for path in (home / "index").iterdir():
        path.unlink()


def _garble_meta(home: Path) -> None:
    (home / "index" / "L0.meta.json").write_text("{ not json")


def _other_space(home: Path) -> None:
    path = home / "index" / "L0.meta.json"
    meta = json.loads(path.read_text())
    meta["space"] = "some-other-embedder/v0"
    path.write_text(json.dumps(meta))


def _restore_backup(home: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{home / 'hyphae.db'}{suffix}").unlink(missing_ok=True)
    shutil.copy(home.parent / "backup.db", home / "hyphae.db")


CASES = {
    "deleted": (_delete_index_files, "missing", CELLS),
    "checksum": (_flip_index_bytes, "corrupt: checksum mismatch", CELLS),
    "meta": (_garble_meta, "corrupt: meta unreadable", CELLS),
    "space": (_other_space, "stale: space differs", CELLS),
    "backup": (_restore_backup, "stale: the files cover row", BACKUP_AT),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_index_files_are_rebuilt_on_start_saying_why(filled, tmp_path, case):
    damage, reason, expected = CASES[case]
    home, key, stored = _copy(filled, tmp_path)
    damage(home)
    log_size = _log_size(home)
    daemon = start_daemon(home)
    try:
        with daemon.client(key) as http:
            assert http.get("/v1/stats").json()["layers"]["L0"] == expected
            for node_id, content in stored[:expected]:
                hits = http.post("/v1/recall", json={"query": content, "k": 3}).json()["results"]
                assert hits[0]["node_id"] == node_id, (case, content)
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()
    started = daemon.log.read_text()[log_size:]
    assert f"rebuilding the L0 index from the database ({expected} rows): {reason}" in started, started
    assert f"indexing the L0 layer: 100% ({expected}/{expected} rows)" in started, started
    # Every Decision at salience 0.9 is in L1 too; only the cases that hit L1's files rebuild it.
    rebuilt_l1 = "rebuilding the L1 index" in started
    assert rebuilt_l1 == (case in ("deleted", "backup")), started

    # The rebuilt files were saved: the next start loads them and says nothing about indexes.
    log_size = _log_size(home)
    daemon = start_daemon(home)
    assert daemon.stop() == 0
    again = daemon.log.read_text()[log_size:]
    assert "rebuilding" not in again and "indexing the" not in again, again


def test_a_rebuild_on_a_terminal_draws_a_progress_bar(filled, tmp_path):
    home, key, _ = _copy(filled, tmp_path)
    _delete_index_files(home)
    controller, terminal = pty.openpty()
    process = subprocess.Popen([*HYPHAE, "--home", str(home), "up"], stdin=subprocess.DEVNULL, stdout=terminal,
                               stderr=terminal, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(terminal)
    output = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            output.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        daemon = Daemon(home, process, wait_for_daemon(home, pid=process.pid, process=process), home.parent / "none")
        with daemon.client(key) as http:
            assert http.get("/v1/stats").json()["layers"]["L0"] == CELLS
    finally:
        assert stop_process(process) == 0
        reader.join(10)
        os.close(controller)
    text = output.decode(errors="replace")
    assert f"rebuilding the L0 index from the database ({CELLS} rows): missing" in text, text
    assert f"indexing L0 [{'#' * 30}] {CELLS}/{CELLS} (100%)" in text, text  # the bar, drawn in place
    assert "indexing the L0 layer" not in text, text  # no percent log lines on a terminal


def _log_size(home: Path) -> int:
    log = home.parent / f"{home.name}-daemon.log"
    return log.stat().st_size if log.exists() else 0
