"""The node's admission rule as the simulator's admission stage (simulations.admission)."""

import numpy as np

from mesh.wire import BeaconPayload, CellPayload
from simulations.admission import NodeAdmission
from simulations.semantic import fresh, load_admission
from tests.node.test_judges import DIM, at, unit
from tests.simulations.test_labelled import QUICK, WORKLOAD, FirstWordEmbedder


def test_the_stage_judges_each_owners_pairs_against_what_reached_that_owners_node():
    rng = np.random.default_rng(7)
    axis = unit(rng.standard_normal(DIM))
    beacon = BeaconPayload("b1", "t", "ana", "the team's work", 0.28, embedding=axis, embedding_space="s")
    stage = NodeAdmission()

    def cell(i: int, vector: np.ndarray) -> CellPayload:
        return CellPayload(f"c{i}", "t", "bo", f"note {i}", "Context", 0.0, 0, embedding=vector, embedding_space="s")

    # Before the node holds 32 cells, the cosine rule: 0.45 >= 0.28 gets in.
    assert stage(beacon, cell(0, at(axis, 0.45, rng)))
    for i in range(1, 40):  # everyday cells at 0.4-0.5 are held by ana's node (reached it, or her own)
        stage.hold("ana", cell(i, at(axis, rng.uniform(0.40, 0.50), rng)))
    assert not stage(beacon, cell(40, at(axis, 0.45, rng)))  # ordinary now
    assert stage(beacon, cell(41, at(axis, 0.95, rng)))  # stands out
    # another owner's node has its own (empty) background: the cosine rule there
    other = BeaconPayload("b2", "t", "cy", "the team's work", 0.28, embedding=axis, embedding_space="s")
    assert stage(other, cell(42, at(axis, 0.45, rng)))


def test_the_summary_tells_a_learning_stage_of_every_cell_an_owners_node_holds(tmp_path):
    from simulations.runner import RunConfig, run

    class Recorder:
        def __init__(self):
            self.held, self.asked = {}, []

        def hold(self, owner, cell):
            self.held.setdefault(owner, []).append(cell.source_agent)

        def __call__(self, beacon, cell):
            self.asked.append((beacon.agent_id, cell.source_agent))
            return True

    stage = Recorder()
    cfg = RunConfig(nodes=6, stores=None, seed=3, workload=WORKLOAD, embed_cache=str(tmp_path), **QUICK)
    run(cfg, admit=stage, embedder=FirstWordEmbedder())
    for owner, sources in stage.held.items():
        assert owner in sources  # the owner's own memories are held too, never asked about
        assert (owner, owner) not in stage.asked


def test_a_stage_loaded_by_class_is_made_anew_for_each_strategy():
    spec = load_admission("simulations.admission:NodeAdmission")
    first, second = fresh(spec), fresh(spec)
    assert isinstance(first, NodeAdmission) and first is not second
    plain = load_admission(None)
    assert fresh(plain) is plain
