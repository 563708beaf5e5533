"""A labelled workload as a story: a tiny team stream, read by hand, gives the figures the summary reports.

The stream (``tiny_team_stream.json``): ana holds beacons on alpha and beta, bo one on gamma, cy
holds none. A fake embedder puts each text on a basis vector by its first word, so a beacon
accepts exactly the memories that start with its word (cosine 1), and no other (cosine 0).
What routing brings each owner, and what the judgements say they wanted:

* ana: routed m1, m2, m3 (m7 is her own); wanted m1, m3 and m4 (in other words: never routed):
  precision 2/3, recall 2/3;
* bo: routed m5, m6; wanted m5 and m8 (in other words): precision 1/2, recall 1/2;
* macro: 7/12 each. An admission stage that turns away the two "noise" memories makes
  precision 1 for both, recall unchanged, F1 (0.8 + 2/3) / 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from node.energy import EnergyModel
from simulations import labelled
from simulations.cli import main
from simulations.labelled import build_labelled, load_stream, parse_workload, place_team
from simulations.runner import RunConfig, run

TINY_STREAM = Path(__file__).resolve().parent / "tiny_team_stream.json"
WORKLOAD = f"team-stream:{TINY_STREAM}"
QUICK = dict(latency="constant:10", drain_ms=3000, strategies=("hyphae", "oracle"))


class FirstWordEmbedder:
    """alpha, beta, gamma -> e1, e2, e3; any other first word -> e4. Counts its calls."""

    dim = 4
    space = "fake-first-word-4"
    words = ("alpha", "beta", "gamma")

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            word = text.split()[0].strip(":,?").lower()
            out[row, self.words.index(word) if word in self.words else 3] = 1.0
        return out


def _run(tmp_path: Path, nodes: int = 6, **kwargs):
    cfg = RunConfig(nodes=nodes, seed=3, workload=WORKLOAD, embed_cache=str(tmp_path / "cache"),
                    **{**QUICK, "stores": None, **kwargs})  # fmt: skip
    return run(cfg, embedder=FirstWordEmbedder())


def test_semantic_precision_and_recall_by_hand(tmp_path):
    summary = _run(tmp_path).summary
    for name in ("hyphae", "oracle"):
        strategy = summary["strategies"][name]
        assert strategy["delivery_ratio"] == 1.0 and strategy["precision"] == 1.0  # transport: all of the rule
        semantic = strategy["semantic"]
        assert semantic["owners"] == 2
        ana, bo = semantic["routed"]["per_owner"]["ana"], semantic["routed"]["per_owner"]["bo"]
        assert (ana["delivered"], ana["relevant"], ana["hits"]) == (3, 3, 2)
        assert (bo["delivered"], bo["relevant"], bo["hits"]) == (2, 2, 1)
        assert ana["precision"] == ana["recall"] == round(2 / 3, 6) and bo["precision"] == bo["recall"] == 0.5
        routed = semantic["routed"]
        assert routed["precision"] == routed["recall"] == routed["f1"] == round(7 / 12, 6)
        # no admission stage: the inbox holds whatever routing delivered
        assert {k: semantic["admitted"][k] for k in ("precision", "recall", "f1")} == \
            {k: routed[k] for k in ("precision", "recall", "f1")}  # fmt: skip
    assert summary["workload"]["rule"] == {"precision": round(7 / 12, 6), "recall": round(7 / 12, 6),
                                           "f1": round(7 / 12, 6)}  # fmt: skip


def test_the_admission_stage_decides_what_enters_the_inbox(tmp_path):
    asked = []

    def no_noise(beacon, cell):
        asked.append((beacon.beacon_id, cell.content.split()[0], cell.source_agent))
        return "noise" not in cell.content

    cfg = RunConfig(nodes=6, stores=None, seed=3, workload=WORKLOAD, embed_cache=str(tmp_path / "cache"), **QUICK)
    summary = run(cfg, embedder=FirstWordEmbedder(), admit=no_noise).summary
    semantic = summary["strategies"]["hyphae"]["semantic"]
    assert semantic["routed"]["precision"] == round(7 / 12, 6)  # routing is what it was
    admitted = semantic["admitted"]
    assert admitted["per_owner"]["ana"]["delivered"] == 2 and admitted["per_owner"]["bo"]["delivered"] == 1
    figures = (admitted["precision"], admitted["recall"], admitted["f1"])
    assert figures == (1.0, round(7 / 12, 6), round((0.8 + 2 / 3) / 2, 6))
    # asked once per (beacon, cell) pair routing delivered, per strategy, in the order cells reached the node
    per_strategy = [("b1", "alpha", "bo"), ("b1", "alpha", "cy"), ("b2", "beta", "cy"), ("b3", "gamma", "ana"),
                    ("b3", "gamma", "cy")]  # fmt: skip
    assert asked == per_strategy * 2
    assert summary["config"]["admission"].endswith("no_noise")


def test_an_admission_stage_by_name(tmp_path):
    cfg = RunConfig(nodes=6, seed=3, workload=WORKLOAD, admission="simulations.semantic:accept_routed",
                    embed_cache=str(tmp_path), stores=None, **QUICK)  # fmt: skip
    assert run(cfg, embedder=FirstWordEmbedder()).summary["config"]["admission"] == "simulations.semantic:accept_routed"
    with pytest.raises(ValueError, match="MODULE:NAME"):
        RunConfig(workload=WORKLOAD, admission="no-colon")
    with pytest.raises(ValueError, match="cannot be loaded"):
        RunConfig(workload=WORKLOAD, admission="simulations.semantic:no_such_stage")


def test_the_team_lands_on_nodes_by_seed(tmp_path):
    people = ["ana", "bo", "cy"]
    first = place_team(people, 1000, seed=7)
    assert first == place_team(list(reversed(people)), 1000, seed=7)  # the same seed, the same places
    assert len(set(first.values())) == 3 and all(0 <= n < 1000 for n in first.values())
    assert any(place_team(people, 1000, seed=s) != first for s in range(8, 12))
    with pytest.raises(ValueError, match="at least 3 nodes"):
        place_team(people, 2, seed=0)

    w = build_labelled(TINY_STREAM, nodes=40, seed=7, energy=EnergyModel(), threshold=0.28, store_interval_ms=50,
                       stores=None, embedder=FirstWordEmbedder(), cache_dir=tmp_path)  # fmt: skip
    team = place_team(people, 40, seed=7)
    assert w.team == team
    # every owner's beacons on the owner's node; every other node an idle relay
    assert {b.payload.beacon_id: b.node for b in w.beacons} == {"b1": team["ana"], "b2": team["ana"], "b3": team["bo"]}
    assert all(w.beacons_of(n) == [] for n in range(40) if n not in (team["ana"], team["bo"]))
    # stored in timestamp order, each from its author's node, one every store interval
    assert [c.memory_id for c in w.stream_cells] == ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"]
    assert [c.origin for c in w.stream_cells] == [team[c.author] for c in w.stream_cells]
    assert [c.at_ms for c in w.cells] == [50 * i for i in range(8)]
    assert [sorted(c.interested) for c in w.cells] == [[team["ana"]]] * 3 + [[]] + [[team["bo"]]] * 2 + [[]] * 2
    assert all(b.payload.threshold == pytest.approx(0.28) for b in w.beacons)
    payload = w.cells[0].payload(123, w.spec.dim)
    first = load_stream(TINY_STREAM).memories[0]["content"]
    assert (payload.source_agent, payload.content, payload.embedding_space) == ("bo", first, FirstWordEmbedder.space)


def test_vectors_are_embedded_once_per_file_and_space(tmp_path):
    stream = load_stream(TINY_STREAM)
    embedder = FirstWordEmbedder()
    first = labelled.embed_stream(stream, embedder, tmp_path)
    again = labelled.embed_stream(stream, embedder, tmp_path)
    assert embedder.calls == 2  # memories and queries, the first time only
    assert all(np.array_equal(a, b) for a, b in zip(first, again))

    class OtherSpace(FirstWordEmbedder):
        space = "fake-first-word-4/v2"

    other = OtherSpace()
    labelled.embed_stream(stream, other, tmp_path)
    assert other.calls == 2 and len(list(tmp_path.glob("*.npz"))) == 2


def test_the_first_stores_memories_and_their_judgements(tmp_path):
    summary = _run(tmp_path, stores=3).summary
    assert summary["config"]["stores"] == 3 and summary["workload"]["memories"] == 3
    ana = summary["strategies"]["hyphae"]["semantic"]["routed"]["per_owner"]["ana"]
    assert (ana["delivered"], ana["relevant"], ana["hits"]) == (3, 2, 2)  # m4 is not stored yet


def test_summary_json_carries_the_semantic_fields(tmp_path, monkeypatch):
    monkeypatch.setattr(labelled, "_node_embedder", lambda settings=None: FirstWordEmbedder())
    out = tmp_path / "out"
    assert main(["run", "--workload", WORKLOAD, "--nodes", "6", "--seed", "3", "--latency", "constant:10",
                 "--drain-ms", "3000", "--strategy", "hyphae,oracle", "--embed-cache", str(tmp_path / "cache"),
                 "--out", str(out), "--no-plots"]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["workload"] == "team-stream" and summary["config"]["stores"] == 8
    assert summary["config"]["beacon_threshold"] == 0.28
    assert "dim" not in summary["config"] and "embed_cache" not in summary["config"]
    workload = summary["workload"]
    assert workload["file"] == TINY_STREAM.name and len(workload["sha256"]) == 64
    assert (workload["memories"], workload["beacons"], workload["owners"], workload["people"]) == (8, 3, 2, 3)
    assert (workload["judged_pairs"], workload["owner_relevant_pairs"]) == (5, 5)
    assert workload["embedding_space"] == FirstWordEmbedder.space and set(workload["team_nodes"]) == {"ana", "bo", "cy"}
    for strategy in summary["strategies"].values():
        for stage in ("routed", "admitted"):
            assert set(strategy["semantic"][stage]) == {"precision", "recall", "f1", "per_owner"}
        assert "delivery_ratio" in strategy  # transport, beside it


def test_a_synthetic_run_has_no_semantic_figures():
    summary = run(RunConfig(nodes=4, stores=2, dim=16, drain_ms=2000, strategies=("oracle",))).summary
    assert "workload" not in summary and "semantic" not in summary["strategies"]["oracle"]
    assert not {"workload", "beacon_threshold", "embed_cache", "admission", "team_peers"} & set(summary["config"])


def test_a_labelled_run_is_the_same_on_two_processes(tmp_path):
    one = _run(tmp_path, nodes=8).summary
    two = _run(tmp_path, nodes=8, processes=2).summary
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_workload_names():
    assert parse_workload("synthetic") == ("synthetic", None)
    assert parse_workload(WORKLOAD) == ("team-stream", TINY_STREAM)
    assert parse_workload("team-stream")[1] == labelled.DEFAULT_STREAM
    for wrong in ("teamstream", "synthetic:x", "team-stream:/no/such/file.json"):
        with pytest.raises(ValueError):
            parse_workload(wrong)


def test_a_team_among_idle_relays_in_a_partial_view(tmp_path):
    """Forty nodes, three of them the team: the warm-up waits for the team's overlay (the idle
    relays have nothing to settle), and every cell still reaches whoever its rule names."""
    hyphae = _run(tmp_path, nodes=40, view="partial").summary["strategies"]["hyphae"]
    assert hyphae["warmup_converged"] and hyphae["delivery_ratio"] == 1.0
    assert hyphae["semantic"]["routed"]["precision"] == round(7 / 12, 6)


def test_teammates_told_of_each_other_at_boot(tmp_path):
    def workload(team_peers: bool):
        return build_labelled(TINY_STREAM, nodes=40, seed=7, energy=EnergyModel(), threshold=0.28,
                              store_interval_ms=50, stores=None, embedder=FirstWordEmbedder(), cache_dir=tmp_path,
                              team_peers=team_peers)  # fmt: skip

    apart, together = workload(False), workload(True)
    team = sorted(together.team.values())
    assert all(apart.boot_peers(n) == () for n in range(40))
    assert together.boot_peers(team[0]) == tuple(team[1:])
    assert all(together.boot_peers(n) == () for n in range(40) if n not in team)
    hyphae = _run(tmp_path, nodes=40, view="partial", team_peers=True).summary["strategies"]["hyphae"]
    assert hyphae["delivery_ratio"] == 1.0
