"""The salience/energy model of DESIGN §4, formula by formula, with the constants it names."""

from __future__ import annotations

import dataclasses

import pytest

from node.energy import CELL_TYPES, DAY_MS, DEFAULT_ENERGY, EnergyModel

WEIGHTS = {
    "Decision": 1.0, "Constraint": 1.0, "Risk": 0.9, "Lesson": 0.8, "Pattern": 0.7,
    "Fact": 0.6, "Preference": 0.6, "Task": 0.5, "Context": 0.4,
}
HALF_LIVES = {
    "Decision": 180, "Constraint": 180, "Risk": 90, "Lesson": 90, "Pattern": 90,
    "Fact": 60, "Preference": 60, "Task": 14, "Context": 3,
}
T0 = 1_780_000_000_000


def test_the_nine_seed_cell_types_in_their_exact_spelling():
    assert set(CELL_TYPES) == set(WEIGHTS) and len(CELL_TYPES) == 9


def test_default_constants_are_the_designs():
    model = EnergyModel()
    assert model == DEFAULT_ENERGY
    assert dict(model.type_weights) == WEIGHTS
    assert dict(model.half_life_days) == {t: float(d) for t, d in HALF_LIVES.items()}
    assert (model.max_hops, model.match_slack, model.repair_floor, model.promote_energy) == (6, 0.05, 0.05, 0.7)
    assert (model.promote_recall_hits, model.promote_recall_rank, model.near_duplicate_cos) == (3, 3, 0.95)


@pytest.mark.parametrize("cell_type", list(WEIGHTS))
@pytest.mark.parametrize("salience", [0.0, 0.25, 0.5, 1.0])
def test_initial_energy_is_salience_times_type_weight(cell_type, salience):
    assert DEFAULT_ENERGY.initial(salience, cell_type) == pytest.approx(salience * WEIGHTS[cell_type])


@pytest.mark.parametrize("cell_type", list(HALF_LIVES))
def test_energy_halves_at_each_half_life(cell_type):
    model = DEFAULT_ENERGY
    half_life_ms = HALF_LIVES[cell_type] * DAY_MS
    assert model.at(0.8, cell_type, T0, T0) == 0.8
    assert model.at(0.8, cell_type, T0, T0 + half_life_ms) == pytest.approx(0.4)
    assert model.at(0.8, cell_type, T0, T0 + 2 * half_life_ms) == pytest.approx(0.2)
    assert model.at(0.8, cell_type, T0, T0 + half_life_ms // 2) == pytest.approx(0.8 / 2 ** 0.5)


def test_decay_is_monotonic_and_never_exceeds_e0():
    model = DEFAULT_ENERGY
    ages = [0, 1, DAY_MS, 7 * DAY_MS, 365 * DAY_MS]
    values = [model.at(1.0, "Task", T0, T0 + age) for age in ages]
    assert values == sorted(values, reverse=True) and values[-1] > 0
    # A cell "from the future" (clock skew between nodes) does not gain energy.
    assert model.at(1.0, "Task", T0 + DAY_MS, T0) == 1.0


def test_context_fades_faster_than_decisions():
    model = DEFAULT_ENERGY
    month = T0 + 30 * DAY_MS
    assert model.at(1.0, "Context", T0, month) < model.at(1.0, "Task", T0, month) < model.at(1.0, "Decision", T0, month)


@pytest.mark.parametrize(
    ("e0", "hops"),
    [(0.0, 1), (0.05, 1), (0.1, 1), (0.2, 1), (0.3, 2), (0.5, 3), (0.6, 4), (0.9, 5), (1.0, 6)],
)
def test_hop_budget_is_max_1_round_e0_times_max_hops(e0, hops):
    assert DEFAULT_ENERGY.hop_budget(e0) == hops
    assert DEFAULT_ENERGY.hop_budget(e0) == max(1, round(e0 * 6))


def test_hop_budget_follows_max_hops():
    model = EnergyModel(max_hops=10)
    assert model.hop_budget(1.0) == 10 and model.hop_budget(0.5) == 5 and model.hop_budget(0.01) == 1


@pytest.mark.parametrize(("tau", "e0", "expected"), [(0.4, 0.0, 0.4), (0.4, 1.0, 0.35), (0.4, 0.5, 0.375), (0.0, 1.0, -0.05)])
def test_match_threshold_is_tau_minus_slack_times_e0(tau, e0, expected):
    assert DEFAULT_ENERGY.match_threshold(tau, e0) == pytest.approx(expected)


def test_higher_salience_matches_more_loosely():
    model = DEFAULT_ENERGY
    low = model.match_threshold(0.4, model.initial(0.1, "Decision"))
    high = model.match_threshold(0.4, model.initial(1.0, "Decision"))
    assert high < low <= 0.4


@pytest.mark.parametrize(
    ("salience", "cell_type", "promoted"),
    [(0.7, "Decision", True), (0.69, "Decision", False), (1.0, "Fact", False), (0.8, "Risk", True), (1.0, "Pattern", True)],
)
def test_promotion_on_arrival_at_e0_of_at_least_0_7(salience, cell_type, promoted):
    model = DEFAULT_ENERGY
    assert model.promoted_on_arrival(model.initial(salience, cell_type)) is promoted


def test_repair_stops_below_the_energy_floor():
    model = DEFAULT_ENERGY
    e0 = 0.1  # a Context cell: 3-day half-life
    assert model.worth_repairing(e0, "Context", T0, T0)
    assert model.worth_repairing(e0, "Context", T0, T0 + 3 * DAY_MS)  # exactly the floor: still sent
    assert not model.worth_repairing(e0, "Context", T0, T0 + 3 * DAY_MS + 60_000)
    assert model.worth_repairing(e0, "Decision", T0, T0 + 3 * DAY_MS)  # slower decay
    assert not model.worth_repairing(0.04, "Decision", T0, T0)  # born below the floor


def test_from_config_overrides_and_merges():
    model = EnergyModel.from_config(
        {"max_hops": 8, "match_slack": 0.1, "promote_energy": 0.5, "type_weights": {"Fact": 1.0},
         "half_life_days": {"Context": 1}}
    )
    assert model.max_hops == 8 and model.match_slack == 0.1 and model.promote_energy == 0.5
    assert model.type_weights["Fact"] == 1.0
    assert model.type_weights["Decision"] == 1.0 and model.type_weights["Context"] == 0.4  # others kept
    assert model.half_life_days["Context"] == 1.0 and model.half_life_days["Task"] == 14.0
    assert model.initial(0.6, "Fact") == pytest.approx(0.6)
    assert model.promoted_on_arrival(model.initial(0.6, "Fact"))
    assert model.at(1.0, "Context", T0, T0 + DAY_MS) == pytest.approx(0.5)
    assert EnergyModel.from_config(None) == EnergyModel.from_config({}) == DEFAULT_ENERGY
    assert DEFAULT_ENERGY.type_weights["Fact"] == 0.6  # the defaults were not mutated


@pytest.mark.parametrize(
    "table",
    [
        {"max_hop": 6},  # a typo
        {"type_weights": {"Decisions": 1.0}},
        {"half_life_days": {"decision": 10}},
        {"type_weights": {"Fact": "heavy"}},
        {"type_weights": 3},
    ],
)
def test_from_config_rejects_unknown_names_and_bad_values(table):
    with pytest.raises((ValueError, TypeError)):
        EnergyModel.from_config(table)


def test_the_model_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_ENERGY.max_hops = 100  # type: ignore[misc]
