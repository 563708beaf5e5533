"""Knowledge that changes in the simulator: supersedes and forgets in the workload, and the stale
exposure the summary reports (small meshes; the N=1,000 and N=10,000 figures are in BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from node.energy import EnergyModel
from simulations.cli import main
from simulations.lifecycle import lifecycle_summary
from simulations.metrics import Recorder
from simulations.runner import RunConfig, run
from simulations.workload import Workload, WorkloadSpec

SMALL = dict(nodes=60, stores=60, seed=3, dim=32, topics=5, beacons_per_node=1, strategies=("hyphae", "oracle"))


def test_a_share_of_the_stores_revise_an_earlier_cell_of_their_author():
    plain = Workload(WorkloadSpec(nodes=30, stores=80, dim=16), 1, EnergyModel())
    changing = Workload(WorkloadSpec(nodes=30, stores=80, dim=16, supersede_share=0.25, forget_share=0.1), 1,
                        EnergyModel())  # fmt: skip
    revisions = [c for c in changing.cells if c.supersedes]
    assert 10 <= len(revisions) <= 30
    for c in revisions:
        (old,) = c.supersedes
        assert old < c.index and changing.cells[old].origin == c.origin and changing.cells[old].topic == c.topic
        assert c.payload(0, 16).metadata == {"supersedes": [f"cell-{old}"]}
    kept = [c.index for c in changing.cells if not c.supersedes]
    assert all(changing.cells[i].vector.tobytes() == plain.cells[i].vector.tobytes() for i in kept)  # same draws
    forgotten = [c for c in changing.cells if c.forgotten_at_ms is not None]
    assert forgotten and all(c.forgotten_at_ms == c.at_ms + 2_000 for c in forgotten)


def test_stale_exposure_by_hand():
    w = Workload(WorkloadSpec(nodes=6, stores=2, dim=16, supersede_share=1.0), 5, EnergyModel())
    assert w.cells[1].supersedes == (0,)
    rec = Recorder(2)
    origin = w.cells[0].origin
    holders = [n for n in range(6) if n != origin][:3]
    for n in holders:
        rec.deliver(0, n, 100, 1)
    t = w.cells[1].at_ms
    rec.deliver(1, holders[0], t + 10, 1)  # 10 ms after the supersede
    rec.deliver(1, holders[1], 50, 1)  # before it: never stale
    rec.messages[1] = 2
    s = lifecycle_summary(rec, w, 0, whole_within_ms=30_000)["supersede"]
    # the author's node (lag 0), two holders served, one never
    assert (s["holders"], s["holders_never"], s["lag_ms_p50"], s["lag_ms_max"]) == (4, 1, 0, None)
    assert s["stale_share_after_ms"]["0"] == 0.5 and s["stale_share_after_ms"]["500"] == 0.25
    assert s["events_whole_within_ms"] == {"30000": 0.0}
    rec.deliver(1, holders[2], t + 40_000, 2)
    s = lifecycle_summary(rec, w, 0, whole_within_ms=30_000)["supersede"]
    assert (s["holders_never"], s["lag_ms_max"], s["events_whole_within_ms"]) == (0, 40_000, {"30000": 0.0})


@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_every_holder_serves_the_successor_and_every_holder_forgets(loss):
    summary = run(RunConfig(**SMALL, loss=loss, supersede=0.3, forget=0.15)).summary
    life = summary["strategies"]["hyphae"]["lifecycle"]
    assert life["supersede"]["events"] > 5 and life["forget"]["events"] > 3
    for kind in ("supersede", "forget"):
        assert life[kind]["holders_never"] == 0 and life[kind]["events_whole_within_ms"] == {"30000": 1.0}, kind
    assert "lifecycle" not in summary["strategies"]["oracle"]
    assert summary["config"]["supersede"] == 0.3


def test_without_supersedes_or_forgets_the_summary_is_as_before(tmp_path):
    summary = run(RunConfig(**SMALL, drain_ms=3000)).summary
    assert "supersede" not in summary["config"] and "lifecycle" not in summary["strategies"]["hyphae"]
    args = ["run", "--nodes", "20", "--stores", "10", "--dim", "16", "--supersede", "0.5", "--forget", "0.2",
            "--strategy", "hyphae", "--no-plots", "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    assert "lifecycle" in json.loads((tmp_path / "summary.json").read_text())["strategies"]["hyphae"]


def test_a_share_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="supersede_share"):
        RunConfig(nodes=4, stores=2, supersede=1.5)
