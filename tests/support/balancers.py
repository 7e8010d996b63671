"""Real replica and balancer processes on loopback ports, and how tests observe them.

Integration tests start emulated replicas (``python -m sim.serve``) and balancers
(``daphne meridian.asgi:application`` with ``MERIDIAN_BALANCER``), reading the
topology rows ``TopologyFactory`` commits (through ``django_db_blocker``: a module
outlives any one test's transaction; ``delete_all`` removes them when it ends).
The observers read what an operator would: ``/health``, ``/metrics``,
``/internal/state`` and the replicas' own gauges.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai
from django.conf import settings

from core.engine_metrics import parse_samples
from ops import http_probe
from ops.drills.redis_outage import every_process_sharing
from routing.calls import HOP_HEADER
from routing.internal_auth import PEER_TOKEN_HEADER, install_headers
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, wait_http
from tests.support.sim_serve import serve_replicas

MODEL = "meridian-test"
T = TypeVar("T")


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


# -- processes -------------------------------------------------------------------------


def start_replicas(
    group: ProcessGroup, label: str, ports: dict[str, int], *extra: str, model: str = MODEL
) -> subprocess.Popen[bytes]:
    """``sim_serve.serve_replicas`` for the balancer tests' model."""
    return serve_replicas(group, label, ports, *extra, model=model)


def balancer_env(env: dict[str, str], name: str, **overrides: str) -> dict[str, str]:
    """A test balancer's settings: fast periods, so tests wait little."""
    return {
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


def start_shared_port_balancer(
    group: ProcessGroup, env: dict[str, str], name: str, port: int, processes: int
) -> str:
    """``processes`` uvicorn processes playing ``name`` on one port (``SO_REUSEPORT``),
    sharing state through Redis; returns the URL once each one answers."""
    from ops.stack.plan import shared_port_argv

    full_env = balancer_env(env, name, MERIDIAN_SHARED_STATE="1")
    for index in range(1, processes + 1):
        group.start(f"{name}#{index}", shared_port_argv("127.0.0.1", port), env=full_env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout=30)
    eventually(
        lambda: every_process_sharing(url, processes),
        what=f"every one of {processes} processes of {name} sharing state",
    )
    return url


def start_balancer(
    group: ProcessGroup, env: dict[str, str], name: str, port: int, **overrides: str
) -> str:
    """A daphne balancer process playing ``name``; returns its URL once it routes."""
    argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "meridian.asgi:application"]
    process = group.python(name, *argv, env=balancer_env(env, name, **overrides))
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process=process, timeout=30)
    eventually(lambda: http_probe.get(f"{url}/health").status_code == 200, what=f"{name} healthy")
    return url


def kill_process_group(process: Any) -> None:
    """SIGKILL, as a crashed host would: no graceful shutdown, sockets reset."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# -- observing -------------------------------------------------------------------------


def samples(url: str) -> dict[str, list[float]]:
    return parse_samples(http_probe.get(f"{url}/metrics").text)


def metric_value(url: str, line_prefix: str) -> float:
    """Sum of the samples whose line starts with ``line_prefix`` (name plus labels)."""
    total = 0.0
    for line in http_probe.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def peer_forward_headers(peer: str) -> dict[str, str]:
    """The headers a peer balancer of this install sends with a forward."""
    return {HOP_HEADER: peer, PEER_TOKEN_HEADER: settings.MERIDIAN_INTERNAL_TOKEN}


def state(url: str) -> dict[str, Any]:
    response = http_probe.get(f"{url}/internal/state", headers=install_headers())
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def replica_waiting(port: int) -> float:
    """The emulated replica's own ``vllm:num_requests_waiting``."""
    return sum(samples(f"http://127.0.0.1:{port}").get("vllm:num_requests_waiting", [0.0]))


def set_fault(port: int, mode: str, **extra: float) -> None:
    url = f"http://127.0.0.1:{port}/fault"
    http_probe.post(url, json={"mode": mode, **extra}).raise_for_status()


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
