"""The argument parser: every command, its options, and the grouped ``hyphae --help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from node.energy import CELL_TYPES

from ..connect import HOST_NAMES
from node.version import package_version

from .data import cmd_export, cmd_import, cmd_reindex
from .lifecycle import add_forget_command, cmd_validate
from .memories import (
    cmd_beacon_add, cmd_beacon_list, cmd_beacon_remove, cmd_consolidate, cmd_inbox, cmd_recall, cmd_store,
)  # fmt: skip
from .running import cmd_doctor, cmd_mcp, cmd_peers, cmd_status, cmd_stop, cmd_up
from .sessions import cmd_scene_get, cmd_scene_list, cmd_session_end, cmd_session_start
from .setup import (
    cmd_agent_add, cmd_agent_list, cmd_agent_revoke, cmd_connect, cmd_init, cmd_team_create, cmd_team_join,
    cmd_team_rotate, cmd_team_show,
)  # fmt: skip

__all__ = ["build_parser"]

QUICK_START = """\
quick start (one machine):
  hyphae init
  export HYPHAE_API_KEY=$(hyphae agent add alice | tail -1)
  hyphae store "Use pgvector for the V1 storage backend." --type Decision
  hyphae recall "which database do we use for storage"
  hyphae connect claude-code          # the MCP set-up for your editor (any host: connect --help)

