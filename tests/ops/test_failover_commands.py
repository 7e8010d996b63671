"""The operator's commands for planned moves: failover/failback and drain/undrain."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from fleet.models import Balancer, Event, Replica
from tests.support.commands import run_command


def test_failover_then_failback_moves_a_region_and_back(demo_fleet: None) -> None:
    text = run_command("failover", "--from", "ap-southeast", "--to", "us-east")
    assert "ap-southeast-r1: home -> us-east-lb" in text
    assert "2 replica(s) moved" in text
    owners = set(
        Replica.objects.filter(region__name="ap-southeast").values_list(
            "balancer__name", "handover"
        )
    )
    assert owners == {("us-east-lb", "planned")}
    event = Event.objects.get(kind="failover")
    assert event.data["planned"] is True and event.data["rtt_ms"] == 150

    text = run_command("failback", "--region", "ap-southeast")
    assert "ap-southeast-r2: us-east-lb -> home" in text
    assert set(
        Replica.objects.filter(region__name="ap-southeast").values_list("balancer", flat=True)
    ) == {None}
    assert Event.objects.filter(kind="failback").exists()


def test_failback_refuses_while_home_is_down_unless_forced(demo_fleet: None) -> None:
    run_command("failover", "--from", "eu-west", "--to", "us-east")
    Balancer.objects.filter(name="eu-west-lb").update(state="down")
    with pytest.raises(CommandError, match="home balancer is down"):
        run_command("failback", "--region", "eu-west")
    assert "3 replica(s) back home" in run_command("failback", "--region", "eu-west", "--force")


def test_drain_and_undrain(demo_fleet: None) -> None:
    assert run_command("drain_replica", "us-east-r1").strip() == "us-east-r1: ready -> draining"
    assert Replica.objects.get(name="us-east-r1").state == Replica.State.DRAINING
    with pytest.raises(CommandError, match="only a ready replica can be drained"):
        run_command("drain_replica", "us-east-r1")
    assert run_command("undrain_replica", "us-east-r1").strip() == "us-east-r1: draining -> ready"
    with pytest.raises(CommandError, match="not draining"):
        run_command("undrain_replica", "us-east-r1")
    kinds = list(Event.objects.filter(subject="us-east-r1").values_list("kind", flat=True))
    assert sorted(kinds) == ["replica_draining", "replica_undrained"]
