"""HTTP for both ports: our HTTP/1.1 server (h11 + trio) and the small ASGI toolkit its apps share.

The floor under everything that speaks HTTP: the mesh port (``mesh.runtime``) and the API
port's surfaces (``api.rest``, ``mcp_bridge``) all stand on it, and it imports nothing of
ours. :mod:`.server` serves ASGI apps; :mod:`.asgi` reads bodies with a cap, answers the
lifespan scope and writes whole responses; :mod:`.origins` holds the loopback checks.
"""

from .asgi import BodyTooLarge, ClientGone, WebError
from .origins import is_loopback_host, is_loopback_origin
from .server import HttpLimits, serve_asgi, serve_http, server_choice

__all__ = [
    "HttpLimits", "serve_asgi", "serve_http", "server_choice",
    "WebError", "BodyTooLarge", "ClientGone",
    "is_loopback_origin", "is_loopback_host",
]  # fmt: skip
