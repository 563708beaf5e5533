"""The lifecycle commands: ``hyphae forget`` (below) and ``hyphae validate`` (at the end).

``hyphae forget`` makes memories tombstones, on this node and every node that holds them.

Two ways in, never mixed in one command:

- ``hyphae forget ID...`` as the agent whose key is in ``HYPHAE_API_KEY``: only the agent
  that stored a cell may forget it, and each id that cannot be forgotten is named with why
  (the others are still forgotten; exit 1 at the end);
- ``hyphae forget --by-agent NAME`` and/or ``--project P``: the data dir's owner (its admin
  token) forgets this node's cells of any of its agents. The count is shown and a
  confirmation asked first (``--yes`` skips it; without a terminal it is required); cells
  that came from other nodes are counted and left, since only their origin may forget them.

Through the running daemon when there is one (so the tombstones reach the team at once),
else on the data dir directly (they go out at the node's next start).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from node.errors import HyphaeError

from .plumbing import (
    EXIT_AUTH, EXIT_FAILED, EXIT_OK, EXIT_USAGE, NO_DAEMON, CliError, admin_call, emit_json, in_process,
)  # fmt: skip

__all__ = ["add_forget_command", "cmd_forget", "cmd_validate"]

_ADMIN_CHUNK = 10_000  # ids per admin request (the route's limit)


def add_forget_command(command) -> None:
    """Register ``forget`` with the parser's ``command(name, handler, help)`` helper."""
    forget = command("forget", cmd_forget, "forget memories: yours by id, or (data dir owner) by agent or project")
    forget.add_argument("node_ids", nargs="*", metavar="ID", help="ids of cells your agent stored")
    forget.add_argument("--by-agent", metavar="NAME", help="every cell this node holds of the agent NAME (owner only)")
    forget.add_argument("--project", metavar="P", help="every cell this node holds in project P (owner only; with "
                        "--by-agent: that agent's cells in P)")  # fmt: skip
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation of a bulk forget")


def cmd_forget(args: argparse.Namespace) -> int:
    bulk = args.by_agent is not None or args.project is not None
    if bulk and args.node_ids:
        raise CliError("give cell ids, or --by-agent/--project, not both", EXIT_USAGE)
    if not bulk and not args.node_ids:
        raise CliError("nothing to forget: give cell ids, or --by-agent NAME and/or --project P", EXIT_USAGE)
    return _forget_in_bulk(args) if bulk else _forget_ids(args)


# -- by id, as the agent -------------------------------------------------------------------


def _forget_ids(args: argparse.Namespace) -> int:
    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set: forgetting by id acts as the agent that stored the cells", EXIT_AUTH)
    ids = list(dict.fromkeys(args.node_ids))
    daemon = _daemon(args, api_key)
    if daemon is not None:
        try:
            results = [_attempt(lambda i=i: daemon.call("DELETE", f"/v1/cells/{i}"), i) for i in ids]
        finally:
            daemon.close()
    else:

        async def run(service):
            principal = await service.authenticate(api_key)
            out = []
            for node_id in ids:
                try:
                    out.append(await service.forget(principal, node_id=node_id))
                except HyphaeError as exc:
                    out.append(_refused(node_id, exc))
            return out

        results = in_process(args, run)
    forgotten = [r for r in results if "forgotten_at" in r]
    refused = [r for r in results if "reason" in r]
    _report(args, {"forgotten": forgotten, "count": len(forgotten), "refused": refused})
    return EXIT_FAILED if refused else EXIT_OK


def _attempt(call, node_id: str) -> dict[str, Any]:
    try:
        return call()
    except HyphaeError as exc:
        if exc.reason in ("unauthenticated", "unavailable", "disk_full"):
            raise  # not about this id: the whole command stops
        return _refused(node_id, exc)


def _refused(node_id: str, exc: HyphaeError) -> dict[str, Any]:
    return {"node_id": node_id, "reason": exc.reason, "message": exc.message}


# -- in bulk, as the data dir's owner ------------------------------------------------------


