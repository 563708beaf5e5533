"""What the fuzz suites share: a budget per target, a case counter, the error rules.

Budgets. Every fuzz target names its CI budget (Hypothesis ``max_examples``); the whole
suite stays well under a minute on a 2-core machine. ``HYPHAE_FUZZ_PROFILE=long``
multiplies every budget by :data:`LONG_FACTOR` for a long run (``benchmarks/results/fuzz.md``
has the command and the figures). Hypothesis' database is off, so a run does not depend on
what an earlier one found; a failure prints its seed and shrunk example as usual.

Counts. :func:`count` tallies the cases each target really ran; the module-scoped
``fuzz_report`` fixture prints them when a module ends and, when ``HYPHAE_FUZZ_REPORT``
names a file, appends them there as JSON lines (``{"target", "cases", "profile"}``).

Errors. :data:`REASONS` is every ``data.reason`` a client may see; a fuzzed call must end
in a success or in one of them, never in ``internal`` (-32603) or a 5xx.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

__all__ = ["PROFILE", "LONG_FACTOR", "REASONS", "budget", "fuzz_settings", "count", "run_given", "fuzz_report",
           "json_values", "check_error"]  # fmt: skip

PROFILE = os.environ.get("HYPHAE_FUZZ_PROFILE", "ci")
LONG_FACTOR = 20
if PROFILE not in ("ci", "long"):
    raise RuntimeError(f"HYPHAE_FUZZ_PROFILE must be 'ci' or 'long', not {PROFILE!r}")

REASONS = {
    "invalid_argument", "too_large", "unauthenticated", "forbidden", "not_found", "conflict", "rate_limited",
}  # fmt: skip

CASES: collections.Counter[str] = collections.Counter()
_STARTED: dict[str, float] = {}
_LAST: dict[str, float] = {}


def budget(ci_examples: int) -> int:
    return ci_examples * (LONG_FACTOR if PROFILE == "long" else 1)


def fuzz_settings(ci_examples: int) -> settings:
    return settings(
        max_examples=budget(ci_examples), deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck), print_blob=True,
    )  # fmt: skip


def count(target: str) -> None:
    now = time.monotonic()
    _STARTED.setdefault(target, now)
    _LAST[target] = now
    CASES[target] += 1


def run_given(strategy: st.SearchStrategy, body: Callable[[Any], None], ci_examples: int) -> None:
    """Run ``body`` over ``strategy`` now (usable from a worker thread of a trio test)."""
    fuzz_settings(ci_examples)(given(strategy)(body))()


@functools.lru_cache(maxsize=None)
def json_values(max_leaves: int = 8) -> st.SearchStrategy:
    """Any JSON value: what a hostile client can put where an argument goes."""
    scalars = (
        st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
    )  # fmt: skip
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=max_leaves,
    )


def check_error(error: dict[str, Any]) -> str:
    """A JSON-RPC error object a client can act on; returns its reason."""
    assert isinstance(error.get("code"), int) and error["code"] != -32603, error
    assert isinstance(error.get("message"), str) and error["message"], error
    data = error.get("data")
    if error["code"] in (-32700, -32600, -32601):  # protocol-level: no facade reason needed
        return "protocol"
    assert isinstance(data, dict) and data.get("reason") in REASONS, error
    return data["reason"]


@pytest.fixture(scope="module", autouse=False)
def fuzz_report(request) -> Iterator[collections.Counter[str]]:
    """Counts of this module's targets, printed (and appended to $HYPHAE_FUZZ_REPORT) at the end."""
    before = collections.Counter(CASES)
    yield CASES
    ran = {target: CASES[target] - before[target] for target in CASES if CASES[target] > before[target]}
    lines = [f"  {target}: {cases} cases" for target, cases in sorted(ran.items())]
    print(f"\nfuzz cases ({PROFILE} profile):\n" + "\n".join(lines))
    path = os.environ.get("HYPHAE_FUZZ_REPORT")
    if path:
        with open(path, "a") as out:
            for target, cases in sorted(ran.items()):
                elapsed = round(_LAST[target] - _STARTED[target], 1)  # first to last case
                out.write(json.dumps({"target": target, "cases": cases, "profile": PROFILE, "seconds": elapsed}) + "\n")
