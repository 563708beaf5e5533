"""Fixtures for the mesh end-to-end tests: real ``hyphae up`` processes in one team.

The harness itself is :mod:`tests.e2e_mesh.cluster` (no pytest in it, so the benchmark
shares it). The ``lab`` fixture hands a test a :class:`~tests.e2e_mesh.cluster.Lab` whose
data dirs live under ``tmp_path`` and whose processes are all stopped and reaped in
teardown (SIGTERM, then SIGKILL after 5 s), whether the test passed, failed or was
interrupted. Ports are ephemeral on 127.0.0.1; every wait has a deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with Lab(tmp_path) as running:
        yield running
