"""The admission rule, written once: which routed cells enter an inbox, scored, with why.

Routing (:mod:`mesh.routing_rule`) is wide on purpose: it runs at every hop on vectors
alone and must not lose what a developer wants. The receiving node then decides what
enters each inbox with a judge that may read more than a vector (the beacon's words and
the cell's). Admission only ever looks at beacons routing already chose, so it can never
accept what routing would refuse: the routing rule is a superset by construction (and a
property test holds it to that).

A judge scores each (beacon, cell) pair and names the score's floor for that pair; the
beacon's feedback offset (:mod:`node.feedback`) moves the floor per beacon. A pair is
admitted when its score reaches the floor, and each principal gets one entry, named by
its best-scoring beacon, with the score and a one-line reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .energy import EnergyModel

if TYPE_CHECKING:  # the book imports this module; the types only flow back
    from .delivery import Beacon, CellFacts

__all__ = ["Admission", "AdmissionRule", "CosineJudge", "Judge", "Verdict"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judge's word on one (beacon, cell) pair."""

    score: float
    floor: float  # admitted when score >= floor (plus the beacon's feedback offset)
    reason: str


@dataclasses.dataclass(frozen=True)
class Admission:
    """One inbox delivery: who, by which beacon, how well, and why."""

    agent_id: str
    beacon_id: str
    similarity: float  # cosine of beacon and cell, whatever the judge
    score: float
    reason: str


class Judge(Protocol):
    """Scores the beacons routing chose against one cell."""

    name: str

    def judge(self, beacons: Sequence[Beacon], cell: CellFacts, similarities: np.ndarray, e0: float) -> list[Verdict]:
        ...

    def observe(self, vector: np.ndarray, content: str) -> None:
        """A cell this node now holds (a judge that learns from the team's writing keeps it)."""
        ...


class CosineJudge:
    """The vector alone: ``cos ≥ τ − slack × E0`` (the rule before admission had a judge)."""

    name = "cosine"

    def __init__(self, energy: EnergyModel) -> None:
        self._energy = energy

    def judge(self, beacons: Sequence[Beacon], cell: CellFacts, similarities: np.ndarray, e0: float) -> list[Verdict]:
        verdicts = []
        for beacon, similarity in zip(beacons, similarities.tolist()):
            floor = self._energy.match_threshold(beacon.threshold, e0)
            verdicts.append(Verdict(similarity, floor, f"cosine {similarity:.2f} (floor {floor:.2f})"))
        return verdicts

    def observe(self, vector: np.ndarray, content: str) -> None:
        pass  # the vector alone: nothing to learn


class AdmissionRule:
    """Routed beacons in, inbox deliveries out (at most one per principal)."""

    def __init__(
        self,
        energy: EnergyModel,
        judge: Judge | None = None,
        offset: Callable[[str], float] | None = None,
    ) -> None:
        self._energy = energy
        self.judge: Judge = judge if judge is not None else CosineJudge(energy)
        self._offset = offset if offset is not None else (lambda beacon_id: 0.0)

    def observe(self, vector: np.ndarray, content: str) -> None:
        self.judge.observe(vector, content)

    def admit(self, routed: Sequence[Beacon], cell: CellFacts) -> list[Admission]:
        if not routed:
            return []
        similarities = np.stack([b.embedding for b in routed]) @ cell.embedding
        e0 = self._energy.initial(cell.salience, cell.cell_type)
        verdicts = self.judge.judge(routed, cell, similarities, e0)
        best: dict[str, Admission] = {}
        for beacon, similarity, verdict in zip(routed, similarities.tolist(), verdicts):
            offset = self._offset(beacon.beacon_id)
            if verdict.score < verdict.floor + offset:
                continue
            current = best.get(beacon.agent_id)
            if current is None or verdict.score > current.score:
                reason = verdict.reason if not offset else f"{verdict.reason}, feedback {offset:+.2f}"
                best[beacon.agent_id] = Admission(beacon.agent_id, beacon.beacon_id, similarity, verdict.score, reason)
        return list(best.values())
