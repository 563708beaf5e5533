"""Where a running daemon says it listens (``daemon.json``) and its admin token file.

Kept apart from ``app.daemon`` so the CLI and ``hyphae mcp`` can find a daemon without
importing the server (the HTTP server, the facade, numpy): every agent start pays that cost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["DAEMON_FILE", "ADMIN_TOKEN_FILE", "read_daemon_file"]

DAEMON_FILE = "daemon.json"
ADMIN_TOKEN_FILE = "admin.token"


def read_daemon_file(home: Path) -> dict[str, Any] | None:
    try:
        return json.loads((home / DAEMON_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None
