"""Files that hold secrets or state: written whole (temp file, fsync, rename) and 0600;
read back with one line that names the file and what to do when it is unusable."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from mesh.identity import NodeIdentity

__all__ = ["write_private", "load_node_key", "open_to_others"]


def write_private(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def load_node_key(path: Path) -> NodeIdentity:
    """The node's identity from its key file; :class:`ConfigError` (exit 3) when the file is
    missing, truncated or unreadable, saying what to do."""
    from mesh.identity import NodeIdentity

    try:
        return NodeIdentity.load(path)
    except FileNotFoundError:
        raise ConfigError(
            f"the node key {path} is missing: restore node.key from a backup; `hyphae init` makes a new one "
            "(the node then has a new id)"
        ) from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError):
            what = f"cannot be read ({exc.strerror or exc})"
        else:  # NodeIdentity.load names the file itself
            what = str(exc).replace(f"{path} ", "", 1)
        raise ConfigError(
            f"the node key {path} {what}: restore node.key from a backup, or delete it and run `hyphae init` "
            "(the node then has a new id)"
        ) from None


def open_to_others(paths: list[Path]) -> list[tuple[Path, int]]:
    """The files among ``paths`` that exist and that the group or others may read or write,
    with their modes."""
    loose = []
    for path in paths:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            loose.append((path, mode))
    return loose
