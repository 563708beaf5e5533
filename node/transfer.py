"""Export and import: a node's memories as one JSONL file.

Theory of operation. ``hyphae export FILE.jsonl`` writes one JSON object per line::

    {"format": "hyphae-export", "version": 1}                       the header, always first
    {"kind": "scene", "scene_id": ..., ...}                          every scene, oldest first
    {"kind": "beacon", "beacon_id": ..., "embedding": "<base64>"}   every beacon, oldest first
    {"kind": "cell", "node_id": ..., "embedding": "<base64>", ...}  every cell, oldest first

Cells keep their provenance (``source_agent``, ``origin_node``, ``hops``, ``signature``)
and carry their vector (float32 little-endian, base64) with its ``embedding_space``: a
node in the same space takes the vector as it is (vectors are not bit-reproducible across
machines, DESIGN §5); a node in another space embeds the content again. A forgotten cell
is exported as a tombstone (``forgotten_at`` set, no content, no vector). The tenant is
not written: what a node imports becomes its own team's. Lines have sorted keys and a
fixed order (created_at, then id), so export -> import into a fresh node -> export gives
the same bytes. The export reads one snapshot (a single read transaction, so a running
daemon can keep writing), page by page (constant memory), into a temporary file that is
renamed into place at the end, so a file with the final name is complete.

``hyphae import FILE.jsonl`` streams the file back. Each line is checked whole before
anything of it is written, so a bad line is reported (line number and reason) and
skipped, never half-stored. Lines are written in batches, one transaction each; cells
already known by id are skipped, so importing twice stores nothing new. After every
batch a checkpoint (``imports/*.json`` in the data dir, keyed by the file's path, size
and mtime) records how far it got: an interrupted import continues from there. A full
disk stops it with :class:`~node.errors.DiskFull` (``disk_full``), saying so.

Beacons are kept as records: they match for the agent that placed them, so they take
effect on a node that has that agent (restoring a node's own export), from its next
start. Imported cells are not gossiped: teammates have them already or import the file.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import trio

from . import cells as v
from .delivery import Beacon
from .errors import DiskFull, InvalidArgument
from .service import MemoryService
from .store import SCENE_FIELDS
from .store.export import Snapshot

__all__ = ["FORMAT", "VERSION", "export_file", "import_file", "ImportReport", "LineError"]

FORMAT = "hyphae-export"
VERSION = 1
HEADER = {"format": FORMAT, "version": VERSION}
PAGE = 500  # rows read per query while exporting
BATCH = 200  # lines written per transaction while importing
MAX_LINE_BYTES = 1024 * 1024
MAX_ERRORS_KEPT = 1000
CHECKPOINT_DIR = "imports"

Progress = Callable[[int, int], None]  # (done, total)


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


# -- export ---------------------------------------------------------------------------

def _cell_record(row: dict[str, Any]) -> dict[str, Any]:
    forgotten_at = row["forgotten_at"]
    record = {
        "kind": "cell",
        "node_id": row["node_id"],
        "source_agent": row["source_agent"],
        "origin_node": row["origin_node"],
        "cell_type": row["cell_type"],
        "salience": row["salience"],
        "scene_id": row["scene_id"],
        "session_id": row["session_id"],
        "project": row["project"],
        "source_ref": row["source_ref"],
        "metadata": row["metadata"],
        "created_at": row["created_at"],
        "layer": row["layer"],
        "embedding_space": row["embedding_space"],
        "hops": row["hops"],
        "signature": _b64(row["signature"]),
        "forgotten_at": forgotten_at,
    }
    for field in ("source_hash", "stale_at", "stale_reason"):  # node.lifecycle; supersede links ride in metadata
        if row[field] is not None:
            record[field] = row[field]
    if forgotten_at is None:
        record["content"] = row["content"]
        record["embedding"] = _b64(row["embedding"])
    return record


def _beacon_record(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "beacon",
        "beacon_id": row["beacon_id"],
        "agent_id": row["agent_id"],
        "origin_node": row["origin_node"],
        "query": row["query"],
        "threshold": row["threshold"],
        "cell_types": row["cell_types"],
        "project": row["project"],
        "min_salience": row["min_salience"],
        "ttl_seconds": row["ttl_seconds"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "removed_at": row["removed_at"],
        "embedding_space": row["embedding_space"],
        "embedding": _b64(row["embedding"]),
    }


def _scene_record(row: dict[str, Any]) -> dict[str, Any]:
    record = {"kind": "scene", **row}
    del record["tenant_id"]
    return record


_EXPORTED = (  # table, record maker; written in this order
    ("scenes", _scene_record),
    ("beacons", _beacon_record),
    ("cells", _cell_record),
)


def _export_sync(service: MemoryService, path: Path, progress: Progress | None) -> dict[str, int]:
    # One read transaction: a consistent snapshot, even while a daemon keeps writing.
    with service.storage.snapshot() as snapshot:
        return _write_export(snapshot, service.config.tenant_id, path, progress)


def _write_export(snapshot: Snapshot, tenant: str, path: Path, progress: Progress | None) -> dict[str, int]:
    counts = snapshot.counts(tenant)
    total, done = sum(counts.values()), 0
    temp = path.with_name(path.name + ".partial")
    try:
        with open(temp, "wb") as out:
            out.write(_line(HEADER))
            for table, make in _EXPORTED:
                for row in snapshot.rows(table, tenant, page=PAGE):
                    out.write(_line(make(row)))
                    done += 1
                    if progress is not None:
                        progress(done, total)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)  # never leave a partial file behind
        raise
    os.replace(temp, path)
    return counts


async def export_file(service: MemoryService, path: Path, *, progress: Progress | None = None) -> dict[str, int]:
    """Write the node's scenes, beacons and cells to ``path``; returns counts per kind."""
    return await trio.to_thread.run_sync(_export_sync, service, Path(path), progress)


