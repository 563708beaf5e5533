"""Real ``hyphae up`` processes in one team on 127.0.0.1: the harness of the mesh tests and benchmark.

A :class:`Lab` owns every data dir and process it makes. Each :class:`MeshNode` is a data
dir (``hyphae init`` + ``team create|join``, either through the CLI as a user would or
in-process for speed) whose config is edited to listen on ephemeral loopback ports; its
daemon is ``python -m app.cli --home DIR up ...`` as a child process, found through
``daemon.json`` and ``/healthz``. :meth:`Lab.close` stops everything (SIGTERM to all,
then SIGKILL after ``GRACE`` seconds, then reaped), and the pytest fixture calls it in
teardown whatever happened in the test.

Talking to a node: REST with httpx (:meth:`MeshNode.rest`; admin routes with the data
dir's ``admin.token``), MCP over HTTP as JSON-RPC (:class:`McpClient`), the CLI
(:meth:`MeshNode.cli`). Every wait has a deadline (:func:`wait_until`).

This module has no pytest dependency, so ``benchmarks/mesh_bench.py`` uses it too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

HYPHAE = (sys.executable, "-m", "app.cli")
DEADLINE = 30.0  # seconds, for anything without a tighter deadline of its own
START_DEADLINE = 60.0  # a daemon with the built-in model on a busy 2-core machine
GRACE = 5.0  # seconds between SIGTERM and SIGKILL

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_until(
    predicate: Callable[[], T], timeout: float, *, interval: float = 0.02, message: str | Callable[[], str] = ""
) -> T:
    """Call ``predicate`` until it returns something truthy (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"not within {timeout} s: {text}")
        time.sleep(interval)


# -- processes ------------------------------------------------------------------------


def stop_processes(processes: Iterable[subprocess.Popen], grace: float = GRACE) -> None:
    """SIGTERM every live one, wait up to ``grace`` s, SIGKILL the rest, reap all."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)


def run_cli(home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = DEADLINE) -> str:
    """``hyphae --home HOME ARGS...`` to completion; its stdout (fails on a non-zero exit)."""
    result = subprocess.run(
        [*HYPHAE, "--home", str(home), *args], env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"hyphae {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


def run_cli_parallel(calls: Sequence[tuple[Path, Sequence[str]]], timeout: float = DEADLINE) -> list[str]:
    """Several ``hyphae`` commands at once (each on its own data dir); their stdouts."""
    processes = [
        subprocess.Popen([*HYPHAE, "--home", str(home), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
        for home, args in calls
    ]  # fmt: skip
    outputs = []
    try:
        for (_, args), process in zip(calls, processes):
            out, err = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise AssertionError(f"hyphae {' '.join(args)} exited {process.returncode}:\n{err}")
            outputs.append(out)
    finally:
        stop_processes(processes)
    return outputs


# -- data dirs ------------------------------------------------------------------------

_LISTEN_EDITS = (('listen = "127.0.0.1:7777"', 'listen = "127.0.0.1:0"'), ('listen = "0.0.0.0:7979"', 'listen = "127.0.0.1:0"'))


def edit_config(home: Path, provider: str) -> None:
    """Ephemeral loopback ports for API and mesh; the embedder ``provider``."""
    path = home / "config.toml"
    text = path.read_text()
    for old, new in (*_LISTEN_EDITS, ('provider = "builtin"', f'provider = "{provider}"')):
        if old not in text:
            raise AssertionError(f"{path} no longer has the line {old!r}")
        text = text.replace(old, new)
    path.write_text(text)


def team_of(home: Path) -> tuple[str, bytes]:
    """``(team_id, team_key)`` from the data dir's ``team.json`` (for in-test frame forging)."""
    import base64

    data = json.loads((home / "team.json").read_text())
    return data["team_id"], base64.b64decode(data["team_key"])


# -- one node -------------------------------------------------------------------------


