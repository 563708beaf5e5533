"""``hyphae up``: the node daemon, and the composition root of the surfaces.

It owns the data dir (its lock), opens the memory service, and serves one ASGI app on
the API port with our h11 server (``web.server``; hypercorn when
``HYPHAE_HTTP_SERVER=hypercorn``): REST and the dashboard (``api.rest``), ``POST /mcp``
(``mcp_bridge``), metrics and health, and A2A when asked (``api.a2a``, opt-in); beside it, gRPC
(``api.grpc``) on its own port. It is the composition root, the one place that
knows every surface. ``daemon.json`` in the data dir says where it listens, so the
CLI and ``hyphae mcp`` find it; the admin token there lets the data dir's owner manage
agents through it. SIGINT/SIGTERM shut down cleanly: requests drain, indexes are
saved, the lock is released.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import secrets
import signal
import socket
from pathlib import Path
from typing import Any

import trio

from api.grpc import GrpcSurface
from api.rest import RestApi, make_api_app
from api.rest.dashboard import EVENTS_PATH, events_app, static_apps
from api.rest.metrics import metrics_app
from mcp_bridge import Dispatcher, make_mcp_app
from mcp_bridge.local import SOCKET_NAME, bind_local_socket, serve_local_socket
from node.config import load_config
from node.errors import ConfigError, DiskFull, Unavailable
from node.files import open_to_others, write_private
from node.lock import DataDirLock
from node.metrics import InstrumentedTools
from node.service import MemoryService
from node.teams import TEAM_FILE, load_team
from node.version import package_version
from web.asgi import DRAIN_LIMIT, drain_unread_bodies
from web.hosts import HostCheck, guard_hosts
from web.origins import is_loopback_host
from web.server import HttpLimits, serve_asgi, server_choice

from .daemon_file import ADMIN_TOKEN_FILE, DAEMON_FILE, read_daemon_file
from .mesh_node import clock_from_env, run_mesh

__all__ = ["run_daemon", "parse_listen", "DAEMON_FILE", "ADMIN_TOKEN_FILE"]

log = logging.getLogger("hyphae.daemon")

INDEX_SAVE_INTERVAL = 30.0


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address must be HOST:PORT, not {text!r}")
    return host, int(port)


def _grpc_listen(grpc: str | None, api_host: str, api_port: int) -> tuple[str, int]:
    """Where gRPC listens: ``--grpc``, else beside the API (its host, the next port: 7778 for
    the default 7777; an API on port 0 gets a gRPC port of its own choosing too)."""
    if grpc is not None:
        return parse_listen(grpc)
    return api_host, api_port + 1 if 0 < api_port < 65535 else 0


def _bind(host: str, port: int, option: str = "--api") -> socket.socket:
    """A listening socket; a port in use says which ``hyphae up`` option picks another."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            url_host = f"[{host}]" if ":" in host else host
            hint = (f"; another program uses port {port}: pick another with `hyphae up {option} {url_host}:PORT` "
                    f"(or {option.strip('-')}'s `listen` in config.toml)")  # fmt: skip
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _dispatcher(service: MemoryService):
    """The one MCP dispatcher, shared by ``POST /mcp`` and the local socket of ``hyphae mcp``."""
    return Dispatcher(InstrumentedTools(service, service.metrics), server_version=package_version())


def _build_app(service: MemoryService, admin_token: str, closing: trio.Event | None = None, dispatcher=None,
               extra_mounts: dict | None = None):  # fmt: skip
    """The API port's app; ``closing`` ends the dashboard's event streams at shutdown."""
    dispatcher = dispatcher or _dispatcher(service)
    rest = RestApi(service, admin_token)
    mcp_app = make_mcp_app(dispatcher, service.authenticate)
    mounts = {
        "/mcp": mcp_app,
        "/metrics": metrics_app(service.metrics),
        EVENTS_PATH: events_app(service, closing if closing is not None else trio.Event(), admin_token=admin_token),
        **static_apps(),
        **(extra_mounts or {}),
    }
    app = make_api_app(rest, mounts)
    # Our own server drains (or lingers over) what an app leaves unread; hypercorn needs the wrapper.
    return drain_unread_bodies(app) if server_choice() == "hypercorn" else app


