"""The core's error kinds as gRPC statuses: one table, read by the server and the README.

A refused call ends with the status code of its kind, the core's message, and in the
status details (``grpc-status-details-bin``, a ``google.rpc.Status``) a
``google.rpc.ErrorInfo`` whose ``reason`` is the core's reason code (domain ``hyphae``,
``metadata["field"]`` the offending field when there is one). A key whose rate limit is
exhausted also gets a ``google.rpc.RetryInfo`` and the ``grpc-retry-pushback-ms`` trailer,
which grpcio's own retry policy honours.
"""

from __future__ import annotations

import collections
import logging

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from node.errors import HyphaeError

__all__ = ["DOMAIN", "STATUS_OF_REASON", "internal_status", "status_of"]

log = logging.getLogger("hyphae.grpc")

DOMAIN = "hyphae"

# reason (node.errors, node.ratelimit)  ->  gRPC status code
STATUS_OF_REASON: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.FAILED_PRECONDITION,
    "rate_limited": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    # gRPC's own guide names a full file system as RESOURCE_EXHAUSTED; the reason tells it apart
    "disk_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "misconfigured": grpc.StatusCode.INTERNAL,
}


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    """What ``context.abort_with_status`` takes."""


def status_of(exc: HyphaeError) -> grpc.Status:
    code = STATUS_OF_REASON.get(exc.reason, grpc.StatusCode.INTERNAL)
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=DOMAIN)
    if exc.field is not None:
        info.metadata["field"] = exc.field
    details = [info]
    trailers: list[tuple[str, str | bytes]] = []
    retry_ms = exc.details.get("retry_after_ms") if exc.reason == "rate_limited" else None
    if retry_ms is not None:
        retry_ms = max(1, int(retry_ms))
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=retry_ms // 1000, nanos=(retry_ms % 1000) * 1_000_000)))  # fmt: skip
        trailers.append(("grpc-retry-pushback-ms", str(retry_ms)))
    return _pack(code, exc.message, details, trailers)


def internal_status(exc: BaseException) -> grpc.Status:
    """A bug, not a refusal: logged here, and the client learns nothing of the insides."""
    log.error("gRPC call failed", exc_info=exc)
    return _pack(grpc.StatusCode.INTERNAL, "internal error (see the node's log)",
                 [error_details_pb2.ErrorInfo(reason="internal", domain=DOMAIN)], [])  # fmt: skip


def _pack(code: grpc.StatusCode, message: str, details: list, trailers: list) -> grpc.Status:
    packed = []
    for detail in details:
        wrapped = any_pb2.Any()
        wrapped.Pack(detail)
        packed.append(wrapped)
    status = status_pb2.Status(code=code.value[0], message=message, details=packed)
    return _Status(code, message, (*trailers, ("grpc-status-details-bin", status.SerializeToString())))
