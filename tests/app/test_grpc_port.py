"""Where ``hyphae up`` serves gRPC: beside the API by default, ``--grpc HOST:PORT``, off with
``--no-grpc``, never on a non-loopback address without ``--allow-remote``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from app.daemon import _grpc_listen
from tests.e2e.conftest import DEADLINE, make_home, run_cli, start_daemon


@pytest.mark.parametrize(("grpc", "api", "expected"), [
    (None, ("127.0.0.1", 7777), ("127.0.0.1", 7778)),  # the defaults: 7777 and 7778
    (None, ("127.0.0.1", 9000), ("127.0.0.1", 9001)),
    (None, ("127.0.0.1", 0), ("127.0.0.1", 0)),  # an ephemeral API port: an ephemeral gRPC port
    (None, ("::1", 65535), ("::1", 0)),
    ("127.0.0.2:5000", ("127.0.0.1", 7777), ("127.0.0.2", 5000)),
])  # fmt: skip
def test_grpc_listens_beside_the_api_unless_told(grpc, api, expected) -> None:
    assert _grpc_listen(grpc, *api) == expected


def test_no_grpc_serves_none_and_grpc_picks_the_address(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    daemon = start_daemon(home, "--no-grpc")
    try:
        assert "grpc_address" not in json.loads((home / "daemon.json").read_text())
    finally:
        daemon.stop()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start_daemon(home, "--grpc", f"127.0.0.1:{port}")  # a port just free; nobody else binds here
    try:
        assert json.loads((home / "daemon.json").read_text())["grpc_address"] == f"127.0.0.1:{port}"
    finally:
        daemon.stop()


@pytest.mark.parametrize(("args", "says"), [
    (("--grpc", "0.0.0.0:0"), "refusing to serve gRPC on 0.0.0.0"),
    (("--grpc", "127.0.0.1:0", "--no-grpc"), "--grpc and --no-grpc"),
    (("--grpc", "localhost"), "must be HOST:PORT"),
])  # fmt: skip
def test_a_bad_grpc_address_is_one_line_and_nothing_starts(tmp_path: Path, args, says) -> None:
    home = make_home(tmp_path / "home")
    result = run_cli(home, "up", "--no-discovery", *args, check=False, timeout=DEADLINE)
    assert result.returncode != 0 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (home / "daemon.json").exists()


def test_a_grpc_port_in_use_says_which_option_picks_another(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(home, "up", "--no-discovery", "--grpc", f"127.0.0.1:{port}", check=False, timeout=DEADLINE)
    assert result.returncode != 0, result.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in result.stderr and "--grpc HOST:PORT" in result.stderr
    assert not (home / "daemon.json").exists()
