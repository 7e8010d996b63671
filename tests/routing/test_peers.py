"""Peer heartbeats and the choice of the nearest available peer."""

from __future__ import annotations

import math

import pytest

from routing.core.peers import Heartbeat, heartbeat_key, peer_view, rank_peers
from routing.core.topology import PeerSpec


def _beat(name: str, *, ts: float = 100.0, available: int = 1, queue: int = 0) -> Heartbeat:
    return Heartbeat(
        balancer=name,
        region=name,
        url=f"http://{name}",
        ts=ts,
        healthy_replicas=2,
        available_replicas=available,
        inflight=0,
        queue=queue,
        models={"m": available},
    )


PEERS = [
    PeerSpec("far", "http://far", "ap", rtt_ms=180.0),
    PeerSpec("near", "http://near", "eu", rtt_ms=80.0),
    PeerSpec("unknown-rtt", "http://u", "sa", rtt_ms=math.inf),
]


def test_heartbeat_round_trips_through_json() -> None:
    beat = _beat("near")
    assert Heartbeat.from_json(beat.to_json()) == beat
    assert heartbeat_key("b-us") == "meridian:balancer:b-us:heartbeat"


@pytest.mark.parametrize("raw", ["[]", '{"balancer": "x"}', "not json"])
def test_malformed_heartbeats_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        Heartbeat.from_json(raw)


def test_nearest_available_peer_comes_first() -> None:
    beats = {p.name: _beat(p.name) for p in PEERS}
    ranked = rank_peers(PEERS, beats, "m", now=101.0, max_age_s=5.0)
    assert [c.spec.name for c in ranked] == ["near", "far", "unknown-rtt"]


def test_stale_busy_queued_excluded_or_silent_peers_are_skipped() -> None:
    beats = {
        "near": _beat("near", ts=90.0),  # older than the TTL
        "far": _beat("far", available=0),  # nothing available
        "unknown-rtt": _beat("unknown-rtt", queue=3),  # queue over the buffer
    }
    assert rank_peers(PEERS, beats, "m", now=101.0, max_age_s=5.0) == []
    fresh = {p.name: _beat(p.name) for p in PEERS}
    ranked = rank_peers(PEERS, fresh, "m", now=101.0, max_age_s=5.0, exclude=frozenset({"near"}))
    assert [c.spec.name for c in ranked] == ["far", "unknown-rtt"]
    assert rank_peers(PEERS, fresh, "other-model", now=101.0, max_age_s=5.0) == []
    assert rank_peers(PEERS, {}, "m", now=101.0, max_age_s=5.0) == []


def test_peer_view_shows_dead_peers_as_not_alive() -> None:
    rows = peer_view(PEERS, {"near": _beat("near")}, now=200.0, max_age_s=5.0)
    assert [r["name"] for r in rows] == ["near", "far", "unknown-rtt"]
    assert rows[0]["alive"] is False and rows[0]["heartbeat_age_s"] == 100.0
    assert rows[2]["rtt_ms"] is None
