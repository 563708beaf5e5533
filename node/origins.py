"""The DNS-rebinding guard shared by the REST and MCP surfaces: is an Origin loopback?"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback_origin"]


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
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
