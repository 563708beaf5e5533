"""Moving over from the official MCP memory server (modelcontextprotocol/servers, src/memory).

That server keeps a knowledge graph in a JSONL file (``memory.json`` by default), written
entities first, then relations, one object per line::

    {"type":"entity","name":"John_Smith","entityType":"person","observations":["Speaks Spanish"]}
    {"type":"relation","from":"John_Smith","to":"Anthropic","relationType":"works_at"}

``hyphae import --from memory-server FILE`` stores each line as one cell, as the agent of
``HYPHAE_API_KEY`` (so through the facade, and through the daemon when one runs):

- an **entity** becomes a cell whose content is ``"John_Smith (person)"`` followed by one
  ``- observation`` line each; its type is the entityType when that names a cell type
  (``decision`` -> Decision, case-insensitive), else ``Fact``;
- a **relation** becomes a ``Fact`` reading ``"John_Smith works at Anthropic"``
  (underscores in the relation type read as spaces);
- both keep the graph in ``metadata.memory_graph`` (kind, name and entityType, or from,
  to and relationType) and point back with ``source_ref {kind: "memory-graph",
  locator: "entity:NAME" | "relation:FROM|TYPE|TO"}``.

Each cell's idempotency key is a hash of its line, so importing the same file again stores
nothing new, and an interrupted import is simply run again. Unknown extra fields (newer
servers add ``project``, ``createdAt``...) are kept in the metadata, not refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from .energy import CELL_TYPES
from .errors import InvalidArgument

__all__ = ["SOURCE_KIND", "store_requests", "import_memory_graph"]

SOURCE_KIND = "memory-graph"
_TYPES = {name.lower(): name for name in CELL_TYPES}
_ENTITY_KEYS = ("name", "entityType", "observations")
_RELATION_KEYS = ("from", "to", "relationType")


class GraphLineError(Exception):
    """What is wrong with one line of a memory-server file."""


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise GraphLineError(f"'{key}' must be a non-empty string")
    return value


def _extras(record: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: val for k, val in sorted(record.items()) if k not in known and k != "type"}


def _key(record: dict[str, Any]) -> str:
    canonical = json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return f"{SOURCE_KIND}:{hashlib.sha256(canonical.encode()).hexdigest()[:40]}"


def entity_request(record: dict[str, Any]) -> dict[str, Any]:
    name, entity_type = _text(record, "name"), _text(record, "entityType")
    observations = record.get("observations", [])
    if not isinstance(observations, list) or not all(isinstance(o, str) for o in observations):
        raise GraphLineError("'observations' must be a list of strings")
    content = "\n".join([f"{name} ({entity_type})", *(f"- {o}" for o in observations if o.strip())])
    return {
        "content": content,
        "cell_type": _TYPES.get(entity_type.strip().lower(), "Fact"),
        "metadata": {"memory_graph": {"kind": "entity", "name": name, "entityType": entity_type,
                                      **_extras(record, _ENTITY_KEYS)}},
        "source_ref": {"kind": SOURCE_KIND, "locator": f"entity:{name}"},
        "idempotency_key": _key(record),
    }  # fmt: skip


def relation_request(record: dict[str, Any]) -> dict[str, Any]:
    source, target, relation = _text(record, "from"), _text(record, "to"), _text(record, "relationType")
    return {
        "content": f"{source} {relation.replace('_', ' ')} {target}",
        "cell_type": "Fact",
        "metadata": {"memory_graph": {"kind": "relation", "from": source, "to": target, "relationType": relation,
                                      **_extras(record, _RELATION_KEYS)}},
        "source_ref": {"kind": SOURCE_KIND, "locator": f"relation:{source}|{relation}|{target}"},
        "idempotency_key": _key(record),
    }  # fmt: skip


def store_requests(path: Path) -> Iterator[tuple[int, int, dict[str, Any] | GraphLineError]]:
    """(line number, bytes read so far, the store call's fields or what is wrong with the line), streamed."""
    offset = 0
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            offset += len(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield line_no, offset, GraphLineError(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                yield line_no, offset, GraphLineError(f"not JSON ({exc})")
                continue
            try:
                if not isinstance(record, dict):
                    raise GraphLineError("not a JSON object")
                kind = record.get("type")
                if kind == "entity":
                    yield line_no, offset, entity_request(record)
                elif kind == "relation":
                    yield line_no, offset, relation_request(record)
                else:
                    hint = " (a Hyphae export? import it without --from)" if "format" in record or "kind" in record else ""
                    raise GraphLineError(f"'type' must be \"entity\" or \"relation\", not {kind!r}{hint}")
            except GraphLineError as exc:
                yield line_no, offset, exc


async def import_memory_graph(
    path: Path,
    store: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
    *,
    progress: Callable[[int, int], None] | None = None,
    on_error: Callable[[int, str], None] | None = None,
) -> dict[str, Any]:
    """Store every entity and relation of ``path`` with ``store`` (a facade ``store`` call
    for one agent); returns counts and per-line errors. A line the facade refuses (too
    large, say) is reported and skipped; any other failure stops the import."""
    report: dict[str, Any] = {"entities": 0, "relations": 0, "errors": [], "error_count": 0}
    size = Path(path).stat().st_size
    for line_no, offset, request in store_requests(Path(path)):
        problem = str(request) if isinstance(request, GraphLineError) else None
        if problem is None:
            try:
                await store(request)
            except InvalidArgument as exc:
                problem = f"refused: {exc.message}"
            else:
                kind = request["metadata"]["memory_graph"]["kind"]
                report["entities" if kind == "entity" else "relations"] += 1
        if problem is not None:
            report["error_count"] += 1
            report["errors"].append({"line": line_no, "reason": problem})
            if on_error is not None:
                on_error(line_no, problem)
        if progress is not None:
            progress(offset, size)
    return report
