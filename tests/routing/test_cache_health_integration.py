"""The balancer tells a human when its view of a replica's cache is wrong, over real
processes: emulated replicas publishing (or not) vLLM KV events, real balancers.

* A service in ``vllm`` block identity whose ``hash_seed`` is not the engine's
  computes block keys that never match the events' keys: the hit-rate mismatch
  detector fires, for a ``cache_map`` service and for a ``meridian`` one whose tree
  follows the events.  The same workload for a service with the engine's seed
  leaves it quiet.
* A replica whose endpoint is written ``tcp://127.0.0.1:PORT`` makes the publisher
  connect instead of bind (as vLLM does): ``connect_endpoint``.
* A replica that serves prefix-cache misses while no event arrives: ``silent``.
* A replica whose small KV cache evicts a prefix while a request routed for it
  waits behind a long one: the view was right, and the warning says the cache
  evicts (``evicting``), not that the view is wrong.

Claims are on ``/internal/state`` and ``/metrics``, waited for with bounded polling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ops import http_probe
from tests.support.balancers import TopologyFactory, start_balancer, start_replicas, state
from tests.support.metrics import metric
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GOOD, BAD, CONNECT, SILENT = "hv-good", "hv-bad", "hv-connect", "hv-silent"
EVICT = "hv-evict"
# A meridian service whose tree follows the engine's events, with the wrong seed too.
BAD_TREE = "hv-bad-tree"
# 24 blocks of 16 tokens, one sequence at a time, at a quarter of the L4's times: a
# request queued behind a long one waits while that one's decode evicts the cache.
SMALL_CACHE = (
    "--profile", "l4-llama3.1-8b", "--num-blocks", "24", "--max-num-seqs", "1",
    "--time-scale", "0.25",
)  # fmt: skip
DETECTOR = {
    "MERIDIAN_CACHE_MISMATCH_WINDOW": "8",
    "MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS": "6",
    "MERIDIAN_KV_SILENT_PROBES": "3",
}


@dataclass(frozen=True)
class Fleet:
    right: str  # the balancer of the services hashing like the engines
    wrong: str  # the one of the service with another hash seed
    key: str
    replicas: dict[str, str]  # name -> url

    def complete(self, balancer: str, replica: str, prompt: str) -> dict[str, Any]:
        response = http_probe.post(
            f"{balancer}/v1/completions",
            json={"model": replica, "prompt": prompt, "max_tokens": 1},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def row(self, balancer: str, replica: str) -> dict[str, Any]:
        rows = {r["name"]: r for r in state(balancer)["replicas"]}
        return rows[replica]

    def applied(self, balancer: str, replica: str) -> bool:
        """Every event the replica published so far is in the balancer's map."""
        snapshot = http_probe.get(f"{self.replicas[replica]}/kv_cache/blocks", timeout=5).json()
        stream = state(balancer)["kv_events"]["replicas"].get(replica) or {}
        sequence = int(snapshot["sequence"])
        return (stream.get("next_sequence") or 0) >= sequence and stream.get("pending") == 0


def prompt(tag: str, words: int = 80) -> str:
    return f"{tag} " + " ".join(f"w{i}" for i in range(words))  # 80: five full 16-token blocks


