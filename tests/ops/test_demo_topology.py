from __future__ import annotations

import pytest

from fleet.models import Balancer, RegionLatency, Replica, ServiceConfig, Zone
from ops.demo import DEMO_MODEL, plan_demo, seed_demo


def test_plan_is_unbalanced_four_three_two_with_distinct_ports() -> None:
    topology = plan_demo("127.0.0.1", 8100, 9100)
    counts = {r: len(topology.replicas_in(r)) for r in ("us-east", "eu-west", "ap-southeast")}
    assert counts == {"us-east": 4, "eu-west": 3, "ap-southeast": 2}
    ports = [b.port for b in topology.balancers] + [r.port for r in topology.replicas]
    assert len(ports) == len(set(ports)) == 12


@pytest.mark.django_db
def test_seeding_twice_gives_one_consistent_topology() -> None:
    topology = plan_demo("127.0.0.1", 8100, 9100)
    seed_demo(topology)
    Replica.objects.filter(name="us-east-r1").update(state=Replica.State.READY)
    seed_demo(topology)
    assert Replica.objects.count() == 9
    assert Zone.objects.count() == 6
    assert Balancer.objects.count() == 3
    assert ServiceConfig.objects.get().model_name == DEMO_MODEL
    # Re-seeding resets replicas to starting: the probe, not the seed, decides readiness.
    assert set(Replica.objects.values_list("state", flat=True)) == {"starting"}
    rtt = {(x.source.name, x.target.name): x.rtt_ms for x in RegionLatency.objects.all()}
    assert rtt[("us-east", "eu-west")] == rtt[("eu-west", "us-east")] == 80.0
    assert len(rtt) == 6
    for replica in Replica.objects.select_related("zone", "region"):
        assert replica.zone.region_id == replica.region_id
        assert replica.hourly_price > 0
    kinds = set(Replica.objects.values_list("kind", flat=True))
    assert kinds == {"reserved", "on-demand", "spot"}
