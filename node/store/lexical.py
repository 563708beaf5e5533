"""The lexical index: SQLite FTS5 over each live cell's content and source reference.

Small dense models blur identifiers: a ticket id (``PAY-1432``), a file path, a
``snake_case`` or dotted name, a version number. BM25 over the words themselves finds
them, and :mod:`node.retrieval` fuses the two rankings. The index is an *external
content* FTS5 table over ``cells`` (no second copy of the text), maintained by hand on
the one insert path and on erasure, in the same transaction as the row's own change:

- a live cell is added by :meth:`LexicalIndex.add` right after its row is inserted;
- a cell that is forgotten (locally, by a tombstone from the mesh) is removed by
  :meth:`LexicalIndex.remove` *before* its content is erased, from the row itself, so the
  tokens removed are exactly the tokens that were added;
- a tombstone written whole (an imported one) never enters it.

Removing is not yet erasing: FTS5 records a removal as a delete marker in a new segment and
keeps the words in the old ones until they are merged. So after forgets :meth:`LexicalIndex.purge`
merges every segment into one (FTS5's ``optimize``), which drops the removed entries and
their words from the file; SQLite's ``secure_delete`` (set on every connection) zeroes the
pages that frees. Where SQLite is 3.44 or newer the table's ``secure-delete`` option is also
set, so a removal erases its entries at once; SQLite 3.40 (Debian 12, the CI image) lacks it.

Tokenizer: ``unicode61`` with ``remove_diacritics 2`` (the default folding) and no extra
token characters. An identifier is split into its parts (``pay-1432`` into ``pay`` ``1432``,
``cells.py`` into ``cells`` ``py``) and every query term is sent as a quoted FTS5 *phrase*,
which FTS5 tokenizes the same way: ``PAY-1432`` matches those two tokens side by side,
exactly, and ``cells`` alone still finds ``cells.py``. Measured against ``porter``, ``tokenchars '-_.'``
and ``trigram`` (BENCHMARKS.md, "Hybrid recall"), it ranks best or level on every set:
``tokenchars`` glues sentence-final full stops to words (``backend.``), so plain words and
identifiers at a sentence's end stop matching (identifier hit@1 0.90 against 0.98);
``porter`` merges words a developer keeps apart; ``trigram`` matches substrings but ranks
paraphrases worse and makes the index 4.8 times larger.

Query text is untrusted. :func:`match_expression` never passes FTS5 syntax through: each
whitespace-separated term is stripped of control characters, double quotes are doubled,
and the term is wrapped in quotes (a string, never an operator, a column filter, a prefix
``*`` or ``NEAR``); the terms are joined with ``OR`` (BM25 ranks documents matching many
and rare terms first). Terms with no letter or digit are left out. English function words
are left out of what is *matched* (each one OR-ed in makes FTS5 score most of the table:
at 43,000 cells a question's BM25 took 48 CPU-ms with them and 6 without) but kept in the
query's *weight*, the denominator of a cell's coverage, where they cost one count each;
when nothing is left to match the query is dense only.
"""

from __future__ import annotations

import math
import sqlite3
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["LexicalIndex", "match_expression", "MAX_TERMS"]

MAX_TERMS = 32  # a query of 8 KiB is not 1,000 OR-ed phrases: the first 32 distinct terms

# Function words: near-zero IDF, but each one OR-ed in makes FTS5 score most of the table.
_STOPWORDS = frozenset(
    """a about above after again all am an and any are as at be been before being below between both but by
    can could did do does doing down during each few for from further had has have having he her here hers him
    his how i if in into is it its itself just me more most my no nor not now of off on once only or other our
    ours out over own same she should so some such than that the their theirs them then there these they this
    those through to too under until up very was we were what when where which while who whom why will with
    would you your yours""".split()
)


def _clean(term: str) -> str:
    """A term without control characters (FTS5 strings end at a NUL) or unencodable ones."""
    kept = "".join(ch for ch in term if unicodedata.category(ch)[0] != "C")
    return kept.encode("utf-8", "ignore").decode("utf-8")


