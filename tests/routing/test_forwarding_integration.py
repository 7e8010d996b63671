"""Two regions, two balancers, real Redis heartbeats: failover inside a region and
forwarding across regions (SkyLB's two layers).

``fw-us`` owns two replicas in separate processes (so one can be SIGKILLed);
its in-process probe runs only at start-up, so a dead replica is discovered by
the request that hits it, which must then be retried on the other one.
``fw-eu`` owns one replica whose process was never started: its probe marks it
unhealthy, so the region has no healthy replica and forwards to ``fw-us``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from django.conf import settings

from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    client,
    kill_process_group,
    metric_value,
    peer_forward_headers,
    start_balancer,
    start_replicas,
    state,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

# See test_proxy_integration.py for why django_db and not transaction=True.
pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MESSAGES = [{"role": "user", "content": "Where am I served?"}]


@dataclass(frozen=True)
class Regions:
    us: str
    eu: str
    key: str
    us_a_process: Any


@pytest.fixture(scope="module")
def regions(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Regions]:
    us_port, eu_port = free_port(), free_port()
    us_a, us_b, eu_a = free_port(), free_port(), free_port()
    us, eu = topology.region("fw-us"), topology.region("fw-eu")
    topology.latency(us, eu, 80.0)
    topology.balancer("fw-us-lb", us, us_port)
    topology.balancer("fw-eu-lb", eu, eu_port)
    topology.replica("fw-us-a", us, us_a)
    topology.replica("fw-us-b", us, us_b)
    topology.replica("fw-eu-a", eu, eu_a)  # nothing listens there
    topology.service()
    key = topology.api_key()
    us_a_process = start_replicas(module_processes, "fw-us-a", {"fw-us-a": us_a})
    start_replicas(module_processes, "fw-us-b", {"fw-us-b": us_b})
    us_url = start_balancer(
        module_processes, child_env, "fw-us-lb", us_port, MERIDIAN_PROBE_INTERVAL_S="600"
    )
    eu_url = start_balancer(module_processes, child_env, "fw-eu-lb", eu_port)
    yield Regions(us_url, eu_url, key, us_a_process)


def _peer(url: str, name: str) -> dict[str, Any] | None:
    return next((p for p in state(url)["peers"] if p["name"] == name), None)


@pytest.fixture
def eu_must_forward(regions: Regions) -> Regions:
    """Wait until eu knows its replica is down and sees us alive with capacity."""
    eventually(lambda: not state(regions.eu)["replicas"][0]["healthy"], what="eu replica unhealthy")
    eventually(
        lambda: (p := _peer(regions.eu, "fw-us-lb")) and p["alive"] and p["models"].get(MODEL),
        what="eu sees the us balancer's heartbeat",
    )
    return regions


def test_request_is_forwarded_to_the_peer_when_the_region_has_no_healthy_replica(
    eu_must_forward: Regions,
) -> None:
    r = eu_must_forward
    forwarded_in = (
        'meridian_requests_total{model="meridian-test",status="200",route="forwarded_in"}'
    )
    forwarded_out = (
        'meridian_requests_total{model="meridian-test",status="200",route="forwarded_out"}'
    )
    before_in = metric_value(r.us, forwarded_in)
    api = client(r.eu, r.key)
    raw = api.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4
    )
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-meridian-entry"] == "fw-eu-lb"
    assert raw.headers["x-meridian-balancer"] == "fw-us-lb"
    assert raw.headers["x-meridian-replica"] in {"fw-us-a", "fw-us-b"}
    chunks = list(
        api.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # The peer counted both as forwarded in: the hop header arrived with them.
    assert metric_value(r.us, forwarded_in) == before_in + 2
    assert metric_value(r.eu, forwarded_out) >= 2
    eventually(lambda: state(r.eu)["inflight"] == 0, what="eu in-flight back to 0")


def test_forwarded_request_is_never_forwarded_again(eu_must_forward: Regions) -> None:
    r = eu_must_forward
    before_in = metric_value(r.us, 'meridian_requests_total{model="meridian-test"')
    response = http_probe.post(
        f"{r.eu}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"Authorization": f"Bearer {r.key}", **peer_forward_headers("fw-us-lb")},
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_healthy_replica"
    assert response.headers["retry-after"]
    assert metric_value(r.us, 'meridian_requests_total{model="meridian-test"') == before_in


def test_peers_are_listed_with_rtt_and_heartbeats_are_in_redis(eu_must_forward: Regions) -> None:
    peer = _peer(eu_must_forward.eu, "fw-us-lb")
    assert peer is not None
    assert peer["rtt_ms"] == 80.0 and peer["url"] == eu_must_forward.us
    assert state(eu_must_forward.eu)["redis"]["connected"] is True
    raw = redis.Redis.from_url(settings.REDIS_URL).get("meridian:balancer:fw-us-lb:heartbeat")
    assert raw is not None and b'"region": "fw-us"' in raw


def test_killed_replica_is_retried_on_another_before_the_first_byte(regions: Regions) -> None:
    eventually(lambda: state(regions.us)["inflight"] == 0, what="us idle before the kill")
    kill_process_group(regions.us_a_process)
    api = client(regions.us, regions.key)
    # Least load breaks the tie between two idle replicas by name: fw-us-a first.
    raw = api.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True
    )
    assert raw.headers["x-meridian-replica"] == "fw-us-b"
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert metric_value(regions.us, 'meridian_upstream_errors_total{target="fw-us-a"') >= 1
    assert metric_value(regions.us, "meridian_retries_total") >= 1
    view = state(regions.us)
    replicas = {r["name"]: r for r in view["replicas"]}
    assert replicas["fw-us-a"]["healthy"] is False and replicas["fw-us-b"]["healthy"] is True
    eventually(lambda: state(regions.us)["inflight"] == 0, what="us in-flight back to 0")
