"""A run split over several processes gives the same results as on one, byte for byte."""

from __future__ import annotations

import multiprocessing

import pytest

from simulations import strategies
from simulations.cli import main
from simulations.runner import RunConfig, run, write
from simulations.shards import ShardError

# Each case stresses a path where a split run could part from a whole one: frames lost and
# duplicated (a duplicated frame's two copies cross to the other process together), a
# partition and restarts (a node's outage is known to every process), crashes for good and a
# latency whose least value is 1 ms (windows of 1 ms), graceful leaves, and the partial view.
CASES = {
    "full, loss and duplicates": dict(nodes=40, stores=30, seed=2, dim=16, loss=0.05, duplicate=0.1),
    "partition and restarts": dict(nodes=40, stores=30, seed=3, dim=16, churn="rate=2,down_ms=3000",
                                   partition="at=200,heal=1500", loss=0.05),
    "partial, crashes, lognormal": dict(nodes=60, stores=30, seed=4, dim=16, view="partial",
                                        churn="rate=2,down_ms=3000,mode=crash", latency="lognormal:12:0.5"),
    "leaves, constant latency": dict(nodes=40, stores=30, seed=5, dim=16, churn="rate=2,mode=leave",
                                     latency="constant:10"),
    "partial, interest relays": dict(nodes=120, stores=40, seed=1, dim=16, view="partial", beacons_per_node=1,
                                     warmup_max_ms=20_000, mesh=(("leaf_walk", 1),)),
}  # fmt: skip


def _files(cfg: RunConfig, out) -> tuple[bytes, bytes]:
    write(run(cfg), out)
    return (out / "summary.json").read_bytes(), (out / "cells.csv").read_bytes()


@pytest.mark.parametrize("case", list(CASES))
def test_a_split_run_gives_the_same_results(case, tmp_path):
    base = dict(strategies=("hyphae",), drain_ms=4000, **CASES[case])
    whole = _files(RunConfig(**base, processes=1), tmp_path / "one")
    summary = whole[0].decode()
    assert '"delivery_ratio"' in summary and '"processes"' not in summary
    for count in (2, 3):
        assert _files(RunConfig(**base, processes=count), tmp_path / str(count)) == whole, f"{count} processes"


def test_the_split_happens(monkeypatch):
    """The parts really are other processes, each holding its share of the nodes."""
    seen: list[tuple[int, int, int]] = []
    real_boot = strategies._HyphaeShard.boot

    def boot(self):
        real_boot(self)
        seen.append((self.index, len(self.net.hosts), multiprocessing.current_process().pid))

    monkeypatch.setattr(strategies._HyphaeShard, "boot", boot)
    monkeypatch.setattr(strategies._HyphaeShard, "result", lambda self: (_ for _ in ()).throw(RuntimeError(repr(seen))))
    cfg = RunConfig(nodes=10, stores=4, seed=1, dim=8, strategies=("hyphae",), drain_ms=500, processes=2)
    with pytest.raises(ShardError) as failed:
        run(cfg)
    text = str(failed.value)
    assert "part 0" in text and "part 1" in text and "RuntimeError" in text
    # Each part saw only its own boot: five nodes each, in a process that is not this one.
    assert "(0, 5, " in text and "(1, 5, " in text
    assert str(multiprocessing.current_process().pid) not in text


def test_a_failing_part_stops_the_run_with_its_traceback(monkeypatch):
    def broken(self, until_ms):
        if self.index == 1:
            raise ValueError("engine blew up")
        return real_step(self, until_ms)

    real_step = strategies._HyphaeShard.step
    monkeypatch.setattr(strategies._HyphaeShard, "step", broken)
    cfg = RunConfig(nodes=10, stores=4, seed=1, dim=8, strategies=("hyphae",), drain_ms=500, processes=2)
    with pytest.raises(ShardError, match="engine blew up"):
        run(cfg)
    assert not multiprocessing.active_children()  # no part left behind


def test_processes_on_the_command_line(tmp_path, capsys):
    args = ["run", "--nodes", "12", "--stores", "4", "--dim", "8", "--strategy", "hyphae", "--no-plots"]
    assert main([*args, "--processes", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "processes must be at least 0, not -1" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main([*args, "--processes", "2", "--out", str(tmp_path / "two")]) == 0
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "two" / "summary.json").read_bytes() == (tmp_path / "one" / "summary.json").read_bytes()
