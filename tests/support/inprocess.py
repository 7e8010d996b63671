"""A real ``BalancerRuntime`` in the test's own event loop, against loopback upstreams.

The runtime is built exactly as a balancer process builds it (its httpx client
for probes and polls, its relay pool, its transport), with its topology set by
hand instead of read from the database: replicas and peers are
``tests.support.upstreams.Upstreams`` servers, so each failure can be placed
exactly (a 500 here, a reset there) while the production clients do the I/O.
Background loops are not started: tests probe and poll when they mean to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from core.block_identity import BlockScheme
from core.openai_request import Endpoint, describe, parse_request
from core.peers import Heartbeat
from core.prompts import FallbackEncoder, prompt_tokens
from core.topology import ModelSpec, PeerSpec, ReplicaSpec, TopologySnapshot
from routing.calls import ProxyCall
from routing.runtime import BalancerConfig, BalancerRuntime
from tests.support.balancers import MODEL
from tests.support.upstreams import Upstreams


def balancer_config(**overrides: Any) -> BalancerConfig:
    values: dict[str, Any] = {
        "balancer": "lb-us",
        "redis_url": "redis://127.0.0.1:1/0",
        "hash_seed": "meridian",
        "tokenizer_json": "",
        "demo": False,
        "topology_refresh_s": 1.0,
        "probe_interval_s": 1.0,
        "probe_timeout_s": 1.0,
        "probe_failure_threshold": 2,
        "heartbeat_interval_s": 1.0,
        "heartbeat_ttl_s": 5.0,
        "connect_timeout_s": 1.0,
        "read_timeout_s": 5.0,
        "max_attempts": 3,
        "max_outstanding": 4,
        "max_body_bytes": 1 << 20,
        "retry_after_s": 2,
        "peer_queue_buffer": 1,
    }
    return BalancerConfig(**{**values, **overrides})


async def runtime_for(
    upstreams: Upstreams,
    *,
    replicas: tuple[str, ...] = ("a", "b"),
    peers: tuple[PeerSpec, ...] = (),
    model: ModelSpec = ModelSpec(MODEL),
    **config: Any,
) -> BalancerRuntime:
    """A runtime owning ``replicas``, with ``peers`` (their URLs are the upstreams'),
    each peer's report saying it has one available replica."""
    rt = BalancerRuntime(balancer_config(**config), asyncio.get_running_loop())
    specs = [
        ReplicaSpec(n, await upstreams.url(n), MODEL, "us", "us-1", "reserved") for n in replicas
    ]
    links = [dataclasses.replace(p, url=await upstreams.url(p.name)) for p in peers]
    rt.adopt(
        TopologySnapshot(
            balancer="lb-us",
            region="us",
            url="http://lb-us",
            replicas=tuple(specs),
            peers=tuple(links),
            models={MODEL: model},
            served_models=frozenset({MODEL}),
        )
    )
    for peer in peers:
        rt.remote.record_report(peer.name, peer_report(peer.name))
    return rt


def peer_report(name: str, *, available: int = 1, healthy: int = 1) -> Heartbeat:
    return Heartbeat(
        name, name, f"http://{name}", time.time(), healthy, available, 0, 0, {MODEL: available}
    )


def proxy_call(
    *, stream: bool = False, forwarded: bool = False, rid: str = "rid", content: str = "hello"
) -> ProxyCall:
    raw = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}
    ).encode()
    request = parse_request(raw, Endpoint.CHAT)
    descriptor = describe(
        request,
        prompt_tokens(request.prompt, FallbackEncoder()),
        request_id=rid,
        session_key="10.0.0.9",
        scheme=BlockScheme(),
        forwarded=forwarded,
    )
    return ProxyCall(request, descriptor, raw, "Bearer mk-test", rid, 0.0)