a team: `hyphae team create` on one machine, `hyphae team join TOKEN` on the others,
then `hyphae up` everywhere (`hyphae stop` ends it). `hyphae doctor` says what is wrong
and how to fix it.

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
    ("run the node", ("up", "stop", "mcp", "status", "peers", "doctor")),
    ("memories (as $HYPHAE_API_KEY's agent)", ("store", "recall", "inbox", "beacon", "session", "scene", "consolidate", "forget")),
    ("data", ("export", "import", "reindex", "validate")),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hyphae",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=QUICK_START,
    )
    parser.add_argument("--home", type=Path, default=None, metavar="DIR", help="data dir (default: $HYPHAE_HOME or ~/.hyphae)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    parser.add_argument("--version", action="version", version=f"hyphae {package_version()}")
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
    add.add_argument("name", help="the agent's name: letters of any script, digits, '.', '_' or '-'")
    add.add_argument("--project", action="append", help="limit the key to a project (repeatable)")
    command("list", cmd_agent_list, "list agents", agent_commands)
    revoke = command("revoke", cmd_agent_revoke, "revoke an agent's key", agent_commands)
    revoke.add_argument("name", help="the agent whose key stops working")

    team_commands = group("team", "create or join a team (the mesh): create | join | show | rotate", "team_command")
    command("create", cmd_team_create, "create a team; prints its join token on the last line", team_commands)
    join = command("join", cmd_team_join, "join a team with a token from `hyphae team create`", team_commands)
    join.add_argument("token", help="the join token (hyphae1....) a teammate's `hyphae team create` printed")
    show = command("show", cmd_team_show, "this node's team", team_commands)
    show.add_argument("--token", action="store_true", help="also print the join token (it holds the team key)")
    rotate = command("rotate", cmd_team_rotate, "give the team a new key (members re-join with the token on the last line)",
                     team_commands)  # fmt: skip
    rotate.add_argument("--remove", action="append", default=[], metavar="NODE_ID",
                        help="shut a node out of the team (repeatable; ids from `hyphae peers`)")  # fmt: skip

    connect = command("connect", cmd_connect, "print (or --write) the MCP set-up for an editor or agent host", json=False)
    connect.add_argument("host", choices=HOST_NAMES, metavar="HOST", help="the MCP host: " + ", ".join(HOST_NAMES))
    connect.add_argument("--http", action="store_true", help="connect over HTTP to the running daemon instead of stdio")
    connect.add_argument("--key", help="the agent's API key for a user-level file (default: a placeholder)")
    connect.add_argument("--project", type=Path, metavar="DIR",
                         help="the project-level file in DIR instead (the key is never written there)")  # fmt: skip
    connect.add_argument("--write", action="store_true",
                         help="merge the set-up into the host's config file (a backup is kept; other servers stay)")  # fmt: skip
    connect.add_argument("--file", type=Path, metavar="PATH", help="use this config file instead of the host's usual one")

    up = command("up", cmd_up, "run the node daemon (API, MCP over HTTP, mesh) in the foreground", json=False)
    up.add_argument("--api", metavar="HOST:PORT", help="API address (default from config: 127.0.0.1:7777)")
    up.add_argument("--allow-remote", action="store_true", help="allow a non-loopback API (and gRPC) address")
    up.add_argument("--grpc", metavar="HOST:PORT", help="gRPC address (default: the API's host, the next port: 127.0.0.1:7778)")
    up.add_argument("--no-grpc", action="store_true", help="do not serve gRPC")
    up.add_argument("--mesh", metavar="HOST:PORT", help="mesh address (default from config: 0.0.0.0:7979)")
    up.add_argument("--peer", action="append", metavar="HOST:PORT", help="a static peer (repeatable)")
    up.add_argument("--no-discovery", action="store_true", help="do not look for peers with zeroconf")
    up.add_argument("--a2a", action="store_true", help="serve the A2A surface too (as [a2a] enabled = true)")
    stop = command("stop", cmd_stop, "stop the node daemon of this data dir cleanly (as Ctrl-C would)")
    stop.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                      help="how long to wait for it to drain and save its indexes (default 60)")  # fmt: skip
    command("mcp", cmd_mcp, "serve MCP over stdio for an agent (starts the daemon if needed)", json=False)
    command("status", cmd_status, "is the daemon running, and what does it hold")
    command("peers", cmd_peers, "the mesh: peers, their state, queues and drops")
    command("doctor", cmd_doctor, "check the data dir, keys, ports, team, peers and embedder; say what to fix (exit 1 on a failure)")

    store = command("store", cmd_store, "store a memory; prints its node_id")
    store.add_argument("text", help="the memory; '-' reads stdin")
    store.add_argument("--type", required=True, choices=CELL_TYPES, help="cell type")
    store.add_argument("--salience", type=float, default=None, help="0..1, default 0.5; higher reaches further")
    store.add_argument("--project", help="the project it belongs to (default: none, readable by every key)")
    store.add_argument("--scene", metavar="SCENE_ID", help="the scene it belongs to (default: your open session's)")
    store.add_argument("--ref", help="source reference as KIND:LOCATOR, e.g. file:src/db.py:42")
    store.add_argument("--metadata", help="a JSON object")
    store.add_argument("--idempotency-key", metavar="KEY", help="storing again with the same key returns the first id")
    store.add_argument("--supersedes", action="append", metavar="ID",
                       help="the node_id of a cell this one replaces (repeatable); it stays, marked superseded")

    recall = command("recall", cmd_recall, "find the memories nearest to a query, with content")
    recall.add_argument("query", help="what you are looking for, in plain words")
    recall.add_argument("-k", type=int, default=10, help="how many memories (1-100, default 10)")
    recall.add_argument("--layer", default="L0", choices=("L0", "L1", "L2"),
                        help="L0 every memory (default), L1 the durable ones, L2 scene summaries")  # fmt: skip
    recall.add_argument("--type", action="append", choices=CELL_TYPES, help="only these cell types (repeatable)")
    recall.add_argument("--project", help="only this project's memories")
    recall.add_argument("--include-superseded", action="store_true", help="also cells that others replaced")

    inbox = command("inbox", cmd_inbox, "show what your beacons caught")
    inbox.add_argument("--since", help="milliseconds or RFC 3339 time")
    inbox.add_argument("--limit", type=int, help="at most this many (default 50)")
    inbox.add_argument("--pull", action="store_true", help="take the next page and advance the server cursor")
    inbox.add_argument("--include-superseded", action="store_true", help="also cells that others replaced")
    validate = command("validate", cmd_validate, "mark memories whose source file changed or vanished as stale")
    validate.add_argument("--project", help="only this project's cells")

    beacon_commands = group("beacon", "standing interests that fill your inbox: add | list | remove", "beacon_command")
    beacon_add = command("add", cmd_beacon_add, "place a beacon; prints its id", beacon_commands)
    beacon_add.add_argument("query", help="what you want to hear about, in plain words")
    beacon_add.add_argument("--threshold", type=float, help="cosine similarity to match (default from config)")
    beacon_add.add_argument("--type", action="append", choices=CELL_TYPES, help="only these cell types (repeatable)")
    beacon_add.add_argument("--project", help="only memories of this project")
    beacon_add.add_argument("--min-salience", type=float, metavar="S", help="only memories at least this salient (0..1)")
    beacon_add.add_argument("--ttl", type=int, metavar="SECONDS", help="expire after this long")
    command("list", cmd_beacon_list, "your live beacons", beacon_commands)
    beacon_remove = command("remove", cmd_beacon_remove, "remove one of your beacons", beacon_commands)
    beacon_remove.add_argument("beacon_id", help="the id `hyphae beacon add` printed (see `beacon list`)")

    session_commands = group("session", "working sessions and their scenes: start | end", "session_command")
    session_start = command("start", cmd_session_start, "open a session in a project; prints its id on the last line",
                            session_commands)  # fmt: skip
    session_start.add_argument("--project", required=True, help="the project the session works in")
    session_start.add_argument("--title", help="a short title for its scene")
    session_end = command("end", cmd_session_end, "close a session (and its scene)", session_commands)
    session_end.add_argument("session_id", help="the id `hyphae session start` printed")

    scene_commands = group("scene", "the scenes sessions made: get | list", "scene_command")
    scene_get = command("get", cmd_scene_get, "one scene and the ids of its memories", scene_commands)
    scene_get.add_argument("scene_id", help="the scene's id (from `hyphae scene list`)")
    scene_list = command("list", cmd_scene_list, "scenes you can read, newest first", scene_commands)
    scene_list.add_argument("--project", help="only this project's scenes")
    scene_list.add_argument("--limit", type=int, help="at most this many (default 50)")
    scene_list.add_argument("--cursor", help="the next page, from the previous page's last line")

    consolidate = command("consolidate", cmd_consolidate, "summarise a scene into one L2 cell")
    consolidate.add_argument("scene_id", help="the scene to summarise")
    add_forget_command(command)

    export = command("export", cmd_export, "write cells, beacons and scenes to a JSONL file")
    export.add_argument("file", metavar="FILE.jsonl", help="the file to write")
    import_ = command("import", cmd_import, "import a JSONL file: a Hyphae export, or --from memory-server")
    import_.add_argument("file", metavar="FILE.jsonl", help="the file to read")
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
