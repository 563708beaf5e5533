"""Looking for a forgotten cell in the files of a data dir, byte by byte.

A forget promises that a cell's content and vector are gone from disk, not hidden: no file
of the data dir (the database, its ``-wal`` and ``-shm``, the index files, anything else)
may hold them. :func:`traces` reads every file and reports which holds which needle;
:func:`needles` makes the needles of one cell: its content, a rare word of it (FTS5 keeps
words, prefix-compressed, so a word's tail is looked for), and two 32-byte runs of its
vector, raw and L2-normalised (hnswlib keeps the normalised one).

A test that uses them first shows that the needles *are* found before the forget (a search
that cannot find anything would prove nothing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["needles", "traces"]


WINDOW = 8  # floats per vector needle: 32 bytes


def _windows(vector: np.ndarray) -> list[int]:
    """Where two needles of a vector start: the two 8-float windows with the most non-zero
    entries, each beginning on one (a sparse vector's zeros are in every file)."""
    nonzero = (vector != 0).astype(int)
    counts = np.convolve(nonzero, np.ones(WINDOW, dtype=int), "valid")
    starts = [i for i in np.argsort(-counts, kind="stable") if nonzero[i]]
    first = starts[0]
    second = next((i for i in starts if abs(i - first) >= WINDOW), first)
    return [int(first), int(second)]


def needles(content: str, word_tail: str, vector: np.ndarray) -> dict[str, bytes]:
    vector = np.asarray(vector, dtype=np.float32)
    unit = (vector / np.linalg.norm(vector)).astype(np.float32)
    found = {"content": content.encode(), "word": word_tail.encode()}
    for n, start in enumerate(_windows(vector)):
        found[f"vector {n}"] = vector[start : start + WINDOW].tobytes()
        found[f"unit vector {n}"] = unit[start : start + WINDOW].tobytes()
    return found


def traces(home: Path, wanted: dict[str, bytes]) -> dict[str, list[str]]:
    """Needle name -> the files under ``home`` (relative paths) that hold it."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in home.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
        except OSError:  # a file removed while we walked (a save's orphan)
            continue
        for name, needle in wanted.items():
            if needle in data:
                found.setdefault(name, []).append(str(path.relative_to(home)))
    return found
