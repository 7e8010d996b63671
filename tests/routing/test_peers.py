"""The heartbeat balancers exchange: its JSON contract and Algorithm 1's τ rule."""

from __future__ import annotations

import json

import pytest

from routing.core.peers import Heartbeat, heartbeat_key


def _beat(*, available: int = 1, queue: int = 0, queues: dict[str, int] | None = None) -> Heartbeat:
    return Heartbeat(
        balancer="near",
        region="eu",
        url="http://near",
        ts=100.0,
        healthy_replicas=2,
        available_replicas=available,
        inflight=0,
        queue=queue,
        models={"m": available},
        queues=queues or {},
    )


def test_heartbeat_round_trips_through_json() -> None:
    beat = _beat(queue=3, queues={"m": 3})
    assert Heartbeat.from_json(beat.to_json()) == beat
    assert heartbeat_key("b-us") == "meridian:balancer:b-us:heartbeat"


def test_a_heartbeat_without_per_model_queues_is_still_read() -> None:
    data = json.loads(_beat(queue=2).to_json())
    del data["queues"]
    beat = Heartbeat.from_json(json.dumps(data))
    assert beat.queues == {} and beat.queue_for("m") == 2


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '{"balancer": "x"}',
        "not json",
        _beat().to_json().replace('"queues": {}', '"queues": 3'),
    ],
)
def test_malformed_heartbeats_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        Heartbeat.from_json(raw)


def test_available_needs_a_replica_and_a_queue_of_at_most_tau() -> None:
    assert _beat().available_for("m", queue_buffer=1)
    assert _beat(queue=1, queues={"m": 1}).available_for("m", queue_buffer=1)
    assert not _beat(queue=2, queues={"m": 2}).available_for("m", queue_buffer=1)
    assert not _beat(available=0).available_for("m", queue_buffer=1)
    assert not _beat().available_for("other", queue_buffer=1)
    # Another model's queue does not count against this one.
    assert _beat(queue=5, queues={"m": 0, "x": 5}).available_for("m", queue_buffer=1)
