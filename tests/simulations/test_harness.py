"""The harness as a story: tiny hand-checked meshes, then determinism and hostile networks."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulations.cli import main
from simulations.runner import RunConfig, run, write
from simulations.workload import Workload, WorkloadSpec
from node.energy import EnergyModel

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(dim=16, topics=3, beacons_per_node=1, drain_ms=5000)


def one_interested(nodes: int, stores: int = 1) -> tuple[RunConfig, Workload]:
    """A seed whose workload has every cell interesting exactly one node (searched, then fixed)."""
    for seed in range(500):
        cfg = RunConfig(nodes=nodes, stores=stores, seed=seed, latency="constant:10", **TINY)
        w = Workload(WorkloadSpec(nodes=nodes, stores=stores, dim=16, topics=3, beacons_per_node=1), seed,
                     EnergyModel())  # fmt: skip
        if all(len(c.interested) == 1 for c in w.cells):
            return cfg, w
    raise AssertionError("no such seed")


def test_four_nodes_one_interested_by_hand():
    cfg, w = one_interested(4)
    s = run(cfg).summary["strategies"]
    # oracle: one message to the one interested node; hyphae pushes exactly that one data diff
    assert s["oracle"]["messages_per_store"] == 1 and s["hyphae"]["messages_per_store"] == 1
    assert s["hyphae"]["data_frames_per_store"] == 1 and s["hyphae"]["hops_max"] == 1
    for name in ("hyphae", "oracle"):
        assert s[name]["delivery_ratio"] == 1.0 and s[name]["precision"] == 1.0
        assert s[name]["duplicates_per_delivery"] == 0.0
    # flood reaches all 3 other nodes: precision 1/3, and every node forwards once to its neighbours
    assert s["flood"]["delivery_ratio"] == 1.0 and s["flood"]["precision"] == pytest.approx(1 / 3, abs=1e-6)
    # 4 nodes, degree 8: the overlay is complete (3 neighbours each). Constant 10 ms links: the
    # origin's 3 copies arrive first, then each receiver forwards to the 2 nodes that are
    # neither the sender nor itself (the origin excluded): 3 + 3 × 2 = 9 messages, 6 of them duplicates
    assert s["flood"]["messages_per_store"] == 9
    assert s["flood"]["duplicates_per_delivery"] == 2.0
    assert s["oracle"]["latency_ms_p50"] == s["hyphae"]["latency_ms_p50"] == 10
    # hyphae's bytes are the engine's own frames; the oracle's are sized by the same codec
    assert abs(s["hyphae"]["bytes_per_store"] - s["oracle"]["bytes_per_store"]) < 64


def test_three_stores_on_five_nodes_match_ground_truth():
    cfg = RunConfig(nodes=5, stores=3, seed=7, **TINY)
    result = run(cfg)
    s = result.summary["strategies"]
    w = Workload(WorkloadSpec(nodes=5, stores=3, dim=16, topics=3, beacons_per_node=1), 7, EnergyModel())
    interested = sum(len(c.interested) for c in w.cells)
    assert s["oracle"]["messages_per_store"] == pytest.approx(interested / 3, abs=1e-6)
    assert s["hyphae"]["messages_per_store"] == s["oracle"]["messages_per_store"]
    rows = [r for r in result.rows if r["strategy"] == "hyphae"]
    assert [r["interested"] for r in rows] == [len(c.interested) for c in w.cells]
    assert all(r["reached"] == r["interested"] == r["deliveries"] for r in rows)


def test_random_push_without_ttl_budget_stops_at_first_hop():
    cfg = RunConfig(nodes=5, stores=2, seed=1, strategies=("random_push",), fanout=2, ttl=1, **TINY)
    s = run(cfg).summary["strategies"]["random_push"]
    assert s["messages_per_store"] == 2 and s["hops_max"] == 1


def test_same_seed_same_bytes(tmp_path):
    cfg = RunConfig(nodes=8, stores=6, seed=5, loss=0.2, duplicate=0.1, latency="lognormal:10:0.8",
                    partition="at=50,heal=2000,split=0.5", churn="rate=6,down_ms=1500", **TINY)  # fmt: skip
    write(run(cfg), tmp_path / "a")
    write(run(cfg), tmp_path / "b")
    for name in ("summary.json", "cells.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other = RunConfig(**{**cfg.__dict__, "seed": 6})
    write(run(other), tmp_path / "c")
    assert (tmp_path / "c" / "summary.json").read_bytes() != (tmp_path / "a" / "summary.json").read_bytes()


def test_same_seed_same_bytes_across_processes_and_hash_seeds(tmp_path):
    """Set iteration order of str differs per PYTHONHASHSEED: the summary must not."""
    args = ["run", "--nodes", "6", "--stores", "4", "--seed", "2", "--dim", "16", "--loss", "0.2",
            "--drain-ms", "4000", "--no-plots"]  # fmt: skip
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / hash_seed
        env = {"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-m", "simulations", *args, "--out", str(out)], cwd=ROOT, env=env,
                       check=True, capture_output=True, timeout=60)  # fmt: skip
        outs.append((out / "summary.json").read_bytes())
    assert outs[0] == outs[1]


def test_loss_is_repaired_and_the_partition_heals():
    cfg = RunConfig(nodes=8, stores=8, seed=3, loss=0.3, partition="at=0,heal=3000,split=0.5",
                    strategies=("hyphae", "oracle"), dim=16, topics=2, beacons_per_node=1, drain_ms=60_000)  # fmt: skip
    s = run(cfg).summary["strategies"]
    assert s["hyphae"]["delivery_ratio"] == 1.0 and s["hyphae"]["precision"] == 1.0
    assert s["hyphae"]["whole_after_heal_share"] == 1.0 and s["hyphae"]["heal_to_whole_ms"] is not None
    assert s["oracle"]["delivery_ratio"] < 1.0  # the yardstick has no repair: the cut side never hears


def test_churned_nodes_come_back_with_their_data():
    cfg = RunConfig(nodes=6, stores=10, seed=4, churn="rate=20,down_ms=2000", strategies=("hyphae",),
                    dim=16, topics=2, beacons_per_node=1, store_interval_ms=300, drain_ms=160_000)  # fmt: skip
    s = run(cfg).summary
    assert s["config"]["outages"] > 0 and s["strategies"]["hyphae"]["restarts"] == s["config"]["outages"]
    assert s["strategies"]["hyphae"]["delivery_ratio"] == 1.0


def test_cli_writes_summary_and_cells(tmp_path):
    assert main(["run", "--nodes", "5", "--stores", "3", "--dim", "16", "--out", str(tmp_path), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["strategies"]) == {"hyphae", "flood", "random_push", "oracle"}
    for s in summary["strategies"].values():
        for key in ("delivery_ratio", "precision", "messages_per_store", "bytes_per_store", "latency_ms_p50",
                    "latency_ms_p99", "hops_max", "duplicates_per_delivery", "max_node_load"):  # fmt: skip
            assert key in s
    lines = (tmp_path / "cells.csv").read_text().splitlines()
    assert lines[0].startswith("strategy,cell,origin") and len(lines) == 1 + 4 * 3


def test_partial_view_runs_and_relays(tmp_path):
    assert main(["run", "--nodes", "12", "--stores", "4", "--dim", "16", "--view", "partial", "--warmup-max-ms",
                 "10000", "--strategy", "hyphae,oracle", "--out", str(tmp_path), "--no-plots"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["view"] == "partial"
    assert summary["strategies"]["hyphae"]["delivery_ratio"] > 0


def test_partial_warm_up_ends_when_the_overlay_settles():
    # Known sets keep growing after the interest overlay forms; the warm-up must not wait them
    # out (it ran 53 of the default 120 virtual s here, 120 at N=1,000, before it watched links).
    cfg = RunConfig(nodes=100, stores=20, seed=1, view="partial", strategies=("hyphae",), dim=64, beacons_per_node=1)
    hyphae = run(cfg).summary["strategies"]["hyphae"]
    assert hyphae["warmup_converged"] and hyphae["warmup_ms"] <= 30_000
    assert hyphae["delivery_ratio"] == 1.0


def test_drain_ends_when_the_data_plane_is_done():
    # Without loss, partitions or churn the default drain stops once every engine's data plane
    # is done (nothing queued, unacknowledged, announced or awaited, nothing sent within the
    # longest link delay); every delivery of the full 10 s drain is already in. Where a frame
    # may take any time (lognormal latency), once no data frame has gone for 2 s.
    cfg = RunConfig(nodes=60, stores=30, seed=2, view="partial", strategies=("hyphae",), dim=16, topics=3,
                    beacons_per_node=1, warmup_max_ms=10_000, mesh=(("lazy_push", True),))  # fmt: skip
    done = run(cfg).summary["strategies"]["hyphae"]
    full = run(dataclasses.replace(cfg, drain_ms=10_000)).summary["strategies"]["hyphae"]
    assert 0 < done["drain_ms"] < 2_000 and full["drain_ms"] == 10_000
    for key in ("delivery_ratio", "precision", "messages_per_store", "latency_ms_p99", "latency_ms_max", "hops_max"):
        assert done[key] == full[key]
    assert done["delivery_ratio"] > 0.9
    spread = dataclasses.replace(cfg, latency="lognormal:12:0.5")
    quiet = run(spread).summary["strategies"]["hyphae"]
    full = run(dataclasses.replace(spread, drain_ms=10_000)).summary["strategies"]["hyphae"]
    assert 2_000 <= quiet["drain_ms"] < 10_000
    assert quiet["delivery_ratio"] == full["delivery_ratio"] and quiet["latency_ms_max"] == full["latency_ms_max"]
    lossy = run(dataclasses.replace(cfg, loss=0.05)).summary["strategies"]["hyphae"]
    assert lossy["drain_ms"] == 75_000  # repair needs its rounds: a hostile run drains in full


def test_bad_specs_are_clear_errors(tmp_path, capsys):
    assert main(["run", "--nodes", "4", "--partition", "at=5,hael=9", "--out", str(tmp_path)]) == 2
    assert "hael" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["--nodes", "1"], "nodes must be at least 2, not 1"),
    (["--stores", "-1"], "stores must be at least 0, not -1"),
    (["--store-interval-ms", "-5"], "store_interval_ms must be at least 0, not -5"),
    (["--drain-ms", "-1"], "drain_ms must be at least 0, not -1"),
    (["--warmup-max-ms", "-1"], "warmup_max_ms must be at least 0, not -1"),
    (["--mesh", "gossip_intervall_ms=500"], "unknown mesh setting(s): gossip_intervall_ms (known: ack_delay_ms"),
    (["--mesh", "team=1"], "unknown mesh setting(s): team"),  # the harness sets it per node
    (["--mesh", "gossip_interval_ms=fast"], "expected KEY=NUMBER, got 'gossip_interval_ms=fast'"),
    (["--mesh", "gossip_interval_ms=-5"], "mesh setting gossip_interval_ms must be at least 1, not -5"),
    (["--energy", "max_hops"], "expected KEY=NUMBER, got 'max_hops'"),
])  # fmt: skip
def test_bad_numbers_and_settings_are_named_in_the_error(tmp_path, capsys, args, says):
    assert main(["run", "--nodes", "4", "--stores", "2", *args, "--out", str(tmp_path / "out")]) == 2
    assert f"error: {says}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_ground_truth_uses_the_energy_rule():
    w = Workload(WorkloadSpec(nodes=30, stores=50, dim=32, topics=4), 1, EnergyModel())
    energy = EnergyModel()
    for cell in w.cells:
        e0 = energy.initial(cell.salience, cell.cell_type)
        want = set()
        for b in w.beacons:
            p = b.payload
            if b.node == cell.origin or (p.cell_types and cell.cell_type not in p.cell_types):
                continue
            if p.min_salience is not None and cell.salience < p.min_salience:
                continue
            if float(p.embedding @ cell.vector) >= p.threshold - energy.match_slack * e0 + 1e-6:
                want.add(b.node)
        assert want <= cell.interested  # float32 boundary cases may add, never lose
        assert np.isclose(np.linalg.norm(cell.vector), 1.0, atol=1e-5)


def test_churn_modes_schedule_departures():
    from simulations.network import FOREVER, ChurnSpec, churn_schedule
    import random

    def schedule(mode):
        return churn_schedule(ChurnSpec.parse(f"rate=6,down_ms=500,mode={mode},grace_ms=700"), 50, 60_000,
                              random.Random(1))  # fmt: skip

    rejoin, crash, leave = schedule("rejoin"), schedule("crash"), schedule("leave")
    assert all(o.up_at == o.down_at + 500 and o.grace == 0 for o in rejoin)
    assert len({o.node for o in rejoin}) < len(rejoin)  # rejoining nodes can go again
    for outages, grace in ((crash, 0), (leave, 700)):
        assert len({o.node for o in outages}) == len(outages)  # once, for good
        assert all(o.up_at == FOREVER and o.permanent and o.off_at == o.down_at + grace for o in outages)
    assert [(o.node, o.down_at) for o in crash] == [(o.node, o.down_at) for o in leave]
    with pytest.raises(ValueError, match="mode"):
        ChurnSpec.parse("rate=1,mode=vanish")


def test_graceful_leave_finishes_its_sends_where_a_crash_loses_them():
    """Same departures, 30 % loss: a leaving node retransmits until acked; a crashed one cannot."""
    def hyphae(mode: str, loss: float) -> dict:
        cfg = RunConfig(nodes=8, stores=30, seed=4, churn=f"rate=3,down_ms=2000,mode={mode}", loss=loss,
                        strategies=("hyphae",), dim=16, topics=2, beacons_per_node=1, store_interval_ms=300,
                        drain_ms=60_000, energy=(("route_margin", 0.0),))  # fmt: skip
        return run(cfg).summary

    # Routing at the beacons' thresholds: with a wider rule, one more reader is interested in a
    # cell just before that reader itself leaves, which no sender can help.
    crash, leave = hyphae("crash", 0.3), hyphae("leave", 0.3)
    for s in (crash, leave):
        assert s["config"]["departed_nodes"] == s["config"]["outages"] == 4
        assert s["strategies"]["hyphae"]["restarts"] == 0
        assert s["config"]["skipped_stores"] == 8  # stores a departed node's agents would have made
    assert leave["strategies"]["hyphae"]["delivery_ratio"] == 1.0
    assert crash["strategies"]["hyphae"]["delivery_ratio"] < 0.95
    # departed nodes leave the interested set of later cells: without loss, everyone left is reached
    assert hyphae("crash", 0.0)["strategies"]["hyphae"]["delivery_ratio"] == 1.0


def test_energy_overrides_reach_the_engine_and_the_ground_truth():
    # sparse interest, known one hop away only: cells walk, and the hop budget is what the walk spends
    base = dict(nodes=12, stores=8, seed=3, view="partial", strategies=("hyphae",), dim=16, topics=6,
                beacons_per_node=1, drain_ms=3000, warmup_max_ms=10_000, mesh=(("interest_radius", 1),))  # fmt: skip
    default = run(RunConfig(**base)).summary
    one_hop = run(RunConfig(**base, energy=(("max_hops", 1),))).summary
    assert one_hop["config"]["energy"] == {"max_hops": 1}
    assert default["strategies"]["hyphae"]["hops_max"] > 1
    assert one_hop["strategies"]["hyphae"]["messages_per_store"] < default["strategies"]["hyphae"]["messages_per_store"]
    wider = run(RunConfig(**base, energy=(("match_slack", 0.5),))).summary["strategies"]["hyphae"]
    assert wider["interested_mean"] > default["strategies"]["hyphae"]["interested_mean"]
    with pytest.raises(ValueError, match="bogus"):
        RunConfig(energy=(("bogus", 1),))


def test_a_run_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    # A run collects less often (its objects live until it ends, some frozen out of the
    # collector's sight); a caller's process, or a run that fails half way, gets its own
    # thresholds back and nothing left frozen.
    import gc

    from simulations import strategies

    before = gc.get_threshold()
    seen = []

    class Failing:
        def run(self, ctx):
            seen.append(gc.get_threshold())
            gc.freeze()  # as the hyphae strategy does with its engines
            raise RuntimeError("half way")

    run(RunConfig(nodes=4, stores=2, strategies=("oracle", "hyphae"), **TINY))
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    monkeypatch.setitem(strategies.STRATEGIES, "failing", Failing)
    with pytest.raises(RuntimeError, match="half way"):
        run(RunConfig(nodes=4, stores=2, strategies=("failing",), **TINY))
    assert seen and seen[0] != before and gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_long_run_says_where_it_is_without_changing_it(tmp_path, monkeypatch, capsys):
    cfg = RunConfig(nodes=40, stores=20, seed=3, view="partial", strategies=("hyphae",), dim=16, topics=3,
                    beacons_per_node=1, warmup_max_ms=6_000)  # fmt: skip
    steps = []
    watched = run(cfg, on_step=steps.append)
    assert watched.summary == run(cfg).summary  # stepping the queue changes no event
    phases = [s.phase for s in steps]
    assert phases[0] == "warm-up" and "stores" in phases and phases[-1] == "drain"
    assert phases == sorted(phases, key=["warm-up", "stores", "drain"].index)
    for phase in ("warm-up", "stores", "drain"):
        at = [s.at_ms for s in steps if s.phase == phase]
        assert at == sorted(at) and all(0 < a <= s.of_ms for a, s in zip(at, steps))
    frames = [s.frames for s in steps]
    assert frames == sorted(frames) and frames[-1] > 0
    # The command line prints them (every 5 s of wall time; here every step).
    monkeypatch.setattr("simulations.cli.PROGRESS_EVERY_S", 0.0)
    assert main(["run", "--nodes", "12", "--stores", "4", "--dim", "16", "--view", "partial",
                 "--warmup-max-ms", "3000", "--strategy", "hyphae", "--no-plots", "--out", str(tmp_path)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "hyphae: warm-up 1.0/3.0 virtual s" in err and "hyphae: stores" in err and "peak RSS" in err