class MeshNode:
    """A data dir and, while started, its daemon process (a child of this process)."""

    def __init__(self, lab: "Lab", name: str, home: Path, provider: str) -> None:
        self.lab = lab
        self.name = name
        self.home = home
        self.provider = provider
        self.log = home.parent / f"{name}-daemon.log"
        self.process: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self.starts = 0
        self.env: dict[str, str] = {}  # extra environment of the daemon (test hooks), kept across restarts
        self._http: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"<MeshNode {self.name} {self.info.get('api_url', 'stopped')}>"

    # -- identity and addresses

    @property
    def node_id(self) -> str:
        return self.info["node_id"]

    @property
    def api_url(self) -> str:
        return self.info["api_url"]

    @property
    def mesh_address(self) -> str:
        return self.info["mesh_address"]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    # -- the daemon

    def launch(self, *, peers: Sequence[str] = (), discovery: bool = False, extra: Sequence[str] = ()) -> None:
        """Start ``hyphae up`` (returns at once; :meth:`wait_serving` waits for it)."""
        if self.running:
            raise AssertionError(f"{self.name} already runs")
        args = ["up"]
        for peer in peers:
            args += ["--peer", peer]
        if not discovery:
            args.append("--no-discovery")
        args += list(extra)
        (self.home / "daemon.json").unlink(missing_ok=True)  # a stale one from a killed daemon
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n=== start {self.starts}: {' '.join(args)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                [*HYPHAE, "--home", str(self.home), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )  # fmt: skip
        self.lab.processes.append(self.process)

    def wait_serving(self, timeout: float = START_DEADLINE) -> dict[str, Any]:
        """Wait for this start's ``daemon.json`` and a 200 from ``/healthz``."""
        assert self.process is not None
        pid = self.process.pid

        def ready() -> dict[str, Any] | None:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name}'s daemon exited {self.process.returncode}:\n{self.log_tail()}")
            try:
                info = json.loads((self.home / "daemon.json").read_text())
            except (OSError, ValueError):
                return None
            if info.get("pid") != pid:
                return None
            try:
                ok = httpx.get(f"{info['api_url']}/healthz", timeout=2.0).status_code == 200
            except httpx.TransportError:
                return None
            return info if ok else None

        self.info = wait_until(ready, timeout, interval=0.05, message=lambda: f"{self.name} serving\n{self.log_tail()}")
        self._close_http()
        return self.info

    def start(self, *, peers: Sequence[str] = (), discovery: bool = False, extra: Sequence[str] = (),
              timeout: float = START_DEADLINE) -> "MeshNode":  # fmt: skip
        self.launch(peers=peers, discovery=discovery, extra=extra)
        self.wait_serving(timeout)
        return self

    def kill(self) -> int | None:
        """SIGKILL, no warning (a crash); returns the exit code once reaped."""
        self._close_http()
        if self.process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        return self.process.wait(GRACE)

    # -- test hooks (read by the daemon from its environment; see app/mesh_node.py)

    @property
    def faults_file(self) -> Path:
        return self.home.parent / f"{self.name}-faults.json"

    def hook_faults(self) -> None:
        """From the next start on, the daemon's mesh transport follows :meth:`set_faults`."""
        self.set_faults()
        self.env["HYPHAE_MESH_FAULTS"] = str(self.faults_file)

    def set_faults(self, *, partition: Iterable[str] = (), delay: dict[str, float] | None = None,
                   loss: dict[str, float] | None = None) -> None:  # fmt: skip
        """Replace the running daemon's faults (written atomically; it re-reads within 0.1 s)."""
        spec = {"partition": list(partition), "delay": delay or {}, "loss": loss or {}}
        scratch = self.faults_file.with_suffix(".tmp")
        scratch.write_text(json.dumps(spec))
        os.replace(scratch, self.faults_file)

    def skew_clock(self, offset_ms: int) -> None:
        """From the next start on, the whole node's clock runs ``offset_ms`` off the wall clock."""
        self.env["HYPHAE_CLOCK_OFFSET_MS"] = str(offset_ms)

    def stop(self, grace: float = GRACE) -> int | None:
        """SIGTERM, then SIGKILL after ``grace``; returns the exit code."""
        self._close_http()
        if self.process is None:
            return None
        stop_processes([self.process], grace)
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- REST, admin, CLI

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(base_url=self.api_url, timeout=DEADLINE, trust_env=False)
        return self._http

    def _close_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def rest(self, method: str, path: str, key: str | None = None, *, admin: bool = False, expect: int | None = None,
             **kwargs: Any) -> Any:  # fmt: skip
        headers = kwargs.pop("headers", {})
        if key is not None:
            headers["x-hyphae-key"] = key
        if admin:
            headers["x-hyphae-admin"] = self.admin_token()
        response = self.http.request(method, path, headers=headers, **kwargs)
        if expect is not None:
            assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text}"
        elif response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    def add_agent(self, name: str) -> tuple[str, str]:
        """A new agent through the admin API: ``(api_key, agent_id)``."""
        agent = self.rest("POST", "/v1/admin/agents", admin=True, json={"name": name}, expect=201)
        return agent["api_key"], agent["agent_id"]

    def peers(self) -> dict[str, Any]:
        """``GET /v1/admin/peers``: the mesh status with peers, counters and drops."""
        return self.rest("GET", "/v1/admin/peers", admin=True)

    def alive_peers(self) -> set[str]:
        return {p["node_id"] for p in self.peers().get("peers", []) if p["state"] == "alive"}

    def cli(self, *args: str, key: str | None = None, timeout: float = DEADLINE) -> str:
        return run_cli(self.home, *args, env={"HYPHAE_API_KEY": key} if key else None, timeout=timeout)

    def mcp(self, key: str) -> "McpClient":
        return McpClient(self, key)


