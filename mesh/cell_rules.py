"""The rules a cell's fields obey, wherever the cell was made: one set, for local input and remote diffs.

A cell an agent stores here is checked by the node's facade (:mod:`node.cells`); a cell a
member signs is checked by the payload decoder (:mod:`mesh.diffs`) before the engine sees,
logs or relays it. Both call these functions, so every cell a node accepts from the mesh is
one it could have accepted from its own agents, and can store: a cell type outside the
nine, a time past SQLite's 64-bit integers or metadata that is not plain JSON is refused on
the way in, not found out where it is stored (or at every start after).

The rules live on the mesh's floor because the arrows point down: the node imports the
mesh, never the reverse. They are pure (no I/O, no clock) and import nothing of the mesh
but :mod:`mesh.errors`, so the node and the CLI load them without the engine.

Each check returns the value (the metadata as its JSON text) or raises
:class:`~mesh.errors.CellRuleError`, naming the field and whether a limit was passed; each
side translates that once, at its boundary: the node into ``InvalidArgument``/``TooLarge``
for its caller, the decoder into a :class:`~mesh.errors.WireError` (a counted drop).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import CellRuleError, Reason

__all__ = [
    "CELL_TYPES", "MAX_CONTENT_BYTES", "MAX_METADATA_BYTES", "MAX_NAME_CHARS", "MAX_SOURCE_REF_CHARS", "MAX_TIME_MS",
    "utf8_size", "check_content", "check_cell_type", "check_unit_interval", "check_source_ref", "metadata_json",
    "check_text", "check_time_ms",
]  # fmt: skip

# Exact spelling, as in seed 001.
CELL_TYPES: tuple[str, ...] = (
    "Decision",
    "Constraint",
    "Risk",
    "Pattern",
    "Lesson",
    "Fact",
    "Preference",
    "Context",
    "Task",
)
_CELL_TYPE_SET = frozenset(CELL_TYPES)

MAX_CONTENT_BYTES = 64 * 1024
MAX_METADATA_BYTES = 16 * 1024
MAX_NAME_CHARS = 200  # projects, agent names, ...
MAX_SOURCE_REF_CHARS = 2048
MAX_TIME_MS = 2**63 - 1  # SQLite integers are 64-bit and signed: a larger time cannot be stored


def _invalid(message: str, field: str) -> CellRuleError:
    return CellRuleError(Reason.INVALID_CELL, message, field=field)


def _too_large(message: str, field: str, limit: int | None = None) -> CellRuleError:
    return CellRuleError(Reason.CONTENT_TOO_LARGE, message, field=field, limit=limit)


def utf8_size(value: str, field: str) -> int:
    """Bytes as UTF-8; lone surrogates (not text) are refused, not crashed on."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _invalid(f"'{field}' is not valid Unicode text (lone surrogate)", field) from None


def check_content(value: Any, field: str = "content") -> str:
    if not isinstance(value, str):
        raise _invalid(f"'{field}' must be a string", field)
    size = utf8_size(value, field)
    if size == 0:
        raise _invalid(f"'{field}' must not be empty", field)
    if size > MAX_CONTENT_BYTES:
        raise _too_large(
            f"'{field}' is {size} bytes; the limit is {MAX_CONTENT_BYTES} bytes (64 KiB)", field, MAX_CONTENT_BYTES
        )
    return value


def check_cell_type(value: Any, field: str = "cell_type") -> str:
    if not isinstance(value, str) or value not in _CELL_TYPE_SET:
        raise _invalid(f"'{field}' must be one of {', '.join(CELL_TYPES)} (exact spelling), not {value!r}", field)
    return value


def check_unit_interval(value: Any, field: str) -> float:
    """A number in [0, 1]; booleans and NaN are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise _invalid(f"'{field}' must be a number between 0 and 1", field)
    if not 0.0 <= value <= 1.0:
        raise _invalid(f"'{field}' must be between 0 and 1, not {value}", field)
    return float(value)


def check_source_ref(value: Any) -> dict[str, str] | None:
    """None, or exactly ``{"kind": ..., "locator": ...}`` with non-empty strings."""
    if value is None:
        return None
    field = "source_ref"
    if not isinstance(value, dict) or set(value) != {"kind", "locator"}:
        raise _invalid("'source_ref' must be an object with exactly the string fields 'kind' and 'locator'", field)
    for key in ("kind", "locator"):
        item = value[key]
        if not isinstance(item, str) or not item:
            raise _invalid(f"'source_ref.{key}' must be a non-empty string", field)
        utf8_size(item, "source_ref")
        if len(item) > MAX_SOURCE_REF_CHARS:
            raise _too_large(f"'source_ref.{key}' is longer than {MAX_SOURCE_REF_CHARS} characters", field)
    return {"kind": value["kind"], "locator": value["locator"]}


def metadata_json(value: Any) -> str:
    """The metadata (a map, None for none) as the JSON text it is stored as: plain JSON only
    (no bytes, NaN or infinity), at most ``MAX_METADATA_BYTES`` as UTF-8."""
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise _invalid("'metadata' must be a JSON object", "metadata")
    if not value:
        return "{}"
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _invalid(f"'metadata' is not plain JSON: {exc}", "metadata") from None
    size = utf8_size(encoded, "metadata")
    if size > MAX_METADATA_BYTES:
        raise _too_large(
            f"'metadata' is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} bytes (16 KiB)", "metadata",
            MAX_METADATA_BYTES,
        )  # fmt: skip
    return encoded


def check_text(value: Any, field: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    """A non-blank string of at most ``max_chars`` characters."""
    if not isinstance(value, str) or not value.strip():
        raise _invalid(f"'{field}' must be a non-empty string", field)
    if len(value) > max_chars:
        raise _too_large(f"'{field}' is longer than {max_chars} characters", field)
    utf8_size(value, field)
    return value


def check_time_ms(value: Any, field: str) -> int:
    """Milliseconds since the epoch, as an integer SQLite can hold (0 to 2^63 - 1)."""
    if value.__class__ is not int:
        raise _invalid(f"'{field}' must be milliseconds since the epoch (an integer)", field)
    if value < 0:
        raise _invalid(f"'{field}' must not be negative", field)
    if value > MAX_TIME_MS:
        raise _invalid(f"'{field}' is too large to be milliseconds since the epoch", field)
    return value
