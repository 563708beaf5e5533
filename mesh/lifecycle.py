"""Supersede and forget as the mesh carries them: the rule for a cell's ``supersedes`` list.

A cell replaces earlier ones by naming them in ``metadata["supersedes"]``: a list of at most
``MAX_SUPERSEDES`` cell ids. No diff kind of its own: an older peer sees a cell with metadata,
stores and relays it as any other (the wire format is unchanged). What the mesh adds
(:mod:`mesh.data_plane`, :mod:`mesh.repair`) is where such a cell goes: where its own beacons
say, and where each cell it supersedes went, so every holder of the old cell is sent the new
one (one diff per holder). Forgetting is the tombstone diff, which existed before.

**A bad list.** A list that breaks the rule (not a list, too long, an entry that is not a cell
id, the cell naming itself) is ignored, as if the cell superseded nothing, and counted
(``Counters.supersedes_ignored``); the cell itself stays valid. Refusing it would make a node
of this version and an older one (which knows no rule for metadata beyond plain JSON) disagree
on what is held, and a diff both accept must be routed by both. The node's facade refuses such
a list from its own agents outright (:func:`check_supersedes`, the same rule, strict).

**Cell ids.** The node names cells with UUIDs; the mesh holds an entry to the shape of an id
(1 to ``MAX_CELL_ID_CHARS`` letters, digits, ``-`` or ``_``) and no more: it only looks ids up
in its log, and the simulator's and tests' cells are named ``cell-N``.

**Order.** Nothing here depends on the order diffs arrive in. A tombstone that comes before
its cell is logged and handed to the node; the cell that follows is neither handed over nor
logged nor relayed (:meth:`mesh.memory.DiffLog.forgotten`). A superseding cell that comes
before the one it replaces is simply delivered; the node keeps the link and applies it when
the old cell arrives. For every order to end in the same state, a link made by a cell that is
later forgotten is void: a node that received the tombstone first never learns the link, so
one that did must let it go when the successor is forgotten (:func:`statuses` is that rule,
as the test network's nodes and the simulator's apply it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import CellRuleError, Reason

__all__ = [
    "ACTIVE",
    "FORGOTTEN",
    "MAX_CELL_ID_CHARS",
    "MAX_SUPERSEDES",
    "SUPERSEDED",
    "SUPERSEDES_KEY",
    "check_supersedes",
    "statuses",
    "supersedes",
]  # fmt: skip

SUPERSEDES_KEY = "supersedes"
MAX_SUPERSEDES = 16
MAX_CELL_ID_CHARS = 64
_CELL_ID = re.compile(rf"[0-9A-Za-z_-]{{1,{MAX_CELL_ID_CHARS}}}")

ACTIVE, SUPERSEDED, FORGOTTEN = "active", "superseded", "forgotten"


def check_supersedes(value: Any, cell_id: str | None = None) -> tuple[str, ...]:
    """The ids a ``supersedes`` value names (in order, each once), or :class:`CellRuleError`."""
    field = f"metadata.{SUPERSEDES_KEY}"
    if not isinstance(value, list):
        raise CellRuleError(Reason.INVALID_CELL, f"'{field}' must be a list of cell ids", field=field)
    if len(value) > MAX_SUPERSEDES:
        raise CellRuleError(
            Reason.CONTENT_TOO_LARGE, f"'{field}' names {len(value)} cells; at most {MAX_SUPERSEDES}", field=field,
            limit=MAX_SUPERSEDES,
        )  # fmt: skip
    ids: dict[str, None] = {}
    for item in value:
        if not isinstance(item, str) or not _CELL_ID.fullmatch(item):
            raise CellRuleError(Reason.INVALID_CELL, f"'{field}' holds {str(item)[:80]!r}, not a cell id", field=field)
        if item == cell_id:
            raise CellRuleError(Reason.INVALID_CELL, f"'{field}': a cell cannot supersede itself", field=field)
        ids[item] = None
    return tuple(ids)


def supersedes(metadata: Mapping[str, Any] | None, cell_id: str) -> tuple[str, ...] | None:
    """The ids a cell's metadata says it supersedes: () for none, None for a list that breaks
    the rule (the caller ignores it, and counts it)."""
    if not metadata or SUPERSEDES_KEY not in metadata:
        return ()
    try:
        return check_supersedes(metadata[SUPERSEDES_KEY], cell_id)
    except CellRuleError:
        return None


def statuses(cells: Mapping[str, tuple[str, ...]], forgotten: Iterable[str]) -> dict[str, str]:
    """Each cell's status at a node holding ``cells`` (id -> the ids it supersedes) and the
    tombstones of ``forgotten``: forgotten, else superseded (a held cell that is not forgotten
    names it), else active. A cell known only by its tombstone is forgotten. The same whatever
    order the cells and tombstones came in."""
    gone = set(forgotten)
    replaced = {old for cell_id, olds in cells.items() if cell_id not in gone for old in olds}
    out = {cell_id: FORGOTTEN for cell_id in gone}
    for cell_id in cells:
        if cell_id not in gone:
            out[cell_id] = SUPERSEDED if cell_id in replaced else ACTIVE
    return out