def match_expression(text: str, *, stopwords: bool = True) -> str | None:
    """An FTS5 MATCH expression for free text: its terms as quoted phrases joined by OR, or
    None when no term is left (the caller then searches densely only). Never raises, and
    nothing in ``text`` is read as FTS5 syntax."""
    phrases: list[str] = []
    seen: set[str] = set()
    for raw in str(text).split():
        term = _clean(raw).strip(".,;:!?()[]{}<>'\"`").lower()
        if not any(ch.isalnum() for ch in term):
            continue
        if stopwords and term in _STOPWORDS:
            continue
        if term in seen:
            continue
        seen.add(term)
        phrases.append('"' + term.replace('"', '""') + '"')
        if len(phrases) == MAX_TERMS:
            break
    return " OR ".join(phrases) if phrases else None


_OVERFETCH = 4


def _varint(data: bytes) -> int:
    """SQLite's varint (FTS5 writes its records with it): big-endian groups of 7 bits, the
    high bit set on all but the last; a ninth byte carries 8."""
    value = 0
    for i, byte in enumerate(data[:9]):
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value
    return value


def _scope(
    tenant_id: str,
    layer: str,
    space: str,
    projects: tuple[str, ...] | None,
    cell_types: tuple[str, ...] | None,
    only_project: str | None,
) -> tuple[str, list[object]]:
    """The read scope and filters as a condition on ``cells c``, with its arguments."""
    where = [
        "c.tenant_id = ?", "c.forgotten_at IS NULL", "c.embedding_space = ?",
        "EXISTS (SELECT 1 FROM layer_members m WHERE m.layer = ? AND m.cell_rowid = c.rowid)",
    ]  # fmt: skip
    args: list[object] = [tenant_id, space, layer]
    if only_project is not None:
        where.append("c.project = ?")
        args.append(only_project)
    elif projects:
        where.append(f"(c.project IS NULL OR c.project IN ({','.join('?' * len(projects))}))")
        args.extend(projects)
    if cell_types:
        where.append(f"c.cell_type IN ({','.join('?' * len(cell_types))})")
        args.extend(cell_types)
    return " AND ".join(where), args


