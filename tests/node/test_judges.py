"""The calibrated judge: each beacon measured against its own background, plus rare shared words."""

import numpy as np
import pytest

from node.admission_rule import AdmissionRule
from node.delivery import Beacon, BeaconBook, CellFacts
from node.energy import EnergyModel
from node.judges import MIN_BACKGROUND, REFRESH_CELLS, Background, CalibratedJudge, TermStats, load_background_notes, terms

DIM = 384  # wide enough that unrelated vectors sit near cosine 0, as a real model's do
ENERGY = EnergyModel()


def unit(v) -> np.ndarray:
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def at(axis: np.ndarray, cos: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector at exactly ``cos`` from the unit vector ``axis``."""
    other = rng.standard_normal(DIM).astype(np.float32)
    other -= (other @ axis) * axis
    other /= np.linalg.norm(other)
    return unit(cos * axis + np.sqrt(1 - cos * cos) * other)


def book_with(judge: CalibratedJudge, *beacons: Beacon) -> BeaconBook:
    book = BeaconBook(ENERGY, AdmissionRule(ENERGY, judge))
    book.add_many(beacons)
    return book


def judge(background: Background, notes=()) -> CalibratedJudge:
    return CalibratedJudge(ENERGY, background, TermStats(notes), default_threshold=0.28, z_floor=3.0, lexical_weight=4.0)


def cell(vector: np.ndarray, content: str = "a note") -> CellFacts:
    return CellFacts("t", "writer", "Context", 0.0, None, vector, "s", content)  # E0 = 0: no slack


def test_a_broad_beacon_needs_more_than_its_threshold_and_a_narrow_one_less():
    rng = np.random.default_rng(1)
    team = unit(rng.standard_normal(DIM))  # what this team writes about, all the time
    broad = Beacon("broad", "t", "ana", "o", "the team's work", 0.28, team, "s", 0)
    narrow_axis = at(team, 0.0, rng)  # a topic the team seldom touches
    narrow = Beacon("narrow", "t", "bo", "o", "a rare topic", 0.28, narrow_axis, "s", 0)
    background = Background(DIM)
    for _ in range(200):  # everyday cells: all close to the broad beacon, far from the narrow one
        background.add(at(team, rng.uniform(0.35, 0.55), rng))
    book = book_with(judge(background), broad, narrow)

    everyday = at(team, 0.45, rng)  # cosine 0.45 >= 0.28, but ordinary for this beacon
    assert [b.beacon_id for b in book.routed(cell(everyday), 0)][:1] == ["broad"]
    assert [a.beacon_id for a in book.match(cell(everyday), 0)] == []
    standout = at(team, 0.95, rng)
    assert [a.beacon_id for a in book.match(cell(standout), 0)] == ["broad"]
    # The narrow beacon's background sits near 0 with a small spread: a cell at 0.30 stands out.
    rare = unit(0.3 * narrow_axis + 0.05 * team + 0.9 * at(narrow_axis, 0.0, rng))
    (admitted,) = book.match(cell(rare), 0)
    assert admitted.beacon_id == "narrow" and "sd over this beacon's background" in admitted.reason


def test_too_little_background_falls_back_to_the_cosine_rule():
    rng = np.random.default_rng(2)
    axis = unit(rng.standard_normal(DIM))
    background = Background(DIM)
    for _ in range(MIN_BACKGROUND - 1):
        background.add(at(axis, 0.5, rng))
    book = book_with(judge(background), Beacon("b", "t", "ana", "o", "q", 0.28, axis, "s", 0))
    (admitted,) = book.match(cell(at(axis, 0.5, rng)), 0)
    assert "too few cells" not in admitted.reason and admitted.reason.startswith("cosine 0.50 (floor 0.28)")
    background.add(at(axis, 0.5, rng))
    assert book.match(cell(at(axis, 0.5, rng)), 0) == []  # now 0.5 is this beacon's everyday


def test_a_rare_shared_identifier_lifts_a_cell_over_the_floor():
    rng = np.random.default_rng(3)
    axis = unit(rng.standard_normal(DIM))
    background = Background(DIM)
    notes = [f"note {i} about the deploy pipeline and its checks" for i in range(50)]
    for _ in range(100):
        background.add(at(axis, rng.uniform(0.2, 0.4), rng))
    beacon = Beacon("b", "t", "ana", "o", "anything on PAY-1432?", 0.28, axis, "s", 0)
    book = book_with(judge(background, notes), beacon)
    vector = at(axis, 0.45, rng)  # a little above this beacon's everyday: not enough alone
    assert book.match(cell(vector, "the deploy pipeline checks were slow again"), 0) == []
    (admitted,) = book.match(cell(vector, "PAY-1432 is fixed: the retry budget is back to 3"), 0)
    assert "shares pay-1432" in admitted.reason


def test_raising_a_beacons_threshold_raises_its_floor():
    rng = np.random.default_rng(4)
    axis = unit(rng.standard_normal(DIM))
    background = Background(DIM)
    for _ in range(100):
        background.add(at(axis, rng.uniform(0.0, 0.3), rng))
    vector = at(axis, 0.6, rng)
    low = book_with(judge(background), Beacon("b", "t", "ana", "o", "q", 0.28, axis, "s", 0))
    high = book_with(judge(background), Beacon("b", "t", "ana", "o", "q", 0.70, axis, "s", 0))
    assert low.match(cell(vector), 0) and not high.match(cell(vector), 0)


def test_the_background_keeps_the_newest_cells_of_its_own_space():
    background = Background(4, capacity=3)
    for x in range(5):
        background.add(unit([1, x, 0, 0]))
    background.add(np.ones(8, np.float32))  # another space's vector: ignored
    assert len(background) == 3 and background.taken == 5
    mean, spread = background.scale(unit([1, 0, 0, 0]))
    assert mean == pytest.approx(np.mean([1 / np.sqrt(1 + x * x) for x in (2, 3, 4)]), abs=1e-6)


def test_terms_keep_identifiers_and_drop_stop_words():
    assert terms("What did we decide about PAY-1432 and payments.commands in retry_policy.py?") == {
        "decide", "pay-1432", "payments.commands", "retry_policy.py",
    }
    assert "worker" in terms("the workers")  # a plural folds onto its singular
    stats = TermStats(["pay-1432 again", "nothing here"])
    assert stats.documents == 2 and stats.idf("pay-1432") < stats.idf("never-seen")


def test_the_bundled_notes_load():
    notes = load_background_notes()
    assert len(notes) >= 400 and all(notes)


def test_a_removed_beacons_scale_is_not_kept_once_the_background_moves_on():
    rng = np.random.default_rng(5)
    axis = unit(rng.standard_normal(DIM))
    background = Background(DIM)
    for _ in range(MIN_BACKGROUND):
        background.add(at(axis, 0.3, rng))
    calibrated = judge(background)
    gone = Beacon("gone", "t", "ana", "o", "q", 0.28, axis, "s", 0)
    kept = Beacon("kept", "t", "bo", "o", "q", 0.28, axis, "s", 0)
    book_with(calibrated, gone, kept).match(cell(at(axis, 0.5, rng)), 0)
    for _ in range(REFRESH_CELLS):
        background.add(at(axis, 0.3, rng))
    book_with(calibrated, kept).match(cell(at(axis, 0.5, rng)), 0)  # "gone" was removed
    assert set(calibrated._scales) == {"kept"}
