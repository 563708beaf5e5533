"""The outbox's ack timer adapts to each peer (RFC 6298 style) and backs off on resends."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.outbox import MAX_ACK_TIMEOUT_MS, Outbox
from mesh.wire import TombstonePayload, sign_diff

ORIGIN = "00" * 16


def diff(seq: int):
    payload = TombstonePayload(cell_id=f"cell-{seq}", tenant_id="t", forgotten_at=1)
    return sign_diff(payload, origin=ORIGIN, seq=seq, ts=1, sign=lambda data: b"\0" * 64)


def outbox(**overrides) -> Outbox:
    options = dict(queue_limit=100, max_inflight=4, max_diffs=8, max_bytes=1 << 20, pacing_ms=0,
                   ack_timeout_ms=1000, max_attempts=4)  # fmt: skip
    options.update(overrides)
    return Outbox(**options)


def send_and_ack(box: Outbox, seq: int, sent_at: int, rtt: int) -> None:
    box.enqueue("peer", diff(seq), 0.5)
    batch = box.take("peer", sent_at)
    assert box.acked("peer", batch.batch_id, sent_at + rtt)


def test_a_fresh_peer_gets_the_configured_timeout():
    box = outbox()
    box.enqueue("peer", diff(1), 0.5)
    assert box.take("peer", 10_000).deadline == 11_000


def test_a_slow_peer_earns_a_longer_timeout_and_a_fast_one_keeps_the_floor():
    slow, fast = outbox(), outbox()
    for seq in range(1, 11):
        send_and_ack(slow, seq, seq * 10_000, 3_000)
        send_and_ack(fast, seq, seq * 10_000, 20)
    slow.enqueue("peer", diff(99), 0.5)
    fast.enqueue("peer", diff(99), 0.5)
    assert slow.take("peer", 500_000).deadline - 500_000 >= 3_000  # acks take 3 s: do not resend at 1 s
    assert fast.take("peer", 500_000).deadline - 500_000 == 1_000  # never below the configured floor


def test_each_resend_doubles_the_wait_and_retransmissions_are_not_sampled():
    box = outbox()
    box.enqueue("peer", diff(1), 0.5)
    first = box.take("peer", 0)
    assert first.deadline == 1_000
    box.expire(1_000)  # no ack: back in the queue
    second = box.take("peer", 1_000)
    assert second.deadline == 1_000 + 2_000
    assert box.acked("peer", second.batch_id, 2_900)  # an ack of a resend says nothing about the RTT
    box.enqueue("peer", diff(2), 0.5)
    assert box.take("peer", 5_000).deadline == 6_000


def test_the_wait_is_capped():
    box = outbox(ack_timeout_ms=20_000, max_attempts=10)
    box.enqueue("peer", diff(1), 0.5)
    now = 0
    for _ in range(5):
        batch = box.take("peer", now)
        now = batch.deadline
        box.expire(now)
    assert batch.deadline - batch.sent_at == MAX_ACK_TIMEOUT_MS


def test_a_delivered_batch_waits_for_its_ack_instead_of_being_sent_again():
    box = outbox(delivered_timeout_ms=15_000)
    for seq in (1, 2):
        box.enqueue("peer", diff(seq), 0.5)
    delivered, pending = box.take("peer", 0), None
    box.enqueue("peer", diff(3), 0.5)
    pending = box.take("peer", 0)
    assert box.delivered("peer", delivered.batch_id, 500)  # the peer's endpoint took it at 500 ms
    assert not box.delivered("other", pending.batch_id, 500) and not box.delivered("peer", 999, 500)
    assert box.expire(1_000) == ([], 0)
    assert box.depth("peer") == 1  # the undelivered batch came back to the queue at its 1 s deadline
    assert box.inflight("peer") == 1  # the delivered one is still waiting for its ack
    box.expire(15_499)
    assert box.inflight("peer") == 1
    box.expire(15_500)  # no ack by then after all: sent again
    assert box.inflight("peer") == 0 and box.depth("peer") == 3


def test_once_deliveries_are_reported_a_batch_on_its_way_is_not_resent_early():
    box = outbox(pending_timeout_ms=6_000)
    box.enqueue("peer", diff(1), 0.5)
    assert box.take("peer", 0).deadline == 1_000  # a runtime that reports nothing: the ack timer alone
    box.delivered("peer", 1, 10)
    box.enqueue("peer", diff(2), 0.5)
    assert box.take("peer", 100).deadline == 6_100  # still on its way after 1 s is no reason to resend


def test_a_lone_diff_leaves_at_once_and_diffs_behind_an_unacked_batch_wait_for_its_ack():
    box = outbox(pacing_ms=5, busy_pacing_ms=100)
    box.enqueue("peer", diff(1), 0.5)
    first = box.take("peer", 1_000)
    assert first is not None  # an idle lane: no wait
    for seq in range(2, 5):
        box.enqueue("peer", diff(seq), 0.5)
    assert box.take("peer", 1_010) is None  # the first batch is out: the others gather
    assert box.next_deadline() == 1_100
    assert box.acked("peer", first.batch_id, 1_040)
    second = box.take("peer", 1_040)  # its ack is back: they leave together, at once
    assert [d.seq for _, _, d in second.items] == [2, 3, 4]


def test_behind_a_slow_ack_diffs_leave_after_the_busy_gap_or_once_a_batch_is_full():
    box = outbox(pacing_ms=5, busy_pacing_ms=100, max_diffs=8)
    box.enqueue("peer", diff(1), 0.5)
    box.take("peer", 0)
    box.enqueue("peer", diff(2), 0.5)
    assert box.take("peer", 99) is None
    assert [d.seq for _, _, d in box.take("peer", 100).items] == [2]  # the gap is over: no ack needed
    for seq in range(3, 11):
        box.enqueue("peer", diff(seq), 0.5)
    assert len(box.take("peer", 105).items) == 8  # a full batch does not wait


def test_a_withdrawn_diff_leaves_the_queue_but_not_a_batch_in_flight():
    box = outbox(max_diffs=1)
    for seq in (1, 2, 3):
        box.enqueue("peer", diff(seq), 0.5)
    first = box.take("peer", 0)  # seq 1 is in flight now
    assert [d.seq for _, _, d in first.items] == [1]
    assert not box.withdraw("peer", ORIGIN, 1)  # in flight: it stays, and is acked or resent as before
    assert box.withdraw("peer", ORIGIN, 3)
    assert not box.withdraw("peer", ORIGIN, 3) and not box.withdraw("other", ORIGIN, 2)
    assert sorted(d.seq for _, d in box.held("peer")) == [1, 2]
    assert box.withdraw("peer", ORIGIN, 2)
    assert "peer" not in box.ready  # nothing left to send


def test_a_held_copy_waits_for_its_hold_and_can_be_withdrawn_meanwhile():
    box = outbox(pacing_ms=5)
    box.enqueue("peer", diff(1), 0.5, hold_until=1_030)
    box.enqueue("other", diff(1), 0.5, hold_until=1_030)
    assert box.next_deadline() == 1_030
    assert box.take("peer", 1_000) is None and box.take("peer", 1_029) is None
    assert box.withdraw("other", ORIGIN, 1)  # a copy from elsewhere showed it has the diff
    batch = box.take("peer", 1_030)
    assert [d.seq for _, _, d in batch.items] == [1]
    assert box.take("other", 1_030) is None and "other" not in box.ready


def test_without_a_hold_a_copy_leaves_at_once():
    box = outbox(pacing_ms=5)
    box.enqueue("peer", diff(1), 0.5)
    assert box.next_deadline() == 0
    assert box.take("peer", 1_000) is not None


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["send", "ack", "delivered", "expire", "drop"]),
                              st.integers(0, 2), st.integers(0, 400)), max_size=80))  # fmt: skip
def test_the_next_deadline_is_the_earliest_of_every_batch_in_flight(ops):
    # The deadline heap gives what a scan of every batch in flight and every ready lane would.
    box, now, seq, sent = outbox(pacing_ms=30, max_inflight=3), 0, 0, []
    for op, peer, step in ops:
        now += step
        name = f"p{peer}"
        if op == "send":
            seq += 1
            box.enqueue(name, diff(seq), 0.5)
            batch = box.take(name, now)
            if batch is not None:
                sent.append(batch)
        elif op == "ack" and sent:
            batch = sent.pop(step % len(sent))
            box.acked(batch.peer_id, batch.batch_id, now)
        elif op == "delivered" and sent:
            batch = sent[step % len(sent)]
            box.delivered(batch.peer_id, batch.batch_id, now)
        elif op == "expire":
            box.expire(now)
        elif op == "drop":
            box.drop_peer(name)
        in_flight = [b.deadline for b in box._batches.values()]
        lanes = [box._send_at(box._lanes[p]) for p in box.ready
                 if box._lanes[p].queue and len(box._lanes[p].inflight) < box.max_inflight]  # fmt: skip
        assert box.next_deadline() == min(in_flight + lanes, default=None)
