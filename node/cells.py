"""The cell: the unit of memory, and the validation of everything that makes one.

Validation functions are pure and raise :class:`~node.errors.InvalidArgument` (or
:class:`~node.errors.TooLarge`) naming the field, so every surface reports the same
specific error and nothing is stored when any check fails.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from datetime import datetime
from typing import Any

import numpy as np

from .energy import CELL_TYPES
from .errors import InvalidArgument, TooLarge

__all__ = [
    "Cell",
    "CELL_TYPES",
    "LAYERS",
    "MAX_CONTENT_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_QUERY_BYTES",
    "MAX_PAGE",
    "DEFAULT_PAGE",
    "check_content",
    "check_cell_type",
    "check_cell_types",
    "check_salience",
    "check_unit_interval",
    "check_uuid",
    "check_source_ref",
    "check_metadata",
    "check_idempotency_key",
    "check_project",
    "check_text",
    "check_int",
    "check_layer",
    "parse_time_ms",
]

MAX_CONTENT_BYTES = 64 * 1024
MAX_METADATA_BYTES = 16 * 1024
MAX_IDEMPOTENCY_KEY = 200
MAX_NAME_CHARS = 200
MAX_QUERY_BYTES = 8 * 1024
MAX_PAGE = 500  # items in one page of a listing
DEFAULT_PAGE = 50
LAYERS = ("L0", "L1", "L2")


@dataclasses.dataclass(frozen=True)
class Cell:
    """An immutable memory cell as stored (the seeds call its id ``node_id``)."""

    node_id: str
    tenant_id: str
    source_agent: str
    origin_node: str
    content: str
    cell_type: str
    salience: float
    created_at: int
    layer: str
    embedding: np.ndarray
    embedding_space: str
    scene_id: str | None = None
    session_id: str | None = None
    project: str | None = None
    source_ref: dict[str, str] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    hops: int = 0
    signature: bytes | None = None
    forgotten_at: int | None = None


def utf8_size(value: str, field: str) -> int:
    """Bytes as UTF-8; lone surrogates (not text) are refused, not crashed on."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"'{field}' is not valid Unicode text (lone surrogate)", field=field) from None


def check_content(value: Any, field: str = "content") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"'{field}' must be a string", field=field)
    size = utf8_size(value, field)
    if size == 0:
        raise InvalidArgument(f"'{field}' must not be empty", field=field)
    if size > MAX_CONTENT_BYTES:
        raise TooLarge(
            f"'{field}' is {size} bytes; the limit is {MAX_CONTENT_BYTES} bytes (64 KiB)",
            field=field,
            limit=MAX_CONTENT_BYTES,
        )
    return value


def check_cell_type(value: Any, field: str = "cell_type") -> str:
    if value not in CELL_TYPES:
        raise InvalidArgument(
            f"'{field}' must be one of {', '.join(CELL_TYPES)} (exact spelling), not {value!r}",
            field=field,
        )
    return value


def check_cell_types(value: Any, field: str = "cell_types") -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidArgument(f"'{field}' must be a non-empty list of cell types", field=field)
    return tuple(dict.fromkeys(check_cell_type(v, field) for v in value))


def check_unit_interval(value: Any, field: str) -> float:
    """A number in [0, 1]; booleans and NaN are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidArgument(f"'{field}' must be a number between 0 and 1", field=field)
    if not 0.0 <= value <= 1.0:
        raise InvalidArgument(f"'{field}' must be between 0 and 1, not {value}", field=field)
    return float(value)


def check_salience(value: Any) -> float:
    return 0.5 if value is None else check_unit_interval(value, "salience")


def check_uuid(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"'{field}' must be a UUID string", field=field)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"'{field}' is not a valid UUID: {value[:64]!r}", field=field) from None


def check_source_ref(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    field = "source_ref"
    if not isinstance(value, dict) or set(value) != {"kind", "locator"}:
        raise InvalidArgument(
            "'source_ref' must be an object with exactly the string fields 'kind' and 'locator'",
            field=field,
        )
    for key in ("kind", "locator"):
        item = value[key]
        if not isinstance(item, str) or not item:
            raise InvalidArgument(f"'source_ref.{key}' must be a non-empty string", field=field)
        utf8_size(item, "source_ref")
        if len(item) > 2048:
            raise TooLarge(f"'source_ref.{key}' is longer than 2048 characters", field=field)
    return {"kind": value["kind"], "locator": value["locator"]}


def check_metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument("'metadata' must be a JSON object", field="metadata")
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"'metadata' is not plain JSON: {exc}", field="metadata") from None
    size = utf8_size(encoded, "metadata")
    if size > MAX_METADATA_BYTES:
        raise TooLarge(
            f"'metadata' is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} bytes (16 KiB)",
            field="metadata",
            limit=MAX_METADATA_BYTES,
        )
    return json.loads(encoded)


def check_idempotency_key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument("'idempotency_key' must be a non-empty string", field="idempotency_key")
    utf8_size(value, "idempotency_key")
    if len(value) > MAX_IDEMPOTENCY_KEY:
        raise TooLarge(
            f"'idempotency_key' has {len(value)} characters; the limit is {MAX_IDEMPOTENCY_KEY}",
            field="idempotency_key",
        )
    return value


def check_text(value: Any, field: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"'{field}' must be a non-empty string", field=field)
    if len(value) > max_chars:
        raise TooLarge(f"'{field}' is longer than {max_chars} characters", field=field)
    utf8_size(value, field)
    return value


def check_project(value: Any, field: str = "project") -> str | None:
    return None if value is None else check_text(value, field)


def check_int(value: Any, field: str, *, low: int, high: int | None = None, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"'{field}' must be an integer", field=field)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidArgument(f"'{field}' must be {bounds}, not {value}", field=field)
    return value


def check_layer(value: Any) -> str:
    if value not in LAYERS:
        raise InvalidArgument(f"'layer' must be one of L0, L1, L2, not {value!r}", field="layer")
    return value


_MAX_MS = 2**63 - 1


def parse_time_ms(value: Any, field: str) -> int:
    """Milliseconds since the epoch, given as an integer or an RFC 3339 string."""
    if isinstance(value, bool):
        raise InvalidArgument(f"'{field}' must be milliseconds or an RFC 3339 time", field=field)
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgument(f"'{field}' must not be negative", field=field)
        if value > _MAX_MS:  # SQLite integers are 64-bit; a larger one would crash the query
            raise InvalidArgument(f"'{field}' is too large to be milliseconds since the epoch", field=field)
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None and "T" in text.upper():
                return int(moment.timestamp() * 1000)
    raise InvalidArgument(
        f"'{field}' must be milliseconds since the epoch or an RFC 3339 time such as "
        f"2026-01-31T09:00:00Z, not {str(value)[:64]!r}",
        field=field,
    )
