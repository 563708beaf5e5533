"""The node's team: its id and key on disk, and adopting a team as the node's tenant.

A tenant is a team (DESIGN §3). ``team.json`` (0600) holds the team id and the 32-byte
key; the key never leaves it except inside a join token the user copies on purpose.
Joining or creating a team makes the team id the node's tenant: the node's agents and
memories move into it, so what they already know is the team's from then on.

Rotating (:func:`rotate_team`) keeps the team id, so nothing moves: only the key is
new, and the node ids removed from the team are written beside it (``removed``).
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

from mesh.team import Team

from .config import CONFIG_NAME
from .errors import ConfigError
from .files import write_private
from .store.maintenance import move_tenant

__all__ = ["TEAM_FILE", "load_team", "adopt_team", "rotate_team"]

TEAM_FILE = "team.json"


def load_team(home: Path) -> Team | None:
    path = home / TEAM_FILE
    try:
        data = json.loads(path.read_text())
        return Team(data["team_id"], base64.b64decode(data["team_key"]), frozenset(data.get("removed", ())))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}); join the team again with `hyphae team join TOKEN`") from None


def adopt_team(home: Path, team: Team) -> str:
    """Store the team and make it the node's tenant; returns the previous tenant id."""
    config_path = home / CONFIG_NAME
    text = config_path.read_text(encoding="utf-8")
    match = re.search(r'(?m)^tenant_id\s*=\s*"([^"]*)"', text)
    if match is None:
        raise ConfigError(f"{config_path}: no tenant_id line to update")
    previous = match.group(1)
    move_tenant(home / "hyphae.db", team.team_id, previous)
    _write_team(home, team)
    updated = text[: match.start(1)] + team.team_id + text[match.end(1):]
    temp = config_path.with_name(config_path.name + ".tmp")
    temp.write_text(updated, encoding="utf-8")
    os.replace(temp, config_path)
    return previous


def rotate_team(home: Path, remove: tuple[str, ...] | list[str] = ()) -> Team:
    """Give the node's team a fresh key (and remove ``remove``); returns the new team."""
    current = load_team(home)
    if current is None:
        raise ConfigError("this node is in no team: `hyphae team create` or `hyphae team join TOKEN` first")
    try:
        team = current.rotated(frozenset(remove))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _write_team(home, team)
    return team


def _write_team(home: Path, team: Team) -> None:
    data = {"team_id": team.team_id, "team_key": base64.b64encode(team.team_key).decode()}
    if team.removed:
        data["removed"] = sorted(team.removed)
    write_private(home / TEAM_FILE, json.dumps(data))
