"""The one error hierarchy of the node core.

Every failure a caller can cause or observe is a :class:`HyphaeError` with a stable
``reason`` code; the surfaces (MCP, REST, CLI) translate it once, at their boundary::

    HyphaeError                      reason            whose fault
    ├── InvalidArgument              invalid_argument  caller: a field is malformed
    │   └── TooLarge                 too_large         caller: a field exceeds its limit
    ├── Unauthenticated              unauthenticated   caller: missing, unknown or revoked key
    ├── Forbidden                    forbidden         caller: outside the key's read scope
    ├── NotFound                     not_found         caller: no such id in scope
    ├── Conflict                     conflict          caller: the state does not allow it
    ├── Unavailable                  unavailable       local: endpoint down, database closed, ...
    │   └── DiskFull                 disk_full         local: the data dir's disk is full
    └── ConfigError                  misconfigured     local: data dir or config.toml unusable

``field`` names the offending argument where there is one, so a client can point at it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HyphaeError",
    "InvalidArgument",
    "TooLarge",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "Unavailable",
    "DiskFull",
    "ConfigError",
]


class HyphaeError(Exception):
    """Base of every error the node core raises on purpose."""

    reason: str = "internal"
    http_status: int = 500

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The error as plain data: what every surface sends back."""
        data: dict[str, Any] = {"reason": self.reason, "message": self.message}
        if self.field is not None:
            data["field"] = self.field
        data.update(self.details)
        return data


class InvalidArgument(HyphaeError):
    reason = "invalid_argument"
    http_status = 400


class TooLarge(InvalidArgument):
    reason = "too_large"
    http_status = 413


class Unauthenticated(HyphaeError):
    reason = "unauthenticated"
    http_status = 401


class Forbidden(HyphaeError):
    reason = "forbidden"
    http_status = 403


class NotFound(HyphaeError):
    reason = "not_found"
    http_status = 404


class Conflict(HyphaeError):
    reason = "conflict"
    http_status = 409


class Unavailable(HyphaeError):
    reason = "unavailable"
    http_status = 503


class DiskFull(Unavailable):
    """A write found no space on the data dir's disk: nothing was written, reads still work.

    507 Insufficient Storage over REST; over MCP the code of ``unavailable`` (try later) with
    ``data.reason`` ``disk_full``, so a client that only knows the codes still backs off.
    """

    reason = "disk_full"
    http_status = 507


class ConfigError(HyphaeError):
    reason = "misconfigured"
    http_status = 500
