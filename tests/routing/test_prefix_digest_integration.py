"""Prefix digests over real sockets: a region served by the ``meridian`` cost model
says in ``/internal/availability`` which block hashes its replica holds, and its
peer reads that off its polls (``/internal/state``'s peer rows).

Two regions, one balancer and one emulated replica each; Redis is pointed at a
closed port, so the digest travels in the HTTP-polled heartbeat alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from core.peers import Heartbeat
from ops import http_probe
from tests.support.balancers import MODEL, TopologyFactory, start_balancer, start_replicas, state
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# Long enough for a few dozen full blocks however the fallback tokenizer counts.
DOCUMENT = "Meridian keeps every shared prefix where its KV cache lives. " * 60


@pytest.fixture(scope="module")
def regions(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[tuple[dict[str, str], str]]:
    us, eu = topology.region("pd-us"), topology.region("pd-eu")
    topology.latency(us, eu, 80.0)
    replica_ports = {"pd-us-a": free_port(), "pd-eu-a": free_port()}
    lb_ports = {"us": free_port(), "eu": free_port()}
    topology.balancer("pd-us-lb", us, lb_ports["us"])
    topology.balancer("pd-eu-lb", eu, lb_ports["eu"])
    topology.replica("pd-us-a", us, replica_ports["pd-us-a"])
    topology.replica("pd-eu-a", eu, replica_ports["pd-eu-a"])
    topology.service(policy="meridian")
    key = topology.api_key()
    start_replicas(module_processes, "pd-replicas", replica_ports)
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    urls = {
        name: start_balancer(module_processes, env, f"pd-{name}-lb", port)
        for name, port in lb_ports.items()
    }
    yield urls, key


def _availability(url: str) -> Heartbeat:
    response = http_probe.get(
        f"{url}/internal/availability",
        headers={"Authorization": f"Bearer {settings.MERIDIAN_INTERNAL_TOKEN}"},
    )
    response.raise_for_status()
    return Heartbeat.from_json(response.content)


def _peer_row(url: str, peer: str) -> dict[str, Any]:
    row: dict[str, Any] = next(p for p in state(url)["peers"] if p["name"] == peer)
    return row


def test_a_region_says_what_its_replica_holds_and_its_peer_hears_it(
    regions: tuple[dict[str, str], str],
) -> None:
    urls, key = regions
    before = _availability(urls["us"]).prefixes.get(MODEL)
    assert before is not None and not before.hashes  # nothing served yet: it holds nothing
    response = http_probe.post(
        f"{urls['us']}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "system", "content": DOCUMENT},
                {"role": "user", "content": "Hi"},
            ],
            "max_tokens": 4,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-meridian-balancer"] == "pd-us-lb"
    digest = _availability(urls["us"]).prefixes[MODEL]
    # The stride positions of the prompt it just routed, and the prompt's last block.
    assert digest.stride == 4 and digest.block_tokens == 16
    assert len(digest.hashes) >= 5
    # The peer polls it: its view of pd-us-lb shows the same digest's size.
    eventually(
        lambda: (
            _peer_row(urls["eu"], "pd-us-lb")["prefixes"].get(MODEL, {}).get("hashes")
            == len(digest.hashes)
        ),
        what="eu heard us's digest",
    )