# -- import: checking one line --------------------------------------------------------


class LineError(Exception):
    """What is wrong with one line of an import file."""


_CELL_KEYS = {
    "kind", "node_id", "source_agent", "origin_node", "content", "cell_type", "salience", "scene_id", "session_id",
    "project", "source_ref", "metadata", "created_at", "layer", "embedding_space", "embedding", "hops", "signature",
    "forgotten_at", "source_hash", "stale_at", "stale_reason",
}  # fmt: skip
_BEACON_KEYS = {
    "kind", "beacon_id", "agent_id", "origin_node", "query", "threshold", "cell_types", "project", "min_salience",
    "ttl_seconds", "created_at", "expires_at", "removed_at", "embedding_space", "embedding",
}  # fmt: skip
_SCENE_KEYS = {"kind", *(f for f in SCENE_FIELDS if f != "tenant_id")}


def _keys(record: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(record) - allowed)
    if unknown:
        raise LineError(f"unknown field(s) {', '.join(unknown)}")
    missing = sorted(required - set(record))
    if missing:
        raise LineError(f"missing field(s) {', '.join(missing)}")


def _str(record: dict[str, Any], field: str, *, optional: bool = False) -> str | None:
    value = record.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise LineError(f"'{field}' must be a non-empty string")
    return value


def _ms(record: dict[str, Any], field: str, *, optional: bool = False) -> int | None:
    value = record.get(field)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LineError(f"'{field}' must be milliseconds since the epoch (a non-negative integer)")
    return value


def _vector(record: dict[str, Any], dim: int | None) -> np.ndarray:
    text = record.get("embedding")
    if not isinstance(text, str):
        raise LineError("'embedding' must be base64 text")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise LineError("'embedding' is not valid base64") from None
    if not raw or len(raw) % 4:
        raise LineError("'embedding' is not a float32 vector")
    vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if dim is not None and len(vector) != dim:
        raise LineError(f"'embedding' has {len(vector)} dimensions; this node's space has {dim}")
    if not np.all(np.isfinite(vector)):
        raise LineError("'embedding' holds a NaN or infinity")
    return vector