@pytest.fixture(scope="module")
def fleet(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Fleet]:
    # Each replica serves a model of its own name, so each test's traffic stays on it.
    right_region, wrong_region = topology.region("hv-right"), topology.region("hv-wrong")
    ports = {name: free_port() for name in (GOOD, BAD, CONNECT, SILENT, EVICT, BAD_TREE)}
    kv = free_port_run(5)
    replay = free_port_run(5)
    placement = {GOOD: right_region, CONNECT: right_region, SILENT: right_region}
    placement[EVICT] = right_region
    for name, port in ports.items():
        topology.replica(name, placement.get(name, wrong_region), port, model=name)
    for index, name in ((0, GOOD), (1, BAD), (4, BAD_TREE)):
        start_replicas(
            module_processes, name, {name: ports[name]}, "--kv-events-port-base",
            str(kv + index), "--kv-events-replay-port-base", str(replay + index), model=name,
        )  # fmt: skip
    start_replicas(
        module_processes, CONNECT, {CONNECT: ports[CONNECT]}, "--kv-events-port-base",
        str(kv + 2), "--kv-events-host", "127.0.0.1", model=CONNECT,
    )  # fmt: skip
    start_replicas(module_processes, SILENT, {SILENT: ports[SILENT]}, model=SILENT)
    start_replicas(
        module_processes, EVICT, {EVICT: ports[EVICT]}, "--kv-events-port-base",
        str(kv + 3), *SMALL_CACHE, model=EVICT,
    )  # fmt: skip
    params: dict[str, Any] = {"pushing": "blind"}
    engines_hash = {"mode": "vllm"}  # the emulated engines' default seed
    wrong_seed = {"mode": "vllm", "hash_seed": "not-the-engines"}
    hashing = ((GOOD, engines_hash), (BAD, wrong_seed), (CONNECT, engines_hash))
    for name, identity in (*hashing, (EVICT, engines_hash)):
        service_params = {**params, "block_identity": identity}
        topology.service(name, policy="cache_map", policy_params=service_params)
    tree = {"tree_from_kv_events": True, "block_identity": wrong_seed}
    topology.service(BAD_TREE, policy="meridian", policy_params=tree)
    # An endpoint configured where nothing publishes: the stream stays silent.
    dead = {"kv_events": {SILENT: f"tcp://127.0.0.1:{free_port()}"}}
    topology.service(SILENT, policy="cache_map", policy_params={**params, **dead})
    right_port, wrong_port = free_port(), free_port()
    topology.balancer("hv-right-lb", right_region, right_port)
    topology.balancer("hv-wrong-lb", wrong_region, wrong_port)
    key = topology.api_key()
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", **DETECTOR}
    right = start_balancer(module_processes, env, "hv-right-lb", right_port)
    wrong = start_balancer(module_processes, env, "hv-wrong-lb", wrong_port)
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    yield Fleet(right, wrong, key, urls)


def subscribe(fleet: Fleet, balancer: str, replica: str) -> None:
    """Publish until the balancer has seen the replica's events (ZMQ subscriptions
    propagate asynchronously, so the first messages may go to nobody)."""

    def seen() -> bool:
        fleet.complete(balancer, replica, prompt(f"warm-{replica}"))
        row = state(balancer)["kv_events"]["replicas"].get(replica) or {}
        return bool(row.get("received"))

    eventually(seen, what=f"{replica}'s events reach the balancer")


