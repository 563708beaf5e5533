"""Running the mesh inside the daemon: engine, runtime, mesh port, discovery.

Only a node that belongs to a team runs the mesh. The mesh port serves the gossip
endpoints alone (``/mesh/v1/...``); every frame on it is sealed with the team key and
carries membership proofs, so discovery (zeroconf on the LAN, static peers from config
or ``--peer``) only *proposes* addresses.

Two test hooks, for fault tests with real processes, read from the environment of
``hyphae up`` and off unless set (the daemon logs a warning when one is on):

* ``HYPHAE_MESH_FAULTS=/path/faults.json``: the mesh transport follows the fault spec in
  that file (partitions, delay, loss; see ``FaultPlan.apply_spec``), re-read whenever it
  changes, so a test partitions, slows or heals a running daemon by rewriting a file.
* ``HYPHAE_CLOCK_OFFSET_MS=N``: the whole node (stamps, the mesh engine's clock) runs N ms
  ahead of the wall clock (negative: behind), to test members with skewed clocks.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from mesh.config import MeshConfig
from mesh.engine import MeshEngine
from mesh.events import PeerDiscovered
from mesh.runtime import Discovery, FaultPlan, HttpTransport, MeshRuntime, make_mesh_app, serve_mesh, watch_fault_file
from mesh.team import Team

from .mesh_link import MeshLink
from node.service import MemoryService

__all__ = ["run_mesh", "clock_from_env", "FAULTS_ENV", "CLOCK_OFFSET_ENV"]

log = logging.getLogger("hyphae.mesh")

FAULTS_ENV = "HYPHAE_MESH_FAULTS"
CLOCK_OFFSET_ENV = "HYPHAE_CLOCK_OFFSET_MS"


def clock_from_env(environ: Mapping[str, str] = os.environ) -> Callable[[], int] | None:
    """A wall clock shifted by ``HYPHAE_CLOCK_OFFSET_MS`` (test hook), or None when unset."""
    raw = environ.get(CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return None
    try:
        offset = int(raw)
    except ValueError:
        raise ValueError(f"{CLOCK_OFFSET_ENV} must be an integer number of ms, not {raw!r}") from None
    log.warning("test hook: this node's clock runs %+d ms off the wall clock (%s)", offset, CLOCK_OFFSET_ENV)
    return lambda: time.time_ns() // 1_000_000 + offset


def advertised_host(bind_host: str) -> str:
    """Where peers can reach us: the bind address, or this host's LAN address for a wildcard.

    For a wildcard bind, the address the kernel would send from towards the mDNS group
    comes first (a UDP connect sends nothing); the host name's address only after it,
    because many systems map their host name to a loopback address in /etc/hosts
    (Debian and Ubuntu: 127.0.1.1), which teammates cannot reach and which would also
    confine zeroconf to the loopback interface. Loopback is the last resort.
    """
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    for candidate in (_source_address("224.0.0.251", 5353), _hostname_address()):
        if candidate and not candidate.startswith("127.") and candidate != "0.0.0.0":
            return candidate
    return "127.0.0.1"


def _source_address(host: str, port: int) -> str | None:
    """The local IPv4 address a datagram to ``host`` would leave from (nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError:
        return None


def _hostname_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


async def run_mesh(
    service: MemoryService,
    team: Team,
    sock: socket.socket,
    *,
    peers: list[str],
    discovery: bool,
    task_status: trio.TaskStatus[dict[str, Any]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the mesh for ``service`` on the bound socket until cancelled."""
    bind_host, port = sock.getsockname()[:2]
    host = advertised_host(bind_host)
    address = f"{host}:{port}"
    engine = MeshEngine(
        service.identity, MeshConfig(team=team, address=address), service.storage.diff_log(), energy=service.energy
    )
    faults_path = os.environ.get(FAULTS_ENV, "").strip()
    faults = FaultPlan() if faults_path else None
    transport = HttpTransport(faults=faults, max_frame_bytes=engine.config.limits.max_frame_bytes)
    link: MeshLink | None = None
    runtime = MeshRuntime(engine, transport=transport, sink=_LazySink(lambda: link), clock=service.clock)
    link = MeshLink(service, runtime.submit)
    app = make_mesh_app(runtime, max_frame_bytes=engine.config.limits.max_frame_bytes)
    try:
        async with trio.open_nursery() as nursery:
            if faults is not None:
                log.warning("test hook: mesh faults follow %s (%s)", faults_path, FAULTS_ENV)
                nursery.start_soon(watch_fault_file, faults, faults_path)
            await nursery.start(runtime.run)
            await nursery.start(functools.partial(serve_mesh, app, sock))
            service.mesh = link
            finder: Discovery | None = None
            service.mesh_status = lambda: _status(team, runtime, link, finder)
            await link.start()
            for peer in peers:
                runtime.submit(PeerDiscovered(peer))
            if discovery:
                finder = Discovery(
                    node_id=service.node_id,
                    team_hash=team.id_hash,
                    port=port,
                    addresses=[host],
                    on_peer=lambda peer_address, peer_id: runtime.submit(PeerDiscovered(peer_address, peer_id)),
                    interfaces=[host] if host.startswith("127.") else None,
                )
                nursery.start_soon(finder.run)
            task_status.started({"mesh_address": address})
            await trio.sleep_forever()
    finally:
        service.mesh = None
        service.mesh_status = None
        with trio.CancelScope(shield=True):
            await transport.aclose()


def _status(team: Team, runtime: MeshRuntime, link: MeshLink, finder: Discovery | None) -> dict[str, Any]:
    """The mesh status; team mates zeroconf saw on another protocol join the engine's outdated peers."""
    status = {"enabled": True, "team_id": team.team_id, **runtime.status(), **link.status()}
    if finder is not None and finder.outdated:
        seen = {p["node_id"] for p in status["outdated_peers"]}
        status["outdated_peers"] = status["outdated_peers"] + [
            {"node_id": node_id, "message": message, "via": "zeroconf"}
            for node_id, message in finder.outdated.items() if node_id not in seen
        ]  # fmt: skip
    return status


class _LazySink:
    """The runtime needs its sink before the link (which needs the runtime) exists.

    It passes ``apply_many`` on too: the runtime looks for it on its sink, and without it
    every remote cell of a batch was its own write job, awaited one after the other on
    the engine's task (mesh.md, 2026-12-03).
    """

    def __init__(self, get) -> None:
        self._get = get

    async def apply(self, effect: Any) -> None:
        await self._get().apply(effect)

    async def apply_many(self, effects: list[Any]) -> None:
        await self._get().apply_many(effects)
