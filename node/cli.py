"""``hyphae``: the command line.

Commands that read or write memories act as the agent whose key is in
``HYPHAE_API_KEY``. While a daemon runs for the data dir, every command goes through it
(never around it to the database); ``reindex``, which needs the data dir to itself, says
so and stops. Every read command takes ``--json``. Exit
codes: 0 done, 1 the operation failed, 2 bad usage, 3 no usable data dir or config,
4 not authenticated. Colours and progress bars only on a terminal (``NO_COLOR`` honoured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import trio

from .config import resolve_home
from .energy import CELL_TYPES
from .errors import ConfigError, HyphaeError, Unauthenticated
from .logs import setup_logging

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG, EXIT_AUTH = 0, 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- output -----------------------------------------------------------------------


def emit_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2))


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _short(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- commands -----------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from mesh.identity import NodeIdentity

    from .home import init_home

    config, created = init_home(args.home)
    node_id = NodeIdentity.load(config.key_path).node_id
    if args.json:
        emit_json({"home": str(config.home), "node_id": node_id, "tenant_id": config.tenant_id, "created": created})
        return EXIT_OK
    verb = "Initialised" if created else "Already initialised:"
    print(f"{verb} {config.home}")
    print(f"  node id   {node_id}")
    print(f"  tenant    {config.tenant_id}")
    if created:
        print("Next: `hyphae agent add NAME` to get an API key for an agent.")
    return EXIT_OK


def cmd_agent_add(args: argparse.Namespace) -> int:
    agent = administer(args, "add_agent", name=args.name, projects=args.project)
    if args.json:
        emit_json(agent)
        return EXIT_OK
    scope = ", ".join(agent["projects"]) or "all projects"
    print(f"Agent {agent['name']!r} ({agent['agent_id']}) can read {scope}.", file=sys.stderr)
    print("Its API key is shown once; store it now (e.g. export HYPHAE_API_KEY=...):", file=sys.stderr)
    print(agent["api_key"])
    return EXIT_OK


def cmd_agent_list(args: argparse.Namespace) -> int:
    agents = administer(args, "list_agents")["agents"]
    if args.json:
        emit_json({"agents": agents})
        return EXIT_OK
    if not agents:
        print("No agents yet: `hyphae agent add NAME`.")
    for agent in agents:
        state = f"revoked {_when(agent['revoked_at'])}" if agent["revoked_at"] else "active"
        scope = ",".join(agent["projects"]) or "*"
        print(f"{agent['name']:<20} {state:<28} projects={scope}  id={agent['agent_id']}")
    return EXIT_OK


def cmd_agent_revoke(args: argparse.Namespace) -> int:
    result = administer(args, "revoke_agent", name=args.name)
    if args.json:
        emit_json(result)
    else:
        print(f"Revoked {args.name!r}: its key stops working on the next call.")
    return EXIT_OK


def cmd_store(args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.text == "-" else args.text
    metadata = json.loads(args.metadata) if args.metadata else None
    source_ref = None
    if args.ref:
        kind, _, locator = args.ref.partition(":")
        source_ref = {"kind": kind, "locator": locator}
    fields = {
        "content": content,
        "cell_type": args.type,
        "salience": args.salience,
        "project": args.project,
        "scene_id": args.scene,
        "source_ref": source_ref,
        "metadata": metadata,
        "idempotency_key": args.idempotency_key,
    }
    result = act(args, "store", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
    else:
        print(result["node_id"])
    return EXIT_OK


def cmd_recall(args: argparse.Namespace) -> int:
    fields = {"query": args.query, "k": args.k, "layer": args.layer, "cell_types": args.type, "project": args.project}
    result = act(args, "search", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["results"]:
        print("No memories match.")
    for hit in result["results"]:
        print(f"{hit['distance']:.3f}  [{hit['cell_type']}] {_short(hit['content'])}")
        print(f"       {hit['node_id']}  {_when(hit['created_at'])}")
    return EXIT_OK


def cmd_inbox(args: argparse.Namespace) -> int:
    if args.pull:
        result = act(args, "pull_inbox", **({"limit": args.limit} if args.limit else {}))
    else:
        since = int(args.since) if args.since and args.since.isdigit() else args.since
        result = act(args, "inbox", since=since, limit=args.limit)
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["diffs"]:
        print("Inbox is empty.")
    for diff in result["diffs"]:
        print(f"{_when(diff['received_at'])}  sim={diff['similarity']:.2f}  [{diff['cell_type']}] {_short(diff['content'])}")
        print(f"       {diff['node_id']} from {diff['source_agent']} @ {diff['origin_node'][:12]} hops={diff['hops']}")
    return EXIT_OK


def cmd_consolidate(args: argparse.Namespace) -> int:
    result = act(args, "consolidate_scene", scene_id=args.scene_id)
    if args.json:
        emit_json(result)
    else:
        print(f"Scene {result['scene_id']}: {result['source_count']} cells summarised as {result['node_id']} (L2)")
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    from .daemon import run_daemon

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
            announce=announce,
        )
    )
    return EXIT_OK


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdin/stdout for one agent session, relayed to the data dir's daemon."""
    import httpx

    from mcp_bridge import HttpRelay, serve_stdio
    from mcp_bridge.local import SocketRelay

    from .client import DaemonClient, ensure_daemon, key_is_active, running_daemon
    from .config import load_config

    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set; give the MCP host the key from `hyphae agent add NAME`", EXIT_AUTH)
    load_config(args.home)  # no data dir: say so before starting anything
    if running_daemon(args.home) is None and not key_is_active(args.home, api_key):
        raise Unauthenticated("HYPHAE_API_KEY is not valid for this data dir (unknown or revoked)")
    info = ensure_daemon(args.home)
    client = DaemonClient(args.home, info, api_key)
    try:
        who = client.call("GET", "/v1/whoami")  # the key is resolved once, before anything is served
    finally:
        client.close()
    print(f"hyphae mcp: serving agent {who['name']!r} through {info['api_url']}", file=sys.stderr)

    async def serve() -> None:
        if info.get("mcp_socket"):  # same machine: the daemon's Unix socket, no HTTP per call
            relay = SocketRelay(info["mcp_socket"], api_key)
            try:
                await serve_stdio(relay)
            finally:
                await relay.aclose()
            return
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0)) as http:
            await serve_stdio(HttpRelay(info["api_url"], api_key, http))

    trio.run(serve)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from .client import running_daemon

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
    if "stats" in status:
        stats = status["stats"]
        print(f"cells     {stats['cells']}  layers {stats['layers']}")
    return EXIT_OK