def multi_turn(fleet: Fleet, balancer: str, replica: str, turns: int) -> list[int]:
    """A conversation that grows one turn at a time: each request repeats the one
    before and adds to it, as chat clients do.  The cached tokens reported."""
    cached = []
    text = prompt(f"conversation-{replica}")
    for turn in range(turns):
        eventually(lambda: fleet.applied(balancer, replica), what="events applied")
        body = fleet.complete(balancer, replica, text)
        cached.append(body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
        text += " " + " ".join(f"t{turn}x{i}" for i in range(20))
    return cached


@pytest.mark.parametrize("replica", [BAD, BAD_TREE], ids=["cache_map", "meridian_tree"])
def test_a_hash_seed_unlike_the_engines_raises_the_mismatch_warning(
    fleet: Fleet, replica: str
) -> None:
    """For a ``cache_map`` service, and for a ``meridian`` one whose tree follows the
    events: its holdings are paths, and the check reads the map of confirmed blocks
    kept beside the tree."""
    subscribe(fleet, fleet.wrong, replica)
    cached = multi_turn(fleet, fleet.wrong, replica, turns=8)
    assert sum(cached[1:]) > 0  # the engine did find its cache: the balancer did not
    row = fleet.row(fleet.wrong, replica)
    view = row["cache_view"]
    assert view["state"] == "mismatch" and view["expected_cached_tokens"] == 0
    assert view["reported_cached_tokens"] >= sum(cached[1:])
    assert any(w["kind"] == "cache_view_mismatch" for w in row["warnings"])
    assert metric(fleet.wrong, "meridian_cache_view_state", replica=replica, state="mismatch") == 1
    assert metric(fleet.wrong, "meridian_cache_view_mismatch_ratio", replica=replica) > 0.5


def test_the_same_workload_with_the_engines_seed_stays_quiet(fleet: Fleet) -> None:
    subscribe(fleet, fleet.right, GOOD)
    cached = multi_turn(fleet, fleet.right, GOOD, turns=8)
    assert sum(cached[1:]) > 0
    row = fleet.row(fleet.right, GOOD)
    view = row["cache_view"]
    # Expected and reported agree to within a block on every request of the window.
    assert view["state"] == "ok" and view["mismatch_ratio"] == 0.0
    assert view["expected_cached_tokens"] > 0
    assert row["warnings"] == [] and row["kv_stream"] == "ok"
    assert metric(fleet.right, "meridian_cache_view_state", replica=GOOD, state="ok") == 1
    assert metric(fleet.right, "meridian_kv_event_stream_state", replica=GOOD, state="ok") == 1


def test_an_endpoint_written_with_a_host_is_reported_as_connect_not_bind(fleet: Fleet) -> None:
    def flagged() -> bool:
        return fleet.row(fleet.right, CONNECT)["kv_stream"] == "connect_endpoint"

    eventually(flagged, what="the connect-instead-of-bind warning")
    warning = fleet.row(fleet.right, CONNECT)["warnings"][0]
    assert warning["kind"] == "kv_stream_connect_endpoint"
    assert "tcp://*:PORT" in warning["message"]
    labels = {"replica": CONNECT, "state": "connect_endpoint"}
    assert metric(fleet.right, "meridian_kv_event_stream_state", **labels) == 1


def test_misses_without_events_make_the_stream_silent(fleet: Fleet) -> None:
    turn = iter(range(1000))

    def silent() -> bool:
        fleet.complete(fleet.right, SILENT, prompt(f"miss-{next(turn)}"))
        return fleet.row(fleet.right, SILENT)["kv_stream"] == "silent"

    eventually(silent, what="the silent-stream warning", interval=0.1)
    warning = fleet.row(fleet.right, SILENT)["warnings"][0]
    assert warning["kind"] == "kv_stream_silent" and "tcp://*:PORT" in warning["message"]


def test_a_cache_that_evicts_what_waits_on_it_is_told_from_a_wrong_view(fleet: Fleet) -> None:
    """Each round caches a prompt on the replica, starts a long request there (both
    sent to the replica itself, so the balancer checks neither), and sends the prompt
    again through the balancer: routed while the map confirms its blocks, it waits
    behind the long one, whose decode evicts them.  Without the engine's eviction
    events in the comparison, these requests read as a wrong view (``mismatch``)."""
    subscribe(fleet, fleet.right, EVICT)
    replica = fleet.replicas[EVICT]
    found = []
    for round_ in range(6):
        kept = prompt(f"kept-{round_}")
        direct(replica, EVICT, kept, max_tokens=1)
        eventually(lambda: fleet.applied(fleet.right, EVICT), what="the prompt's blocks mapped")
        # 193 prompt tokens and 176 decoded fill all 24 blocks: the kept prompt's five,
        # freed last, are evicted last, about a second into the long request's decode.
        long = threading.Thread(
            target=direct, args=(replica, EVICT, prompt(f"long-{round_}", 190), 176)
        )
        long.start()
        eventually(lambda: running(replica) == 1, what="the long request running", interval=0.005)
        body = fleet.complete(fleet.right, EVICT, kept)
        long.join()
        found.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert all(cached < 64 for cached in found)  # the map expected 80 tokens each time
    row = fleet.row(fleet.right, EVICT)
    view = row["cache_view"]
    assert view["state"] == "evicting" and view["mismatch_ratio"] == 0.0
    assert view["evicted_ratio"] > 0.5 and view["expected_cached_tokens"] >= 6 * 64
    assert [w["kind"] for w in row["warnings"]] == ["cache_evicting"]
    assert "--scheduling-policy priority" in row["warnings"][0]["message"]
    assert metric(fleet.right, "meridian_cache_view_state", replica=EVICT, state="evicting") == 1
    assert metric(fleet.right, "meridian_cache_view_evicted_ratio", replica=EVICT) > 0.5


def direct(replica: str, model: str, text: str, max_tokens: int) -> None:
    """A completion sent to the replica itself, past every balancer."""
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "ignore_eos": True}
    http_probe.post(f"{replica}/v1/completions", json=body, timeout=30).raise_for_status()


def running(replica: str) -> float:
    return metric(replica, "vllm:num_requests_running")
