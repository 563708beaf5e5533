"""Judges for the admission rule: how well a routed cell answers a beacon.

:class:`CalibratedJudge` is the default. Raw cosine is a poor judge across beacons: a
broad beacon ("anything about the payment worker") sits close to half of what a team
writes, a narrow one ("PAY-1432") close to nothing, so one threshold is too loose for the
first and too tight for the second. The judge reads two things instead:

* **where the cell stands against the beacon's own background** (TREC filtering's
  per-profile calibration): the beacon's mean and spread of cosine over the cells this
  node holds (:class:`Background`, the newest few thousand), so the score is in standard
  deviations above what that beacon sees in its team's everyday writing (``z``);
* **the words they share**, weighted by rarity (idf over a bundled set of ordinary
  engineering notes and every cell this node has stored): identifiers, names and ticket
  ids that a small dense model blurs count here.

Until the node holds enough cells for a background (``MIN_BACKGROUND``), the judge falls
back to the cosine rule. The constants were chosen on the project's labelled team stream
by leave-one-developer-out cross-validation (BENCHMARKS.md, "Relevance").

``score = z + lexical_weight × shared``, where ``shared`` is the idf mass of the beacon's
terms found in the cell over the idf mass of all its terms (0..1). The floor keeps the
beacon's own threshold meaningful: a beacon at the default threshold needs ``z_floor``;
each 0.01 of threshold above (or slack below, ``slack × E0``) moves the floor by 0.01 of
cosine, in that beacon's standard deviations.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .admission_rule import CosineJudge, Verdict
from .energy import EnergyModel

if TYPE_CHECKING:
    from .delivery import Beacon, CellFacts

__all__ = ["Background", "CalibratedJudge", "TermStats", "load_background_notes", "terms"]

# Words, identifiers (snake_case, dotted, dashed: PAY-1432, payments.commands) and numbers.
_TERM = re.compile(r"[a-z0-9](?:[a-z0-9_.\-]*[a-z0-9])?")
_STOP = frozenset(
    ["a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "done", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "let", "me", "more", "most", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "anything", "something", "thing", "things", "get", "got", "know", "want", "wants", "need", "needs", "new", "use", "used", "using", "like", "make", "made", "one", "two", "way", "ever", "latest", "else", "still"]
)
_MIN_SPREAD = 0.02  # a beacon whose background barely varies still has a finite scale
MIN_BACKGROUND = 32  # cells held before a beacon's background means anything
BACKGROUND_CELLS = 2048  # the newest cells a background keeps
REFRESH_CELLS = 16  # a beacon's scale is recomputed once the background has taken this many more
_NOTES = Path(__file__).with_name("data") / "background_notes.txt"


def load_background_notes() -> list[str]:
    """The bundled engineering notes that seed the term statistics (one per line)."""
    return [line.strip() for line in _NOTES.read_text(encoding="utf-8").splitlines() if line.strip()]


def terms(text: str) -> frozenset[str]:
    """The distinct content terms of ``text``: lower-cased, stop words out, plurals folded."""
    out = set()
    for term in _TERM.findall(text.lower()):
        if term in _STOP or len(term) < 2:
            continue
        if len(term) > 4 and term.endswith("s") and not term.endswith("ss") and term.isalpha():
            term = term[:-1]  # retries ~ retrie, workers ~ worker: cheap, and the same both sides
        out.add(term)
    return frozenset(out)


class TermStats:
    """Document frequencies: the background's, plus every cell this node has stored."""

    def __init__(self, background: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._df: Counter[str] = Counter()
        self._docs = 0
        self.observe_many(background)

    def observe(self, text: str) -> None:
        found = terms(text)
        with self._lock:
            self._df.update(found)
            self._docs += 1

    def observe_many(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.observe(text)

    @property
    def documents(self) -> int:
        return self._docs

    def idf(self, term: str) -> float:
        # BM25's idf, floored at a small positive weight: a word in most documents still counts a little.
        df = self._df.get(term, 0)
        return max(0.05, math.log(1 + (self._docs - df + 0.5) / (df + 0.5)))


class Background:
    """The newest cells this node holds, as vectors: a ring of ``capacity`` rows."""

    def __init__(self, dim: int, capacity: int = BACKGROUND_CELLS) -> None:
        self._lock = threading.Lock()
        self._rows = np.zeros((capacity, dim), np.float32)
        self._size = 0
        self._next = 0
        self.taken = 0  # cells taken in all: a scale computed at an older count may be stale

    def add(self, vector: np.ndarray) -> None:
        if np.shape(vector) != self._rows.shape[1:]:
            return  # another embedding space: not this node's background
        with self._lock:
            self._rows[self._next] = vector
            self._next = (self._next + 1) % len(self._rows)
            self._size = min(self._size + 1, len(self._rows))
            self.taken += 1

    def __len__(self) -> int:
        return self._size

    def scale(self, vector: np.ndarray) -> tuple[float, float]:
        """Mean and spread of ``vector``'s cosine over the background."""
        with self._lock:
            rows = self._rows[: self._size]
            sims = rows @ vector if rows.shape[1] == np.shape(vector)[0] else np.zeros(0, np.float32)
        if len(sims) == 0:
            return 0.0, 1.0
        return float(sims.mean()), max(_MIN_SPREAD, float(sims.std()))


class CalibratedJudge:
    """Per-beacon calibrated cosine plus rare shared words (see the module docstring)."""

    name = "calibrated"

    def __init__(
        self,
        energy: EnergyModel,
        background: Background,
        term_stats: TermStats,
        *,
        default_threshold: float,
        z_floor: float = 3.0,
        lexical_weight: float = 4.0,
    ) -> None:
        self._energy = energy
        self.background = background
        self.terms = term_stats
        self._default_threshold = default_threshold
        self._z_floor = z_floor
        self._lexical_weight = lexical_weight
        self._lock = threading.Lock()
        self._scales: dict[str, tuple[Beacon, int, float, float, frozenset[str]]] = {}
        self._fallback = CosineJudge(energy)

    def observe(self, vector: np.ndarray, content: str) -> None:
        """A cell this node now holds joins the background and the term statistics."""
        self.background.add(vector)
        self.terms.observe(content)

    def _scale(self, beacon: Beacon) -> tuple[float, float, frozenset[str]]:
        """The beacon's background mean and spread of cosine, and its terms (kept per beacon
        until the background has moved on by ``REFRESH_CELLS``)."""
        taken = self.background.taken
        with self._lock:
            known = self._scales.get(beacon.beacon_id)
        if known is not None and known[0] is beacon and taken - known[1] < REFRESH_CELLS:
            return known[2:]
        mean, spread = self.background.scale(np.asarray(beacon.embedding, np.float32))
        scale = (mean, spread, terms(beacon.query))
        with self._lock:
            # A stale scale would be recomputed on its next use anyway: dropping them here is what
            # keeps a removed beacon's from staying for good.
            self._scales = {k: v for k, v in self._scales.items() if taken - v[1] < REFRESH_CELLS}
            self._scales[beacon.beacon_id] = (beacon, taken, *scale)
        return scale

    def judge(self, beacons: Sequence[Beacon], cell: CellFacts, similarities: np.ndarray, e0: float) -> list[Verdict]:
        if len(self.background) < MIN_BACKGROUND:
            return self._fallback.judge(beacons, cell, similarities, e0)
        cell_terms = terms(cell.content)
        verdicts = []
        for beacon, similarity in zip(beacons, similarities.tolist()):
            mean, spread, wanted = self._scale(beacon)
            z = (similarity - mean) / spread
            shared = sorted(wanted & cell_terms)
            lexical = self._shared_mass(wanted, shared)
            score = z + self._lexical_weight * lexical
            shift = beacon.threshold - self._default_threshold - self._energy.match_slack * e0
            floor = self._z_floor + shift / spread
            words = f"; shares {', '.join(shared[:4])}" if shared else ""
            reason = f"cosine {similarity:.2f}, {z:+.1f} sd over this beacon's background{words}"
            verdicts.append(Verdict(score, floor, reason))
        return verdicts

    def _shared_mass(self, wanted: frozenset[str], shared: Sequence[str]) -> float:
        if not shared:
            return 0.0
        idf = self.terms.idf
        return sum(map(idf, shared)) / sum(map(idf, wanted))
