"""Scenes: episodes of work, their listing cursor, and extractive consolidation.

Consolidation writes what a scene taught as one L2 cell. It is *extractive*: no model
invents text. Cells are taken most energetic first; a cell whose vector is within
``MERGE_COS`` of one already taken is a near-duplicate and is merged into it (counted,
not repeated), so the summary says each thing once.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import numpy as np

from .cells import MAX_CONTENT_BYTES
from .energy import EnergyModel
from .errors import InvalidArgument

__all__ = ["encode_cursor", "decode_cursor", "consolidate", "Summary"]

MERGE_COS = 0.9
MAX_LINES = 12
MAX_LINE_CHARS = 600


def encode_cursor(created_at: int, scene_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at}:{scene_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: Any) -> tuple[int, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, scene_id = base64.urlsafe_b64decode(padded.encode()).decode().split(":", 1)
        return int(created_at), scene_id
    except (TypeError, ValueError, AttributeError, UnicodeDecodeError):
        raise InvalidArgument("'cursor' is not a cursor this server gave out", field="cursor") from None


@dataclasses.dataclass(frozen=True)
class Summary:
    content: str
    cell_type: str
    salience: float
    source_ids: list[str]


def consolidate(rows: list[tuple], energy: EnergyModel, now_ms: int, *, dim: int) -> Summary:
    """Summarise ``(node_id, content, cell_type, salience, energy0, created_at, embedding)`` rows."""
    scored = sorted(
        rows,
        key=lambda r: (-energy.at(r[4], r[2], r[5], now_ms), r[5]),
    )
    taken: list[tuple] = []
    merged: list[int] = []
    vectors: list[np.ndarray] = []
    for row in scored:
        vector = np.frombuffer(row[6], dtype=np.float32, count=dim)
        twins = [i for i, other in enumerate(vectors) if float(other @ vector) >= MERGE_COS]
        if twins:
            merged[twins[0]] += 1
            continue
        if len(taken) == MAX_LINES:
            continue
        taken.append(row)
        merged.append(0)
        vectors.append(vector)
    lines = []
    for row, extra in zip(taken, merged):
        text = " ".join(row[1].split())
        if len(text) > MAX_LINE_CHARS:
            text = text[: MAX_LINE_CHARS - 1] + "…"
        note = f" (+{extra} similar)" if extra else ""
        lines.append(f"- [{row[2]}] {text}{note}")
    content = "\n".join(lines)
    while len(content.encode("utf-8")) > MAX_CONTENT_BYTES:
        lines.pop()
        content = "\n".join(lines)
    lead = taken[0]
    return Summary(
        content=content,
        cell_type=lead[2],
        salience=max(r[3] for r in taken),
        source_ids=[r[0] for r in taken],
    )
