"""The simulator against the real thing: one short workload, live and simulated.

Live: two ``python -m sim.serve`` replicas (at ``--time-scale 2``, so the modeled
GPU time dominates the HTTP and Python overheads this shared machine adds) behind
a real daphne balancer running SkyLB with SP-P, then Meridian's cost model with
token admission (the default policy), driven by ``replay``'s own runner through
the official ``openai`` client.  Simulated: the same workload, seed, engine,
policy, probe interval and time scale in ``sim.des``.  The two must
agree on the KV hit rate within a few points and on the median TTFT within
~20 %, at small scale (SkyLB's metrics, §5).  Each policy takes ~20 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ops.embedded_redis import EmbeddedRedis
from ops.replay.service import ReplayConfig, run_replay
from ops.replay.stats import ReplaySnapshot
from sim.des.config import MODEL, SimConfig, TimingConfig
from sim.des.metrics import Summary, summarize
from sim.des.world import simulate
from tests.support.balancers import TopologyFactory, start_balancer
from tests.support.django_env import child_process_env
from tests.support.processes import ProcessGroup, free_port
from tests.support.sim_serve import serve_replicas

pytestmark = pytest.mark.integration

WORKLOAD = (
    "conversations:system_tokens=256,users=4,turns_min=2,turns_max=3,"
    "user_tokens_min=150,user_tokens_max=250,max_tokens_min=6,max_tokens_max=10"
)
CLIENTS, REQUESTS, SEED = 3, 24, 5
TIME_SCALE, PROBE_INTERVAL_S = 2.0, 0.2


@pytest.fixture(scope="module", params=["skylb", "meridian"])
def balancer_url(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    django_db_blocker: Any,
    redis_server: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, str]]:
    policy: str = request.param
    group = ProcessGroup(tmp_path_factory.mktemp(f"fidelity-{policy}"))
    factory = TopologyFactory()
    with django_db_blocker.unblock():
        try:
            region = factory.region("fid")
            factory.service(model=MODEL, policy=policy)
            key = factory.api_key("fidelity")
            ports = {f"fid-r{n}": free_port() for n in (1, 2)}
            for name, port in ports.items():
                factory.replica(name, region, port, model=MODEL)
            serve_replicas(
                group, "fid-replicas", ports, "--time-scale", str(TIME_SCALE), model=MODEL
            )
            port = free_port()
            factory.balancer("fid-lb", region, port)
            env = child_process_env(redis_server.url)
            url = start_balancer(
                group, env, "fid-lb", port, MERIDIAN_PROBE_INTERVAL_S=str(PROBE_INTERVAL_S)
            )
            yield url, key, policy
        finally:
            group.stop_all()
            factory.delete_all()


def live(url: str, key: str) -> ReplaySnapshot:
    config = ReplayConfig(
        workload=WORKLOAD,
        base_url=url,
        api_key=key,
        model=MODEL,
        clients=CLIENTS,
        max_requests=REQUESTS,
        seed=SEED,
    )
    return asyncio.run(run_replay(config, signals=()))


def simulated(policy: str) -> Summary:
    config = SimConfig(
        workload=WORKLOAD,
        policy=policy,
        replicas={"fid": 2},
        clients={"fid": CLIENTS},
        max_requests=REQUESTS,
        seed=SEED,
        time_scale=TIME_SCALE,
        timing=TimingConfig(probe_interval_s=PROBE_INTERVAL_S),
    )
    return summarize(simulate(config))


@pytest.mark.django_db  # reads nothing; makes pytest-django create the test database
def test_live_fleet_and_simulator_agree_on_hit_rate_and_median_ttft(
    balancer_url: tuple[str, str, str],
) -> None:
    url, key, policy = balancer_url
    measured, model = live(url, key), simulated(policy)
    assert (measured.ok, model.ok) == (REQUESTS, REQUESTS), measured.error_messages
    live_hit = measured.cached_tokens / measured.prompt_tokens
    # The same requests, give or take which program the budget cut short.
    assert measured.prompt_tokens == pytest.approx(model.prompt_tokens, rel=0.1)
    # Measured: 57-58 % live, 54 % simulated (routing ties break on probe timing).
    assert abs(live_hit - model.hit_rate) <= 0.06, (live_hit, model.hit_rate)
    assert measured.ttft_p50 is not None and model.ttft["p50"] is not None
    assert model.ttft["p50"] == pytest.approx(measured.ttft_p50, rel=0.2), (
        measured.ttft_p50,
        model.ttft,
    )
