"""``hyphae connect --write``: merge our one server into a host's config file, losing nothing else.

The rules, in order: the file is read strictly (JSON, or TOML for Codex); a file we cannot
read strictly (comments, trailing commas: JSONC) is left alone with an error, since
rewriting it would drop what we cannot parse. Nothing else in the file changes: other
servers, other settings, key order. A copy of the old file is written beside it before
anything is replaced, and the new file replaces the old in one rename, with its mode kept
(a new file is 0600: it may hold the key). Writing the same set-up twice changes nothing.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from .connect import SERVER_NAME, ConnectError, Target

__all__ = ["WriteResult", "write_target"]


class WriteResult:
    def __init__(self, path: Path, backup: Path | None, changed: bool) -> None:
        self.path, self.backup, self.changed = path, backup, changed


def write_target(target: Target) -> WriteResult:
    """Merge ``target``'s server into its file; see the module docstring for the rules."""
    path = target.path
    old_text = _read(path)
    new_text = _merge_toml(target, old_text) if target.host.toml else _merge_json(target, old_text)
    if old_text is not None and new_text == old_text:
        return WriteResult(path, None, changed=False)
    backup = None
    if old_text is not None:
        backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
        while backup.exists():
            backup = backup.with_name(backup.name + "~")
        shutil.copy2(path, backup)
    _replace(path, new_text)
    return WriteResult(path, backup, changed=True)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConnectError(f"cannot read {path}: {exc}") from None


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _merge_json(target: Target, old_text: str | None) -> str:
    if old_text is None or not old_text.strip():
        document: dict[str, Any] = {}
    else:
        try:
            document = json.loads(old_text)
        except json.JSONDecodeError as exc:
            raise ConnectError(
                f"{target.path} is not plain JSON ({exc.msg} at line {exc.lineno}; comments or trailing commas?): "
                "--write would lose what it cannot read, so it changed nothing. Add the block printed by "
                "`hyphae connect` without --write by hand"
            ) from None
        if not isinstance(document, dict):
            raise ConnectError(f"{target.path} does not hold a JSON object; it was left as it is")
    merged = copy.deepcopy(document)
    node = merged
    for key in target.host.servers_key:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConnectError(f"{target.path}: {key!r} is not an object; it was left as it is")
        node = child
    node[SERVER_NAME] = target.entry
    for extra, value in target.document.items():  # VS Code's inputs: added once, by id
        if extra in target.host.servers_key[:1]:
            continue
        present = merged.setdefault(extra, [])
        if not isinstance(present, list):
            raise ConnectError(f"{target.path}: {extra!r} is not a list; it was left as it is")
        ids = {item.get("id") for item in present if isinstance(item, dict)}
        present.extend(item for item in value if item["id"] not in ids)
    if merged == document and old_text is not None:
        return old_text
    return json.dumps(merged, indent=2, ensure_ascii=False) + "\n"


def _merge_toml(target: Target, old_text: str | None) -> str:
    """Codex's config.toml: our table (and its sub-tables) is cut out and written again at the end;
    every other line stays as it is. The result is parsed again to prove nothing else moved."""
    old_text = old_text or ""
    try:
        before = tomllib.loads(old_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConnectError(f"{target.path} is not valid TOML ({exc}); it was left as it is") from None
    prefix = ".".join(target.host.servers_key + (SERVER_NAME,))
    header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    kept: list[str] = []
    skipping = False
    for line in old_text.splitlines(keepends=True):
        match = header.match(line)
        if match:
            name = re.sub(r"\s*\.\s*", ".", match.group(1)).replace('"', "")
            skipping = name == prefix or name.startswith(prefix + ".")
        if not skipping:
            kept.append(line)
    text = "".join(kept).rstrip()
    text = text + "\n" if text else ""
    try:
        remaining = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConnectError(f"{target.path}: could not take the old {prefix} out cleanly ({exc}); "
                           "it was left as it is") from None  # fmt: skip
    servers = remaining
    for key in target.host.servers_key:
        servers = servers.get(key, {}) if isinstance(servers, dict) else {}
    if isinstance(servers, dict) and SERVER_NAME in servers:
        raise ConnectError(f"{target.path} defines {prefix} inline (not as a [{prefix}] table); "
                           "edit it by hand, it was left as it is")  # fmt: skip
    new_text = text + ("\n" if text else "") + target.render()
    after = tomllib.loads(new_text)
    expected = copy.deepcopy(before)
    node = expected
    for key in target.host.servers_key:
        node = node.setdefault(key, {})
    node[SERVER_NAME] = target.entry
    if after != expected:
        raise ConnectError(f"{target.path}: merging would change more than {prefix}; it was left as it is")
    return old_text if new_text == old_text else new_text
