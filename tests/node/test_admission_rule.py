"""Route wide, admit narrow: the routing rule is a superset of the admission rule, and the
admission rule picks one beacon per principal, with its score and why."""

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.routing_rule import accepts
from node.admission_rule import AdmissionRule, Verdict
from node.delivery import Beacon, BeaconBook, CellFacts
from node.energy import EnergyModel

AGENTS = ["ana", "bo", "cy"]
PROJECTS = [None, "apollo", "gemini"]
KINDS = ["Fact", "Risk", "Decision", "Context"]


def unit(rng: random.Random, dim: int = 6) -> np.ndarray:
    v = np.array([rng.gauss(0, 1) for _ in range(dim)])
    return (v / np.linalg.norm(v)).astype(np.float32)


def random_beacon(rng: random.Random, i: int, filtered: float) -> Beacon:
    filters = {} if rng.random() >= filtered else {
        "cell_types": rng.choice([None, tuple(rng.sample(KINDS, rng.randint(1, 2)))]),
        "project": rng.choice(PROJECTS), "min_salience": rng.choice([None, rng.random()]),
        "expires_at": rng.choice([None, rng.randint(0, 2000)]),
        "owner_projects": rng.choice([(), ("apollo",)]),
    }  # fmt: skip
    return Beacon(f"b{i}", "t", rng.choice(AGENTS), "origin", f"query {i}", rng.uniform(-0.2, 0.6),
                  unit(rng), "s", 0, **filters)  # fmt: skip


def random_cell(rng: random.Random) -> CellFacts:
    return CellFacts("t", rng.choice(AGENTS + ["stranger"]), rng.choice(KINDS), rng.random(),
                     rng.choice(PROJECTS), unit(rng), "s", "content")  # fmt: skip


class Lenient:
    """A judge that would admit anything, however far from the beacon: admission must still
    stay inside what routing sends."""

    name = "lenient"

    def judge(self, beacons, cell, similarities, e0):
        return [Verdict(1.0, -10.0, "anything goes") for _ in beacons]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), filtered=st.floats(0, 1), lenient=st.booleans())
def test_routing_never_drops_what_admission_would_accept(seed, filtered, lenient):
    rng, energy = random.Random(seed), EnergyModel()
    beacons = [random_beacon(rng, i, filtered) for i in range(rng.randint(1, 20))]
    book = BeaconBook(energy, AdmissionRule(energy, Lenient()) if lenient else None)
    book.add_many(beacons)
    by_id = {b.beacon_id: b for b in beacons}
    for _ in range(20):
        cell = random_cell(rng)
        e0, now = energy.initial(cell.salience, cell.cell_type), 1000
        routed = {b.beacon_id for b in beacons if accepts(b, cell, e0, now, energy)}
        assert {b.beacon_id for b in book.routed(cell, now)} == routed
        for admission in book.match(cell, now):
            assert admission.beacon_id in routed
            assert by_id[admission.beacon_id].agent_id == admission.agent_id != cell.source_agent


def test_the_cosine_judge_admits_at_the_beacon_threshold_and_routing_reaches_wider():
    energy = EnergyModel()
    rng = random.Random(3)
    topic = unit(rng)
    beacon = Beacon("b1", "t", "ana", "origin", "what about retries?", 0.5, topic, "s", 0)
    book = BeaconBook(energy)
    book.add(beacon)

    def cell_at(cos: float) -> CellFacts:
        other = unit(rng)
        other -= (other @ topic) * topic
        other /= np.linalg.norm(other)
        vector = (cos * topic + np.sqrt(1 - cos * cos) * other).astype(np.float32)
        return CellFacts("t", "bo", "Context", 0.0, None, vector, "s", "x")  # E0 = 0: no slack

    inside, between, outside = cell_at(0.52), cell_at(0.48), cell_at(0.40)  # margin 0.04: routes from 0.46
    assert [a.beacon_id for a in book.match(inside, 0)] == ["b1"]
    assert book.routed(between, 0) == [beacon] and book.match(between, 0) == []
    assert book.routed(outside, 0) == []
    (admitted,) = book.match(inside, 0)
    assert admitted.score == admitted.similarity == np.float32(admitted.similarity)
    assert "cosine 0.52" in admitted.reason


def test_one_entry_per_principal_named_by_its_best_scoring_beacon():
    energy = EnergyModel()
    rng = random.Random(5)
    topic = unit(rng)
    book = BeaconBook(energy)
    book.add(Beacon("near", "t", "ana", "o", "q1", 0.1, topic, "s", 0))
    book.add(Beacon("far", "t", "ana", "o", "q2", 0.1, (0.7 * topic + 0.3 * unit(rng)), "s", 0))
    book.add(Beacon("other", "t", "cy", "o", "q3", 0.1, topic, "s", 0))
    admitted = {a.agent_id: a.beacon_id for a in book.match(CellFacts("t", "bo", "Fact", 0.5, None, topic, "s"), 0)}
    assert admitted == {"ana": "near", "cy": "other"}


def test_a_beacons_feedback_offset_moves_its_floor():
    energy = EnergyModel()
    rng = random.Random(9)
    topic = unit(rng)
    offsets = {"b1": 0.0}
    book = BeaconBook(energy, AdmissionRule(energy, offset=lambda beacon_id: offsets.get(beacon_id, 0.0)))
    book.add(Beacon("b1", "t", "ana", "o", "q", 0.9, topic, "s", 0))
    cell = CellFacts("t", "bo", "Context", 0.0, None, (0.95 * topic + 0.05 * unit(rng)).astype(np.float32), "s")
    cell = CellFacts(**{**cell.__dict__, "embedding": cell.embedding / np.linalg.norm(cell.embedding)})
    assert [a.beacon_id for a in book.match(cell, 0)] == ["b1"]
    offsets["b1"] = 0.2  # the owner left this beacon's deliveries unread: its floor rose
    assert book.match(cell, 0) == []
