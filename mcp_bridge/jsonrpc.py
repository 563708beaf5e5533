"""JSON-RPC 2.0 framing, with no I/O at all.

Theory of operation: a transport hands :func:`parse` the bytes (or text, or an already
decoded object) of *one* message and gets back exactly one event:

    RequestReceived       has an ``id``: the peer waits for exactly one response
    NotificationReceived  no ``id``: never answered, not even with an error
    ResponseReceived      a reply to a request *we* sent (we send none, so it is dropped)
    MessageRejected       unparseable or not a JSON-RPC 2.0 message: carries the error
                          response to send back (``id`` null unless one could be read)

The rules, in the order they are applied:

    input                                          event            code
    not UTF-8, not JSON, NaN/Infinity literals     MessageRejected  -32700 parse error
    a JSON array (a batch)                         MessageRejected  -32600 (see below)
    not an object, "jsonrpc" != "2.0"              MessageRejected  -32600
    "id" present but not a string or an integer    MessageRejected  -32600 (id null)
    "method" present but not a string              MessageRejected  -32600
    "params" present but not an object or array    MessageRejected  -32600
    "method" and "id"                              RequestReceived
    "method" without "id"                          NotificationReceived
    "result" xor "error", with "id", no "method"   ResponseReceived
    anything else                                  MessageRejected  -32600

Batches: JSON-RPC batching was removed from MCP in revision 2025-06-18, and no MCP
client sends them; a JSON array is rejected as a whole with one -32600 error (id null),
so every call still gets exactly one response object.

Ids: MCP requires a string or an integer and forbids null; a JSON boolean is not an
integer, and a float (which JSON-RPC discourages) is refused too.

:func:`success`, :func:`failure` and :func:`encode` build and serialise responses:
compact, UTF-8, one line (``json.dumps`` escapes control characters inside strings, so
an encoded message never contains a raw newline, which the stdio framing relies on).
A result that already knows its own encoding (:class:`EncodedResult`) is spliced in as
it is rather than encoded a second time.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Union

__all__ = [
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "JsonRpcError",
    "EncodedResult",
    "RequestReceived",
    "NotificationReceived",
    "ResponseReceived",
    "MessageRejected",
    "Event",
    "RequestId",
    "parse",
    "success",
    "failure",
    "encode",
    "is_valid_id",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

RequestId = Union[str, int]


class JsonRpcError(Exception):
    """An error that is answered as a JSON-RPC error object: ``{code, message, data?}``."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def __repr__(self) -> str:
        return f"JsonRpcError({self.code}, {self.message!r}, {self.data!r})"


@dataclasses.dataclass(frozen=True)
class RequestReceived:
    id: RequestId
    method: str
    params: dict[str, Any] | list[Any] | None


@dataclasses.dataclass(frozen=True)
class NotificationReceived:
    method: str
    params: dict[str, Any] | list[Any] | None


@dataclasses.dataclass(frozen=True)
class ResponseReceived:
    id: RequestId
    result: Any = None
    error: Any = None


@dataclasses.dataclass(frozen=True)
class MessageRejected:
    error: JsonRpcError
    id: RequestId | None = None

    def response(self) -> dict[str, Any]:
        """The error response owed to the peer."""
        return failure(self.id, self.error)


Event = Union[RequestReceived, NotificationReceived, ResponseReceived, MessageRejected]


def is_valid_id(value: Any) -> bool:
    """A request id MCP accepts: a string or an integer (a bool is neither)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads/json.dumps with any non-default option build a new decoder or
# encoder on every call, which cost as much as parsing a tools/call message itself.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _decode(data: bytes | bytearray | memoryview | str) -> Any:
    if isinstance(data, (bytes, bytearray, memoryview)):
        text = bytes(data).decode("utf-8")  # UnicodeDecodeError is a ValueError
    else:
        text = data
    return _DECODER.decode(text)


def parse(data: bytes | bytearray | memoryview | str | Any) -> Event:
    """Turn one message into one event. Never raises for any input.

    ``bytes``/``str`` are decoded as JSON first; anything else is taken as an already
    decoded JSON value (a transport that parsed the body itself passes a dict).
    """
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        try:
            message = _decode(data)
        except (ValueError, RecursionError):
            return MessageRejected(JsonRpcError(PARSE_ERROR, "parse error: the message is not valid JSON"))
    else:
        message = data
    return _classify(message)


def _invalid(message: str, id: RequestId | None = None) -> MessageRejected:
    return MessageRejected(JsonRpcError(INVALID_REQUEST, f"invalid request: {message}"), id)


def _classify(message: Any) -> Event:
    if isinstance(message, list):
        return _invalid(
            "JSON-RPC batches are not supported (MCP removed them in 2025-06-18); send one message per request"
        )
    if not isinstance(message, dict):
        return _invalid("a JSON-RPC message must be a JSON object")
    has_id = "id" in message
    message_id = message.get("id")
    if has_id and not is_valid_id(message_id):
        return _invalid("'id' must be a string or an integer")
    known_id = message_id if has_id else None
    if message.get("jsonrpc") != "2.0":
        return _invalid("'jsonrpc' must be exactly \"2.0\"", known_id)

    if "method" in message:
        method = message["method"]
        if not isinstance(method, str):
            return _invalid("'method' must be a string", known_id)
        params = message.get("params")
        if "params" in message and not isinstance(params, (dict, list)):
            return _invalid("'params' must be an object or an array", known_id)
        if has_id:
            return RequestReceived(message_id, method, params)
        return NotificationReceived(method, params)

    if has_id and (("result" in message) != ("error" in message)):
        return ResponseReceived(message_id, message.get("result"), message.get("error"))
    return _invalid("a message needs a 'method' (request or notification) or a 'result'/'error' (response)", known_id)


class EncodedResult(dict):
    """A result object that carries its own compact JSON text in ``json``.

    It is still the dict (callers read it as one); :func:`encode` writes ``json`` instead
    of walking the dict again. Whoever builds one guarantees that ``json`` is the dict
    encoded as :func:`encode` would (compact, ``ensure_ascii=False``, no NaN).
    """

    __slots__ = ("json",)

    def __init__(self, value: dict[str, Any], json_text: str) -> None:
        super().__init__(value)
        self.json = json_text


def success(id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": result}


def failure(id: RequestId | None, error: JsonRpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "error": error.to_dict()}


_SUCCESS_KEYS = frozenset({"jsonrpc", "id", "result"})


def encode(message: Any) -> bytes:
    """Compact UTF-8 JSON on one line (no trailing newline).

    A lone surrogate (legal in a JSON string, not in UTF-8) falls back to ``\\u`` escapes.
    """
    try:
        result = message.get("result") if type(message) is dict else None
        if type(result) is EncodedResult and message.keys() == _SUCCESS_KEYS and message["jsonrpc"] == "2.0":
            head = COMPACT.encode(message["id"])
            return f'{{"jsonrpc":"2.0","id":{head},"result":{result.json}}}'.encode("utf-8")
        return COMPACT.encode(message).encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT_ASCII.encode(message).encode("ascii")
