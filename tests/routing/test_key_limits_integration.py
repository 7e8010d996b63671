"""Per-key limits across real processes: two daphne balancers in one region sharing one
Redis, a third in another region that forwards to them, the official OpenAI client.

Requests are sent concurrently through both balancers of ``kl-us``; the requests-per-
minute limit must hold over the pair (to within one request) and the usage counted in
Redis, in the balancers' ``/metrics`` and, after the rollup, on the ApiKey row must add
up to what the clients received.  ``kl-eu``'s only replica has nothing listening, so it
forwards to ``kl-us``: the forward is admitted and counted once, at ``kl-eu``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import redis
from django.conf import settings

from core.key_limits import KeyLimits, usage_key
from fleet.models import ApiKey, hash_api_key
from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    client,
    metric_value,
    set_fault,
    start_balancer,
    start_replicas,
    state,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port
from workers.key_usage import rollup_key_usage

# See test_proxy_integration.py for why django_db and not transaction=True.
pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MESSAGES = [{"role": "user", "content": "Count me once."}]
RPM = 12
CONCURRENT = 3


@dataclass(frozen=True)
class Stack:
    us: tuple[str, str]
    eu: str
    keys: dict[str, str]  # name -> raw key
    replica_ports: tuple[int, ...]


def _key(topology: TopologyFactory, name: str, limits: KeyLimits) -> str:
    key, raw = ApiKey.issue(name, limits)
    topology.created.append(key)
    return raw


@pytest.fixture(scope="module")
def stack(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Stack]:
    us, eu = topology.region("kl-us"), topology.region("kl-eu")
    topology.latency(us, eu, 80.0)
    ports = [free_port() for _ in range(3)]
    replica_ports = {"kl-us-a": free_port(), "kl-us-b": free_port()}
    topology.balancer("kl-us-lb1", us, ports[0])
    topology.balancer("kl-us-lb2", us, ports[1])
    topology.balancer("kl-eu-lb", eu, ports[2])
    for name, port in replica_ports.items():
        topology.replica(name, us, port)  # unowned: both us balancers route to both
    topology.replica("kl-eu-a", eu, free_port())  # nothing listens: eu forwards
    topology.service()
    keys = {
        "rpm": _key(topology, "kl-rpm", KeyLimits(requests_per_minute=RPM)),
        "usage": _key(topology, "kl-usage", KeyLimits(tokens_per_minute=10**9)),
        "models": _key(topology, "kl-models", KeyLimits(allowed_models=frozenset({"other"}))),
        "forward": _key(topology, "kl-forward", KeyLimits(max_concurrent=50)),
        "concurrent": _key(topology, "kl-concurrent", KeyLimits(max_concurrent=CONCURRENT)),
    }
    for name, port in replica_ports.items():
        start_replicas(module_processes, name, {name: port})
    urls = tuple(
        start_balancer(module_processes, child_env, f"kl-us-lb{i + 1}", ports[i]) for i in (0, 1)
    )
    eu_url = start_balancer(module_processes, child_env, "kl-eu-lb", ports[2])
    yield Stack((urls[0], urls[1]), eu_url, keys, tuple(replica_ports.values()))
    r = redis.Redis.from_url(settings.REDIS_URL)
    for raw in keys.values():
        for name in r.scan_iter(match=f"meridian:kl:\\{{{hash_api_key(raw)}\\}}:*"):
            r.delete(name)
    r.close()


def _post(url: str, key: str, **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, **body}
    return http_probe.post(
        f"{url}/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def _wait_for_a_fresh_minute() -> None:
    """Start a burst early in a minute window (Redis runs on this host's clock), so
    the whole burst falls in one window."""
    if time.time() % 60 > 45:
        time.sleep(60 - time.time() % 60 + 0.2)


def test_the_limit_holds_across_two_processes_and_usage_adds_up(stack: Stack) -> None:
    _wait_for_a_fresh_minute()
    key = stack.keys["rpm"]
    targets = [stack.us[i % 2] for i in range(3 * RPM)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(pool.map(lambda url: _post(url, key), targets))
    ok = [r for r in responses if r.status_code == 200]
    limited = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(limited) == len(responses)
    assert abs(len(ok) - RPM) <= 1, [r.status_code for r in responses]
    assert {r.headers["X-Meridian-Balancer"] for r in ok} == {"kl-us-lb1", "kl-us-lb2"}
    error = limited[0].json()["error"]
    assert error["type"] == error["code"] == "rate_limit_exceeded"
    assert limited[0].headers["x-ratelimit-remaining-requests"] == "0"
    assert int(limited[0].headers["retry-after"]) >= 1
    assert ok[0].headers["x-ratelimit-limit-requests"] == str(RPM)

    key_hash = hash_api_key(key)
    prefix = ApiKey.objects.get(key_hash=key_hash).prefix
    prompt = sum(r.json()["usage"]["prompt_tokens"] for r in ok)
    completion = sum(r.json()["usage"]["completion_tokens"] for r in ok)
    r = redis.Redis.from_url(settings.REDIS_URL)

    def usage() -> dict[str, int]:
        raw = r.hgetall(usage_key(key_hash))
        return {k.decode(): int(v) for k, v in raw.items()}

    eventually(lambda: usage().get("requests") == len(ok), what="usage reaches Redis")
    assert usage()["prompt_tokens"] == prompt and usage()["completion_tokens"] == completion
    # /metrics of the two processes add up to the same counts.
    line = f'meridian_key_requests_total{{key="{prefix}"}}'
    assert sum(metric_value(url, line) for url in stack.us) == len(ok)
    tokens = f'meridian_key_tokens_total{{key="{prefix}",kind="prompt"}}'
    assert sum(metric_value(url, tokens) for url in stack.us) == prompt
    limited_line = f'meridian_key_limited_total{{key="{prefix}",limit="requests"}}'
    assert sum(metric_value(url, limited_line) for url in stack.us) == len(limited)
    # And the rollup puts them on the row.
    rollup_key_usage(r)
    row = ApiKey.objects.get(key_hash=key_hash)
    assert (row.usage_requests, row.usage_prompt_tokens) == (len(ok), prompt)
    r.close()


def test_the_openai_client_sees_a_429_with_the_headers(stack: Stack) -> None:
    openai_client = client(stack.us[0], stack.keys["rpm"])
    _wait_for_a_fresh_minute()
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(RPM + 1):
            openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    response = caught.value.response
    assert response.status_code == 429
    assert caught.value.code == "rate_limit_exceeded"
    assert response.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert response.headers["x-ratelimit-reset-requests"].endswith("s")
    assert "retry-after" in response.headers


def test_a_model_the_key_may_not_use_is_not_found(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(stack.us[1], stack.keys["models"]).chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
        )
    assert caught.value.code == "model_not_found"
    # The catalogue shows the key only its models: none of those served here.
    listing = http_probe.get(f"{stack.us[1]}/v1/models", headers=_bearer(stack.keys["models"]))
    assert listing.json()["data"] == []
    card = http_probe.get(f"{stack.us[1]}/v1/models/{MODEL}", headers=_bearer(stack.keys["models"]))
    assert card.status_code == 404 and card.json()["error"]["code"] == "model_not_found"
    everything = http_probe.get(f"{stack.us[1]}/v1/models", headers=_bearer(stack.keys["rpm"]))
    assert [m["id"] for m in everything.json()["data"]] == [MODEL]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_streams_release_their_slots_and_a_forward_counts_once(stack: Stack) -> None:
    key = stack.keys["forward"]
    key_hash = hash_api_key(key)
    eventually(
        lambda: any(p["alive"] and p["models"].get(MODEL) for p in state(stack.eu)["peers"]),
        what="eu sees a us balancer",
    )
    eventually(lambda: not state(stack.eu)["replicas"][0]["healthy"], what="eu replica down")
    r = redis.Redis.from_url(settings.REDIS_URL)
    before = int(r.hget(usage_key(key_hash), "requests") or 0)
    forwarded = _post(stack.eu, key)
    assert forwarded.status_code == 200, forwarded.text
    assert forwarded.headers["X-Meridian-Entry"] == "kl-eu-lb"
    streamed = openai.OpenAI(base_url=f"{stack.eu}/v1", api_key=key, max_retries=0).chat
    chunks = list(
        streamed.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)  # type: ignore[arg-type]
    )
    assert chunks and all(not c.usage for c in chunks)  # the client did not ask for usage
    expected_prompt = forwarded.json()["usage"]["prompt_tokens"]
    eventually(
        lambda: int(r.hget(usage_key(key_hash), "requests") or 0) == before + 2,
        what="both requests counted",
    )
    time.sleep(0.5)  # a second count (by the serving region) would have arrived by now
    assert int(r.hget(usage_key(key_hash), "requests") or 0) == before + 2
    # The stream's usage reached the entry balancer, which stripped it for the client.
    assert int(r.hget(usage_key(key_hash), "prompt_tokens") or 0) >= 2 * expected_prompt
    # Every slot came back: the concurrency set is empty.
    assert r.zcard(f"meridian:kl:{{{key_hash}}}:c") == 0
    r.close()


def test_concurrent_requests_are_held_across_both_processes(stack: Stack) -> None:
    """Replicas hang, so requests stay in flight: the key's fourth concurrent request is
    refused by whichever balancer gets it, and once the first three end it is served."""
    key = stack.keys["concurrent"]
    for port in stack.replica_ports:
        set_fault(port, "hang")
    try:
        with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
            held = [pool.submit(_post, stack.us[i % 2], key) for i in range(CONCURRENT)]
            r = redis.Redis.from_url(settings.REDIS_URL)
            slots = f"meridian:kl:{{{hash_api_key(key)}}}:c"
            eventually(lambda: r.zcard(slots) == CONCURRENT, what="three requests in flight")
            for url in stack.us:
                refused = _post(url, key)
                assert refused.status_code == 429, refused.text
                assert "concurrent" in refused.json()["error"]["message"]
                assert refused.headers["retry-after"] == "1"
            for port in stack.replica_ports:
                set_fault(port, "none")
            assert [f.result().status_code for f in held] == [200] * CONCURRENT
        eventually(lambda: r.zcard(slots) == 0, what="every slot back")
        assert _post(stack.us[1], key).status_code == 200
        r.close()
    finally:
        for port in stack.replica_ports:
            set_fault(port, "none")