def cmd_connect(args: argparse.Namespace) -> int:
    from .connect import snippet

    print(snippet(args.host, home=args.home, http=args.http, api_key=args.key))
    return EXIT_OK


def cmd_team_create(args: argparse.Namespace) -> int:
    from mesh.team import Team

    return _adopt(args, Team.create(), "Created")


def cmd_team_join(args: argparse.Namespace) -> int:
    from mesh.errors import JoinTokenError
    from mesh.team import Team

    try:
        team = Team.from_join_token(args.token.strip())
    except JoinTokenError as exc:
        raise CliError(f"that is not a valid join token: {exc}", EXIT_USAGE) from None
    return _adopt(args, team, "Joined")


def _adopt(args: argparse.Namespace, team, verb: str) -> int:
    from .client import running_daemon
    from .teams import adopt_team, load_team

    if running_daemon(args.home) is not None:
        raise CliError("stop the running node first (`hyphae up` in its terminal: Ctrl-C); joining changes its tenant")
    current = load_team(args.home)
    if current is not None and current.team_id != team.team_id:
        raise CliError(f"this node is already in team {current.team_id}; use a fresh data dir for another team")
    from .config import load_config

    config = load_config(args.home)  # a clear error if there is no data dir
    from mesh.identity import NodeIdentity

    if NodeIdentity.load(config.key_path).node_id in team.removed:
        raise CliError(f"this node was removed from team {team.team_id}: its token does not let it back in")
    adopt_team(args.home, team)
    if args.json:
        emit_json({"team_id": team.team_id, "join_token": team.join_token()})
        return EXIT_OK
    print(f"{verb} team {team.team_id}. Teammates join with the token below (keep it secret:", file=sys.stderr)
    print("it is the team key). Then run `hyphae up`: nodes on your LAN find each other.", file=sys.stderr)
    print(team.join_token())
    return EXIT_OK