async def run_daemon(
    home: Path,
    *,
    api: str | None = None,
    mesh: str | None = None,
    peers: list[str] | None = None,
    discovery: bool | None = None,
    allow_remote: bool = False,
    a2a: bool | None = None,
    grpc: str | None = None,
    no_grpc: bool = False,
    announce=print,
    task_status: trio.TaskStatus[dict[str, Any]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the node in ``home`` until SIGINT/SIGTERM (or cancellation)."""
    config = load_config(home)
    team = load_team(home)  # a damaged team.json is one line and exit 3, before anything starts
    for path, mode in open_to_others([config.key_path, home / TEAM_FILE]):
        log.warning("%s is readable by other users (mode %04o): anyone who can read it can act as this node "
                    "(node.key) or read and inject the team's traffic (team.json); run `chmod 600 %s`",
                    path, mode, path)  # fmt: skip
    host, port = parse_listen(api or config.api_listen)
    a2a = config.a2a_enabled if a2a is None else a2a
    if a2a:
        # Imported here, before anything starts: without the SDK installed, one clear line (ConfigError).
        from api.a2a import A2A_PATH, CARD_PATH, make_a2a_mounts
    if not allow_remote and not is_loopback_host(host):
        raise ConfigError(
            f"refusing to serve the API on {host}: it is not a loopback address. "
            "Agents' memories would be reachable from the network; pass --allow-remote if you mean it"
        )
    if no_grpc and grpc is not None:
        raise ConfigError("--grpc and --no-grpc contradict each other: give one")
    grpc_at = None if no_grpc else _grpc_listen(grpc, host, port)
    if grpc_at is not None and not allow_remote and not is_loopback_host(grpc_at[0]):
        raise ConfigError(f"refusing to serve gRPC on {grpc_at[0]}: it is not a loopback address; "
                          "pass --allow-remote if you mean it")  # fmt: skip
    lock = DataDirLock(config.lock_path)
    try:
        lock.acquire(timeout=0)
    except OSError as exc:
        raise _startup_error(exc, home) from None
    except Unavailable:
        info = read_daemon_file(home)
        where = f" at {info['api_url']} (pid {info['pid']})" if info else ""
        raise Unavailable(f"a Hyphae node already runs for {home}{where}") from None
    daemon_file = home / DAEMON_FILE
    surface: GrpcSurface | None = None
    try:
        service = await MemoryService.open(config, clock=clock_from_env())  # None unless a test sets the hook
        try:
            sock = _bind(host, port)
            bound_host, bound_port = sock.getsockname()[:2]
            url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
            api_url = f"http://{url_host}:{bound_port}"
            admin_token = secrets.token_urlsafe(32)
            try:
                write_private(home / ADMIN_TOKEN_FILE, admin_token + "\n")
            except OSError as exc:
                raise _startup_error(exc, home) from None
            # On loopback every client is the one address (32 agents and a dashboard in the load
            # test): a limit per address would be a second max_connections. Served to the network
            # (--allow-remote), one address may hold 64: a host's agents, two connections each.
            limits = HttpLimits(
                keep_alive_timeout=75, graceful_timeout=5, max_body_bytes=DRAIN_LIMIT,
                max_connections_per_address=None if is_loopback_host(host) else 64,
            )  # fmt: skip
            info = {
                "pid": os.getpid(),
                "api_url": api_url,
                "node_id": service.node_id,
                "version": package_version(),
            }
            shutdown = trio.Event()
            dispatcher = _dispatcher(service)
            try:
                hosts = HostCheck(bound_host, bound_port, config.allowed_hosts)
            except ValueError as exc:
                sock.close()
                raise ConfigError(f"{home / 'config.toml'}: [api] allowed_hosts: {exc}") from None
            # Opt-in surfaces: mounted only when on, so their paths are 404 otherwise.
            extra = {}
            if a2a:
                extra.update(make_a2a_mounts(service, api_url, package_version(), config.node_name))
                info["a2a_url"] = f"{api_url}{A2A_PATH}"
            app = guard_hosts(_build_app(service, admin_token, shutdown, dispatcher, extra), hosts)
            local_sock = bind_local_socket(home / SOCKET_NAME)
            if local_sock is not None:
                info["mcp_socket"] = str(home / SOCKET_NAME)
            served = trio.Event()
            if grpc_at is not None:
                surface = GrpcSurface(service)
                info["grpc_address"] = surface.bind(*grpc_at)

            async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await serve_asgi(app, sock, shutdown_trigger=shutdown.wait, limits=limits, task_status=task_status)
                finally:
                    served.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, shutdown)
                nursery.start_soon(_save_indexes_periodically, service)
                await nursery.start(run_server)
                if surface is not None:
                    surface.start()
                    announce(f"gRPC: hyphae.v1.Memory on {info['grpc_address']}")
                if local_sock is not None:
                    await nursery.start(serve_local_socket, local_sock, dispatcher, service.authenticate)
                if team is not None:
                    mesh_host, mesh_port = parse_listen(mesh or config.mesh_listen)
                    mesh_sock = _bind(mesh_host, mesh_port, "--mesh")
                    started = await nursery.start(
                        functools.partial(
                            run_mesh,
                            service,
                            team,
                            mesh_sock,
                            peers=[*config.peers, *(peers or [])],
                            discovery=config.discovery if discovery is None else discovery,
                        )
                    )
                    info["mesh_address"] = started["mesh_address"]
                    announce(f"Mesh: team {team.team_id} on {started['mesh_address']}")
                else:
                    announce("Mesh: off (this node is in no team; see `hyphae team create|join`)")
                write_private(daemon_file, json.dumps(info))
                announce(f"Hyphae node {service.node_id} serving {api_url} (MCP: {api_url}/mcp) from {home}")
                if a2a:
                    announce(f"A2A: {info['a2a_url']} (Agent Card: {api_url}{CARD_PATH})")
                if not is_loopback_host(bound_host) and not config.allowed_hosts:
                    announce("API: only loopback names and the listen address are answered (DNS-rebinding guard); "
                             "list the names remote clients use in [api] allowed_hosts")  # fmt: skip
                task_status.started(info)
                await served.wait()  # the server returns once shutdown was asked for and requests drained
                if surface is not None:
                    await surface.stop()
                nursery.cancel_scope.cancel()
            announce("Shutting down: requests drained; saving indexes.")
        finally:
            if surface is not None:
                surface.server.stop(None)  # an exit by error: its calls end now, before the service closes
            daemon_file.unlink(missing_ok=True)
            (home / SOCKET_NAME).unlink(missing_ok=True)
            (home / ADMIN_TOKEN_FILE).unlink(missing_ok=True)
            await service.aclose()
    finally:
        lock.release()


def _startup_error(exc: OSError, home: Path) -> Exception:
    """What a start that cannot write its small files (lock, admin token) says: a full disk is
    named as such, with what to do, rather than shown as a traceback."""
    if exc.errno == errno.ENOSPC:
        return DiskFull(f"cannot start: the disk holding {home} is full; free some space and start again")
    return exc


async def _watch_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            log.info("signal received; shutting down")
            shutdown.set()


async def _save_indexes_periodically(service: MemoryService) -> None:
    while True:
        await trio.sleep(INDEX_SAVE_INTERVAL)
        await trio.to_thread.run_sync(service.layers.save)
