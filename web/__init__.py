"""HTTP for both ports: our HTTP/1.1 server (h11 + trio) and the small ASGI toolkit its apps share.

The floor under everything that speaks HTTP: the mesh port (``mesh.runtime``) and the API
port's surfaces (``api.rest``, ``mcp_bridge``) all stand on it, and it imports nothing of
ours. :mod:`.server` serves ASGI apps; :mod:`.asgi` reads bodies with a cap, answers the
lifespan scope and writes whole responses; :mod:`.origins` holds the loopback checks.
"""

from typing import TYPE_CHECKING, Any

from .asgi import BodyTooLarge, ClientGone, WebError
from .origins import is_loopback_host, is_loopback_origin

if TYPE_CHECKING:
    from .server import HttpLimits, serve_asgi, serve_http, server_choice

__all__ = [
    "HttpLimits", "serve_asgi", "serve_http", "server_choice",
    "WebError", "BodyTooLarge", "ClientGone",
    "is_loopback_origin", "is_loopback_host",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The server's names load on first use: ``hyphae mcp`` relays over the local socket and
    reads only the toolkit, and must not pay for h11 and the server to start."""
    if name in ("HttpLimits", "serve_asgi", "serve_http", "server_choice"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
