"""Running the node: the daemon, the stdio MCP server, and what the node is doing."""

from __future__ import annotations

import argparse
import os
import sys

import trio

from node.errors import Unauthenticated
from .plumbing import EXIT_AUTH, EXIT_FAILED, EXIT_OK, CliError, act, administer, emit_json

def cmd_up(args: argparse.Namespace) -> int:
    from ..daemon import run_daemon

    def announce(line: str) -> None:
        print(line, flush=True)

    trio.run(
        lambda: run_daemon(
            args.home,
            api=args.api,
            mesh=args.mesh,
            peers=args.peer,
            discovery=False if args.no_discovery else None,
            allow_remote=args.allow_remote,
            a2a=args.a2a or None,
            grpc=args.grpc,
            no_grpc=args.no_grpc,
            announce=announce,
        )
    )
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdin/stdout for one agent session, relayed to the data dir's daemon."""
    from mcp_bridge import HttpRelay, serve_stdio
    from mcp_bridge.local import SocketRelay

    from ..client import DaemonClient, ensure_daemon, key_is_active, running_daemon
    from node.config import load_config

    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set; give the MCP host the key from `hyphae agent add NAME`", EXIT_AUTH)
    from node.data_dir import require_database

    require_database(load_config(args.home))  # no data dir, or a lost database: say so before starting anything
    if running_daemon(args.home) is None and not key_is_active(args.home, api_key):
        raise Unauthenticated("HYPHAE_API_KEY is not valid for this data dir (unknown or revoked)")
    info = ensure_daemon(args.home)
    client = DaemonClient(args.home, info, api_key)
    try:
        who = client.call("GET", "/v1/whoami")  # the key is resolved once, before anything is served
    finally:
        client.close()
    # Say how calls travel: over the data dir's local socket when the daemon has one, else its HTTP port.
    via = "relaying over the local socket" if info.get("mcp_socket") else f"relaying over HTTP to {info['api_url']}/mcp"
    print(f"hyphae mcp: serving agent {who['name']!r}, {via}", file=sys.stderr)

    async def serve() -> None:
        if info.get("mcp_socket"):  # same machine: the daemon's Unix socket, no HTTP per call
            relay = SocketRelay(info["mcp_socket"], api_key)
            try:
                await serve_stdio(relay)
            finally:
                await relay.aclose()
            return
        import httpx  # only without the socket (another machine's daemon): ~0.1 s of start-up otherwise

        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0)) as http:
            await serve_stdio(HttpRelay(info["api_url"], api_key, http))

    trio.run(serve)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """End the data dir's daemon as Ctrl-C would (SIGTERM: requests drain, indexes are saved,
    the lock is released) and wait until it is gone."""
    import signal
    import time

    from ..client import running_daemon

    info = running_daemon(args.home)  # daemon.json counts only while its lock is held: the pid is live
    if info is None:
        if args.json:
            emit_json({"home": str(args.home), "stopped": False, "running": False})
        else:
            print(f"No node is running for {args.home}.")
        return EXIT_OK
    pid = info["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended between the look and the signal
    except PermissionError:
        raise CliError(f"the node for {args.home} runs as another user (pid {pid}); stop it as that user") from None
    deadline = time.monotonic() + args.timeout
    while running_daemon(args.home) is not None:
        if time.monotonic() > deadline:
            raise CliError(f"the node (pid {pid}) has not stopped after {args.timeout:g} s; "
                           f"it may still be saving its indexes: wait, or `kill {pid}` again")  # fmt: skip
        time.sleep(0.05)
    if args.json:
        emit_json({"home": str(args.home), "stopped": True, "pid": pid})
    else:
        print(f"Stopped the node for {args.home} (pid {pid}).")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from ..client import running_daemon

    info = running_daemon(args.home)
    status = {"home": str(args.home), "daemon": info}
    if info is not None:
        status["mesh"] = administer(args, "peers")
    if info is not None and os.environ.get("HYPHAE_API_KEY"):
        status["stats"] = act(args, "stats")
    if args.json:
        emit_json(status)
        return EXIT_OK
    print(f"data dir  {args.home}")
    if info is None:
        print("daemon    not running (start it with `hyphae up`)")
    else:
        print(f"daemon    {info['api_url']} (pid {info['pid']}, node {info['node_id']})")
    mesh = status.get("mesh")
    if mesh is not None:
        if not mesh.get("enabled"):
            print("mesh      off (no team: `hyphae team create|join`)")
        else:
            states: dict[str, int] = {}
            for peer in mesh["peers"]:
                states[peer["state"]] = states.get(peer["state"], 0) + 1
            summary = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "no peers yet"
            queued = sum(peer["queue_depth"] for peer in mesh["peers"])
            drops = sum((mesh.get("drops") or {}).values())
            print(f"mesh      team {mesh['team_id']} at {mesh['address']}: {summary}; queued {queued}; drops {drops}")
            for conflict in (mesh.get("identity") or {}).get("conflicts", []):
                print(f"identity  CONFLICT: {conflict.get('message', conflict['evidence'])}")
            for outdated in mesh.get("outdated_peers") or []:
                print(f"outdated  {outdated['message']}")
    if "stats" in status:
        stats = status["stats"]
        layers = ", ".join(f"{layer} {count}" for layer, count in sorted(stats["layers"].items())) or "empty"
        print(f"cells     {stats['cells']}  (layers: {layers})")
    return EXIT_OK


def cmd_peers(args: argparse.Namespace) -> int:
    from ..client import running_daemon

    if running_daemon(args.home) is None:
        raise CliError("no node is running for this data dir: start it with `hyphae up`")
    status = administer(args, "peers")
    if args.json:
        emit_json(status)
        return EXIT_OK
    if not status.get("enabled"):
        print("Mesh is off: this node is in no team (`hyphae team create|join`).")
        return EXIT_OK
    print(f"node {status['node_id']} at {status['address']}, team {status['team_id']}")
    if not status["peers"]:
        print("No peers yet (LAN discovery runs; add static ones with `hyphae up --peer HOST:PORT`).")
    from ..term import paint

    colours = {"alive": "green", "suspect": "yellow", "dead": "red"}
    for peer in status["peers"]:
        state = paint(f"{peer['state']:<8}", colours.get(peer["state"], "dim"), sys.stdout)
        print(f"  {peer['node_id'][:12]}  {peer['address']:<22} {state} queue={peer['queue_depth']}")
    drops = status.get("drops") or {}
    if drops:
        print("drops: " + ", ".join(f"{reason}={count}" for reason, count in sorted(drops.items())))
    for conflict in (status.get("identity") or {}).get("conflicts", []):
        print(paint("identity conflict: ", "red", sys.stdout) + conflict.get("message", conflict["evidence"]))
    for outdated in status.get("outdated_peers") or []:
        print(paint("outdated: ", "yellow", sys.stdout) + outdated["message"])
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import FAIL, run_doctor
    from ..term import paint

    checks = run_doctor(args.home)
    failed = any(check.status == FAIL for check in checks)
    if args.json:
        emit_json({"ok": not failed, "checks": [check.to_dict() for check in checks]})
        return EXIT_FAILED if failed else EXIT_OK
    colours = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in checks:
        status = paint(f"{check.status:<4}", colours[check.status], sys.stdout)
        print(f"{status}  {check.name:<13} {check.message}")
        if check.fix:
            print(f"      {'':<13} fix: {check.fix}")
    warned = sum(check.status == "warn" for check in checks)
    failures = sum(check.status == FAIL for check in checks)
    print(f"{len(checks)} checks: {failures} failed, {warned} warnings." if failures or warned else f"{len(checks)} checks: all ok.")
    return EXIT_FAILED if failed else EXIT_OK


