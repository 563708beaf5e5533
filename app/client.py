"""Finding, starting and talking to the data dir's daemon.

While a daemon runs, every CLI command goes through it (never around it to the
database). ``daemon.json`` says where it listens; it only counts while the data-dir
lock is held, so a daemon killed with SIGKILL leaves nothing that misleads.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from .daemon_file import ADMIN_TOKEN_FILE, read_daemon_file
from node.errors import (
    Conflict,
    DiskFull,
    Forbidden,
    HyphaeError,
    InvalidArgument,
    NotFound,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from node.lock import DataDirLock

__all__ = ["running_daemon", "ensure_daemon", "key_is_active", "DaemonClient", "SPAWN_LOG"]

SPAWN_LOG = "daemon.log"
_ERRORS = {
    cls.reason: cls
    for cls in (InvalidArgument, TooLarge, Unauthenticated, Forbidden, NotFound, Conflict, Unavailable, DiskFull)
}


def running_daemon(home: Path) -> dict[str, Any] | None:
    """The daemon's ``daemon.json`` if one is serving this data dir, else None."""
    info = read_daemon_file(home)
    if info is None:
        return None
    probe = DataDirLock(home / "node.lock")
    try:
        probe.acquire(timeout=0)
    except Unavailable:
        return info  # held: the daemon is alive
    probe.release()
    return None  # a stale file from a daemon that died


def ensure_daemon(home: Path, *, timeout: float = 60.0) -> dict[str, Any]:
    """Return the running daemon, starting one in the background if there is none.

    Many ``hyphae mcp`` processes may start at once: a spawn lock lets exactly one of
    them launch the daemon while the others wait for it to answer.
    """
    info = running_daemon(home)
    if info is not None:
        return info
    spawn_lock = DataDirLock(home / "spawn.lock")
    spawn_lock.acquire(timeout=timeout)
    try:
        info = running_daemon(home)
        if info is not None:
            return info
        log_path = home / SPAWN_LOG
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "--home", str(home), "up"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # detached: it outlives the agent session that started it
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = running_daemon(home)
            if info is not None:
                return info
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise Unavailable(f"the Hyphae daemon failed to start: {' / '.join(tail)} (log: {log_path})")
            time.sleep(0.05)
        raise Unavailable(f"the Hyphae daemon did not start within {timeout:.0f} s (log: {log_path})")
    finally:
        spawn_lock.release()


def key_is_active(home: Path, api_key: str) -> bool:
    """Is this key known and not revoked? Read straight from the database (WAL readers
    never block the writer), so a bad key is refused before a daemon is started for it."""
    from node.principals import hash_api_key
    from node.store.agents import key_is_active as active_in

    return active_in(home / "hyphae.db", hash_api_key(api_key))


class DaemonClient:
    """The REST API of a running daemon, with its errors turned back into HyphaeErrors.

    Plain HTTP to the daemon's own port, one kept-alive connection, from the standard
    library: every CLI command and every ``hyphae mcp`` start pays for this client, and
    httpx's import and TLS set-up cost ~0.2 s that a loopback call does not need.
    """

    def __init__(self, home: Path, info: dict[str, Any], api_key: str | None = None, *, timeout: float | None = 30.0) -> None:
        self.base_url = info["api_url"]
        self._home = home
        url = urlsplit(self.base_url)
        self._host, self._port, self._timeout = url.hostname or "127.0.0.1", url.port or 80, timeout
        self._headers = {"x-hyphae-key": api_key} if api_key else {}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None, admin: bool = False) -> Any:
        headers = dict(self._headers)
        if admin:
            try:
                headers["x-hyphae-admin"] = (self._home / ADMIN_TOKEN_FILE).read_text().strip()
            except OSError as exc:
                raise Unavailable(f"cannot read the admin token of {self._home}: {exc}") from None
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
        target = f"{path}?{query}" if query else path
        body = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            headers["content-type"] = "application/json"
        try:
            status, content = self._exchange(method, target, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"the Hyphae daemon at {self.base_url} is not reachable ({type(exc).__name__})") from None
        try:
            data = jsonlib.loads(content)
        except ValueError:
            raise Unavailable(f"the daemon answered {status} with no JSON") from None
        if 200 <= status < 300:
            return data
        error = data.get("error", {}) if isinstance(data, dict) else {}
        cls = _ERRORS.get(error.get("reason"), HyphaeError)
        details = {k: v for k, v in error.items() if k not in ("reason", "message", "field")}
        raise cls(error.get("message", f"HTTP {status}"), field=error.get("field"), **details)

    def _exchange(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        reused = self._conn is not None
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            self._conn.request(method, target, body=body, headers=headers)
            response = self._conn.getresponse()
            return response.status, response.read()
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            self.close()
            if not reused:
                raise
            # The daemon closed the idle kept-alive connection before reading this request: once more, fresh.
            return self._exchange(method, target, body, headers)
        except BaseException:
            self.close()
            raise
