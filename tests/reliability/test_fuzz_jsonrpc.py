"""Fuzz the JSON-RPC layer: the parser, the dispatcher's method table, the stdio framing.

* ``jsonrpc.parse`` over arbitrary bytes and over mutated valid messages never raises and
  always yields one event; a rejection is -32700 or -32600 and its response encodes to
  one line of JSON.
* Over JSON values shaped like messages (every field present or not, of any type), the
  event is exactly what the rules table in ``mcp_bridge/jsonrpc.py`` says: the table is
  restated here as a small independent model.
* ``Dispatcher.handle`` over any message: a response is owed exactly for requests and
  rejections, carries the request's id, and is never an internal error.
* ``serve_stdio`` over a byte stream cut into random chunks (valid requests, garbage,
  notifications, blank and over-long lines): one response line per owed answer, each a
  whole JSON object, and the loop ends cleanly at EOF.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mcp_bridge import Dispatcher, jsonrpc, serve_stdio
from mcp_bridge.dispatch import SUPPORTED_PROTOCOL_VERSIONS
from mcp_bridge.jsonrpc import (
    INVALID_REQUEST, PARSE_ERROR, MessageRejected, NotificationReceived, RequestReceived, ResponseReceived,
)  # fmt: skip
from tests.mcp_bridge.fakes import ALICE, FakeService
from tests.mcp_bridge.test_stdio import CollectingStdout, ScriptedStdin

from .fuzz import check_error, count, fuzz_report, fuzz_settings, json_values  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("fuzz_report")

VALID = [
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"store","arguments":{"content":"x"}}}',
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
    b'{"jsonrpc":"2.0","id":7,"result":{}}',
]
METHODS = ["initialize", "ping", "tools/list", "server/discover", "notifications/initialized",
           "notifications/cancelled", "prompts/list", ""]  # fmt: skip


def check_event(event: Any) -> None:
    assert isinstance(event, (RequestReceived, NotificationReceived, ResponseReceived, MessageRejected)), event
    if isinstance(event, MessageRejected):
        assert event.error.code in (PARSE_ERROR, INVALID_REQUEST) and event.error.message
        line = jsonrpc.encode(event.response())
        assert b"\n" not in line and json.loads(line)["error"]["code"] == event.error.code


@fuzz_settings(300)
@given(st.binary(max_size=400) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_always_become_one_event(data: bytes) -> None:
    count("jsonrpc.parse arbitrary bytes")
    check_event(jsonrpc.parse(data))


@fuzz_settings(200)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, 200))  # fmt: skip
def test_mutated_and_truncated_messages_always_become_one_event(valid: bytes, flips, cut: int) -> None:
    count("jsonrpc.parse mutated messages")
    raw = bytearray(valid)
    for position, value in flips:
        raw[position % len(raw)] = value
    check_event(jsonrpc.parse(bytes(raw)))
    check_event(jsonrpc.parse(bytes(raw[: len(raw) - cut % len(raw)])))


def expected_kind(message: Any) -> type:
    """The rules table of mcp_bridge/jsonrpc.py, restated."""
    if not isinstance(message, dict):
        return MessageRejected
    has_id = "id" in message
    if has_id and not (isinstance(message["id"], str) or (isinstance(message["id"], int) and not isinstance(message["id"], bool))):
        return MessageRejected
    if message.get("jsonrpc") != "2.0":
        return MessageRejected
    if "method" in message:
        if not isinstance(message["method"], str):
            return MessageRejected
        if "params" in message and not isinstance(message["params"], (dict, list)):
            return MessageRejected
        return RequestReceived if has_id else NotificationReceived
    if has_id and ("result" in message) != ("error" in message):
        return ResponseReceived
    return MessageRejected


def shaped_messages() -> st.SearchStrategy:
    fields = {
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2.0, None]) | json_values(2),
        "id": st.integers() | st.text(max_size=5) | json_values(2),
        "method": st.sampled_from(METHODS) | json_values(2),
        "params": st.dictionaries(st.text(max_size=10), json_values(3), max_size=3) | json_values(3),
        "result": json_values(2),
        "error": json_values(2),
    }
    return st.fixed_dictionaries({}, optional=fields) | json_values(4)


@fuzz_settings(300)
@given(shaped_messages())
def test_message_shaped_values_are_classified_by_the_rules_table(message: Any) -> None:
    count("jsonrpc.parse message-shaped values")
    event = jsonrpc.parse(message)
    check_event(event)
    assert type(event) is expected_kind(message), (message, event)
    assert type(jsonrpc.parse(json.dumps(message))) is type(event)  # decoded or not, the same answer


@fuzz_settings(200)
@given(shaped_messages())
async def test_the_dispatcher_answers_exactly_what_is_owed(message: Any) -> None:
    count("dispatcher.handle message-shaped values")
    event = jsonrpc.parse(message)
    with trio.fail_after(10):
        response = await Dispatcher(FakeService(), server_version="0").handle(json.dumps(message), ALICE)
    if isinstance(event, (NotificationReceived, ResponseReceived)):
        assert response is None
        return
    assert response is not None and response["jsonrpc"] == "2.0"
    if isinstance(event, RequestReceived):
        assert response["id"] == event.id
    if "error" in response:
        check_error(response["error"])
    elif isinstance(event, RequestReceived) and event.method == "initialize":
        assert response["result"]["protocolVersion"] in SUPPORTED_PROTOCOL_VERSIONS


LINE_LIMIT = 200


def stdio_lines() -> st.SearchStrategy:
    line = st.one_of(
        st.sampled_from(VALID),
        st.integers(1, 10**6).map(lambda n: json.dumps({"jsonrpc": "2.0", "id": n, "method": "ping"}).encode()),
        st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")),
        st.sampled_from([b"", b"   ", b"\r", b"[]", b"{}", b"null"]),
        st.integers(LINE_LIMIT - 2, LINE_LIMIT + 50).map(lambda n: b'{"jsonrpc":"2.0","id":1,"method":"' + b"p" * n + b'"}'),
    )
    return st.lists(line, max_size=12)


def owed(line: bytes) -> int:
    if len(line) > LINE_LIMIT:
        return 1  # the too-long error
    if not line.strip():
        return 0
    return int(isinstance(jsonrpc.parse(line), (RequestReceived, MessageRejected)))


@fuzz_settings(150)
@given(stdio_lines(), st.integers(1, 64), st.booleans())
async def test_stdio_answers_every_owed_line_whole_whatever_the_chunking(lines, chunk: int, final_newline: bool) -> None:
    count("stdio framing chunked streams")
    stream = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    chunks = [stream[i:i + chunk] for i in range(0, len(stream), chunk)]
    stdout = CollectingStdout(piece=7)
    handle = Dispatcher(FakeService(), server_version="0").bind(ALICE)
    with trio.fail_after(10):
        await serve_stdio(handle, stdin=ScriptedStdin(chunks), stdout=stdout, max_line_bytes=LINE_LIMIT)
    out = bytes(stdout.data)
    assert out == b"" or out.endswith(b"\n")
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == sum(owed(line) for line in stream.split(b"\n")), (lines, answers)
    for answer in answers:
        assert answer["jsonrpc"] == "2.0"
        if "error" in answer:
            check_error(answer["error"])
