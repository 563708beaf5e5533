"""The cell: the unit of memory, and the validation of everything that makes one.

Validation functions are pure and raise :class:`~node.errors.InvalidArgument` (or
:class:`~node.errors.TooLarge`) naming the field, so every surface reports the same
specific error and nothing is stored when any check fails. The rules on a cell's own
fields (type, content, salience, source_ref, metadata, names, times) are the mesh's
(:mod:`mesh.cell_rules`), translated here: the decoder applies the very same functions to
every cell a member sends, so a remote cell is held to local input's rules.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from mesh import cell_rules as rules
from mesh.cell_rules import CELL_TYPES, MAX_CONTENT_BYTES, MAX_METADATA_BYTES
from mesh.errors import CellRuleError, Reason

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
    "check_bool",
    "check_layer",
    "parse_time_ms",
]

T = TypeVar("T")

MAX_IDEMPOTENCY_KEY = 200
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
    # node.lifecycle, this node's own knowledge of the cell (never gossiped): its source file's
    # SHA-256 when stored, and whether `hyphae validate` found that file changed or gone since.
    source_hash: str | None = None
    stale_at: int | None = None
    stale_reason: str | None = None


def _node_error(exc: CellRuleError) -> InvalidArgument:
    """A broken cell rule as the caller's error, with the rule's own words."""
    if exc.reason == Reason.CONTENT_TOO_LARGE:
        details = {"limit": exc.limit} if exc.limit is not None else {}
        return TooLarge(exc.message, field=exc.field, **details)
    return InvalidArgument(exc.message, field=exc.field)


def _translated(rule: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(rule)
    def check(*args: Any, **kwargs: Any) -> T:
        try:
            return rule(*args, **kwargs)
        except CellRuleError as exc:
            raise _node_error(exc) from None

    return check


# The cell rules (mesh.cell_rules), raising the node's errors: the same checks the mesh's
# decoder applies to every remote cell, so both refuse exactly the same cells.
utf8_size = _translated(rules.utf8_size)
check_content = _translated(rules.check_content)
check_cell_type = _translated(rules.check_cell_type)
check_unit_interval = _translated(rules.check_unit_interval)
check_source_ref = _translated(rules.check_source_ref)
check_text = _translated(rules.check_text)
_metadata_json = _translated(rules.metadata_json)


def check_cell_types(value: Any, field: str = "cell_types") -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidArgument(f"'{field}' must be a non-empty list of cell types", field=field)
    return tuple(dict.fromkeys(check_cell_type(v, field) for v in value))


def check_salience(value: Any) -> float:
    return 0.5 if value is None else check_unit_interval(value, "salience")


def check_uuid(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"'{field}' must be a UUID string", field=field)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"'{field}' is not a valid UUID: {value[:64]!r}", field=field) from None


def check_metadata(value: Any) -> dict[str, Any]:
    """Plain JSON of at most 16 KiB; returned as the copy JSON gives back."""
    return json.loads(_metadata_json(value))


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


def check_bool(value: Any, field: str) -> bool:
    """A flag: true or false (REST query strings give the text "true"/"false")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise InvalidArgument(f"'{field}' must be true or false, not {str(value)[:32]!r}", field=field)


def check_layer(value: Any) -> str:
    if value not in LAYERS:
        raise InvalidArgument(f"'layer' must be one of L0, L1, L2, not {value!r}", field="layer")
    return value


_time_ms = _translated(rules.check_time_ms)


def parse_time_ms(value: Any, field: str) -> int:
    """Milliseconds since the epoch, given as an integer or an RFC 3339 string."""
    if isinstance(value, bool):
        raise InvalidArgument(f"'{field}' must be milliseconds or an RFC 3339 time", field=field)
    if isinstance(value, int):
        return _time_ms(int(value), field)
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