def cmd_team_rotate(args: argparse.Namespace) -> int:
    """A fresh team key; the nodes named with --remove are shut out for good."""
    import re

    from mesh.identity import NodeIdentity

    from .client import running_daemon
    from .config import load_config
    from .teams import rotate_team

    config = load_config(args.home)
    remove = sorted({node_id.strip().lower() for node_id in args.remove})
    bad = [node_id for node_id in remove if not re.fullmatch(r"[0-9a-f]{32}", node_id)]
    if bad:
        raise CliError(f"not a node id (32 hex digits, as `hyphae peers` shows): {bad[0]!r}", EXIT_USAGE)
    if NodeIdentity.load(config.key_path).node_id in remove:
        raise CliError("a node cannot remove itself: rotate from a node that stays in the team", EXIT_USAGE)
    if running_daemon(args.home) is not None:
        raise CliError("stop the running node first (`hyphae up` in its terminal: Ctrl-C); it holds the old key")
    team = rotate_team(args.home, remove)
    if args.json:
        emit_json({"team_id": team.team_id, "removed": sorted(team.removed), "join_token": team.join_token()})
        return EXIT_OK
    gone = f"; removed {len(remove)} node(s), refused from now on" if remove else ""
    print(f"Team {team.team_id} has a new key{gone}. Every member that stays: stop its node,", file=sys.stderr)
    print("`hyphae team join` the token below, start it again. A node with the old key can no longer", file=sys.stderr)
    print("read or send team traffic. Keep the token secret: it is the team key.", file=sys.stderr)
    print(team.join_token())
    return EXIT_OK


def cmd_team_show(args: argparse.Namespace) -> int:
    from .teams import load_team

    team = load_team(args.home)
    if team is None:
        raise CliError("this node is in no team: `hyphae team create` or `hyphae team join TOKEN`")
    data = {"team_id": team.team_id, "team_hash": team.id_hash}
    if args.token:
        data["join_token"] = team.join_token()
    if args.json:
        emit_json(data)
    else:
        print(f"team {team.team_id} (hash {team.id_hash})")
        if args.token:
            print(data["join_token"])
    return EXIT_OK


def cmd_peers(args: argparse.Namespace) -> int:
    from .client import running_daemon

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
    from .term import paint

    colours = {"alive": "green", "suspect": "yellow", "dead": "red"}
    for peer in status["peers"]:
        state = paint(f"{peer['state']:<8}", colours.get(peer["state"], "dim"), sys.stdout)
        print(f"  {peer['node_id'][:12]}  {peer['address']:<22} {state} queue={peer['queue_depth']}")
    drops = status.get("drops") or {}
    if drops:
        print("drops: " + ", ".join(f"{reason}={count}" for reason, count in sorted(drops.items())))
    return EXIT_OK


