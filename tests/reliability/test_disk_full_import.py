"""A full disk during ``hyphae import`` says ``disk_full`` (issue "Trust no member", bug 8).

The import wrote its batches and its checkpoint until the disk filled; then the checkpoint's
``OSError: No space left on device`` (or SQLite's ``database or disk is full`` inside a
batch's job) came out as a traceback in process, and as ``internal error`` through the
daemon. Now either is :class:`~node.errors.DiskFull`: one line, ``disk_full``, saying what
was stored and that the same command resumes once space is freed, which it then does.

The data dir sits on a small tmpfs of its own, as in ``test_disk_full.py`` (root with
CAP_SYS_ADMIN; a refused mount fails the test); the unit test below injects SQLite's own
error by capping the database's pages.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from node.embedding import HashedEmbedder
from node.store import database
from tests.e2e.conftest import HYPHAE, make_home, start_daemon, stop_process

from .test_disk_full import small_tmpfs

CELLS = 1500
CONTENT_BYTES = 6000  # per cell: 1500 of them need about 9 MiB, the disk has 6


def write_export(path: Path, cells: int = CELLS) -> set[str]:
    """An export file of ``cells`` random cells in the hashed embedder's space; their ids."""
    space = HashedEmbedder().space
    rng = np.random.default_rng(7)
    ids = set()
    with open(path, "w") as out:
        out.write(json.dumps({"format": "hyphae-export", "version": 1}) + "\n")
        for i in range(cells):
            vector = rng.standard_normal(384).astype("<f4")
            vector /= np.linalg.norm(vector)
            node_id = str(uuid.uuid4())
            ids.add(node_id)
            out.write(json.dumps({
                "kind": "cell", "node_id": node_id, "source_agent": "a", "origin_node": "n" * 32,
                "cell_type": "Fact", "salience": 0.5, "scene_id": None, "session_id": None, "project": None,
                "source_ref": None, "metadata": {}, "created_at": 1_780_000_000_000 + i, "layer": "L0",
                "embedding_space": space, "hops": 0, "signature": None, "forgotten_at": None,
                "content": os.urandom(CONTENT_BYTES // 2).hex(), "embedding": base64.b64encode(vector.tobytes()).decode(),
            }) + "\n")  # fmt: skip
    return ids


def stored_ids(db_path: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {node_id for (node_id,) in conn.execute("SELECT node_id FROM cells")}
    finally:
        conn.close()


@pytest.mark.parametrize("through", ["in process", "the daemon"])
def test_an_import_that_fills_the_disk_says_disk_full_and_resumes_once_space_is_freed(tmp_path, through):
    export = tmp_path / "export.jsonl"
    ids = write_export(export)
    with small_tmpfs(tmp_path / "disk", "6m") as disk:
        home = make_home(disk / "home")
        daemon = start_daemon(home) if through == "the daemon" else None
        try:
            result = subprocess.run([*HYPHAE, "--home", str(home), "import", str(export)],
                                    capture_output=True, text=True, timeout=300)  # fmt: skip
            assert result.returncode == 1, result.stdout + result.stderr
            assert "Traceback" not in result.stderr and "internal" not in result.stderr, result.stderr
            # One line says it (in process, the node's close may log that its index save did not fit).
            (line,) = [line for line in result.stderr.splitlines() if line.startswith("hyphae:")]
            assert line.startswith("hyphae: disk_full: the disk holding the node's data is full"), line
            assert "run the same import again" in line, line

            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
            again = subprocess.run([*HYPHAE, "--home", str(home), "import", str(export)],
                                   capture_output=True, text=True, timeout=300)  # fmt: skip
            assert again.returncode == 0, again.stdout + again.stderr
        finally:
            if daemon is not None:
                assert stop_process(daemon.process) == 0, daemon.log.read_text()
        assert stored_ids(home / "hyphae.db") == ids


def test_a_full_database_inside_an_import_batch_is_disk_full(tmp_path, monkeypatch, capsys):
    """SQLite's own SQLITE_FULL, raised inside a batch's job (not at its commit)."""
    home = make_home(tmp_path / "home")
    export = tmp_path / "export.jsonl"
    write_export(export, cells=600)
    connect = database._connect

    def capped(path):
        conn = connect(path)
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + 500}")  # room for the first batch, not for all
        return conn

    monkeypatch.setattr(database, "_connect", capped)
    assert main(["--home", str(home), "import", str(export)]) == 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("hyphae:")]  # the rest: the node's log
    assert line.startswith("hyphae: disk_full: the disk holding the node's data is full"), err
    assert "Traceback" not in err, err
