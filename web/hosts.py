"""The ``Host`` check: the API port answers only requests addressed to it by a name it serves.

DNS rebinding: a web page on ``evil.example`` re-points its own name at 127.0.0.1 and then
calls the local daemon from the browser. The browser then sends ``Host: evil.example:7777``
(it cannot lie about the name it resolved), and the ``Origin`` it sends may be absent on a
simple request. Checking ``Host`` closes that door for every route of the port at once.

Served names: ``localhost``, any loopback address (127.0.0.0/8, ``[::1]``), the address the
daemon is bound to, and what ``[api] allowed_hosts`` lists (``"name"`` for any port,
``"name:port"`` for one). A loopback name or the bound address must carry the daemon's own
port when it carries one (a page served by another local port proves nothing). A request with
no ``Host`` at all (HTTP/1.0 tools) carries no name a browser chose and is let through.
Anything else gets 421 Misdirected Request with a JSON body that says what to configure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .asgi import ASGIApp, Receive, Scope, Send, header, send_bytes
from .origins import is_loopback_host

__all__ = ["HostCheck", "guard_hosts", "split_host"]


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6][:port]`` as (lower-case name, port or None); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text = value.partition(":")
        if not sep:
            port_text = None
        elif ":" in port_text:
            return None  # an IPv6 address must be bracketed in a Host header
    if not name:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return name, int(port_text)


class HostCheck:
    """Which ``Host`` values the API port accepts (see the module docstring)."""

    def __init__(self, bound_host: str, port: int, allowed: Iterable[str] = ()) -> None:
        self.port = port
        self._own = {bound_host.strip("[]").lower(), "localhost"}
        self._any_port: set[str] = set()
        self._exact: set[tuple[str, int]] = set()
        for entry in allowed:
            parsed = split_host(entry)
            if parsed is None:
                raise ValueError(f"not a host name or host:port: {entry!r}")
            name, entry_port = parsed
            if entry_port is None:
                self._any_port.add(name)
            else:
                self._exact.add((name, entry_port))

    def accepts(self, value: str | None) -> bool:
        if value is None:
            return True
        parsed = split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        if name in self._any_port or (port is not None and (name, port) in self._exact):
            return True
        if name in self._own or is_loopback_host(name):
            return port is None or port == self.port
        return False


def guard_hosts(app: ASGIApp, check: HostCheck) -> ASGIApp:
    """``app`` behind the ``Host`` check; lifespan and other scopes pass through untouched."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = header(scope, "host")
            if not check.accepts(host):
                message = (
                    f"Host {host!r} is not an address this Hyphae node serves (DNS-rebinding guard): "
                    f"call it as 127.0.0.1:{check.port} or localhost:{check.port}, or add the name to "
                    "[api] allowed_hosts in config.toml"
                )
                body = json.dumps({"error": {"reason": "misdirected", "message": message}}).encode()
                await send_bytes(send, 421, body, b"application/json")
                return
        await app(scope, receive, send)

    return guarded
