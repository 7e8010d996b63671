"""Selective pushing over real sockets (SkyLB §3.3): SP-P against blind pushing, and
the regional queue's bounds as a client sees them.

One balancer owns three services' replicas, each service in its own
``sim.serve`` process with ``--max-num-seqs 2`` so a batch fills fast:

* ``meridian-test``: two replicas, default SP-P pushing;
* ``meridian-test-blind``: two replicas, ``{"pushing": "blind"}``;
* ``meridian-test-tight``: one replica, a queue of one entry and one second of
  patience, to see 429 (queue full), 503 (waited too long) and a client that
  leaves while queued.

The claims are about where requests wait, read from the replicas' own
``vllm:num_requests_waiting`` while a burst runs, never about times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    metric_value,
    replica_waiting,
    set_fault,
    start_balancer,
    start_replicas,
    state,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

BLIND = "meridian-test-blind"
TIGHT = "meridian-test-tight"
BURST = 16


@dataclass(frozen=True)
class Lab:
    url: str
    key: str
    ports: dict[str, list[int]]  # model → its replicas' ports

    def post(self, model: str, *, max_tokens: int = 40, timeout: float = 60) -> httpx.Response:
        return http_probe.post(
            f"{self.url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "push me"}],
                "max_tokens": max_tokens,
            },
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def lab(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Lab]:
    region = topology.region("sp-lab")
    lb_port = free_port()
    topology.balancer("sp-lab-lb", region, lb_port)
    layout = {MODEL: ["sp-a", "sp-b"], BLIND: ["bp-a", "bp-b"], TIGHT: ["tq-a"]}
    ports: dict[str, list[int]] = {}
    for model, names in layout.items():
        named = {name: free_port() for name in names}
        for name, port in named.items():
            topology.replica(name, region, port, model=model)
        start_replicas(module_processes, model, named, "--max-num-seqs", "2", model=model)
        ports[model] = list(named.values())
    topology.service(MODEL)
    topology.service(BLIND, policy_params={"pushing": "blind"})
    topology.service(TIGHT, queue_max_len=1, queue_max_wait_s=1.0)
    key = topology.api_key()
    url = start_balancer(
        module_processes,
        {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
        "sp-lab-lb",
        lb_port,
    )
    eventually(
        lambda: all(r["healthy"] for r in state(url)["replicas"]), what="every replica probed"
    )
    yield Lab(url, key, ports)
    for group in ports.values():
        for port in group:
            set_fault(port, "none")


def _max_waiting_during_burst(lab: Lab, model: str) -> float:
    """Send BURST requests at once; the most requests any replica had waiting meanwhile."""
    for port in lab.ports[model]:
        set_fault(port, "slow", factor=20.0)  # every request arrives before one finishes
    stop, seen = threading.Event(), [0.0]

    def sample() -> None:
        while not stop.is_set():
            for port in lab.ports[model]:
                seen[0] = max(seen[0], replica_waiting(port))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(BURST) as pool:
            statuses = list(pool.map(lambda _: lab.post(model).status_code, range(BURST)))
    finally:
        stop.set()
        sampler.join()
        for port in lab.ports[model]:
            set_fault(port, "none")
    assert statuses == [200] * BURST
    return seen[0]


def test_sp_p_keeps_replica_queues_near_empty_where_blind_pushing_piles_up(lab: Lab) -> None:
    sp_p = _max_waiting_during_burst(lab, MODEL)
    blind = _max_waiting_during_burst(lab, BLIND)
    # 16 requests, 2 replicas of 2 slots: SP-P holds the rest in the balancer (at most
    # the one push a probe has not confirmed waits on a replica); blind sends them all.
    assert sp_p <= 1
    assert blind >= 3
    assert metric_value(lab.url, f'meridian_queue_wait_seconds_count{{model="{MODEL}"') >= 1
    assert metric_value(lab.url, f'meridian_queue_wait_seconds_count{{model="{BLIND}"') == 0
    eventually(lambda: state(lab.url)["inflight"] == 0, what="burst fully released")


@pytest.fixture
def tight_full(lab: Lab) -> Iterator[Lab]:
    """The tight service's only replica saturated behind the balancer's back."""
    (port,) = lab.ports[TIGHT]
    set_fault(port, "slow", factor=200.0)
    hogs = [threading.Thread(target=_hog, args=(port,), daemon=True) for _ in range(3)]
    for thread in hogs:
        thread.start()
    eventually(lambda: replica_waiting(port) >= 1, what="tight replica has a waiting request")
    eventually(
        lambda: not next(r for r in state(lab.url)["replicas"] if r["name"] == "tq-a")["available"],
        what="balancer sees the tight replica full",
    )
    yield lab
    set_fault(port, "none")
    for thread in hogs:
        thread.join(timeout=30)
    eventually(lambda: state(lab.url)["inflight"] == 0, what="tight requests released")


def _hog(port: int) -> None:
    http_probe.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": TIGHT, "messages": [{"role": "user", "content": "hog"}], "max_tokens": 600},
        timeout=120,
    )


def _tight_queue(url: str) -> int:
    return next(q["length"] for q in state(url)["queues"] if q["model"] == TIGHT)


def test_full_queue_is_429_and_a_request_that_waited_too_long_is_503(tight_full: Lab) -> None:
    lab = tight_full
    waited: list[httpx.Response] = []
    first = threading.Thread(target=lambda: waited.append(lab.post(TIGHT)))
    first.start()
    eventually(lambda: _tight_queue(lab.url) == 1, what="first request queued")
    overflow = lab.post(TIGHT)
    assert overflow.status_code == 429 and overflow.headers["retry-after"] == "1"
    assert overflow.json()["error"]["code"] == "queue_full"
    first.join(timeout=30)
    assert waited and waited[0].status_code == 503
    assert waited[0].headers["retry-after"] == "1"
    assert waited[0].json()["error"]["code"] == "queue_timeout"
    assert metric_value(lab.url, f'meridian_queue_rejected_total{{model="{TIGHT}"}}') >= 1
    timeout_line = f'meridian_queue_wait_seconds_count{{model="{TIGHT}",outcome="timeout"}}'
    assert metric_value(lab.url, timeout_line) >= 1
    assert _tight_queue(lab.url) == 0
    row = next(q for q in state(lab.url)["queues"] if q["model"] == TIGHT)
    assert row["rejected_full"] >= 1 and row["timed_out"] >= 1


def test_a_client_that_leaves_while_queued_is_taken_out_of_the_queue(tight_full: Lab) -> None:
    lab = tight_full
    cancelled = f'meridian_queue_wait_seconds_count{{model="{TIGHT}",outcome="cancelled"}}'
    before = metric_value(lab.url, cancelled)
    with pytest.raises(httpx.ReadTimeout):
        lab.post(TIGHT, timeout=0.3)
    eventually(lambda: metric_value(lab.url, cancelled) == before + 1, what="cancel counted")
    assert _tight_queue(lab.url) == 0
    assert next(r for r in state(lab.url)["replicas"] if r["name"] == "tq-a")["outstanding"] == 0
