"""End-to-end fixtures: real ``hyphae`` processes on fresh data dirs.

Every test here talks to the product the way a user's machine does: a daemon started
with ``python -m app.cli up`` (our h11 server on trio, an ephemeral port on 127.0.0.1, found
through ``daemon.json``), agents made with ``hyphae agent add``, ``hyphae mcp`` driven
over its stdin/stdout. Nothing is imported from the product except to *prepare* a data
dir (``init_home``) and to read constants for comparison.

Rules the helpers keep, so a failing test never leaves a process behind or hangs CI:

- every wait has a deadline (``DEADLINE`` seconds unless said otherwise);
- every process started here is stopped in a ``finally`` or a fixture teardown:
  SIGTERM, then SIGKILL after a grace period, then reaped;
- a daemon that ``hyphae mcp`` started on its own (detached, so not our child) is found
  through ``daemon.json`` and stopped by its pid, which the teardown also remembers in
  case ``daemon.json`` is already gone.

Most data dirs use the hashed embedder (``[embedder] provider = "hashed"``): the daemon
starts in well under a second and nothing here depends on meaning. The story test asks
for the built-in model with ``make_home(provider="builtin")``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.home import init_home

HYPHAE = (sys.executable, "-m", "app.cli")
DEADLINE = 30.0  # seconds: generous, because CI machines are small and busy
GRACE = 5.0  # seconds between SIGTERM and SIGKILL


# -- processes ----------------------------------------------------------------------


def stop_process(process: subprocess.Popen, grace: float = GRACE) -> int | None:
    """SIGTERM, wait ``grace``, SIGKILL, reap. Returns the exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(grace)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return process.returncode


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def stop_pid(pid: int, grace: float = GRACE) -> None:
    """Stop a process we started but are not the parent of (a detached daemon)."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.05)


def run_cli(home: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = DEADLINE, check: bool = True) -> subprocess.CompletedProcess:
    """``hyphae --home HOME ARGS...`` to completion (through the daemon when one runs)."""
    full_env = {**os.environ, **(env or {})}
    result = subprocess.run(
        [*HYPHAE, "--home", str(home), *args],
        env=full_env, input=input, capture_output=True, text=True, timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"hyphae {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


# -- data dirs ----------------------------------------------------------------------


def make_home(path: Path, *, provider: str = "hashed", listen: str = "127.0.0.1:0") -> Path:
    """A fresh data dir whose daemon listens on an ephemeral loopback port."""
    init_home(path)
    config = path / "config.toml"
    text = config.read_text()
    for old, new in (
        ('listen = "127.0.0.1:7777"', f'listen = "{listen}"'),
        ('provider = "builtin"', f'provider = "{provider}"'),
    ):
        assert old in text, f"config.toml no longer has the line {old!r}"
        text = text.replace(old, new)
    config.write_text(text)
    return path


def read_daemon_json(home: Path) -> dict[str, Any] | None:
    try:
        return json.loads((home / "daemon.json").read_text())
    except (OSError, ValueError):
        return None


def wait_healthy(api_url: str, deadline: float) -> None:
    while True:
        try:
            if httpx.get(f"{api_url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{api_url}/healthz did not answer 200 in time")
        time.sleep(0.05)


def wait_for_daemon(home: Path, *, pid: int | None = None, process: subprocess.Popen | None = None,
                    timeout: float = DEADLINE, log: Path | None = None) -> dict[str, Any]:
    """Wait for ``daemon.json`` (of ``pid`` when given) and a healthy ``/healthz``."""
    deadline = time.monotonic() + timeout
    while True:
        info = read_daemon_json(home)
        if info is not None and (pid is None or info.get("pid") == pid):
            wait_healthy(info["api_url"], deadline)
            return info
        if process is not None and process.poll() is not None:
            text = log.read_text(errors="replace") if log else ""
            raise AssertionError(f"the daemon exited {process.returncode} before serving:\n{text}")
        if time.monotonic() > deadline:
            text = log.read_text(errors="replace") if log else ""
            raise AssertionError(f"no daemon.json in {home} after {timeout} s:\n{text}")
        time.sleep(0.05)


@dataclasses.dataclass
class Daemon:
    """A ``hyphae up`` we started and own."""

    home: Path
    process: subprocess.Popen
    info: dict[str, Any]
    log: Path

    @property
    def url(self) -> str:
        return self.info["api_url"]

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"x-hyphae-key": key} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=DEADLINE, **kwargs)

    def stop(self) -> int | None:
        return stop_process(self.process)


def start_daemon(home: Path, *extra: str, timeout: float = DEADLINE) -> Daemon:
    log = home.parent / f"{home.name}-daemon.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [*HYPHAE, "--home", str(home), "up", *extra],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        info = wait_for_daemon(home, pid=process.pid, process=process, timeout=timeout, log=log)
    except BaseException:
        stop_process(process)
        raise
    return Daemon(home, process, info, log)


_names = itertools.count()


def add_agent(home: Path, name: str | None = None, *projects: str) -> str:
    """``hyphae agent add NAME`` (through the daemon when it runs); returns the key."""
    name = name or f"agent{next(_names)}"
    extra = [arg for project in projects for arg in ("--project", project)]
    result = run_cli(home, "agent", "add", name, *extra)
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("hy_"), result.stdout
    return key


def prepare_agents(home: Path, *names: str) -> dict[str, str]:
    """Agents made in this process, on a data dir no daemon serves yet (setup only: faster
    than one ``hyphae agent add`` process per agent, each of which opens the node)."""
    import trio

    from app.home import open_node

    async def make() -> dict[str, str]:
        async with open_node(home) as service:
            return {name: (await service.add_agent(name))[1] for name in names}

    assert read_daemon_json(home) is None, "prepare_agents is for a data dir with no daemon"
    return trio.run(make)


def add_agents(home: Path, *names: str, timeout: float = DEADLINE) -> dict[str, str]:
    """Several ``hyphae agent add`` at once (they go through the daemon, which
    serialises them); returns name -> key."""
    processes = {
        name: subprocess.Popen([*HYPHAE, "--home", str(home), "agent", "add", name],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in names
    }
    keys = {}
    try:
        for name, process in processes.items():
            out, err = process.communicate(timeout=timeout)
            assert process.returncode == 0, f"hyphae agent add {name} exited {process.returncode}:\n{err}"
            keys[name] = out.strip().splitlines()[-1]
            assert keys[name].startswith("hy_"), out
    finally:
        for process in processes.values():
            stop_process(process)
    return keys


# -- raw stdio sessions ----------------------------------------------------------------


class StdioSession:
    """``hyphae mcp`` as a subprocess, spoken to in raw newline-delimited JSON-RPC.

    Reader threads drain stdout (line by line, into a queue) and stderr (kept whole), so
    the child never blocks on a full pipe and every read here has a timeout.
    """

    def __init__(self, home: Path, api_key: str | None, *, env: dict[str, str] | None = None) -> None:
        full_env = {k: v for k, v in os.environ.items() if k != "HYPHAE_API_KEY"}
        if api_key is not None:
            full_env["HYPHAE_API_KEY"] = api_key
        full_env.update(env or {})
        self.process = subprocess.Popen(
            [*HYPHAE, "--home", str(home), "mcp"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr: list[bytes] = []
        self._ids = itertools.count(1)
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        self._stderr_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self._stderr_thread.start()

    def _pump_stdout(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_stderr(self) -> None:
        for chunk in iter(lambda: self.process.stderr.read1(65536), b""):
            self._stderr.append(chunk)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.process.stdin.write(data + b"\n")
        self.process.stdin.flush()

    def recv_line(self, timeout: float = DEADLINE) -> bytes | None:
        """The next raw stdout line (None at EOF)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from hyphae mcp within {timeout} s; stderr:\n{self.stderr}") from None

    def recv(self, timeout: float = DEADLINE) -> dict[str, Any]:
        line = self.recv_line(timeout)
        assert line is not None, f"hyphae mcp closed stdout; stderr:\n{self.stderr}"
        assert line.endswith(b"\n")
        return json.loads(line)

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = DEADLINE) -> dict[str, Any]:
        """Send one request and return its response (nothing else may be in flight)."""
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        response = self.recv(timeout)
        assert response.get("id") == request_id, response
        return response

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        response = self.request("initialize", {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response["result"]

    def call(self, tool: str, arguments: dict[str, Any] | None = None, timeout: float = DEADLINE) -> dict[str, Any]:
        return self.request("tools/call", {"name": tool, "arguments": arguments or {}}, timeout)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()

    def wait(self, timeout: float = DEADLINE) -> int:
        code = self.process.wait(timeout)
        self._stderr_thread.join(timeout)
        return code

    def stop(self) -> None:
        self.close_stdin()
        try:
            self.process.wait(GRACE)
        except subprocess.TimeoutExpired:
            pass
        stop_process(self.process)


def tool_payload(response: dict[str, Any]) -> dict[str, Any]:
    """The structuredContent of a successful tools/call, checked against its text block (recall
    and query add a resource_link per hit after it)."""
    assert "error" not in response, response
    result = response["result"]
    assert result["isError"] is False
    block, *links = result["content"]
    assert all(link["type"] == "resource_link" for link in links)
    assert block["type"] == "text"
    assert json.loads(block["text"]) == result["structuredContent"]
    return result["structuredContent"]


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture
def e2e_home(tmp_path: Path) -> Path:
    """A fresh data dir (hashed embedder, API on 127.0.0.1:0); no daemon."""
    return make_home(tmp_path / "home")


@pytest.fixture
def daemon(e2e_home: Path) -> Iterator[Daemon]:
    """A running ``hyphae up`` on ``e2e_home``, stopped (and reaped) in teardown."""
    running = start_daemon(e2e_home)
    try:
        yield running
    finally:
        running.stop()


class DaemonReaper:
    """Stops daemons that ``hyphae mcp`` started on its own (detached, not our children).

    ``watch(home)`` registers a data dir; ``remember()`` notes the pid in its
    ``daemon.json`` (call it once a daemon runs, in case the file is gone by teardown);
    ``reap()`` stops every pid noted, plus whatever ``daemon.json`` names then.
    """

    def __init__(self) -> None:
        self.homes: list[Path] = []
        self.pids: set[int] = set()

    def watch(self, home: Path) -> Path:
        self.homes.append(home)
        return home

    def remember(self) -> set[int]:
        for home in self.homes:
            info = read_daemon_json(home)
            if info:
                self.pids.add(info["pid"])
        return self.pids

    def reap(self) -> None:
        self.remember()
        for pid in self.pids:
            if pid != os.getpid():
                stop_pid(pid)


@pytest.fixture
def spawned_daemons() -> Iterator[DaemonReaper]:
    reaper = DaemonReaper()
    try:
        yield reaper
    finally:
        reaper.reap()
