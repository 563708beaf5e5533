"""The JSON-RPC 2.0 core: every input becomes exactly one event, and nothing raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_bridge import jsonrpc
from mcp_bridge.jsonrpc import (
    INVALID_REQUEST,
    PARSE_ERROR,
    MessageRejected,
    NotificationReceived,
    RequestReceived,
    ResponseReceived,
)

# -- well-formed messages -------------------------------------------------------------


@pytest.mark.parametrize("form", [bytes, str, "object"])
def test_a_request_in_any_form_becomes_request_received(form) -> None:
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"cursor": "x"}}
    data = message if form == "object" else json.dumps(message)
    if form is bytes:
        data = data.encode()
    assert jsonrpc.parse(data) == RequestReceived(7, "tools/list", {"cursor": "x"})


def test_string_ids_and_absent_params_are_kept_as_they_are() -> None:
    assert jsonrpc.parse(b'{"jsonrpc":"2.0","id":"a-1","method":"ping"}') == RequestReceived("a-1", "ping", None)


def test_array_params_are_valid_json_rpc() -> None:
    assert jsonrpc.parse('{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]}') == RequestReceived(1, "m", [1, 2])


def test_a_message_without_id_is_a_notification() -> None:
    event = jsonrpc.parse(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert event == NotificationReceived("notifications/initialized", None)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "id": "x", "error": {"code": -1, "message": "no"}},
    ],
)
def test_a_reply_from_the_client_is_a_response_received(message) -> None:
    assert isinstance(jsonrpc.parse(message), ResponseReceived)


# -- rejected messages ----------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"   ", b"{", b'{"jsonrpc": "2.0",}', b"\xff\xfe{}", b'{"jsonrpc":"2.0","id":1,"method":"m","params":NaN}',
     b"Infinity", "\ufeff{}".encode(), b"[" * 100_000],
)
def test_malformed_json_is_a_parse_error_with_id_null(data) -> None:
    event = jsonrpc.parse(data)
    assert isinstance(event, MessageRejected)
    assert event.error.code == PARSE_ERROR
    assert event.response() == {"jsonrpc": "2.0", "id": None, "error": event.error.to_dict()}


@pytest.mark.parametrize("batch", [[], [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]])
def test_batches_are_refused_whole_with_one_invalid_request(batch) -> None:
    event = jsonrpc.parse(json.dumps(batch))
    assert isinstance(event, MessageRejected)
    assert (event.error.code, event.id) == (INVALID_REQUEST, None)
    assert "batch" in event.error.message


@pytest.mark.parametrize("data", ['"ping"', "42", "null", "true"])
def test_a_message_that_is_not_an_object_is_an_invalid_request(data) -> None:
    event = jsonrpc.parse(data)
    assert isinstance(event, MessageRejected) and event.error.code == INVALID_REQUEST


@pytest.mark.parametrize("bad_id", [None, True, 1.5, 2.0, {}, []])
def test_an_id_that_is_not_a_string_or_integer_is_refused_with_id_null(bad_id) -> None:
    event = jsonrpc.parse({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
    assert isinstance(event, MessageRejected)
    assert (event.error.code, event.id) == (INVALID_REQUEST, None)


@pytest.mark.parametrize(
    "message, field",
    [
        ({"id": 1, "method": "ping"}, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, "jsonrpc"),
        ({"jsonrpc": 2.0, "id": 1, "method": "ping"}, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, "method"),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "x"}, "params"),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": None}, "params"),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": 3}, "params"),
        ({"jsonrpc": "2.0", "id": 1}, "method"),
        ({"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}}, "method"),
    ],
)
def test_an_invalid_request_with_a_readable_id_echoes_it(message, field) -> None:
    event = jsonrpc.parse(message)
    assert isinstance(event, MessageRejected)
    assert (event.error.code, event.id) == (INVALID_REQUEST, 1)
    assert field in event.error.message


def test_an_invalid_message_without_id_is_still_answered() -> None:
    # {"method": 1} cannot be known to be a notification: JSON-RPC answers it with id null.
    event = jsonrpc.parse({"jsonrpc": "2.0", "method": 1, "params": "bar"})
    assert isinstance(event, MessageRejected)
    assert event.response()["id"] is None


# -- encoding -------------------------------------------------------------------------


def test_encode_is_compact_utf8_on_one_line() -> None:
    data = jsonrpc.encode(jsonrpc.success(1, {"text": "line one\nline two\r\u2028", "name": "Zoë"}))
    assert b"\n" not in data and b"\r" not in data
    assert b": " not in data and b", " not in data
    assert "Zoë".encode() in data
    assert json.loads(data)["result"]["text"] == "line one\nline two\r\u2028"


def test_encode_escapes_a_lone_surrogate_instead_of_failing() -> None:
    text = json.loads('"\\ud800"')
    data = jsonrpc.encode(jsonrpc.success(1, {"text": text}))
    assert json.loads(data)["result"]["text"] == text


def test_encode_refuses_nan_rather_than_write_invalid_json() -> None:
    with pytest.raises(ValueError):
        jsonrpc.encode({"x": float("nan")})


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    request_id=st.integers() | st.text(),
    payload=st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=5),
)
def test_a_tool_result_encoded_once_is_byte_for_byte_what_encoding_it_twice_gives(request_id, payload) -> None:
    from mcp_bridge.dispatch import _envelope

    envelope = _envelope(payload)
    assert isinstance(envelope, jsonrpc.EncodedResult)
    spliced = jsonrpc.encode(jsonrpc.success(request_id, envelope))
    walked = jsonrpc.encode(jsonrpc.success(request_id, dict(envelope)))  # a plain dict: encoded the long way
    assert spliced == walked
    decoded = json.loads(spliced)
    assert decoded["result"]["structuredContent"] == payload
    assert json.loads(decoded["result"]["content"][0]["text"]) == payload


def test_a_spliced_result_with_a_lone_surrogate_falls_back_to_escapes() -> None:
    from mcp_bridge.dispatch import _envelope

    text = json.loads('"\\udc80"')
    data = jsonrpc.encode(jsonrpc.success(text, _envelope({"content": text})))
    assert data.isascii()
    decoded = json.loads(data)
    assert decoded["id"] == text and decoded["result"]["structuredContent"] == {"content": text}


def test_failure_carries_code_message_and_data() -> None:
    error = jsonrpc.JsonRpcError(-32004, "no such scene", {"reason": "not_found"})
    assert jsonrpc.failure("a", error) == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {"code": -32004, "message": "no such scene", "data": {"reason": "not_found"}},
    }
    assert "data" not in jsonrpc.JsonRpcError(-32601, "x").to_dict()


# -- properties -----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200))
def test_parse_never_raises_on_any_bytes(data: bytes) -> None:
    assert isinstance(
        jsonrpc.parse(data), (RequestReceived, NotificationReceived, ResponseReceived, MessageRejected)
    )


@settings(max_examples=40, deadline=None)
@given(json_values)
def test_parse_never_raises_on_any_json_value(value) -> None:
    event = jsonrpc.parse(json.dumps(value))
    if isinstance(event, MessageRejected):
        assert event.error.code == INVALID_REQUEST
        jsonrpc.encode(event.response())


@settings(max_examples=40, deadline=None)
@given(
    st.one_of(st.text(), st.integers()),
    st.text(min_size=1),
    st.one_of(st.none(), st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
)
def test_any_well_formed_request_round_trips(request_id, method, params) -> None:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    assert jsonrpc.parse(jsonrpc.encode(message)) == RequestReceived(request_id, method, params)
