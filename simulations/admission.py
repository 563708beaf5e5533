"""The node's own admission rule as the simulator's admission stage.

``--admission simulations.admission:NodeAdmission`` (or ``run(cfg, admit=NodeAdmission())``)
asks, for every (beacon, cell) pair routing delivered to a beacon owner's node, what
:mod:`node.admission_rule` would decide there with the node's default judge
(:class:`node.judges.CalibratedJudge`). The judge learns from the cells its node holds, so
there is one per owner's node, told by :meth:`NodeAdmission.hold` of every cell that node
holds (what reached it, and its own agents' memories) after that cell has been judged, as
on the node (``node.ingest``). Load it by class: each strategy gets a fresh one.
"""

from __future__ import annotations

import numpy as np

from mesh.wire import BeaconPayload, CellPayload
from node.admission_rule import AdmissionRule
from node.config import DEFAULT_BEACON_THRESHOLD
from node.delivery import Beacon, CellFacts
from node.energy import EnergyModel
from node.judges import Background, CalibratedJudge, TermStats, load_background_notes

__all__ = ["NodeAdmission"]


class NodeAdmission:
    """``admit(beacon_payload, cell_payload) -> bool`` by the node's calibrated judge."""

    def __init__(self, energy: EnergyModel | None = None) -> None:
        self._energy = energy or EnergyModel()
        self._notes = load_background_notes()
        self._judges: dict[str, CalibratedJudge] = {}  # by beacon owner (one node each)

    def _judge(self, owner: str, dim: int) -> CalibratedJudge:
        judge = self._judges.get(owner)
        if judge is None:
            judge = self._judges[owner] = CalibratedJudge(
                self._energy, Background(dim), TermStats(self._notes), default_threshold=DEFAULT_BEACON_THRESHOLD
            )
        return judge

    def hold(self, owner: str, cell: CellPayload) -> None:
        """``owner``'s node now holds ``cell``: it joins that node's background."""
        self._judge(owner, len(cell.embedding)).observe(cell.embedding, cell.content)

    def __call__(self, beacon: BeaconPayload, cell: CellPayload) -> bool:
        judge = self._judge(beacon.agent_id, len(cell.embedding))
        facts = CellFacts(cell.tenant_id, cell.source_agent, cell.cell_type, cell.salience, cell.project,
                          cell.embedding, cell.embedding_space, cell.content)  # fmt: skip
        local = Beacon(beacon.beacon_id, beacon.tenant_id, beacon.agent_id, "sim", beacon.query, beacon.threshold,
                       np.asarray(beacon.embedding, np.float32), beacon.embedding_space, 0,
                       beacon.cell_types, beacon.project, beacon.min_salience)  # fmt: skip
        return bool(AdmissionRule(self._energy, judge).admit([local], facts))
