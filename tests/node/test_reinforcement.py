"""Recall reinforcement on virtual time: when gathered counts are drained, and that none is lost.

The policy (``node.reinforcement``) is told the time and given its timers, so these
stories run on a :class:`FakeScheduler`: no thread, no sleep, and time moves only when a
test moves it.
"""

from __future__ import annotations

import trio

from node.embedding import HashedEmbedder
from app.home import open_node
from node.reinforcement import FakeScheduler, RecallReinforcement

INTERVAL = 0.25


def policy() -> tuple[RecallReinforcement, FakeScheduler, list[dict[int, int]]]:
    """A policy whose drains take the counts at once, as the writer job would."""
    scheduler = FakeScheduler(start=64.0)  # times in binary fractions: exact sums
    drained: list[dict[int, int]] = []
    reinforcement = RecallReinforcement(
        interval=INTERVAL,
        clock=scheduler.now,
        scheduler=scheduler,
        drain=lambda: drained.append(dict(reinforcement.take())),
    )
    return reinforcement, scheduler, drained


def test_the_first_recall_is_drained_at_once():
    reinforcement, scheduler, drained = policy()
    reinforcement.count([7, 8, 9])
    assert drained == [{7: 1, 8: 1, 9: 1}]
    assert scheduler.pending() == 0


def test_recalls_soon_after_a_drain_wait_out_the_interval_together():
    reinforcement, scheduler, drained = policy()
    reinforcement.count([7])
    scheduler.advance(0.125)
    reinforcement.count([7, 8])
    reinforcement.count([8])
    assert drained == [{7: 1}] and scheduler.pending() == 1  # one drain scheduled for all of them
    scheduler.advance(0.0625)
    assert len(drained) == 1  # 0.1875 s after the drain: not yet
    scheduler.advance(0.0625)
    assert drained == [{7: 1}, {7: 1, 8: 2}]
    assert scheduler.pending() == 0


def test_a_recall_after_a_quiet_interval_is_drained_at_once():
    reinforcement, scheduler, drained = policy()
    reinforcement.count([1])
    scheduler.advance(INTERVAL + 0.125)
    reinforcement.count([2])
    assert drained == [{1: 1}, {2: 1}] and scheduler.pending() == 0


def test_a_flush_drains_now_and_cancels_the_scheduled_drain():
    reinforcement, scheduler, drained = policy()
    reinforcement.count([1])
    reinforcement.count([2])  # within the interval: scheduled
    reinforcement.flush()
    assert drained == [{1: 1}, {2: 1}] and scheduler.pending() == 0
    scheduler.advance(10)
    assert len(drained) == 2  # the cancelled drain never runs
    reinforcement.flush()  # nothing gathered: nothing to drain
    assert len(drained) == 2


def test_no_hits_no_drain():
    reinforcement, scheduler, drained = policy()
    reinforcement.count([])
    assert drained == [] and scheduler.pending() == 0


async def test_the_node_writes_scheduled_counts_when_its_scheduler_fires(home, clock):
    scheduler = FakeScheduler()
    texts = [f"rollback plan step {i} for the billing service" for i in range(4)]
    options = {"embedder": HashedEmbedder(), "clock": clock, "monotonic": scheduler.now, "scheduler": scheduler}
    async with open_node(home, **options) as service:
        alice, _ = await service.add_agent("alice")
        with trio.fail_after(20):
            for text in texts:
                await service.store(alice, content=text, cell_type="Fact")
            await service.recall(alice, query=texts[0], k=3)  # drained at once
            await service.db.write(lambda tx: None)  # whatever that recall queued has run now
            await service.recall(alice, query=texts[0], k=3)  # within the interval: scheduled
            await service.db.write(lambda tx: None)
            assert service.db.query_one("SELECT SUM(recall_hits) FROM cells") == (3,)
            assert scheduler.pending() == 1
            scheduler.advance(1.0)
            await service.db.write(lambda tx: None)
            assert service.db.query_one("SELECT SUM(recall_hits) FROM cells") == (6,)