def _checked(check: Callable[..., Any], *args: Any) -> Any:
    try:
        return check(*args)
    except InvalidArgument as exc:
        raise LineError(exc.message) from None


def parse_cell(record: dict[str, Any], tenant_id: str, space: str, dim: int) -> tuple[v.Cell, bool]:
    """A cell line as a Cell of ``tenant_id``; the flag says whether its content must be
    embedded again (another embedding space)."""
    _keys(record, _CELL_KEYS, {"node_id", "source_agent", "origin_node", "cell_type", "created_at", "layer", "embedding_space"})
    forgotten_at = _ms(record, "forgotten_at", optional=True)
    cell_space = _str(record, "embedding_space")
    same_space = cell_space == space
    if forgotten_at is None:
        content = _checked(v.check_content, record.get("content"))
        # Another space: the vector is useless here; the content is embedded again.
        vector = _vector(record, dim) if same_space else np.zeros(0, dtype=np.float32)
    else:
        content, vector = "", np.zeros(0, dtype=np.float32)
    signature = record.get("signature")
    if signature is not None:
        if not isinstance(signature, str):
            raise LineError("'signature' must be base64 text or null")
        try:
            signature = base64.b64decode(signature, validate=True)
        except ValueError:
            raise LineError("'signature' is not valid base64") from None
    hops = record.get("hops", 0)
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise LineError("'hops' must be a non-negative integer")
    layer = _checked(v.check_layer, record.get("layer"))
    source_hash = _str(record, "source_hash", optional=True)
    if source_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", source_hash):
        raise LineError("'source_hash' must be a SHA-256 in hex")
    stale_at = _ms(record, "stale_at", optional=True)
    stale_reason = _str(record, "stale_reason", optional=True) if stale_at is not None else None
    cell = v.Cell(
        node_id=_checked(v.check_uuid, record.get("node_id"), "node_id"),
        tenant_id=tenant_id,
        source_agent=_str(record, "source_agent"),
        origin_node=_str(record, "origin_node"),
        content=content,
        cell_type=_checked(v.check_cell_type, record.get("cell_type")),
        salience=_checked(v.check_salience, record.get("salience")),
        created_at=_ms(record, "created_at"),
        layer=layer,
        embedding=vector,
        embedding_space=cell_space,
        scene_id=None if record.get("scene_id") is None else _checked(v.check_uuid, record["scene_id"], "scene_id"),
        session_id=None if record.get("session_id") is None else _checked(v.check_uuid, record["session_id"], "session_id"),
        project=_checked(v.check_project, record.get("project")),
        source_ref=_checked(v.check_source_ref, record.get("source_ref")),
        metadata=_checked(v.check_metadata, record.get("metadata")),
        hops=hops,
        signature=signature,
        forgotten_at=forgotten_at,
        source_hash=source_hash,
        stale_at=stale_at,
        stale_reason=stale_reason,
    )
    return cell, forgotten_at is None and not same_space


def parse_scene(record: dict[str, Any], tenant_id: str) -> dict[str, Any]:
    _keys(record, _SCENE_KEYS, {"scene_id", "origin_node", "created_at"})
    scene = {k: record.get(k) for k in _SCENE_KEYS if k != "kind"}
    scene["scene_id"] = _checked(v.check_uuid, record.get("scene_id"), "scene_id")
    _str(record, "origin_node")
    _ms(record, "created_at")
    for field in ("ended_at", "consolidated_at"):
        _ms(record, field, optional=True)
    for field in ("agent_id", "project", "title", "session_id", "summary_node_id"):
        if record.get(field) is not None and not isinstance(record[field], str):
            raise LineError(f"'{field}' must be a string or null")
    scene["tenant_id"] = tenant_id
    return scene