class McpClient:
    """MCP over HTTP (``POST /mcp``), JSON-RPC 2.0, stateless: one POST per message."""

    VERSION = "2025-11-25"

    def __init__(self, node: MeshNode, key: str, *, initialize: bool = True) -> None:
        self.node = node
        self.key = key
        self._ids = itertools.count(1)
        if initialize:
            result = self.request("initialize", {
                "protocolVersion": self.VERSION, "capabilities": {}, "clientInfo": {"name": "e2e-mesh", "version": "0"},
            })  # fmt: skip
            assert result["result"]["protocolVersion"] == self.VERSION, result
            self.notify("notifications/initialized")

    def _post(self, message: dict[str, Any]) -> httpx.Response:
        return self.node.http.post(
            "/mcp", json=message,
            headers={"x-hyphae-key": self.key, "mcp-protocol-version": self.VERSION,
                     "accept": "application/json, text/event-stream"},
        )  # fmt: skip

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = self._post(message)
        assert response.status_code == 200, f"{method}: HTTP {response.status_code} {response.text}"
        body = response.json()
        assert body.get("id") == request_id, body
        return body

    def notify(self, method: str) -> None:
        response = self._post({"jsonrpc": "2.0", "method": method})
        assert response.status_code == 202, response.text

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """``tools/call``; the structuredContent of a successful result."""
        body = self.request("tools/call", {"name": tool, "arguments": arguments or {}})
        assert "error" not in body, body
        result = body["result"]
        assert result.get("isError") is False, result
        return result["structuredContent"]


# -- the lab --------------------------------------------------------------------------


