"""What every command shares: exit codes, output helpers, and the way a call reaches the node.

A memory or admin call goes through the running daemon when there is one (never around it to
the database), else opens the data dir in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import trio

__all__ = [
    "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_CONFIG", "EXIT_AUTH", "CliError", "NO_DAEMON",
    "emit_json", "format_time", "one_line", "act", "administer", "in_process", "admin_call",
    "progress_bar", "refuse_while_running",
]  # fmt: skip

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG, EXIT_AUTH = 0, 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def emit_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2))


def format_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def one_line(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# How each facade call travels when a daemon runs: (HTTP method, path).
ROUTES = {
    "store": ("POST", "/v1/cells"),
    "search": ("POST", "/v1/search"),
    "inbox": ("GET", "/v1/inbox"),
    "pull_inbox": ("POST", "/v1/inbox/pull"),
    "consolidate_scene": ("POST", "/v1/scenes/{scene_id}/consolidate"),
    "whoami": ("GET", "/v1/whoami"),
    "start_session": ("POST", "/v1/sessions"),
    "end_session": ("POST", "/v1/sessions/{session_id}/end"),
    "get_scene": ("GET", "/v1/scenes/{scene_id}"),
    "list_scenes": ("GET", "/v1/scenes"),
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
    from ..client import DaemonClient, running_daemon

    info = running_daemon(args.home)
    if info is None:
        return NO_DAEMON
    method, template = ROUTES[op]
    in_path = {k: quote(str(v), safe="") for k, v in kwargs.items() if "{" + k + "}" in template}  # e.g. a name like 李雷
    path = template.format(**in_path)
    rest = {k: v for k, v in kwargs.items() if k not in in_path}
    client = DaemonClient(args.home, info, api_key)
    try:
        if method == "GET":
            return client.call(method, path, params=rest, admin=api_key is None)
        return client.call(method, path, json=rest or None, admin=api_key is None)
    finally:
        client.close()


NO_DAEMON = object()


def act(args: argparse.Namespace, op: str, **kwargs: Any) -> Any:
    """Run a facade call as the agent whose key is in ``HYPHAE_API_KEY``: through the
    daemon when one runs, else on the data dir directly."""
    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set: create a key with `hyphae agent add NAME`", EXIT_AUTH)
    result = _through_daemon(args, op, kwargs, api_key)
    if result is not NO_DAEMON:
        return result

    async def run(service):
        principal = await service.authenticate(api_key)
        return await getattr(service, op)(principal, **kwargs)

    return in_process(args, run)


def administer(args: argparse.Namespace, op: str, **kwargs: Any) -> Any:
    """Run an admin call (agents) as the owner of the data dir."""
    result = _through_daemon(args, op, kwargs, None)
    if result is not NO_DAEMON:
        return result

    async def run(service):
        if op == "peers":
            return {"enabled": False}
        value = await getattr(service, op)(*kwargs.values())
        if op == "add_agent":
            principal, api_key = value
            return {"name": principal.name, "agent_id": principal.agent_id, "projects": list(principal.projects), "api_key": api_key}
        return {"agents": value} if op == "list_agents" else value

    return in_process(args, run)


def in_process(args: argparse.Namespace, action: Callable) -> Any:
    from ..home import open_node

    async def run():
        async with open_node(args.home) as service:
            return await action(service)

    return trio.run(run)


def admin_call(args: argparse.Namespace, path: str, body: dict[str, Any]) -> Any:
    """A long admin call (export, import) to the running daemon, or NO_DAEMON."""
    from ..client import DaemonClient, running_daemon

    info = running_daemon(args.home)
    if info is None:
        return NO_DAEMON
    client = DaemonClient(args.home, info, timeout=None)  # as long as the work takes
    try:
        return client.call("POST", path, json=body, admin=True)
    finally:
        client.close()


def progress_bar(args: argparse.Namespace, label: str):
    from node.progress import Progress

    return Progress(label, None, enabled=not args.json and sys.stderr.isatty())


def refuse_while_running(args: argparse.Namespace, what: str) -> None:
    """Commands that need the data dir to themselves refuse while a daemon runs."""
    from ..client import running_daemon

    info = running_daemon(args.home)
    if info is not None:
        raise CliError(
            f"a node is running for {args.home} ({info['api_url']}, pid {info['pid']}); {what} needs the data dir "
            "to itself: stop the node (Ctrl-C where `hyphae up` runs) and run this again"
        )


