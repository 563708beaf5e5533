"""The data dir and ``config.toml``.

The data dir is ``$HYPHAE_HOME``, else ``~/.hyphae``. It holds ``config.toml``,
``node.key`` (0600), ``hyphae.db`` (SQLite, WAL), ``index/`` and ``node.lock``.
``hyphae init`` writes a commented config with every default spelled out, so the file
documents itself; reading it is strict, so a typo is an error rather than a silent default.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
import uuid
from pathlib import Path
from typing import Any

from .energy import EnergyModel
from .errors import ConfigError
from .ratelimit import DEFAULT_BURST, DEFAULT_RATE

__all__ = ["NodeConfig", "resolve_home", "load_config", "write_initial_config", "CONFIG_NAME"]

CONFIG_NAME = "config.toml"
DEFAULT_API = "127.0.0.1:7777"
DEFAULT_MESH = "0.0.0.0:7979"
# Calibrated on benchmarks/data/beacon_pairs.json with the built-in embedder.
DEFAULT_BEACON_THRESHOLD = 0.28
# Hybrid recall (node.retrieval): chosen by the sweep in benchmarks/hybrid_sweep.py (BENCHMARKS.md).
DEFAULT_LEXICAL_WEIGHT = 0.4
# Possible conflicts (node.lifecycle): chosen on halves of benchmarks/data/conflicts.json and measured on
# the other halves (benchmarks/conflicts.py, BENCHMARKS.md): ~5 % of close rulings that do not conflict
# raise an alarm, ~27 % of conflicting ones do (0.75 before: ~9 % and ~34 %).
DEFAULT_CONFLICT_COS = 0.80

_SECTIONS = {"node", "api", "mesh", "embedder", "energy", "beacons", "storage", "recall", "lifecycle", "a2a"}


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    home: Path
    tenant_id: str
    node_name: str
    api_listen: str = DEFAULT_API
    mesh_listen: str = DEFAULT_MESH
    peers: tuple[str, ...] = ()
    discovery: bool = True
    embedder: dict[str, Any] = dataclasses.field(default_factory=dict)
    energy: EnergyModel = dataclasses.field(default_factory=EnergyModel)
    default_beacon_threshold: float = DEFAULT_BEACON_THRESHOLD
    # The admission rule's judge (node.judges): "calibrated", or "cosine" (the threshold alone).
    admission_judge: str = "calibrated"
    admission_z_floor: float = 3.0
    admission_lexical_weight: float = 4.0
    group_commit_ms: float = 2.0
    rate_limit: float = DEFAULT_RATE  # calls per second per API key; 0: no limit
    rate_burst: int = DEFAULT_BURST
    # [api] allowed_hosts: Host names the API port answers besides loopback and its bound address
    # (web.hosts, the DNS-rebinding guard); "name" for any port, "name:port" for one.
    allowed_hosts: tuple[str, ...] = ()
    hybrid_recall: bool = True  # [recall] hybrid: BM25 fused with the dense ranking
    lexical_weight: float = DEFAULT_LEXICAL_WEIGHT  # [recall] lexical_weight: what holding all of the query's words adds
    conflict_cos: float = DEFAULT_CONFLICT_COS  # [lifecycle] conflict_cos: two rulings this close may conflict
    file_roots: tuple[Path, ...] = ()  # [lifecycle] file_roots: where relative `kind: file` locators are found
    a2a_enabled: bool = False  # [a2a] enabled: serve the A2A surface (api.a2a) on the API port; opt-in

    @property
    def db_path(self) -> Path:
        return self.home / "hyphae.db"

    @property
    def index_dir(self) -> Path:
        return self.home / "index"

    @property
    def key_path(self) -> Path:
        return self.home / "node.key"

    @property
    def lock_path(self) -> Path:
        return self.home / "node.lock"


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data dir: an explicit path, else ``$HYPHAE_HOME``, else ``~/.hyphae``."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("HYPHAE_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".hyphae"


def write_initial_config(home: Path, *, tenant_id: str | None = None) -> Path:
    """Write a fresh, commented ``config.toml``; refuses to overwrite one."""
    path = home / CONFIG_NAME
    if path.exists():
        raise ConfigError(f"{path} already exists")
    tenant_id = tenant_id or str(uuid.uuid4())
    text = f'''# Hyphae node configuration. Every value below is the default unless noted.

[node]
# The team (tenant) this node's agents belong to; `hyphae team join` replaces it.
tenant_id = "{tenant_id}"
name = "{_toml_escape(socket.gethostname())}"

[api]
# REST, MCP over HTTP and the dashboard. Loopback only unless `hyphae up --allow-remote`.
listen = "{DEFAULT_API}"
# Calls per second per API key (a token bucket; 0 turns the limit off), and the burst.
# rate_limit = {DEFAULT_RATE:g}
# rate_burst = {DEFAULT_BURST}
# Host names the API answers besides localhost, loopback addresses and the listen address
# (a guard against DNS rebinding), e.g. ["hyphae.internal:7777"] behind --allow-remote.
# allowed_hosts = []

[mesh]
listen = "{DEFAULT_MESH}"
# Static peers as "host:port", besides the ones zeroconf finds on the LAN.
peers = []
discovery = true

[a2a]
# The A2A surface (Agent Card at /.well-known/agent-card.json, JSON-RPC at /a2a) on the API port,
# for agents built on other frameworks; off unless true here or `hyphae up --a2a`.
# enabled = false

[embedder]
# "builtin" (all-MiniLM-L6-v2, offline), "hashed", "openai" or "ollama".
provider = "builtin"

[beacons]
default_threshold = {DEFAULT_BEACON_THRESHOLD}
# What enters an inbox: "calibrated" (each beacon's cosine against its own background, plus rare
# shared words; see the README, "Relevance") or "cosine" (the threshold alone).
# judge = "calibrated"
# z_floor = 3.0
# lexical_weight = 4.0

[recall]
# recall, query and search rank by meaning (the embedder's cosine) and by words (BM25 over the content):
# a cell scores its cosine + lexical_weight x the share of the query's rare words it holds (BM25 over
# the query's own weight, at most 1). false: by meaning alone.
hybrid = true
# lexical_weight = {DEFAULT_LEXICAL_WEIGHT}

[lifecycle]
# A Decision or Constraint at least this close (cosine) to a current one of the same project by another
# agent, and not superseding it, puts a possible_conflict entry in both authors' inboxes (above 1: never).
# At the default, measured on a labelled set: ~1 alarm in 20 on rulings that agree or only touch the same
# area, and ~1 conflict in 4 caught (mostly the same ruling with a changed value); lower it to hear more.
# conflict_cos = {DEFAULT_CONFLICT_COS}
# Folders where a cell's relative `kind: file` source_ref locator is looked for (absolute ones need none):
# the file's SHA-256 is recorded when the cell is stored, and `hyphae validate` checks it again.
# file_roots = ["~/src/shop"]

[storage]
# While writes arrive together, a lone write waits this long for others to share its fsync'd transaction
# (queued writes commit at once; a client that waits for each answer before writing again never waits).
group_commit_ms = 2.0

[energy]
# max_hops = 6
# match_slack = 0.05
# repair_floor = 0.05
# promote_energy = 0.7
# [energy.type_weights]   e.g. Decision = 1.0
# [energy.half_life_days] e.g. Context = 3.0
'''
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def load_config(home: Path) -> NodeConfig:
    """Read ``config.toml`` strictly: unknown sections or keys are errors."""
    path = home / CONFIG_NAME
    if not path.exists():
        raise ConfigError(f"{home} is not a Hyphae data dir (no {CONFIG_NAME}); run `hyphae init` first")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    unknown = sorted(set(data) - _SECTIONS)
    if unknown:
        raise ConfigError(f"{path}: unknown sections: {', '.join(unknown)}")
    node = _table(data, "node", {"tenant_id", "name"}, path)
    api = _table(data, "api", {"listen", "rate_limit", "rate_burst", "allowed_hosts"}, path)
    mesh = _table(data, "mesh", {"listen", "peers", "discovery"}, path)
    beacons = _table(data, "beacons", {"default_threshold", "judge", "z_floor", "lexical_weight"}, path)
    storage = _table(data, "storage", {"group_commit_ms"}, path)
    recall = _table(data, "recall", {"hybrid", "lexical_weight"}, path)
    lifecycle = _table(data, "lifecycle", {"conflict_cos", "file_roots"}, path)
    a2a_enabled = _table(data, "a2a", {"enabled"}, path).get("enabled", False)
    if not isinstance(a2a_enabled, bool):
        raise ConfigError(f"{path}: [a2a] enabled must be true or false, not {a2a_enabled!r}")
    conflict_cos = _number(lifecycle, "conflict_cos", DEFAULT_CONFLICT_COS, path, "lifecycle")
    if not 0.0 <= conflict_cos <= 2.0:
        raise ConfigError(f"{path}: [lifecycle] conflict_cos must be between 0 and 2 (above 1: never)")
    file_roots = lifecycle.get("file_roots", [])
    if not isinstance(file_roots, list) or not all(isinstance(r, str) and r for r in file_roots):
        raise ConfigError(f"{path}: [lifecycle] file_roots must be a list of folder paths")
    hybrid = recall.get("hybrid", True)
    if not isinstance(hybrid, bool):
        raise ConfigError(f"{path}: [recall] hybrid must be true or false, not {hybrid!r}")
    lexical_weight = _number(recall, "lexical_weight", DEFAULT_LEXICAL_WEIGHT, path, "recall")
    if not 0.0 <= lexical_weight <= 1.0:
        raise ConfigError(f"{path}: [recall] lexical_weight must be between 0 and 1")
    if "tenant_id" not in node:
        raise ConfigError(f"{path}: [node] tenant_id is missing")
    try:
        energy = EnergyModel.from_config(data.get("energy"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    threshold = _number(beacons, "default_threshold", DEFAULT_BEACON_THRESHOLD, path, "beacons")
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"{path}: [beacons] default_threshold must be between 0 and 1")
    judge = beacons.get("judge", "calibrated")
    if judge not in ("calibrated", "cosine"):
        raise ConfigError(f"{path}: [beacons] judge must be \"calibrated\" or \"cosine\", not {judge!r}")
    z_floor = _number(beacons, "z_floor", 3.0, path, "beacons")
    judge_lexical_weight = _number(beacons, "lexical_weight", 4.0, path, "beacons")
    if not -10.0 <= z_floor <= 10.0 or not 0.0 <= judge_lexical_weight <= 20.0:
        raise ConfigError(f"{path}: [beacons] z_floor must be within -10..10 and lexical_weight within 0..20")
    group_commit_ms = _number(storage, "group_commit_ms", 2.0, path, "storage")
    if not 0.0 <= group_commit_ms <= 100.0:
        raise ConfigError(f"{path}: [storage] group_commit_ms must be between 0 and 100")
    rate_limit = _number(api, "rate_limit", DEFAULT_RATE, path, "api")
    rate_burst = _number(api, "rate_burst", DEFAULT_BURST, path, "api")
    if not 0 <= rate_limit < float("inf") or not 1 <= rate_burst < float("inf") or rate_burst != int(rate_burst):
        raise ConfigError(f"{path}: [api] rate_limit must be >= 0 (0: no limit) and rate_burst a whole number >= 1")
    allowed_hosts = api.get("allowed_hosts", [])
    if not isinstance(allowed_hosts, list) or not all(isinstance(h, str) and h.strip() for h in allowed_hosts):
        raise ConfigError(f"{path}: [api] allowed_hosts must be a list of \"name\" or \"name:port\" strings")
    peers = mesh.get("peers", [])
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise ConfigError(f"{path}: [mesh] peers must be a list of \"host:port\" strings")
    for name, table, key in (("api", api, "listen"), ("mesh", mesh, "listen"), ("node", node, "tenant_id"), ("node", node, "name")):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{path}: [{name}] {key} must be a string")
    return NodeConfig(
        home=home,
        tenant_id=str(node["tenant_id"]),
        node_name=str(node.get("name", socket.gethostname())),
        api_listen=str(api.get("listen", DEFAULT_API)),
        mesh_listen=str(mesh.get("listen", DEFAULT_MESH)),
        peers=tuple(peers),
        discovery=bool(mesh.get("discovery", True)),
        embedder=dict(data.get("embedder", {})),
        energy=energy,
        default_beacon_threshold=threshold,
        admission_judge=judge,
        admission_z_floor=z_floor,
        admission_lexical_weight=judge_lexical_weight,
        group_commit_ms=group_commit_ms,
        rate_limit=rate_limit,
        rate_burst=int(rate_burst),
        allowed_hosts=tuple(allowed_hosts),
        hybrid_recall=hybrid,
        lexical_weight=lexical_weight,
        conflict_cos=conflict_cos,
        file_roots=tuple(Path(r).expanduser() for r in file_roots),
        a2a_enabled=a2a_enabled,
    )


def _table(data: dict[str, Any], name: str, allowed: set[str], path: Path) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{path}: unknown keys in [{name}]: {', '.join(unknown)}")
    return table


def _number(table: dict[str, Any], key: str, default: float, path: Path, section: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: [{section}] {key} must be a number, not {value!r}")
    return float(value)


def _toml_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
