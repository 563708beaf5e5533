"""Loopback checks: the DNS-rebinding guard on ``Origin`` headers, and the bind-address guard.

The REST, MCP and metrics surfaces refuse a browser ``Origin`` that is not loopback (a web
page must not drive a local agent's memory), and ``hyphae up`` refuses a non-loopback API
address unless told otherwise. Both ask the same question of a host, answered here once.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback_origin", "is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """``localhost``, any ``127.0.0.0/8`` address or ``::1``; nothing else."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_origin(origin: str) -> bool:
    """``http(s)://localhost``, ``127.0.0.0/8`` or ``[::1]``, any port; nothing else."""
    try:
        parts = urlsplit(origin)
        parts.port  # raises ValueError on a malformed port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.username is not None or parts.query or parts.fragment:
        return False
    if parts.path not in ("", "/"):
        return False
    host = parts.hostname
    return host is not None and is_loopback_host(host)