def parse_beacon(record: dict[str, Any], tenant_id: str) -> tuple[Beacon, int | None]:
    """A beacon line as a Beacon of ``tenant_id``, and when it was removed (None: live)."""
    _keys(record, _BEACON_KEYS, _BEACON_KEYS - {"cell_types", "project", "min_salience", "ttl_seconds", "expires_at", "removed_at"})
    cell_types = _checked(v.check_cell_types, record.get("cell_types"))
    min_salience = record.get("min_salience")
    if min_salience is not None:
        min_salience = _checked(v.check_unit_interval, min_salience, "min_salience")
    ttl = record.get("ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1):
        raise LineError("'ttl_seconds' must be a positive integer or null")
    beacon = Beacon(
        beacon_id=_checked(v.check_uuid, record.get("beacon_id"), "beacon_id"), tenant_id=tenant_id,
        agent_id=_str(record, "agent_id"), origin_node=_str(record, "origin_node"),
        query=_checked(lambda q: v.check_text(q, "query", max_chars=8192), record.get("query")),
        threshold=_checked(v.check_unit_interval, record.get("threshold"), "threshold"), cell_types=cell_types,
        project=_checked(v.check_project, record.get("project")), min_salience=min_salience, ttl_seconds=ttl,
        created_at=_ms(record, "created_at"), expires_at=_ms(record, "expires_at", optional=True),
        embedding=_vector(record, None), embedding_space=_str(record, "embedding_space"),
    )  # fmt: skip
    return beacon, _ms(record, "removed_at", optional=True)


# -- import: the file -----------------------------------------------------------------


class ImportReport(dict):
    """Counts and per-line errors: ``{read, stored, known, scenes, beacons, errors, error_count, resumed_at_line}``."""


def _checkpoint_path(home: Path, path: Path) -> Path:
    stat = path.stat()
    identity = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return home / CHECKPOINT_DIR / (hashlib.sha256(identity).hexdigest()[:32] + ".json")


def _read_checkpoint(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data.get("offset"), int) and isinstance(data.get("line"), int) else None
    except (OSError, ValueError, AttributeError):
        return None


def _write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temp.write_text(json.dumps(state))
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise DiskFull(f"no space left for the import's checkpoint {path}") from None
        raise


def _lines(handle: BinaryIO, offset: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset after the line, the line) from ``offset`` on; None for a line too long to read."""
    handle.seek(offset)
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        offset += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of it
                raw = handle.readline(MAX_LINE_BYTES)
                offset += len(raw)
            yield offset, None
            continue
        yield offset, raw


def _decode(raw: bytes | None) -> dict[str, Any] | None:
    """The JSON object on a line, None for a blank line; LineError otherwise."""
    if raw is None:
        raise LineError(f"the line is longer than {MAX_LINE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        return None
    try:
        record = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise LineError(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise LineError("not a JSON object")
    return record


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def import_file(
    service: MemoryService,
    path: Path,
    *,
    progress: Progress | None = None,
    on_error: Callable[[int, str], None] | None = None,
) -> ImportReport:
    """Import an export file into ``service``'s node (see the module docstring)."""
    path = Path(path)
    home = service.config.home
    tenant = service.config.tenant_id
    space, dim = service.embedder.space, service.embedder.dim
    size = path.stat().st_size
    checkpoint = _checkpoint_path(home, path)
    state = _read_checkpoint(checkpoint) or {"offset": 0, "line": 0}
    report = ImportReport(read=0, stored=0, known=0, scenes=0, beacons=0, errors=[], error_count=0,
                          resumed_at_line=state["line"] + 1 if state["line"] else None)  # fmt: skip

    def fail(line_no: int, reason: str) -> None:
        report["error_count"] += 1
        if len(report["errors"]) < MAX_ERRORS_KEPT:
            report["errors"].append({"line": line_no, "reason": reason})
        if on_error is not None:
            on_error(line_no, reason)

    try:
        await _import_lines(service, path, state, report, checkpoint, tenant, space, dim, fail, progress, size)
    except DiskFull:
        raise DiskFull(
            f"the disk holding the node's data is full: the import of {path} stopped ({report['stored']} new cells "
            "stored, none half-stored); free some space and run the same import again: it resumes where it stopped"
        ) from None
    return report


async def _import_lines(
    service: MemoryService, path: Path, state: dict[str, Any], report: ImportReport, checkpoint: Path, tenant: str,
    space: str, dim: int, fail: Callable[[int, str], None], progress: Progress | None, size: int,
) -> None:  # fmt: skip
    cells: list[tuple[v.Cell, bool]] = []
    beacons: list[tuple[Beacon, int | None]] = []

    async def flush(offset: int, line_no: int) -> None:
        if cells:
            stale = [i for i, (_, re_embed) in enumerate(cells) if re_embed]
            batch = [cell for cell, _ in cells]
            if stale:
                vectors = await service.embed([batch[i].content for i in stale])
                for i, vector in zip(stale, vectors):
                    batch[i] = _replace_vector(batch[i], vector, space)
            stored = await service.import_cells(batch)
            report["stored"] += stored
            report["known"] += len(batch) - stored
            cells.clear()
        if beacons:
            report["beacons"] += await service.import_beacons(list(beacons))
            beacons.clear()
        await trio.to_thread.run_sync(_write_checkpoint, checkpoint, {"path": str(path), "offset": offset, "line": line_no})

    with open(path, "rb") as handle:
        line_no = state["line"]
        offset = state["offset"]
        if offset == 0:
            line_no, offset, header_ok = _header(handle, fail)
            if not header_ok:
                return
        pending = 0
        for offset, raw in _lines(handle, offset):
            line_no += 1
            report["read"] += 1
            try:
                record = _decode(raw)
                if record is None:
                    continue
                kind = record.get("kind")
                if kind == "cell":
                    cells.append(parse_cell(record, tenant, space, dim))
                elif kind == "scene":
                    await service.apply_scene(parse_scene(record, tenant), record["origin_node"])
                    report["scenes"] += 1
                elif kind == "beacon":
                    beacons.append(parse_beacon(record, tenant))
                else:
                    raise LineError(f"unknown kind {kind!r}; expected cell, scene or beacon")
            except LineError as exc:
                fail(line_no, str(exc))
                continue
            pending += 1
            if pending >= BATCH:
                await flush(offset, line_no)
                pending = 0
                if progress is not None:
                    progress(offset, size)
        await flush(offset, line_no)
        if progress is not None:
            progress(size, size)
    checkpoint.unlink(missing_ok=True)


def _replace_vector(cell: v.Cell, vector: np.ndarray, space: str) -> v.Cell:
    return dataclasses.replace(cell, embedding=np.asarray(vector, dtype=np.float32), embedding_space=space)


def _header(handle: BinaryIO, fail: Callable[[int, str], None]) -> tuple[int, int, bool]:
    """Read the header line: (lines read, offset after it, whether it is ours)."""
    line_no = 0
    for offset, raw in _lines(handle, 0):
        line_no += 1
        try:
            record = _decode(raw)
        except LineError as exc:
            fail(line_no, f"{exc}; an export file starts with its header line")
            return line_no, offset, False
        if record is None:
            continue
        if record.get("format") != FORMAT:
            hint = (
                " (this looks like an MCP memory server file: use `hyphae import --from memory-server FILE`)"
                if record.get("type") in ("entity", "relation")
                else ""
            )
            fail(line_no, f"not a Hyphae export: the first line must be {json.dumps(HEADER)}{hint}")
            return line_no, offset, False
        if record.get("version") != VERSION:
            fail(line_no, f"export format version {record.get('version')!r}; this Hyphae reads version {VERSION}")
            return line_no, offset, False
        return line_no, offset, True
    fail(max(line_no, 1), "the file is empty: no header line")
    return line_no, 0, False
