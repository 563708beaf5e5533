"""Setting a node up: the data dir, agents and their keys, teams, and editor snippets."""

from __future__ import annotations

import argparse
import sys

from node.errors import HyphaeError

from .plumbing import EXIT_OK, EXIT_USAGE, CliError, administer, emit_json, format_time

def cmd_init(args: argparse.Namespace) -> int:
    from mesh.identity import NodeIdentity

    from ..home import init_home

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
        state = f"revoked {format_time(agent['revoked_at'])}" if agent["revoked_at"] else "active"
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


def cmd_connect(args: argparse.Namespace) -> int:
    """The host's MCP set-up on stdout alone (a shell line for Claude Code, else the config file's
    JSON or TOML), advice on stderr; ``--write`` merges it into the host's config file."""
    from ..connect import KEY_PLACEHOLDER, ConnectError, claude_code_line, plan
    from ..host_files import write_target

    url = _mcp_url(args)
    if args.host == "claude-code" and args.project is None and not args.write and args.file is None:
        print("# Claude Code: run this line (the first call starts the node daemon in the background)", file=sys.stderr)
        print(claude_code_line(args.home, url, http=args.http, api_key=args.key))
        return EXIT_OK
    try:
        target = plan(args.host, home=args.home, url=url, http=args.http, api_key=args.key,
                      project=args.project, file=args.file)  # fmt: skip
    except ConnectError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.write and KEY_PLACEHOLDER in target.render():
        raise CliError(f"--write needs the agent's key for {target.path}: add --key KEY "
                       "(from `hyphae agent add NAME`), or --project DIR for a file that names the variable instead",
                       EXIT_USAGE)  # fmt: skip
    if args.key and (args.project is not None or args.host == "vscode" or (args.host == "codex" and args.http)):
        print("# --key is not written here: this file names the variable instead (see below)", file=sys.stderr)
    for line in target.advice:
        print(line, file=sys.stderr)
    print(target.render().rstrip("\n"))
    if args.write:
        try:
            result = write_target(target)
        except (ConnectError, OSError) as exc:
            raise CliError(f"--write: {exc}") from None
        if not result.changed:
            print(f"{result.path} already has this set-up; nothing changed.", file=sys.stderr)
        else:
            kept = f" (the old file is kept as {result.backup})" if result.backup else ""
            print(f"Wrote the {target.host.title} set-up into {result.path}{kept}. Restart {target.host.title}.",
                  file=sys.stderr)  # fmt: skip
    return EXIT_OK


def _mcp_url(args: argparse.Namespace) -> str:
    """Where the daemon serves MCP: the running one's address, else the configured one."""
    from ..client import running_daemon
    from node.config import load_config

    info = running_daemon(args.home)
    if info is not None:
        return f"{info['api_url']}/mcp"
    try:
        listen = load_config(args.home).api_listen
    except HyphaeError:
        listen = "127.0.0.1:7777"
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "", "[::]", "::"):  # a wildcard is where it listens, not an address to call
        host = "127.0.0.1"
    return f"http://{host}:{port}/mcp"


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
    from ..client import running_daemon
    from node.teams import adopt_team, load_team

    if running_daemon(args.home) is not None:
        raise CliError("stop the running node first (`hyphae up` in its terminal: Ctrl-C); joining changes its tenant")
    current = load_team(args.home)
    if current is not None and current.team_id != team.team_id:
        raise CliError(f"this node is already in team {current.team_id}; use a fresh data dir for another team")
    from node.config import load_config

    config = load_config(args.home)  # a clear error if there is no data dir
    from mesh.identity import NodeIdentity

    if NodeIdentity.load(config.key_path).node_id in team.removed:
        raise CliError(f"this node was removed from team {team.team_id}: its token does not let it back in")
    adopt_team(args.home, team)
    joined = verb == "Joined"  # the joiner already holds the token: it is the team key, so it is not shown again
    if args.json:
        emit_json({"team_id": team.team_id} if joined else {"team_id": team.team_id, "join_token": team.join_token()})
        return EXIT_OK
    if joined:
        print(f"Joined team {team.team_id}. Run `hyphae up`: nodes on your LAN find each other.")
        return EXIT_OK
    print(f"{verb} team {team.team_id}. Teammates join with the token below (keep it secret:", file=sys.stderr)
    print("it is the team key). Then run `hyphae up`: nodes on your LAN find each other.", file=sys.stderr)
    print(team.join_token())
    return EXIT_OK


def cmd_team_rotate(args: argparse.Namespace) -> int:
    """A fresh team key; the nodes named with --remove are shut out for good."""
    import re

    from mesh.identity import NodeIdentity

    from ..client import running_daemon
    from node.config import load_config
    from node.teams import rotate_team

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
    from node.teams import load_team

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


