"""A grpcio client for the tests: the stub generated from the repo's ``.proto``, and the
status a refused call ends with, read as a client would (code, reason, retry hints)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from api.grpc.hyphae.v1 import memory_pb2 as pb
from api.grpc.hyphae.v1 import memory_pb2_grpc as pb_grpc

DEADLINE = 30.0  # seconds per call: generous, CI machines are small and busy

__all__ = ["DEADLINE", "Refusal", "as_dict", "key", "pb", "pb_grpc", "refusal", "stub"]


@contextlib.contextmanager
def stub(address: str) -> Iterator[pb_grpc.MemoryStub]:
    channel = grpc.insecure_channel(address)
    try:
        yield pb_grpc.MemoryStub(channel)
    finally:
        channel.close()


def key(api_key: str) -> tuple[tuple[str, str], ...]:
    return (("x-hyphae-key", api_key),)


def as_dict(message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@dataclasses.dataclass
class Refusal:
    code: grpc.StatusCode
    message: str
    reason: str | None
    field: str | None
    retry_delay_ms: int | None
    pushback_ms: str | None


def refusal(error: grpc.RpcError) -> Refusal:
    """What a client learns from a refused call: its code, and the details' ErrorInfo/RetryInfo."""
    status = rpc_status.from_call(error)
    reason = field = retry = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "hyphae"
            reason, field = info.reason, info.metadata.get("field")
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            hint = error_details_pb2.RetryInfo()
            detail.Unpack(hint)
            retry = hint.retry_delay.seconds * 1000 + hint.retry_delay.nanos // 1_000_000
    trailers = dict(error.trailing_metadata() or ())
    return Refusal(error.code(), error.details(), reason, field, retry, trailers.get("grpc-retry-pushback-ms"))