def cmd_beacon_add(args: argparse.Namespace) -> int:
    fields = {
        "query": args.query,
        "threshold": args.threshold,
        "cell_types": args.type,
        "project": args.project,
        "min_salience": args.min_salience,
        "ttl_seconds": args.ttl,
    }
    result = act(args, "place_beacon", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
    else:
        print(result["beacon_id"])
    return EXIT_OK


def cmd_beacon_list(args: argparse.Namespace) -> int:
    result = act(args, "list_beacons")
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["beacons"]:
        print('No beacons: `hyphae beacon add "what you want to hear about"`.')
    for beacon in result["beacons"]:
        types = ",".join(beacon.get("cell_types") or []) or "any type"
        print(f"{beacon['beacon_id']}  τ={beacon['threshold']:.2f}  {types:<16} {_short(beacon['query'], 70)}")
    return EXIT_OK


def cmd_beacon_remove(args: argparse.Namespace) -> int:
    result = act(args, "remove_beacon", beacon_id=args.beacon_id)
    if args.json:
        emit_json(result)
    else:
        print(f"Removed beacon {result['beacon_id']}.")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import FAIL, run_doctor
    from .term import paint

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


def _alone(args: argparse.Namespace, what: str) -> None:
    """Commands that need the data dir to themselves refuse while a daemon runs."""
    from .client import running_daemon

    info = running_daemon(args.home)
    if info is not None:
        raise CliError(
            f"a node is running for {args.home} ({info['api_url']}, pid {info['pid']}); {what} needs the data dir "
            "to itself: stop the node (Ctrl-C where `hyphae up` runs) and run this again"
        )


def _bar(args: argparse.Namespace, label: str):
    from .progress import Progress

    return Progress(label, None, enabled=not args.json and sys.stderr.isatty())


def _through_daemon_admin(args: argparse.Namespace, path: str, body: dict[str, Any]) -> Any:
    """A long admin call (export, import) to the running daemon, or _NO_DAEMON."""
    from .client import DaemonClient, running_daemon

    info = running_daemon(args.home)
    if info is None:
        return _NO_DAEMON
    client = DaemonClient(args.home, info, timeout=None)  # as long as the work takes
    try:
        return client.call("POST", path, json=body, admin=True)
    finally:
        client.close()


def cmd_export(args: argparse.Namespace) -> int:
    from .transfer import export_file

    path = Path(args.file).resolve()
    counts = _through_daemon_admin(args, "/v1/admin/export", {"path": str(path)})
    if counts is _NO_DAEMON:
        with _bar(args, "exporting") as bar:
            counts = _in_process(args, lambda service: export_file(service, path, progress=bar.update))
        counts = {"file": str(path), **counts}
    if args.json:
        emit_json(counts)
    else:
        print(f"Exported {counts['cells']} cells, {counts['beacons']} beacons and {counts['scenes']} scenes to {path}.")
    return EXIT_OK


def _line_error(path: Path) -> Callable[[int, str], None]:
    def report(line: int, reason: str) -> None:
        print(f"{path}:{line}: {reason}", file=sys.stderr)

    return report


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"no such file: {path}", EXIT_USAGE)
    if args.source == "memory-server":
        report = _import_memory_graph(args, path)
        summary = f"Imported {report['entities']} entities and {report['relations']} relations from {path}"
    else:
        from .transfer import import_file

        report = _through_daemon_admin(args, "/v1/admin/import", {"path": str(path.resolve())})
        if report is _NO_DAEMON:
            with _bar(args, "importing") as bar:
                report = _in_process(args, lambda service: import_file(service, path, progress=bar.update, on_error=_line_error(path)))
        elif not args.json:
            for error in report["errors"]:
                _line_error(path)(error["line"], error["reason"])
        resumed = f" (resumed at line {report['resumed_at_line']})" if report["resumed_at_line"] else ""
        summary = (
            f"Imported {path}{resumed}: {report['stored']} new cells, {report['known']} already here, "
            f"{report['scenes']} scenes, {report['beacons']} new beacons"
        )
    if args.json:
        emit_json(report)
    else:
        errors = report["error_count"]
        print(summary + (f"; {errors} bad lines skipped (listed above)." if errors else "."))
    return EXIT_FAILED if report["error_count"] else EXIT_OK


