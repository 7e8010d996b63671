"""The simulator's queue and forwarding behave as production's (SkyLB §3.1, §3.3).

Each scenario is small enough to reason about exactly: which requests wait in
the balancer's FCFS queue, which are forwarded, how much a forward costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from core.dispatch import Ticket
from core.remote import Placement
from sim.des.balancer import SimBalancer
from sim.des.calls import SimCall
from sim.des.config import SimConfig
from sim.des.metrics import summarize
from sim.des.replica import Generation
from sim.des.world import World, simulate
from sim.engine import EngineRequest
from tests.sim.des.conftest import SINGLE_TURN


def test_sp_p_holds_a_burst_in_the_balancer_and_releases_it_fcfs(
    make_config: Callable[..., SimConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(
        workload=SINGLE_TURN,
        replicas={"us-east": 1},
        clients={"us-east": 8},
        max_requests=8,
        pushing="sp-p",
    )
    world = World(config)
    replica = world.replicas["us-east-r1"]
    arrived: list[str] = []
    waiting_seen: list[int] = []
    submit = replica.submit

    def logged(request: EngineRequest, generation: Generation) -> None:
        arrived.append(request.request_id)
        waiting_seen.append(replica.engine.num_waiting)
        submit(request, generation)

    monkeypatch.setattr(replica, "submit", logged)
    run = world.run()
    assert arrived == [r.request_id for r in run.records]  # sent together, served FCFS
    assert sum(r.journey.queue_wait > 0 for r in run.records) >= 6
    # Pushed only to an available replica: never onto a queue the engine already has.
    assert max(waiting_seen) <= 1


def test_blind_pushing_never_queues_in_the_balancer(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(
        workload=SINGLE_TURN, replicas={"us-east": 1}, clients={"us-east": 8}, pushing="blind"
    )
    run = simulate(config)
    assert all(r.journey.queue_wait == 0 for r in run.records)


def test_a_region_without_replicas_forwards_everything_and_pays_the_rtt(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(
        replicas={"ap-southeast": 0, "us-east": 1},
        clients={"ap-southeast": 3},
        max_requests=12,
    )
    run = simulate(config)
    rtt = config.rtt_s("ap-southeast", "us-east")
    assert summarize(run).forwarded_share == 1.0
    assert all(r.journey.served_region == "us-east" for r in run.records)
    assert all(r.ttft is not None and r.ttft > rtt for r in run.records)


def test_a_forward_costs_one_rtt_on_the_first_token_and_on_the_answer(
    make_config: Callable[..., SimConfig],
) -> None:
    # The same first request, once served in its own region and once forwarded.
    common = {"clients": {"eu-west": 1}, "max_requests": 1, "workload": SINGLE_TURN}
    local = simulate(make_config(replicas={"eu-west": 1, "us-east": 0}, **common))
    forwarded = simulate(make_config(replicas={"eu-west": 0, "us-east": 1}, **common))
    (here,), (there,) = local.records, forwarded.records
    rtt = local.config.rtt_s("eu-west", "us-east")
    assert there.journey.forwarded and not here.journey.forwarded
    assert there.prompt_tokens == here.prompt_tokens
    assert there.ttft == pytest.approx(here.ttft + rtt)
    assert there.e2e == pytest.approx(here.e2e + rtt)


def test_a_forwarded_request_is_never_forwarded_again(
    make_config: Callable[..., SimConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(
        replicas={"ap-southeast": 0, "us-east": 1, "eu-west": 1},
        clients={"ap-southeast": 10, "us-east": 4, "eu-west": 4},
        max_requests=60,
    )
    forwards: list[bool] = []
    original = SimBalancer._forward

    def spy(self: SimBalancer, ticket: Ticket[SimCall], placement: Placement) -> None:
        forwards.append(ticket.request.forwarded)
        original(self, ticket, placement)

    monkeypatch.setattr(SimBalancer, "_forward", spy)
    summary = summarize(simulate(config))
    assert forwards and not any(forwards)
    assert summary.ok + summary.failed + summary.unfinished == summary.issued == 60


def test_region_local_deployment_never_forwards_even_when_skewed(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(
        replicas={"us-east": 1, "eu-west": 1},
        clients={"us-east": 10, "eu-west": 1},
        deployment="local",
    )
    regional = dataclasses.replace(config, deployment="regional")
    assert summarize(simulate(config)).forwarded_share == 0.0
    assert summarize(simulate(regional)).forwarded_share > 0.0


def test_a_single_balancer_routes_every_region_to_every_replica(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(policy="round_robin", max_requests=30)
    world = World(config)
    assert list(world.balancers) == ["us-east-lb"]
    run = world.run()
    assert {r.journey.served_region for r in run.records} == {"us-east", "eu-west"}
    assert not any(r.journey.forwarded for r in run.records)
    # It knows how far each replica is, as a cost model needs to (the demo's 80 ms).
    router = world.balancers["us-east-lb"].router
    rtt = {t.target_id: t.extra["rtt_ms"] for t in router.targets()}
    assert rtt == {"us-east-r1": 1.0, "us-east-r2": 1.0, "eu-west-r1": 80.0}
