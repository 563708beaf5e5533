"""The salience/energy model (DESIGN §4), in one place.

A cell's *initial energy* ``E0 = salience × w(type)`` decides three things at once:
how far its diff travels (hop budget), how loosely a beacon may match it (slack),
and whether it is durable knowledge straight away (promotion to L1). Energy then
decays with a half-life per type; repair stops re-sending cells whose energy fell
below a floor. Every constant lives in :class:`EnergyModel` and can be overridden
from the ``[energy]`` table of ``config.toml`` or by the simulator.

All functions are pure: time comes in as ``now_ms``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mesh.cell_rules import CELL_TYPES  # the nine, spelt once, beside the rules every cell obeys

__all__ = ["CELL_TYPES", "EnergyModel", "DEFAULT_ENERGY"]

DAY_MS = 86_400_000


def _default_weights() -> dict[str, float]:
    return {
        "Decision": 1.0,
        "Constraint": 1.0,
        "Risk": 0.9,
        "Lesson": 0.8,
        "Pattern": 0.7,
        "Fact": 0.6,
        "Preference": 0.6,
        "Task": 0.5,
        "Context": 0.4,
    }


def _default_half_lives_days() -> dict[str, float]:
    return {
        "Decision": 180.0,
        "Constraint": 180.0,
        "Risk": 90.0,
        "Lesson": 90.0,
        "Pattern": 90.0,
        "Fact": 60.0,
        "Preference": 60.0,
        "Task": 14.0,
        "Context": 3.0,
    }


@dataclasses.dataclass(frozen=True)
class EnergyModel:
    """Constants and formulas of the energy model."""

    type_weights: Mapping[str, float] = dataclasses.field(default_factory=_default_weights)
    half_life_days: Mapping[str, float] = dataclasses.field(default_factory=_default_half_lives_days)
    max_hops: int = 6
    match_slack: float = 0.05
    # How much wider than a beacon's threshold the mesh routes (mesh.routing_rule): routing
    # is tuned for recall, and the receiving node admits narrowly (node.admission_rule).
    route_margin: float = 0.04
    repair_floor: float = 0.05
    promote_energy: float = 0.7
    promote_recall_hits: int = 3
    promote_recall_rank: int = 3
    near_duplicate_cos: float = 0.95

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> "EnergyModel":
        """Build a model from a ``[energy]`` config table; unknown keys are an error."""
        if not table:
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"unknown [energy] settings: {', '.join(unknown)}")
        values = dict(table)
        for field in dataclasses.fields(cls):
            if field.name in values and field.name not in ("type_weights", "half_life_days"):
                value = values[field.name]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"[energy] {field.name} must be a number, not {value!r}")
                if value < 0:
                    raise ValueError(f"[energy] {field.name} must not be negative")
                values[field.name] = int(value) if field.type in (int, "int") else float(value)
        for name in ("type_weights", "half_life_days"):
            if name in values:
                if not isinstance(values[name], Mapping):
                    raise ValueError(f"[energy.{name}] must be a table of cell type = number")
                if any(isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0 for x in values[name].values()):
                    raise ValueError(f"[energy.{name}] values must be positive numbers")
                merged = dict(getattr(cls(), name))
                bad = sorted(set(values[name]) - set(CELL_TYPES))
                if bad:
                    raise ValueError(f"[energy.{name}] names unknown cell types: {', '.join(bad)}")
                merged.update({k: float(v) for k, v in values[name].items()})
                values[name] = merged
        return cls(**values)

    def initial(self, salience: float, cell_type: str) -> float:
        """``E0 = salience × w(type)``."""
        return salience * self.type_weights[cell_type]

    def at(self, e0: float, cell_type: str, created_at_ms: int, now_ms: int) -> float:
        """Energy at ``now_ms``: ``E0 × 2^(−age / half_life(type))``; never above E0."""
        age_ms = max(0, now_ms - created_at_ms)
        half_life_ms = self.half_life_days[cell_type] * DAY_MS
        return e0 * math.pow(2.0, -age_ms / half_life_ms)

    def hop_budget(self, e0: float) -> int:
        """``max(1, round(E0 × max_hops))``: higher energy travels further."""
        return max(1, round(e0 * self.max_hops))

    def match_threshold(self, beacon_threshold: float, e0: float) -> float:
        """A beacon with threshold τ accepts a cell when ``cos ≥ τ − slack × E0``."""
        return beacon_threshold - self.match_slack * e0

    def route_threshold(self, beacon_threshold: float, e0: float) -> float:
        """The routing rule's floor: the match threshold widened by ``route_margin``."""
        return self.match_threshold(beacon_threshold, e0) - self.route_margin

    def promoted_on_arrival(self, e0: float) -> bool:
        """Does a cell enter L1 as soon as it is stored?"""
        return e0 >= self.promote_energy

    def worth_repairing(self, e0: float, cell_type: str, created_at_ms: int, now_ms: int) -> bool:
        """Repair stops re-sending cells whose energy fell below the floor."""
        return self.at(e0, cell_type, created_at_ms, now_ms) >= self.repair_floor


DEFAULT_ENERGY = EnergyModel()
