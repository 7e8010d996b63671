"""A small multi-region cluster of real processes for control-plane tests.

Regions of emulated replicas (``python -m sim.serve``, one process per region) and
one daphne balancer per region, as ``tests/routing`` starts them, with committed
topology rows (the processes read the database).  Control-plane tests act on it the
way operators and Celery do: through the database, Redis and the processes' HTTP.

Rows are committed outside any test transaction (``django_db_blocker.unblock``), so
``teardown`` deletes what the module created, including the history the control
plane wrote (events, drill runs, rollups), which a later test in the session must
not see.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    kill_process_group,
    start_balancer,
    start_shared_port_balancer,
    state,
)
from tests.support.django_env import child_process_env
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port
from tests.support.sim_serve import serve_replicas

# What ``start_balancer`` configures the balancers with (the control plane must agree).
BALANCER_TOPOLOGY_REFRESH_S = 0.5
BALANCER_HEARTBEAT_TTL_S = 2.0


@dataclass
class BalancerProcess:
    name: str
    region: str
    port: int
    process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    group: ProcessGroup
    env: dict[str, str]
    factory: TopologyFactory
    key: str = ""
    balancers: dict[str, BalancerProcess] = field(default_factory=dict)
    replicas: dict[str, str] = field(default_factory=dict)  # name -> region
    # Processes per balancer: more than one share its port (SO_REUSEPORT) and state.
    processes: int = 1
    # Settings for every balancer process on top of the test defaults (``balancer_env``).
    overrides: dict[str, str] = field(default_factory=dict)

    def region_replicas(self, region: str) -> list[str]:
        return sorted(name for name, r in self.replicas.items() if r == region)

    def start_balancer(self, name: str, **overrides: str) -> str:
        lb = self.balancers[name]
        if self.processes > 1:
            return start_shared_port_balancer(self.group, self.env, name, lb.port, self.processes)
        url = start_balancer(self.group, self.env, name, lb.port, **self.overrides, **overrides)
        lb.process = self.group.processes[-1]
        return url

    def kill_balancer(self, name: str) -> None:
        kill_process_group(self.balancers[name].process)

    def routed_by(self, balancer: str) -> set[str]:
        return {row["name"] for row in state(self.balancers[balancer].url)["replicas"]}

    def wait_routed(self, balancer: str, names: set[str], *, healthy: bool = True) -> None:
        def ready() -> bool:
            rows = state(self.balancers[balancer].url)["replicas"]
            seen = {r["name"] for r in rows if r["healthy"] or not healthy}
            return names <= seen

        eventually(ready, what=f"{balancer} routes to {sorted(names)}", timeout=30)


def _populate(
    cluster: Cluster,
    regions: dict[str, int],
    rtts: dict[tuple[str, str], float],
    policy: str,
) -> None:
    from fleet.models import ServiceConfig

    rows = {name: cluster.factory.region(name) for name in regions}
    for (a, b), ms in rtts.items():
        cluster.factory.latency(rows[a], rows[b], ms)
        cluster.factory.latency(rows[b], rows[a], ms)
    ServiceConfig.objects.filter(model_name=MODEL).delete()
    cluster.factory.service(policy=policy)
    cluster.key = cluster.factory.api_key()
    for region, count in regions.items():
        ports = {f"{region}-r{n}": free_port() for n in range(1, count + 1)}
        for name, port in ports.items():
            cluster.factory.replica(name, rows[region], port)
            cluster.replicas[name] = region
        serve_replicas(cluster.group, f"replicas-{region}", ports, model=MODEL)
        lb = BalancerProcess(f"{region}-lb", region, free_port())
        cluster.factory.balancer(lb.name, rows[region], lb.port)
        cluster.balancers[lb.name] = lb
    for name in cluster.balancers:
        cluster.start_balancer(name)


def teardown(cluster: Cluster) -> None:
    from fleet.models import ApiKey, DrillRun, Event, MetricRollup

    cluster.group.stop_all()
    cluster.factory.delete_all()
    for model in (Event, DrillRun, MetricRollup):
        model.objects.all().delete()
    ApiKey.objects.filter(name__startswith="drill").delete()


@contextmanager
def running_cluster(
    group: ProcessGroup,
    redis_url: str,
    regions: dict[str, int],
    rtts: dict[tuple[str, str], float],
    *,
    policy: str = "round_robin",
    processes: int = 1,
    overrides: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """``regions``: name -> replica count.  Names: ``<region>-lb``, ``<region>-r<n>``;
    ``processes`` per balancer, each started with ``overrides`` on top of the test
    balancers' settings."""
    cluster = Cluster(
        group,
        child_process_env(redis_url),
        TopologyFactory(),
        processes=processes,
        overrides=dict(overrides or {}),
    )
    try:
        _populate(cluster, regions, rtts, policy)
        yield cluster
    finally:
        teardown(cluster)
