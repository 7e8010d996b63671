"""The regional FCFS queue: order, bounds, deadlines, cancellation and draining."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.pending_queue import PendingQueue, QueuedRequest, QueueFullError
from core.types import RequestDescriptor


def _request(rid: str) -> RequestDescriptor:
    return RequestDescriptor(request_id=rid, model="m", prompt_tokens=1)


def _queue(max_len: int = 10, max_wait_s: float = 5.0) -> PendingQueue[str]:
    return PendingQueue("m", max_len=max_len, max_wait_s=max_wait_s)


def test_entries_leave_in_arrival_order_and_a_retry_goes_first() -> None:
    queue = _queue()
    for i, rid in enumerate(["a", "b", "c"]):
        queue.push(_request(rid), rid, now=float(i))
    queue.push(_request("retry"), "retry", now=3.0, front=True)
    assert [e.payload for e in queue] == ["retry", "a", "b", "c"]
    placed = queue.drain(lambda entry: entry.payload.upper())
    assert [(e.payload, r) for e, r in placed] == [
        ("retry", "RETRY"),
        ("a", "A"),
        ("b", "B"),
        ("c", "C"),
    ]
    assert len(queue) == 0


def test_a_full_queue_refuses_the_next_push() -> None:
    queue = _queue(max_len=2)
    queue.push(_request("a"), "a", now=0.0)
    queue.push(_request("b"), "b", now=0.0)
    with pytest.raises(QueueFullError) as info:
        queue.push(_request("c"), "c", now=0.0)
    assert (info.value.model, info.value.max_len) == ("m", 2)
    assert len(queue) == 2
    with pytest.raises(QueueFullError):
        _queue(max_len=0).push(_request("x"), "x", now=0.0)


def test_entries_past_their_deadline_expire_oldest_first() -> None:
    queue = _queue(max_wait_s=5.0)
    queue.push(_request("a"), "a", now=0.0)
    queue.push(_request("b"), "b", now=2.0)
    queue.push(_request("c"), "c", now=4.0)
    assert queue.next_deadline() == 5.0
    assert queue.oldest_wait(now=4.5) == 4.5
    assert queue.expire(now=4.9) == []
    assert [e.payload for e in queue.expire(now=7.0)] == ["a", "b"]
    assert [e.payload for e in queue] == ["c"]
    assert queue.oldest_wait(now=7.0) == 3.0 and queue.next_deadline() == 9.0
    assert _queue().oldest_wait(now=1.0) == 0.0 and _queue().next_deadline() is None


def test_a_cancelled_entry_is_removed_once_and_never_placed() -> None:
    queue = _queue()
    a = queue.push(_request("a"), "a", now=0.0)
    b = queue.push(_request("b"), "b", now=0.0)
    assert queue.remove(a) is True and queue.remove(a) is False
    assert a not in queue and b in queue
    assert [e.payload for e, _ in queue.drain(lambda e: e.payload)] == ["b"]
    assert queue.remove(b) is False  # placed entries are gone too


def test_drain_keeps_entries_the_placer_declines_and_stops_when_exhausted() -> None:
    queue = _queue()
    for rid in ["fwd", "a", "b", "c"]:
        queue.push(_request(rid), rid, now=0.0)
    slots = ["x"]  # one slot; the forwarded-in head may not take it

    def place(entry: QueuedRequest[str]) -> str | None:
        if entry.payload == "fwd" or not slots:
            return None
        return slots.pop()

    placed = queue.drain(place, exhausted=lambda: not slots)
    assert [(e.payload, r) for e, r in placed] == [("a", "x")]
    assert [e.payload for e in queue] == ["fwd", "b", "c"]


def test_bounds_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        PendingQueue("m", max_len=-1, max_wait_s=1.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100)), max_size=40))
def test_queue_never_exceeds_its_bound_and_keeps_fcfs(ops: list[tuple[bool, float]]) -> None:
    queue = _queue(max_len=8, max_wait_s=10.0)
    now = 0.0
    for is_push, step in ops:
        now += step / 10
        if is_push:
            try:
                queue.push(_request(str(now)), str(now), now=now)
            except QueueFullError:
                assert len(queue) == 8
        else:
            for entry in queue.expire(now):
                assert entry.deadline <= now
        assert len(queue) <= 8
        arrivals = [e.enqueued_at for e in queue]
        assert arrivals == sorted(arrivals)
        assert all(e.deadline > now for e in queue) or is_push


_OPS = st.lists(
    st.tuples(st.sampled_from(["push", "front", "remove", "drain", "expire"]), st.floats(0, 3)),
    max_size=60,
)


@given(_OPS)
def test_the_earliest_deadline_and_oldest_arrival_are_those_of_a_scan(
    ops: list[tuple[str, float]],
) -> None:
    # The heaps beside the FCFS dict answer what a scan over every waiting entry would,
    # whatever left in between: cancelled, placed by a drain, or expired.
    queue = _queue(max_len=1000, max_wait_s=5.0)
    now, pushed = 0.0, []
    for op, step in ops:
        now += step
        waiting = list(queue)
        if op in ("push", "front"):
            pushed.append(queue.push(_request(str(len(pushed))), "p", now, front=op == "front"))
        elif op == "remove" and waiting:
            queue.remove(waiting[len(waiting) // 2])
        elif op == "drain":
            # The placer takes every other entry, as a drain over held-back targets may.
            flips = iter(range(len(waiting)))
            queue.drain(lambda entry: "x" if next(flips) % 2 else None)
        elif op == "expire":
            expired = queue.expire(now)
            assert all(e.deadline <= now for e in expired)
            assert [e.deadline for e in expired] == sorted(e.deadline for e in expired)
            assert all(e.deadline > now for e in queue)
        left = list(queue)
        assert queue.next_deadline() == min((e.deadline for e in left), default=None)
        assert queue.oldest_wait(now) == max((e.waited(now) for e in left), default=0.0)


def test_entries_that_left_do_not_pile_up_beside_the_queue() -> None:
    queue = _queue(max_len=10, max_wait_s=5.0)
    # Two that wait throughout (the second a retry at the front, with a later
    # deadline), while 10,000 others come and go behind them.
    first = queue.push(_request("first"), "first", now=0.0)
    queue.push(_request("retry"), "retry", now=1.0, front=True)
    for i in range(10_000):
        entry = queue.push(_request(str(i)), "p", now=2.0 + i)
        queue.remove(entry)
    # What the heaps keep of the departed is bounded by the live entries, not the pushes.
    assert len(queue._by_deadline) <= 2 * 2 + 64 + 1
    assert len(queue._by_arrival) <= 2 * 2 + 64 + 1
    # ... and what waits survived every rebuild.
    assert queue.next_deadline() == 5.0 and queue.oldest_wait(now=3.0) == 3.0
    assert [e.payload for e in queue.expire(now=5.5)] == ["first"]
    assert queue.next_deadline() == 6.0 and queue.oldest_wait(now=5.5) == 4.5
    assert first not in queue and [e.payload for e in queue] == ["retry"]
