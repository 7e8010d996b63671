"""The slow-replica drill's check reads traffic share from a balancer's own counters."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ops.drills.reactions import TrafficMovedAway
from tests.support.http_server import FakeServer


def state(**dispatched: tuple[int, int]) -> str:
    """A balancer's ``/internal/state`` with (finished, outstanding) per replica."""
    rows = [
        {"name": name, "model": "m", "healthy": True, "requests": done, "outstanding": out}
        for name, (done, out) in dispatched.items()
    ]
    rows.append({"name": "other", "model": "elsewhere", "requests": 500, "outstanding": 0})
    return json.dumps({"replicas": rows})


@pytest.fixture
def balancer() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()


def test_traffic_leaving_the_slow_replica_is_a_reaction(balancer: FakeServer) -> None:
    check = TrafficMovedAway([balancer.url], "r1", min_dispatched=8)
    balancer.answer("GET", "/internal/state", 200, state(r1=(10, 0), r2=(10, 0), r3=(10, 0)))
    check.mark()
    # r1 still gets its share: no reaction, even though it has one outstanding.
    balancer.answer("GET", "/internal/state", 200, state(r1=(12, 1), r2=(13, 0), r3=(13, 0)))
    assert not check().reacted
    # Then the next requests go to r2 and r3 only.
    balancer.answer("GET", "/internal/state", 200, state(r1=(12, 1), r2=(20, 1), r3=(19, 0)))
    reaction = check()
    assert reaction.reacted
    assert (
        reaction.detail == "r1 got 3 of 23 requests dispatched since the fault (13%; 33% before it)"
    )


def test_no_answer_is_no_reaction(balancer: FakeServer) -> None:
    check = TrafficMovedAway([balancer.url], "r1", min_dispatched=1)
    balancer.answer("GET", "/internal/state", 500)
    reaction = check()
    assert not reaction.reacted and reaction.detail == "no balancer answers"
