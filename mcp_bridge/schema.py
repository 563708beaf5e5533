"""A small JSON Schema checker for the subset the tool descriptors use.

Tool arguments are checked by this checker (the subset the
descriptors use: ``type`` (a name or a list), ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``format`` ``uuid``/``date-time``, ``properties``,
``required``, ``additionalProperties: false``, ``items``, ``minItems``/``maxItems``). It is
hand-rolled because the error text is agent-facing and must name the argument and say
what was expected, and the product takes no ``jsonschema`` dependency for a dozen
keywords; the tests hold the schemas, and results, to the real ``jsonschema``. JSON
semantics, not Python's: ``true`` is not a number, NaN is not a number, and ``10.0`` is
an integer (passed on as ``10``). Numeric keywords apply only to numbers and string
keywords only to strings, as in JSON Schema.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from typing import Any

__all__ = ["SchemaViolation", "UUID_PATTERN", "conform", "expectation"]

UUID_PATTERN = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclasses.dataclass(eq=False)
class SchemaViolation(Exception):
    """Where a value broke its schema, and how.

    ``kind`` is ``"invalid"`` (the value at ``path`` is not ``expected``),
    ``"missing"`` (``name`` is required in the object at ``path``) or
    ``"unknown"`` (``name`` is not a property of the object at ``path``).
    """

    kind: str
    path: str
    expected: str = ""
    name: str = ""

    def __str__(self) -> str:
        where = self.path or "the value"
        if self.kind == "missing":
            return f"{where} is missing required field '{self.name}'"
        if self.kind == "unknown":
            return f"{where} has unknown field '{self.name}'"
        return f"{where} must be {self.expected}"


def _is_rfc3339(text: str) -> bool:
    if not _RFC3339.match(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


_FORMATS = {"uuid": lambda s: bool(UUID_PATTERN.match(s)), "date-time": _is_rfc3339}


def _type_matches(name: str, value: Any) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if name == "number":
        return True
    if name == "integer":
        return isinstance(value, int) or value.is_integer()
    raise ValueError(f"unsupported schema type {name!r}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _expect_one(name: str, schema: dict[str, Any]) -> str:
    if "enum" in schema and name == "string":
        return "one of " + ", ".join(map(str, schema["enum"]))
    if name in ("number", "integer"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and hi is not None:
            return _article(f"{name} between {_num(lo)} and {_num(hi)}")
        if lo is not None:
            return _article(f"{name} of at least {_num(lo)}")
        if hi is not None:
            return _article(f"{name} of at most {_num(hi)}")
        return _article(name)
    if name == "string":
        fmt = schema.get("format")
        if fmt == "uuid":
            return "a UUID string"
        if fmt == "date-time":
            return "an RFC 3339 date-time string (e.g. 2025-01-31T09:30:00Z)"
        words = "non-empty string" if schema.get("minLength", 0) >= 1 else "string"
        if "maxLength" in schema:
            words += f" of at most {schema['maxLength']} characters"
        return _article(words)
    if name == "array":
        words = "non-empty array" if schema.get("minItems", 0) >= 1 else "array"
        if "maxItems" in schema:
            words += f" of at most {schema['maxItems']} items"
        if "items" in schema:
            words += " whose items are each " + expectation(schema["items"])
        return _article(words)
    if name == "object":
        props = list(schema.get("properties", {}))
        if not props:
            return "an object"
        required = set(schema.get("required", ()))
        fields = ", ".join(f"{p}{'' if p in required else '?'}" for p in props)
        return f"an object {{{fields}}}"
    return "null" if name == "null" else _article(name)


def expectation(schema: dict[str, Any]) -> str:
    """What a value of this schema is, in words an agent understands."""
    types = schema.get("type")
    if types is None:
        return "one of " + ", ".join(map(str, schema["enum"])) if "enum" in schema else "any JSON value"
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(_expect_one(n, schema) for n in names)


def conform(schema: dict[str, Any], value: Any, path: str = "") -> Any:
    """Check ``value`` against ``schema``; return it normalised (integral floats -> int).

    Raises :class:`SchemaViolation` at the first problem found, depth first.
    """
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        matched = next((n for n in names if _type_matches(n, value)), None)
        if matched is None:
            raise SchemaViolation("invalid", path, expectation(schema))
        if matched == "integer" and isinstance(value, float):
            value = int(value)
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaViolation("invalid", path, expectation(schema))

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if ("minimum" in schema and value < schema["minimum"]) or ("maximum" in schema and value > schema["maximum"]):
            raise SchemaViolation("invalid", path, expectation(schema))
    elif isinstance(value, str):
        too_short = len(value) < schema.get("minLength", 0)
        too_long = "maxLength" in schema and len(value) > schema["maxLength"]
        bad_format = "format" in schema and schema["format"] in _FORMATS and not _FORMATS[schema["format"]](value)
        if too_short or too_long or bad_format:
            raise SchemaViolation("invalid", path, expectation(schema))
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            raise SchemaViolation("invalid", path, expectation(schema))
        if "items" in schema:
            value = [conform(schema["items"], item, f"{path}[{i}]") for i, item in enumerate(value)]
    elif isinstance(value, dict):
        value = _conform_object(schema, value, path)
    return value


def _conform_object(schema: dict[str, Any], value: dict[str, Any], path: str) -> dict[str, Any]:
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise SchemaViolation("missing", path, name=name)
    if schema.get("additionalProperties", True) is False:
        for name in value:
            if name not in properties:
                raise SchemaViolation("unknown", path, name=name)
    out = dict(value)
    for name, sub in properties.items():
        if name in value:
            out[name] = conform(sub, value[name], f"{path}.{name}" if path else name)
    return out