def _import_memory_graph(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """The memory server's graph, stored as $HYPHAE_API_KEY's agent (through the daemon if one runs)."""
    from .client import DaemonClient, running_daemon
    from .memory_graph import import_memory_graph

    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set: the graph is stored as an agent; create one with `hyphae agent add NAME`", EXIT_AUTH)
    info = running_daemon(args.home)
    with _bar(args, "importing") as bar:
        if info is not None:
            client = DaemonClient(args.home, info, api_key)
            try:
                async def store(fields):
                    return await trio.to_thread.run_sync(lambda: client.call("POST", "/v1/cells", json=fields))

                return trio.run(lambda: import_memory_graph(path, store, progress=bar.update, on_error=_line_error(path)))
            finally:
                client.close()

        async def run(service):
            principal = await service.authenticate(api_key)
            return await import_memory_graph(
                path, lambda fields: service.store(principal, **fields), progress=bar.update, on_error=_line_error(path)
            )

        return _in_process(args, run)


def cmd_reindex(args: argparse.Namespace) -> int:
    from .reindex import reindex

    _alone(args, "reindex")
    with _bar(args, "reindexing") as bar:
        result = trio.run(lambda: reindex(args.home, rebuild=args.rebuild, progress=lambda what, done, total: bar.update(done, total, what)))
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["rebuilt"]:
        print(f"Everything is already in {result['embedding_space']}; nothing to do (--rebuild rebuilds the indexes anyway).")
    else:
        print(f"Re-embedded {result['cells']} cells and {result['beacons']} beacons into {result['embedding_space']}; indexes rebuilt.")
    return EXIT_OK


# -- plumbing ----------------------------------------------------------------------

# How each facade call travels when a daemon runs: (HTTP method, path).
_ROUTES = {
    "store": ("POST", "/v1/cells"),
    "search": ("POST", "/v1/search"),
    "inbox": ("GET", "/v1/inbox"),
    "pull_inbox": ("POST", "/v1/inbox/pull"),
    "consolidate_scene": ("POST", "/v1/scenes/{scene_id}/consolidate"),
    "whoami": ("GET", "/v1/whoami"),
    "place_beacon": ("POST", "/v1/beacons"),
    "list_beacons": ("GET", "/v1/beacons"),
    "remove_beacon": ("DELETE", "/v1/beacons/{beacon_id}"),
    "stats": ("GET", "/v1/stats"),
    "add_agent": ("POST", "/v1/admin/agents"),
    "list_agents": ("GET", "/v1/admin/agents"),
    "revoke_agent": ("DELETE", "/v1/admin/agents/{name}"),
    "peers": ("GET", "/v1/admin/peers"),
}


def _through_daemon(args: argparse.Namespace, op: str, kwargs: dict[str, Any], api_key: str | None) -> Any:
    from .client import DaemonClient, running_daemon

    info = running_daemon(args.home)
    if info is None:
        return _NO_DAEMON
    method, template = _ROUTES[op]
    path = template.format(**kwargs)
    rest = {k: v for k, v in kwargs.items() if "{" + k + "}" not in template}
    client = DaemonClient(args.home, info, api_key)
    try:
        if method == "GET":
            return client.call(method, path, params=rest, admin=api_key is None)
        return client.call(method, path, json=rest or None, admin=api_key is None)
    finally:
        client.close()


_NO_DAEMON = object()


def act(args: argparse.Namespace, op: str, **kwargs: Any) -> Any:
    """Run a facade call as the agent whose key is in ``HYPHAE_API_KEY``: through the
    daemon when one runs, else on the data dir directly."""
    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set: create a key with `hyphae agent add NAME`", EXIT_AUTH)
    result = _through_daemon(args, op, kwargs, api_key)
    if result is not _NO_DAEMON:
        return result

    async def run(service):
        principal = await service.authenticate(api_key)
        return await getattr(service, op)(principal, **kwargs)

    return _in_process(args, run)


def administer(args: argparse.Namespace, op: str, **kwargs: Any) -> Any:
    """Run an admin call (agents) as the owner of the data dir."""
    result = _through_daemon(args, op, kwargs, None)
    if result is not _NO_DAEMON:
        return result

    async def run(service):
        if op == "peers":
            return {"enabled": False}
        value = await getattr(service, op)(*kwargs.values())
        if op == "add_agent":
            principal, api_key = value
            return {"name": principal.name, "agent_id": principal.agent_id, "projects": list(principal.projects), "api_key": api_key}
        return {"agents": value} if op == "list_agents" else value

    return _in_process(args, run)


def _in_process(args: argparse.Namespace, action: Callable) -> Any:
    from .home import open_node

    async def run():
        async with open_node(args.home) as service:
            return await action(service)

    return trio.run(run)


QUICK_START = """\
quick start (one machine):
  hyphae init
  export HYPHAE_API_KEY=$(hyphae agent add alice | tail -1)
  hyphae store "Use pgvector for the V1 storage backend." --type Decision
  hyphae recall "which database do we use for storage"
  hyphae connect claude-code          # the MCP set-up for your editor

a team: `hyphae team create` on one machine, `hyphae team join TOKEN` on the others,
then `hyphae up` everywhere. `hyphae doctor` says what is wrong and how to fix it.

exit codes:
  0 done   1 the operation failed   2 bad usage   3 no usable data dir or config
  4 not authenticated (HYPHAE_API_KEY missing, unknown or revoked)

environment:
  HYPHAE_HOME     the data dir (default ~/.hyphae; --home overrides)
  HYPHAE_API_KEY  the agent key that memory commands act as
  NO_COLOR        no colours even on a terminal
"""

# How `hyphae --help` groups the commands: (heading, command names).
_GROUPS = (
    ("set up", ("init", "agent", "team", "connect")),
    ("run the node", ("up", "mcp", "status", "peers", "doctor")),
    ("memories (as $HYPHAE_API_KEY's agent)", ("store", "recall", "inbox", "beacon", "consolidate")),
    ("data", ("export", "import", "reindex")),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hyphae",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=QUICK_START,
    )
    parser.add_argument("--home", type=Path, default=None, metavar="DIR", help="data dir (default: $HYPHAE_HOME or ~/.hyphae)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    parser.add_argument("--version", action="version", version=f"hyphae {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)
    commands.required = True
    summaries: dict[str, str] = {}

    def command(name: str, handler: Callable, help: str, parent=commands, *, json: bool = True) -> argparse.ArgumentParser:
        sub = parent.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON for scripts (no colours, no progress bar)")
        if parent is commands:
            summaries[name] = help
        return sub

    def group(name: str, help: str, dest: str) -> argparse._SubParsersAction:
        sub = commands.add_parser(name, help=help, description=help)
        summaries[name] = help
        actions = sub.add_subparsers(dest=dest, metavar="ACTION")
        actions.required = True
        return actions

    command("init", cmd_init, "create the data dir, config and node key")

    agent_commands = group("agent", "manage agents and their API keys: add | list | revoke", "agent_command")
    add = command("add", cmd_agent_add, "create an agent; prints its API key once, on the last line", agent_commands)
    add.add_argument("name")
    add.add_argument("--project", action="append", help="limit the key to a project (repeatable)")
    command("list", cmd_agent_list, "list agents", agent_commands)
    revoke = command("revoke", cmd_agent_revoke, "revoke an agent's key", agent_commands)
    revoke.add_argument("name")

    team_commands = group("team", "create or join a team (the mesh): create | join | show | rotate", "team_command")
    command("create", cmd_team_create, "create a team; prints its join token on the last line", team_commands)
    join = command("join", cmd_team_join, "join a team with a token from `hyphae team create`", team_commands)
    join.add_argument("token")
    show = command("show", cmd_team_show, "this node's team", team_commands)
    show.add_argument("--token", action="store_true", help="also print the join token (it holds the team key)")
    rotate = command("rotate", cmd_team_rotate, "give the team a new key (members re-join with the token on the last line)",
                     team_commands)  # fmt: skip
    rotate.add_argument("--remove", action="append", default=[], metavar="NODE_ID",
                        help="shut a node out of the team (repeatable; ids from `hyphae peers`)")  # fmt: skip

    connect = command("connect", cmd_connect, "print the MCP set-up for an editor or agent host", json=False)
    connect.add_argument("host", choices=("claude-code", "cursor", "vscode", "cline"))
    connect.add_argument("--http", action="store_true", help="connect over HTTP instead of stdio")
    connect.add_argument("--key", help="the agent's API key to put in the snippet (default: a placeholder)")

    up = command("up", cmd_up, "run the node daemon (API, MCP over HTTP, mesh) in the foreground", json=False)
    up.add_argument("--api", metavar="HOST:PORT", help="API address (default from config: 127.0.0.1:7777)")
    up.add_argument("--allow-remote", action="store_true", help="allow a non-loopback API address")
    up.add_argument("--mesh", metavar="HOST:PORT", help="mesh address (default from config: 0.0.0.0:7979)")
    up.add_argument("--peer", action="append", metavar="HOST:PORT", help="a static peer (repeatable)")
    up.add_argument("--no-discovery", action="store_true", help="do not look for peers with zeroconf")
    command("mcp", cmd_mcp, "serve MCP over stdio for an agent (starts the daemon if needed)", json=False)
    command("status", cmd_status, "is the daemon running, and what does it hold")
    command("peers", cmd_peers, "the mesh: peers, their state, queues and drops")
    command("doctor", cmd_doctor, "check the data dir, keys, ports, team, peers and embedder; say what to fix (exit 1 on a failure)")

    store = command("store", cmd_store, "store a memory; prints its node_id")
    store.add_argument("text", help="the memory; '-' reads stdin")
    store.add_argument("--type", required=True, choices=CELL_TYPES, help="cell type")
    store.add_argument("--salience", type=float, default=None, help="0..1, default 0.5; higher reaches further")
    store.add_argument("--project")
    store.add_argument("--scene")
    store.add_argument("--ref", help="source reference as KIND:LOCATOR, e.g. file:src/db.py:42")
    store.add_argument("--metadata", help="a JSON object")
    store.add_argument("--idempotency-key")

    recall = command("recall", cmd_recall, "find the memories nearest to a query, with content")
    recall.add_argument("query")
    recall.add_argument("-k", type=int, default=10)
    recall.add_argument("--layer", default="L0", choices=("L0", "L1", "L2"))
    recall.add_argument("--type", action="append", choices=CELL_TYPES, help="only these cell types (repeatable)")
    recall.add_argument("--project")

    inbox = command("inbox", cmd_inbox, "show what your beacons caught")
    inbox.add_argument("--since", help="milliseconds or RFC 3339 time")
    inbox.add_argument("--limit", type=int)
    inbox.add_argument("--pull", action="store_true", help="take the next page and advance the server cursor")

    beacon_commands = group("beacon", "standing interests that fill your inbox: add | list | remove", "beacon_command")
    beacon_add = command("add", cmd_beacon_add, "place a beacon; prints its id", beacon_commands)
    beacon_add.add_argument("query", help="what you want to hear about, in plain words")
    beacon_add.add_argument("--threshold", type=float, help="cosine similarity to match (default from config)")
    beacon_add.add_argument("--type", action="append", choices=CELL_TYPES, help="only these cell types (repeatable)")
    beacon_add.add_argument("--project")
    beacon_add.add_argument("--min-salience", type=float)
    beacon_add.add_argument("--ttl", type=int, metavar="SECONDS", help="expire after this long")
    command("list", cmd_beacon_list, "your live beacons", beacon_commands)
    beacon_remove = command("remove", cmd_beacon_remove, "remove one of your beacons", beacon_commands)
    beacon_remove.add_argument("beacon_id")

    consolidate = command("consolidate", cmd_consolidate, "summarise a scene into one L2 cell")
    consolidate.add_argument("scene_id")

    export = command("export", cmd_export, "write cells, beacons and scenes to a JSONL file")
    export.add_argument("file", metavar="FILE.jsonl")
    import_ = command("import", cmd_import, "import a JSONL file: a Hyphae export, or --from memory-server")
    import_.add_argument("file", metavar="FILE.jsonl")
    import_.add_argument("--from", dest="source", choices=("hyphae", "memory-server"), default="hyphae",
                         help="the file's format: a `hyphae export` (default) or the official MCP "
                              "memory server's knowledge graph (stored as $HYPHAE_API_KEY's agent)")  # fmt: skip
    reindex = command("reindex", cmd_reindex, "re-embed memories in the configured embedder's space; rebuild indexes (node stopped)")
    reindex.add_argument("--rebuild", action="store_true", help="rebuild the indexes even if no vector changed")

    width = max(len(name) for name in summaries) + 2
    lines = ["Hyphae: shared memory for AI coding agents, gossiped to whoever it is relevant to.", ""]
    for heading, names in _GROUPS:
        lines.append(f"{heading}:")
        lines.extend(f"  {name:<{width}}{summaries[name]}" for name in names)
    lines.append("")
    lines.append("`hyphae COMMAND --help` for a command's options.")
    parser.description = "\n".join(lines)
    assert sorted(summaries) == sorted(n for _, names in _GROUPS for n in names), "every command in one help group"
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hyphae")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.home = resolve_home(args.home)
    try:
        setup_logging(verbose=args.verbose)  # HYPHAE_LOG_LEVEL, HYPHAE_LOG_FORMAT: see node/logs.py
        return args.handler(args)
    except CliError as exc:
        print(f"hyphae: {exc}", file=sys.stderr)
        return exc.code
    except Unauthenticated as exc:
        print(f"hyphae: {exc.message}", file=sys.stderr)
        return EXIT_AUTH
    except ConfigError as exc:
        print(f"hyphae: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except HyphaeError as exc:
        where = f" ({exc.field})" if exc.field else ""
        print(f"hyphae: {exc.reason}{where}: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except json.JSONDecodeError as exc:
        print(f"hyphae: --metadata is not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
