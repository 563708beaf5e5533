"""The one table from the core's error kinds to gRPC statuses: complete, packed as clients
read it (ErrorInfo, RetryInfo, the pushback trailer), and the README's table is this one."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from api.grpc.errors import STATUS_OF_REASON, internal_status, status_of
from node import errors
from node.ratelimit import RateLimited

ROOT = Path(__file__).resolve().parents[2]


def kinds(base: type = errors.HyphaeError) -> list[type]:
    found = []
    for sub in base.__subclasses__():
        found += [sub, *kinds(sub)]
    return found


def unpacked(status: grpc.Status) -> tuple[status_pb2.Status, dict[str, str | bytes]]:
    trailers = dict(status.trailing_metadata)
    return status_pb2.Status.FromString(trailers["grpc-status-details-bin"]), trailers


def test_every_error_kind_of_the_core_has_a_status() -> None:
    reasons = {kind.reason for kind in kinds()}
    assert "rate_limited" in reasons and "disk_full" in reasons
    assert reasons == set(STATUS_OF_REASON)


@pytest.mark.parametrize("kind", sorted(set(kinds()), key=lambda k: k.reason), ids=lambda k: k.reason)
def test_a_refusal_carries_its_code_message_and_reason(kind) -> None:
    status = status_of(kind("what went wrong", field="node_id"))
    assert status.code == STATUS_OF_REASON[kind.reason] and status.details == "what went wrong"
    packed, trailers = unpacked(status)
    assert packed.code == status.code.value[0] and packed.message == "what went wrong"
    info = error_details_pb2.ErrorInfo()
    assert packed.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (kind.reason, "hyphae", {"field": "node_id"})
    assert "grpc-retry-pushback-ms" not in trailers and len(packed.details) == 1


def test_a_rate_limit_says_when_to_retry() -> None:
    status = status_of(RateLimited("slow down", retry_after_ms=1250))
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    packed, trailers = unpacked(status)
    retry = error_details_pb2.RetryInfo()
    assert packed.details[1].Unpack(retry)
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (1, 250_000_000)
    assert trailers["grpc-retry-pushback-ms"] == "1250"


def test_a_bug_is_internal_and_tells_the_client_nothing_of_it() -> None:
    status = internal_status(RuntimeError("secret path /home/x"))
    assert status.code == grpc.StatusCode.INTERNAL and "secret" not in status.details
    packed, _ = unpacked(status)
    assert "secret" not in packed.SerializeToString().decode("latin-1")


def test_the_readme_status_table_is_the_code_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    text = readme[readme.index("\n## gRPC\n"):]
    text = text[:text.index("\n## ", 1)]
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            reason, status = line.split("|")[1:3]
            rows[reason.split("`")[1]] = status.split("`")[1]
    assert rows == {reason: code.name for reason, code in STATUS_OF_REASON.items()}