class Lab:
    """Data dirs under ``root`` and every process started for them; :meth:`close` stops all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[MeshNode] = []
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for node in self.nodes:
            node._close_http()
        stop_processes(self.processes)

    def _new(self, name: str, provider: str) -> MeshNode:
        node = MeshNode(self, name, self.root / name, provider)
        self.nodes.append(node)
        return node

    def team(self, names: Sequence[str], *, provider: str = "hashed", via_cli: bool = False) -> list[MeshNode]:
        """Fresh data dirs, one team: the first creates it, the others join with its token.

        The data dirs are made in-process (``init_home``, what ``hyphae init`` runs).
        ``via_cli`` then runs ``hyphae team create`` (its join token is the last stdout
        line) and ``hyphae team join TOKEN`` as a user would; otherwise the team is
        adopted in-process (``adopt_team``), which saves a few seconds of interpreter
        start-ups on a busy machine.
        """
        from mesh.team import Team
        from app.home import init_home
        from node.teams import adopt_team

        nodes = [self._new(name, provider) for name in names]
        for node in nodes:
            init_home(node.home)
            edit_config(node.home, provider)
        if via_cli:
            token = run_cli(nodes[0].home, "team", "create").strip().splitlines()[-1]
            assert token.startswith("hyphae1."), token
            run_cli_parallel([(n.home, ["team", "join", token]) for n in nodes[1:]])
            assert len({team_of(n.home) for n in nodes}) == 1
        else:
            team = Team.create()
            for node in nodes:
                adopt_team(node.home, team)
        return nodes

    def start_all(self, nodes: Sequence[MeshNode], *, peers: Sequence[str] = (), discovery: bool = False,
                  timeout: float = START_DEADLINE) -> None:  # fmt: skip
        """Start several daemons at once and wait for all of them."""
        for node in nodes:
            node.launch(peers=peers, discovery=discovery)
        for node in nodes:
            node.wait_serving(timeout)

    def start_mesh(self, nodes: Sequence[MeshNode], *, timeout: float = START_DEADLINE) -> None:
        """The first node alone, then the rest at once with it as their static peer; wait
        until every node sees every other one alive (peer diffs spread the addresses)."""
        first, rest = nodes[0], nodes[1:]
        first.start(timeout=timeout)
        self.start_all(rest, peers=[first.mesh_address], timeout=timeout)
        wait_connected(nodes)


def wait_connected(nodes: Sequence[MeshNode], timeout: float = DEADLINE) -> float:
    """Every node lists every other one as alive; returns the seconds it took."""
    started = time.monotonic()
    for node in nodes:
        others = {n.node_id for n in nodes if n is not node}
        wait_until(lambda: others <= node.alive_peers(), timeout, interval=0.1,
                   message=lambda: f"{node.name} sees {node.peers().get('peers')}")  # fmt: skip
    return time.monotonic() - started


def wait_outbox_idle(node: MeshNode, timeout: float = DEADLINE) -> dict[str, Any]:
    """Until nothing is queued for, or in flight to, any of ``node``'s peers; its status then.

    An origin routes a cell when it is stored, and a diff leaves its outbox only when the
    peer acknowledged it, which that peer's engine does after accepting it. So once the
    origin's outbox is idle, every peer it sent to has the cell (``cells_delivered``), and
    a peer without it was never sent it: a negative check that needs no waiting "long enough".
    """

    def idle() -> dict[str, Any] | None:
        status = node.peers()
        busy = [p for p in status["peers"] if p.get("queue_depth") or p.get("inflight_batches")]
        return None if busy else status

    return wait_until(idle, timeout, interval=0.02, message=lambda: f"{node.name}'s outbox: {node.peers()['peers']}")


def wait_frames_handled(node: MeshNode, timeout: float = DEADLINE) -> dict[str, Any]:
    """Until ``node``'s engine has handled every frame its endpoint took in so far (accepted
    or dropped, each one counted); its status then."""

    def handled() -> dict[str, Any] | None:
        status = node.peers()
        return status if status["frames_received"] >= status["runtime"]["frames_queued"] else None

    return wait_until(handled, timeout, interval=0.02, message=lambda: f"{node.name} handling its frames")


def wait_beacons_known(node: MeshNode, count: int, timeout: float = DEADLINE) -> float:
    """``node``'s engine knows at least ``count`` remote beacons; returns the seconds it took."""
    started = time.monotonic()
    wait_until(lambda: node.peers().get("beacons_known", 0) >= count, timeout, interval=0.02,
               message=lambda: f"{node.name} knows {node.peers().get('beacons_known')} beacons, wanted {count}")  # fmt: skip
    return time.monotonic() - started
