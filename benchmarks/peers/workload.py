"""The one workload every server gets: memories across topics, paraphrased queries, scoring.

The memories and queries are ``benchmarks/data/retrieval_set.json`` (241 memories of a fictional
team in 20 topics, 103 paraphrased queries, each aimed at one target and never a substring of
it). ``filler(n)`` adds synthetic memories on other subjects, so a run can also measure a larger
store; they are extra distractors for every server alike.

Scoring is per query: the server's ranked answer is mapped back to memory ids (by the id or
content it returns); hit@1 is "the target is first", hit@5 "the target is among the first five".
An empty answer (a substring search that matched nothing) is a miss at both.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Memory", "Query", "Workload", "load_workload", "filler", "score", "percentile", "latency_summary"]

DATA = Path(__file__).resolve().parents[1] / "data" / "retrieval_set.json"


@dataclass(frozen=True)
class Memory:
    id: str
    topic: str
    type: str  # the set's lower-case kind: decision, fact, constraint, risk, lesson, pattern, ...
    text: str


@dataclass(frozen=True)
class Query:
    text: str
    target: str


@dataclass(frozen=True)
class Workload:
    memories: list[Memory]
    queries: list[Query]


def load_workload(path: Path = DATA, *, filler_count: int = 0, seed: int = 1) -> Workload:
    """The paraphrase set, with ``filler_count`` synthetic memories stored first."""
    data = json.loads(path.read_text(encoding="utf-8"))
    memories = [Memory(m["id"], m["topic"], m["type"], m["text"]) for m in data["memories"]]
    queries = [Query(q["query"], q["target"]) for q in data["queries"]]
    return Workload(filler(filler_count, seed) + memories, queries)


_SUBJECTS = ("the cafeteria menu", "the office plants", "parking badges", "the quarterly offsite", "desk booking",
             "the coffee machine", "travel receipts", "the book club", "conference talks", "the printer on floor 3",
             "holiday calendars", "the onboarding checklist", "the team photo", "bike storage", "the recycling bins")
_VERBS = ("was moved to", "now needs", "is handled by", "changes every", "was cancelled for", "depends on")
_OBJECTS = ("the facilities team", "a form in the intranet", "Tuesday mornings", "the second floor", "a shared sheet",
            "the new vendor", "week 12", "the finance portal", "the front desk", "a monthly vote")


def filler(count: int, seed: int = 1) -> list[Memory]:
    """``count`` distinct office-life notes, unrelated to the set's engineering topics."""
    rng = random.Random(seed)
    out: list[Memory] = []
    seen: set[str] = set()
    while len(out) < count:
        text = f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} (note {len(out) + 1})."
        if text not in seen:
            seen.add(text)
            out.append(Memory(f"filler-{len(out) + 1:05d}", "filler", "fact", text))
    return out


def score(ranked: list[list[str]], queries: list[Query]) -> dict[str, float]:
    """hit@1, hit@5 and the share of empty answers, from each query's ranked memory ids."""
    n = len(queries)
    hit1 = sum(bool(r) and r[0] == q.target for r, q in zip(ranked, queries))
    hit5 = sum(q.target in r[:5] for r, q in zip(ranked, queries))
    empty = sum(not r for r in ranked)
    return {"hit@1": hit1 / n, "hit@5": hit5 / n, "empty": empty / n, "queries": n}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """Calls, calls per second (sequential), p50/p99/mean in ms."""
    total = sum(seconds)
    return {
        "calls": len(seconds),
        "per_s": len(seconds) / total if total else float("nan"),
        "p50_ms": percentile(seconds, 50) * 1e3,
        "p99_ms": percentile(seconds, 99) * 1e3,
        "mean_ms": statistics.fmean(seconds) * 1e3 if seconds else float("nan"),
    }
