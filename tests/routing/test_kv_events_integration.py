"""The push path over real sockets: emulated replicas publish vLLM KV events over ZMQ,
the balancer subscribes (endpoint discovery through vLLM's ``GET /kv_event_sources``), applies them
in batches to its ``cache_map`` policy, and anti-entropy (the Celery task's service
function, as beat runs it) replaces what it believes by ``GET /kv_cache/blocks``.

Claims are about where requests go (the replica named in ``X-Meridian-Replica``)
and what the balancer reports in ``/internal/state``, waited for with bounded
polling, never about times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ops import http_probe
from tests.support.balancers import TopologyFactory, start_balancer, start_replicas, state
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, free_port_run
from workers.cache_sync import sync_cache_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MODEL = "meridian-kv-test"
NAMES = ("kv-a", "kv-b")


@dataclass(frozen=True)
class Lab:
    url: str
    key: str
    replicas: dict[str, str]  # name -> url

    def complete(self, prompt: str) -> str:
        """Send ``prompt`` through the balancer; the replica that served it."""
        response = http_probe.post(
            f"{self.url}/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        response.raise_for_status()
        return response.headers["X-Meridian-Replica"]

    def direct(self, replica: str, prompt: str) -> None:
        """Send ``prompt`` to a replica itself, behind the balancer's back."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        http_probe.post(f"{self.replicas[replica]}/v1/completions", json=body, timeout=30)

    def replica_sequence(self, replica: str) -> int:
        """The replica's next KV-event sequence (everything before it is published)."""
        snapshot = http_probe.get(f"{self.replicas[replica]}/kv_cache/blocks", timeout=5).json()
        return int(snapshot["sequence"])

    def applied_through(self, replica: str, sequence: int) -> bool:
        """The balancer has received every message below ``sequence`` and applied it."""
        row = state(self.url)["kv_events"]["replicas"].get(replica) or {}
        return (row.get("next_sequence") or 0) >= sequence and row.get("pending") == 0

    def wait_applied(self, replica: str) -> None:
        sequence = self.replica_sequence(replica)
        eventually(
            lambda: self.applied_through(replica, sequence),
            what=f"{replica}'s events through {sequence} applied",
        )


def prompt(tag: str) -> str:
    return f"{tag} " + " ".join(f"w{i}" for i in range(80))  # five full 16-token blocks


@pytest.fixture(scope="module")
def lab(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Lab]:
    region = topology.region("kv-lab")
    lb_port = free_port()
    topology.balancer("kv-lab-lb", region, lb_port)
    ports = {name: free_port() for name in NAMES}
    for name, port in ports.items():
        topology.replica(name, region, port, model=MODEL)
    kv_base = str(free_port_run(len(NAMES)))
    start_replicas(module_processes, "kv", ports, "--kv-events-port-base", kv_base, model=MODEL)
    # Blind pushing: selective pushing would hold a replica back after a few quick
    # pushes between probes, and these tests are about the cache map's choice alone.
    topology.service(MODEL, policy="cache_map", policy_params={"pushing": "blind"})
    key = topology.api_key()
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    url = start_balancer(module_processes, env, "kv-lab-lb", lb_port)

    def subscribed() -> bool:
        streams = state(url)["kv_events"]["replicas"]
        return set(NAMES) <= set(streams) and all(r["healthy"] for r in state(url)["replicas"])

    eventually(subscribed, what="the balancer subscribed to both replicas' KV events")
    yield Lab(url, key, {n: f"http://127.0.0.1:{p}" for n, p in ports.items()})


def settle_subscriptions(lab: Lab) -> None:
    """ZMQ subscriptions propagate asynchronously: publish until both replicas' events
    are seen, so no later message is dropped for want of a subscriber."""
    for attempt in range(50):
        for name in NAMES:
            lab.direct(name, prompt(f"warm-{name}-{attempt}"))
        rows = state(lab.url)["kv_events"]["replicas"]
        if all(rows[n]["received"] > 0 for n in NAMES):
            return
    raise AssertionError("the balancer never received the replicas' KV events")


def test_replica_endpoints_for_discovery_and_snapshots(lab: Lab) -> None:
    discovery = http_probe.get(f"{lab.replicas['kv-a']}/kv_event_sources").json()
    # vLLM 0.32's shape: the publisher's config per data-parallel rank, bound on '*'.
    assert discovery["0"]["endpoint"].startswith("tcp://*:") and discovery["0"]["topic"] == ""
    lab.direct("kv-a", prompt("snapshot"))
    snapshot = http_probe.get(f"{lab.replicas['kv-a']}/kv_cache/blocks").json()
    assert snapshot["replica"] == "kv-a" and len(snapshot["blocks"]) >= 5
    assert isinstance(snapshot["sequence"], int)


def test_routing_leaves_a_replica_once_its_eviction_event_is_applied(lab: Lab) -> None:
    settle_subscriptions(lab)
    shared = prompt("evicted-doc")
    holder = lab.complete(shared)
    other = next(n for n in NAMES if n != holder)
    lab.wait_applied(holder)
    assert [lab.complete(shared) for _ in range(3)] == [holder] * 3  # sticky to the holder
    lab.direct(other, shared)  # now both hold it ...
    lab.wait_applied(other)
    reset = http_probe.post(f"{lab.replicas[holder]}/reset_prefix_cache", timeout=5)
    assert reset.status_code == 200  # ... and the first one evicts it (AllBlocksCleared)
    lab.wait_applied(holder)  # the next batch flush after the event arrived
    assert [lab.complete(shared) for _ in range(3)] == [other] * 3


def test_a_lost_event_is_healed_by_the_next_anti_entropy_sync(lab: Lab) -> None:
    settle_subscriptions(lab)
    token = _token()
    headers = {"Authorization": f"Bearer {token}"}
    dropped = http_probe.post(
        f"{lab.url}/internal/faults", json={"drop_kv_events": 1}, headers=headers
    )
    assert dropped.json()["drop_kv_events"] == 1
    lost = prompt("lost-event")
    lab.direct("kv-b", lost)  # its BlockStored is the message the balancer throws away
    eventually(lambda: state(lab.url)["faults"]["drop_kv_events"] == 0, what="event dropped")
    syncs_before = state(lab.url)["kv_events"]["syncs"]
    results = {r.balancer: r for r in sync_cache_state(timeout=10)}
    assert results["kv-lab-lb"].ok, results["kv-lab-lb"].detail
    synced = results["kv-lab-lb"].replicas
    assert synced["kv-b"]["error"] is None and synced["kv-b"]["blocks"] >= 5
    assert state(lab.url)["kv_events"]["syncs"] == syncs_before + len(NAMES)
    # kv-b holds the prefix again in the balancer's map, so the request follows it.
    assert [lab.complete(lost) for _ in range(3)] == ["kv-b"] * 3


def test_cache_sync_and_faults_need_the_internal_token(lab: Lab) -> None:
    for path in ("/internal/cache_sync", "/internal/faults"):
        assert http_probe.post(f"{lab.url}{path}", json={}).status_code == 401
    bad = http_probe.post(
        f"{lab.url}/internal/faults",
        json={"partition": ["x"], "until": 1},
        headers={"Authorization": f"Bearer {_token()}"},
    )
    assert bad.status_code == 400 and "until" in bad.json()["error"]["message"]


def _token() -> Any:
    from django.conf import settings

    return settings.MERIDIAN_INTERNAL_TOKEN
