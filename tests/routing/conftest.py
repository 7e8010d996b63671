"""Fixtures for the balancer's tests.

In-process async tests run on asyncio (the balancer's loop under daphne).

In-process tests (``build_runtime``) use a real ``BalancerRuntime`` with its
topology set by hand and its shared client replaced by an in-memory transport
(``Upstreams``) that plays replicas and peer balancers, so each failure can be
placed exactly (a 500 here, a reset there).

Integration tests start real processes: emulated replicas (``python -m sim.serve``)
and balancers (``daphne meridian.asgi:application`` with ``MERIDIAN_BALANCER``),
sharing them across a module because each start costs a Django import.  The
topology rows those processes read are written by ``TopologyFactory`` through
``django_db_blocker`` and committed at once (a module outlives any one test's
transaction), then deleted when the module ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai
import pytest

from ops.embedded_redis import EmbeddedRedis
from routing.core.engine_metrics import parse_samples
from routing.core.openai_request import Endpoint, describe, parse_request
from routing.core.peers import Heartbeat
from routing.core.tokenizer import WordTokenizer
from routing.core.topology import ModelSpec, PeerSpec, ReplicaSpec, TopologySnapshot
from routing.dispatch import ProxyCall
from routing.runtime import BalancerConfig, BalancerRuntime
from tests.support.django_env import child_process_env
from tests.support.processes import ProcessGroup, wait_http

MODEL = "meridian-test"
T = TypeVar("T")


@pytest.fixture
def anyio_backend() -> str:
    # The balancer runs on asyncio (daphne's Twisted asyncio reactor); test on it only.
    return "asyncio"


# -- in-process runtime ------------------------------------------------------------------

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]
OK_BODY = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 16},
    },
}
SSE = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 1}}\n\n'
    b"data: [DONE]\n\n"
)


class Upstreams:
    """Replicas and peers by host name; each answers with what the test scripted."""

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[httpx.Request] = []
        self.waiting: dict[str, int] = {}  # what each replica's /metrics shows

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/metrics":
            waiting = self.waiting.get(host, 0)
            text = f"vllm:num_requests_running 1\nvllm:num_requests_waiting {waiting}\n"
            return httpx.Response(200, text=text)
        self.calls.append(request)
        mode = self.behaviour.get(host, "ok")
        if mode == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        if mode in {"500", "503", "429"}:
            return _response(int(mode), json.dumps({"error": {"message": mode}}).encode())
        if mode == "reset":
            return httpx.Response(200, stream=_ResetStream())
        if json.loads(request.content).get("stream"):
            return _response(200, SSE, content_type="text/event-stream")
        return _response(200, json.dumps(OK_BODY).encode(), {"X-Meridian-Replica": f"{host}-r"})

    def hosts(self) -> list[str]:
        return [r.url.host for r in self.calls]


def _response(
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> httpx.Response:
    """A response whose body arrives like a network one (streamed, not preloaded)."""
    return httpx.Response(
        status, stream=_Body(body), headers={"content-type": content_type, **(headers or {})}
    )


class _Body(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body


class _ResetStream(httpx.AsyncByteStream):
    async def __aiter__(self) -> Any:
        raise httpx.RemoteProtocolError("connection reset before the first byte")
        yield b""  # pragma: no cover - makes this an async generator


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


@pytest.fixture
async def build_runtime() -> AsyncIterator[Callable[..., Awaitable[BalancerRuntime]]]:
    made: list[BalancerRuntime] = []

    async def make(
        upstreams: Upstreams,
        *,
        replicas: tuple[str, ...] = ("a", "b"),
        peers: tuple[PeerSpec, ...] = (),
        model: ModelSpec = ModelSpec(MODEL),
        **config: Any,
    ) -> BalancerRuntime:
        rt = BalancerRuntime(balancer_config(**config), asyncio.get_running_loop())
        await rt.client.aclose()
        rt.client = httpx.AsyncClient(transport=httpx.MockTransport(upstreams))
        rt.prober.client = rt.poller.client = rt.kv.client = rt.client
        await rt.upstream.aclose()
        rt.upstream = rt.client  # the relay takes either client; the mock answers both
        specs = tuple(
            ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in replicas
        )
        rt.snapshot = TopologySnapshot(
            balancer="lb-us",
            region="us",
            url="http://lb-us",
            replicas=specs,
            peers=peers,
            models={MODEL: model},
            served_models=frozenset({MODEL}),
        )
        rt.adopt(rt.snapshot)
        for peer in peers:
            rt.remote.record_report(peer.name, peer_report(peer.name))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.close()


def peer_report(name: str, *, available: int = 1) -> Heartbeat:
    return Heartbeat(
        name, name, f"http://{name}", time.time(), 1, available, 0, 0, {MODEL: available}
    )


def proxy_call(*, stream: bool = False, forwarded: bool = False, rid: str = "rid") -> ProxyCall:
    raw = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    ).encode()
    request = parse_request(raw, Endpoint.CHAT)
    descriptor = describe(
        request,
        WordTokenizer(),
        request_id=rid,
        session_key="10.0.0.9",
        hash_seed="meridian",
        forwarded=forwarded,
    )
    return ProxyCall(request, descriptor, raw, "Bearer mk-test", rid, 0.0)


# -- topology rows ---------------------------------------------------------------------


@dataclass
class TopologyFactory:
    """Creates committed Region/Zone/Balancer/Replica/ServiceConfig/ApiKey rows."""

    created: list[Any] = field(default_factory=list)

    def _keep(self, obj: T) -> T:
        self.created.append(obj)
        return obj

    def region(self, name: str) -> Any:
        from fleet.models import Region, Zone

        region = self._keep(Region.objects.create(name=name))
        Zone.objects.create(region=region, name=f"{name}-1")
        return region

    def latency(self, source: Any, target: Any, rtt_ms: float) -> None:
        from fleet.models import RegionLatency

        RegionLatency.objects.create(source=source, target=target, rtt_ms=rtt_ms)

    def balancer(self, name: str, region: Any, port: int) -> Any:
        from fleet.models import Balancer

        return Balancer.objects.create(name=name, region=region, url=f"http://127.0.0.1:{port}")

    def replica(
        self,
        name: str,
        region: Any,
        port: int,
        *,
        state: str = "ready",
        balancer: Any = None,
        model: str = MODEL,
    ) -> Any:
        from fleet.models import Replica

        return Replica.objects.create(
            name=name,
            url=f"http://127.0.0.1:{port}",
            model_name=model,
            region=region,
            zone=region.zones.get(),
            balancer=balancer,
            state=state,
        )

    def service(self, model: str = MODEL, policy: str = "least_load", **fields: Any) -> Any:
        """A ServiceConfig; ``fields`` sets the rest (policy_params, queue bounds)."""
        from fleet.models import ServiceConfig

        return self._keep(ServiceConfig.objects.create(model_name=model, policy=policy, **fields))

    def api_key(self, name: str = "tests") -> str:
        from fleet.models import ApiKey

        key, raw = ApiKey.issue(name)
        self._keep(key)
        return raw

    def delete_all(self) -> None:
        # Regions cascade to zones, latencies, balancers and replicas.
        for obj in reversed(self.created):
            obj.delete()
        self.created.clear()


@pytest.fixture(scope="module")
def topology(django_db_setup: None, django_db_blocker: Any) -> Iterator[TopologyFactory]:
    factory = TopologyFactory()
    with django_db_blocker.unblock():
        yield factory
        factory.delete_all()


@pytest.fixture(scope="module")
def child_env(topology: TopologyFactory, redis_server: EmbeddedRedis) -> dict[str, str]:
    """Environment for balancer processes: this session's test database and Redis.

    Module-scoped twin of the suite's ``django_subprocess_env`` (which is
    function-scoped because it rides on the ``db`` fixture)."""
    return child_process_env(redis_server.url)


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path_factory.mktemp("routing-processes"))
    yield group
    group.stop_all()


# -- processes -------------------------------------------------------------------------


def start_replicas(
    group: ProcessGroup, label: str, ports: dict[str, int], *extra: str, model: str = MODEL
) -> Any:
    """One ``sim.serve`` process serving ``ports`` (name → port); returns the Popen.

    ``extra`` goes on its command line (``--max-num-seqs 2`` fills a batch fast)."""
    args = ["-m", "sim.serve", "--model", model, "--time-scale", "0.02", *extra]
    for name, port in ports.items():
        args += ["--replica", f"{name}={port}"]
    process = group.python(label, *args)
    for port in ports.values():
        wait_http(f"http://127.0.0.1:{port}/health", process=process)
    return process


def start_balancer(
    group: ProcessGroup, env: dict[str, str], name: str, port: int, **overrides: str
) -> str:
    """A daphne balancer process playing ``name``; returns its URL once it routes."""
    full_env = {
        **env,
        "MERIDIAN_BALANCER": name,
        "MERIDIAN_TOPOLOGY_REFRESH_S": "0.5",
        "MERIDIAN_PROBE_INTERVAL_S": "0.2",
        "MERIDIAN_HEARTBEAT_INTERVAL_S": "0.2",
        "MERIDIAN_HEARTBEAT_TTL_S": "2",
        "MERIDIAN_AVAILABILITY_INTERVAL_S": "0.2",
        "MERIDIAN_AVAILABILITY_TTL_S": "2",
        **overrides,
    }
    argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "meridian.asgi:application"]
    process = group.python(name, *argv, env=full_env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process=process, timeout=30)
    eventually(lambda: httpx.get(f"{url}/health").status_code == 200, what=f"{name} healthy")
    return url


def kill_process_group(process: Any) -> None:
    """SIGKILL, as a crashed host would: no graceful shutdown, sockets reset."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# -- observing -------------------------------------------------------------------------


def eventually(check: Callable[[], T], *, what: str, timeout: float = 20.0) -> T:
    """Poll ``check`` until it returns something truthy (a readiness wait, not a timing claim)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except httpx.HTTPError as exc:
            last = exc
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: still not true after {timeout}s (last: {last!r})")


def samples(url: str) -> dict[str, list[float]]:
    return parse_samples(httpx.get(f"{url}/metrics").text)


def metric_value(url: str, line_prefix: str) -> float:
    """Sum of the samples whose line starts with ``line_prefix`` (name plus labels)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def state(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/internal/state")
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def replica_waiting(port: int) -> float:
    """The emulated replica's own ``vllm:num_requests_waiting``."""
    return sum(samples(f"http://127.0.0.1:{port}").get("vllm:num_requests_waiting", [0.0]))


def set_fault(port: int, mode: str, **extra: float) -> None:
    httpx.post(f"http://127.0.0.1:{port}/fault", json={"mode": mode, **extra}).raise_for_status()


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