def _forget_in_bulk(args: argparse.Namespace) -> int:
    scope = {"agent": args.by_agent, "project": args.project}
    scope = {k: v for k, v in scope.items() if v is not None}
    daemon = _daemon(args, None)
    try:
        if daemon is not None:
            plan = daemon.call("POST", "/v1/admin/forget/matching", json=scope, admin=True)
        else:
            plan = in_process(args, lambda service: service.forgettable(**scope))
        what = _describe(scope)
        others = plan["from_other_nodes"]
        left = f"; {others} more came from other nodes and stay (only their origin can forget them)" if others else ""
        if not plan["count"]:
            if args.json:
                emit_json({"forgotten": [], "count": 0, "refused": [], "from_other_nodes": others})
            else:
                print(f"Nothing to forget: this node holds no live cells {what} of its own{left}.")
            return EXIT_OK
        if not args.json or not args.yes:
            count = plan["count"]
            print(f"{count} cell{'s' if count != 1 else ''} {what} will be forgotten on every node that holds them{left}.",
                  file=sys.stderr if args.json else sys.stdout)  # fmt: skip
        if not args.yes and not _confirmed():
            print("Nothing was forgotten.")
            return EXIT_FAILED
        result: dict[str, Any] = {"forgotten": [], "count": 0, "refused": []}
        for start in range(0, len(plan["node_ids"]), _ADMIN_CHUNK):
            chunk = plan["node_ids"][start : start + _ADMIN_CHUNK]
            if daemon is not None:
                part = daemon.call("POST", "/v1/admin/forget", json={"node_ids": chunk}, admin=True)
            else:
                part = in_process(args, lambda service, chunk=chunk: service.admin_forget(chunk))
            for key in ("forgotten", "refused"):
                result[key] += part[key]
            result["count"] += part["count"]
    finally:
        if daemon is not None:
            daemon.close()
    result["from_other_nodes"] = others
    _report(args, result)
    return EXIT_FAILED if result["refused"] else EXIT_OK


def _describe(scope: dict[str, str]) -> str:
    parts = []
    if "agent" in scope:
        parts.append(f"of agent {scope['agent']!r}")
    if "project" in scope:
        parts.append(f"in project {scope['project']!r}")
    return " ".join(parts)


def _confirmed() -> bool:
    if not sys.stdin.isatty():
        raise CliError("a bulk forget asks for confirmation on a terminal: add --yes to confirm it here", EXIT_USAGE)
    try:
        answer = input("Forget them? This cannot be undone. [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


# -- shared ----------------------------------------------------------------------------------


def _daemon(args: argparse.Namespace, api_key: str | None):
    from ..client import DaemonClient, running_daemon

    info = running_daemon(args.home)
    return None if info is None else DaemonClient(args.home, info, api_key)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        emit_json(result)
        return
    for item in result["refused"]:
        print(f"hyphae: {item['node_id']}: {item['reason']}: {item['message']}", file=sys.stderr)
    count = result["count"]
    if count == 1 and not result["refused"] and len(result["forgotten"]) == 1:
        print(f"Forgot {result['forgotten'][0]['node_id']}.")
    else:
        print(f"Forgot {count} cell{'s' if count != 1 else ''}" + (f"; {len(result['refused'])} refused (above)." if result["refused"] else "."))


# -- validate: file-sourced memories whose file changed (node.lifecycle) ----------------------


def cmd_validate(args: argparse.Namespace) -> int:
    body = {"project": args.project} if args.project else {}
    result = admin_call(args, "/v1/admin/validate", body)
    if result is NO_DAEMON:
        result = in_process(args, lambda service: service.validate_sources(**body))
    if args.json:
        emit_json(result)
        return EXIT_OK
    print(f"Checked {result['checked']} cells whose source is a file on this machine.")
    for stale in result["stale"]:
        print(f"  stale  {stale['node_id']}  {stale['locator']}: {stale['reason']}")
    for node_id in result["fresh_again"]:
        print(f"  fresh  {node_id}  (its file is back as it was)")
    if result["not_hashed"]:
        print(f"{result['not_hashed']} cells name a file that was not found when they were stored: not checked.")
    return EXIT_OK
