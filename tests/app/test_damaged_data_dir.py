"""A damaged data dir gets one line naming the file and what to do, never a traceback.

Issue "Trust no member", bug 8: a malformed ``hyphae.db``, a truncated ``node.key`` or a
garbage ``team.json`` made ``hyphae up`` end in a traceback and exit 1. Now ``up`` prints
``hyphae: ...`` (the file, what is wrong, what to do) and exits 3, the code for "no usable
data dir or config". ``hyphae doctor`` already reported each as a failed check with its fix
(exit 1, its contract for any failed check) and ``hyphae status`` does not open the data
dir when no daemon runs: both are pinned here too, traceback-free. And a ``node.key`` or
``team.json`` that other users may read is said at start, as ``hyphae doctor`` says it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app.cli import main
from mesh.team import Team
from node.teams import adopt_team
from tests.e2e.conftest import HYPHAE, make_home, start_daemon, stop_process


def garbage(path: Path) -> None:
    path.write_bytes(b"this is not what this file should hold, not at all\n" * 3)


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


DAMAGE = {
    "hyphae.db is not a database": ("hyphae.db", garbage, "restore it from a backup"),
    "hyphae.db cut short": ("hyphae.db", lambda p: truncate(p, 5000), "restore it from a backup"),
    "node.key cut short": ("node.key", lambda p: truncate(p, 10), "restore node.key from a backup"),
    "node.key missing": ("node.key", Path.unlink, "restore node.key from a backup"),
    "team.json is not JSON": ("team.json", garbage, "hyphae team join TOKEN"),
    "team.json without its key": ("team.json", lambda p: p.write_text('{"team_id": "x"}'), "hyphae team join TOKEN"),
}


@pytest.fixture(params=list(DAMAGE))
def damaged(request, tmp_path) -> tuple[Path, Path, str]:
    """A node in a team with one file damaged: (home, the file, what its fix says)."""
    home = make_home(tmp_path / "home")
    adopt_team(home, Team.create())
    name, damage, fix = DAMAGE[request.param]
    damage(home / name)
    return home, home / name, fix


def test_hyphae_up_says_what_is_wrong_in_one_line_and_exits_3(damaged):
    home, path, fix = damaged
    result = subprocess.run([*HYPHAE, "--home", str(home), "up", "--mesh", "127.0.0.1:0", "--no-discovery"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("hyphae: ") and str(path) in line and fix in line, line
    assert not (home / "daemon.json").exists()


def test_doctor_and_status_report_it_without_a_traceback(damaged, capsys):
    home, path, fix = damaged
    assert main(["--home", str(home), "doctor"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    failed = [line for line in out.splitlines() if line.startswith("fail")]
    assert failed and any(str(path) in line for line in failed), out
    assert main(["--home", str(home), "status"]) == 0  # no daemon: it reads nothing of the data dir
    out, err = capsys.readouterr()
    assert "not running" in out and err == ""


def test_secret_files_other_users_may_read_are_named_at_start(tmp_path):
    home = make_home(tmp_path / "home")
    adopt_team(home, Team.create())
    for name in ("node.key", "team.json"):
        os.chmod(home / name, 0o644)
    daemon = start_daemon(home, "--mesh", "127.0.0.1:0", "--no-discovery")
    assert stop_process(daemon.process) == 0
    log = daemon.log.read_text()
    for name in ("node.key", "team.json"):
        (line,) = [line for line in log.splitlines() if f"{home / name} is readable by other users" in line]
        assert "level=warning" in line and "mode 0644" in line and f"chmod 600 {home / name}" in line, line