class LexicalIndex:
    """``cells_fts``: what BM25 ranks. Writes take the job's transaction; reads use this
    thread's reader connection."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- writes (inside the cell's own job) --------------------------------------------------

    def add(self, tx: Transaction, rowid: int, content: str, source_ref: str | None) -> None:
        """Index a live cell just inserted (the same values its row holds)."""
        tx.execute("INSERT INTO cells_fts (rowid, content, source_ref) VALUES (?, ?, ?)", (rowid, content, source_ref))

    def remove(self, tx: Transaction, rowid: int) -> None:
        """Take a live cell out, from its row as it is now: call before the row's content is erased."""
        tx.execute(
            "INSERT INTO cells_fts (cells_fts, rowid, content, source_ref) "
            "SELECT 'delete', rowid, content, source_ref FROM cells WHERE rowid = ? AND forgotten_at IS NULL",
            (rowid,),
        )

    def enable_secure_delete(self, tx: Transaction) -> bool:
        """Have FTS5 erase a removed row's entries in place (SQLite 3.44+; the option is kept
        in the table's config); False where this SQLite does not know the option."""
        try:
            tx.execute("INSERT INTO cells_fts (cells_fts, rank) VALUES ('secure-delete', 1)")
        except sqlite3.OperationalError:
            return False
        return True

    def purge(self, tx: Transaction) -> None:
        """Merge every segment into one, so the words of removed rows leave the file (after forgets)."""
        tx.execute("INSERT INTO cells_fts (cells_fts) VALUES ('optimize')")

    # -- reads ---------------------------------------------------------------------------------

    def search(
        self,
        expression: str,
        *,
        tenant_id: str,
        layer: str,
        space: str,
        projects: tuple[str, ...] | None,
        cell_types: tuple[str, ...] | None,
        only_project: str | None,
        limit: int,
        weighed: str | None = None,
    ) -> list[tuple[int, float]]:
        """The best ``limit`` live cells of ``layer`` in ``space`` for ``expression``, best
        first, as ``(rowid, coverage)``: the cell's BM25 score over the query's own weight
        (:meth:`query_weight` of ``weighed``, the query with its function words, or else of
        ``expression``), capped at 1, so 1 means "holds all of the query's words" whatever
        the query's length. The read scope is applied in SQL, so another tenant's or
        project's matches never take a place in the list; the caller applies its own scope
        mask again on top."""
        scope, scope_args = _scope(tenant_id, layer, space, projects, cell_types, only_project)
        conn = self.db.reader()
        try:
            # Fast path: the index's own best few times ``limit``, then the scope over those rows
            # alone (joining every match to its cell row cost 3x the BM25 itself at 43,000 cells).
            # Exact whenever ``limit`` of them are in scope: a better in-scope match would be among them.
            wide = _OVERFETCH * limit
            best = conn.execute(
                "SELECT rowid, -bm25(cells_fts) AS score FROM cells_fts WHERE cells_fts MATCH ? "
                "ORDER BY score DESC LIMIT ?",
                (expression, wide),
            ).fetchall()
            if not best:
                return []
            marks = ",".join("?" * len(best))
            # NOT INDEXED: by rowid, never by scanning the tenant's index (6 ms at 43,000 cells).
            inside = {r for (r,) in conn.execute(
                f"SELECT c.rowid FROM cells c NOT INDEXED WHERE c.rowid IN ({marks}) AND {scope}",
                [r for r, _ in best] + scope_args,
            )}  # fmt: skip
            rows = [(rowid, score) for rowid, score in best if rowid in inside][:limit]
            if len(rows) < limit and len(best) == wide:  # the scope is narrow here: rank within it
                rows = conn.execute(
                    "SELECT c.rowid, -bm25(cells_fts) AS score FROM cells_fts JOIN cells c ON c.rowid = cells_fts.rowid "
                    f"WHERE cells_fts MATCH ? AND {scope} ORDER BY score DESC LIMIT ?",
                    [expression, *scope_args, limit],
                ).fetchall()
            if not rows:
                return []
            weight = self.query_weight(weighed or expression)
        except sqlite3.OperationalError:  # an expression FTS5 refuses: no lexical hits, never an error
            return []
        if weight <= 0.0:
            return []
        return [(int(rowid), min(1.0, float(score) / weight)) for rowid, score in rows]

    def query_weight(self, expression: str) -> float:
        """What BM25 gives a document of average length holding each of the expression's
        phrases once: the sum of their IDFs, computed as FTS5 computes them (over the
        whole index: ``log((N - n + 0.5) / (n + 0.5))``, at least 1e-6, n the rows that
        hold the phrase). Phrases no row holds add nothing."""
        phrases = expression.split(" OR ")  # match_expression's form: quoted phrases joined by OR
        counts = ",".join("(SELECT COUNT(*) FROM cells_fts WHERE cells_fts MATCH ?)" for _ in phrases)
        conn = self.db.reader()
        total = self.rows(conn)
        weight = 0.0
        for hits in conn.execute(f"SELECT {counts}", phrases).fetchone():
            if hits:
                weight += max(1e-6, math.log((total - hits + 0.5) / (hits + 0.5)))
        return weight

    def count(self) -> int:
        """Indexed rows, counted one by one (for tests)."""
        (count,) = self.db.reader().execute("SELECT COUNT(*) FROM cells_fts_docsize").fetchone()
        return count

    def rows(self, conn: sqlite3.Connection | None = None) -> int:
        """Indexed rows as FTS5 itself keeps the number (the N of its IDF): the first varint of
        its averages record, so a recall does not count 43,000 rows (1.2 ms) to learn it."""
        conn = conn if conn is not None else self.db.reader()
        row = conn.execute("SELECT block FROM cells_fts_data WHERE id = 1").fetchone()
        if row is None or not row[0]:
            return 0
        return _varint(row[0])
