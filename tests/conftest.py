"""Shared fixtures: a fresh data dir, and a node opened in it.

Most tests use the hashed embedder (instant, deterministic); tests about meaning ask
for ``minilm`` (the built-in model, loaded once per session).
"""

from __future__ import annotations

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from node.embedding import HashedEmbedder, load_embedder
from app.home import init_home, open_node


class FakeClock:
    """Milliseconds that only move when told to; each read may tick by ``step``."""

    def __init__(self, start_ms: int = 1_780_000_000_000, step: int = 0) -> None:
        self.now = start_ms
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms

    @contextlib.contextmanager
    def frozen(self) -> Iterator[int]:
        """Inside the block every read returns the same instant, which the block is given:
        a time the facade stamps can then be asserted exactly."""
        step, self.step = self.step, 0
        try:
            yield self.now
        finally:
            self.step = step


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "hyphae-home"
    init_home(path)
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(step=1)


@pytest.fixture(scope="session")
def minilm():
    embedder = load_embedder({"provider": "builtin"})
    assert embedder.space.startswith("all-MiniLM-L6-v2"), "the built-in weights are not installed"
    return embedder


@pytest.fixture
async def service(home, clock):
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as svc:
        yield svc


@pytest.fixture
async def semantic_service(home, clock, minilm):
    async with open_node(home, embedder=minilm, clock=clock) as svc:
        yield svc


_names = itertools.count()


@pytest.fixture
def make_agent(service):
    """``await make_agent(projects=[...])`` -> (principal, api_key) on the ``service`` node."""

    async def make(name: str | None = None, projects: list[str] | None = None):
        with trio.fail_after(10):
            return await service.add_agent(name or f"agent{next(_names)}", projects)

    return make
