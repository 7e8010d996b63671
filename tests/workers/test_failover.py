"""The failover controller's decisions (SkyLB §4.2) and the operator's planned moves."""

from __future__ import annotations

import pytest

from fleet.models import Balancer, Event, Replica
from tests.support.rows import Rows
from workers.failover import FailoverError, plan_failback, plan_failover, reconcile_ownership
from workers.tasks import failover_balancers


@pytest.fixture
def world(rows: Rows) -> dict[str, object]:
    """us (2 replicas), eu (1), ap (1); eu is 80 ms from us, ap 150 ms from us, 200 from eu."""
    us, eu, ap = rows.region("us"), rows.region("eu"), rows.region("ap")
    rows.rtt(us, eu, 80)
    rows.rtt(us, ap, 150)
    rows.rtt(eu, ap, 200)
    return {
        "us-lb": rows.balancer("us-lb", us),
        "eu-lb": rows.balancer("eu-lb", eu),
        "ap-lb": rows.balancer("ap-lb", ap),
        "us-r1": rows.replica("us-r1", us),
        "us-r2": rows.replica("us-r2", us),
        "eu-r1": rows.replica("eu-r1", eu),
        "ap-r1": rows.replica("ap-r1", ap),
    }


def set_state(name: str, state: str) -> None:
    Balancer.objects.filter(name=name).update(state=state)


def owners() -> dict[str, str | None]:
    return {r.name: r.balancer.name if r.balancer else None for r in Replica.objects.all()}


def test_all_up_moves_nothing(world: dict[str, object]) -> None:
    assert reconcile_ownership() == []
    assert not Event.objects.filter(kind__in=["failover", "failback"]).exists()


def test_dead_region_goes_to_nearest_live_balancer_and_comes_back(world: dict[str, object]) -> None:
    set_state("us-lb", "down")
    moves = reconcile_ownership()
    assert {(m.replica, m.from_owner, m.to_owner) for m in moves} == {
        ("us-r1", "home", "eu-lb"),
        ("us-r2", "home", "eu-lb"),
    }
    assert owners() == {"us-r1": "eu-lb", "us-r2": "eu-lb", "eu-r1": None, "ap-r1": None}
    event = Event.objects.get(kind="failover")
    assert event.data["to_owner"] == "eu-lb" and event.data["rtt_ms"] == 80
    assert sorted(event.data["replicas"]) == ["us-r1", "us-r2"]
    assert {b["name"]: b["state"] for b in event.data["balancers"]} == {"eu-lb": "up"}
    assert reconcile_ownership() == []  # stable while nothing changes

    set_state("us-lb", "up")
    moves = reconcile_ownership()
    assert {(m.kind, m.to_owner) for m in moves} == {("failback", "home")}
    assert owners()["us-r1"] is None
    assert Replica.objects.get(name="us-r1").handover == ""
    assert Event.objects.get(kind="failback").data["from_owner"] == "eu-lb"


def test_takeover_balancer_dying_too_moves_replicas_on(world: dict[str, object]) -> None:
    set_state("us-lb", "down")
    reconcile_ownership()
    set_state("eu-lb", "down")
    reconcile_ownership()
    # us's replicas go to ap (150 ms); eu's own replica goes to the nearest live one too.
    assert owners() == {"us-r1": "ap-lb", "us-r2": "ap-lb", "eu-r1": "ap-lb", "ap-r1": None}
    set_state("eu-lb", "up")
    reconcile_ownership()
    # eu's replica goes home; us's replicas stay with ap while it is up: a live owner is
    # not moved again just because a nearer one came back (no churn of warm caches).
    assert owners()["eu-r1"] is None
    assert owners()["us-r1"] == "ap-lb"


def test_pinned_replica_returns_to_its_pinned_balancer(world: dict[str, object]) -> None:
    us_lb = world["us-lb"]
    Replica.objects.filter(name="us-r1").update(balancer=us_lb)
    set_state("us-lb", "down")
    reconcile_ownership()
    replica = Replica.objects.get(name="us-r1")
    assert (replica.balancer.name, replica.home_balancer.name, replica.handover) == (
        "eu-lb",
        "us-lb",
        "auto",
    )
    set_state("us-lb", "up")
    reconcile_ownership()
    replica.refresh_from_db()
    assert (replica.balancer_id, replica.home_balancer_id) == (us_lb.id, None)  # type: ignore[attr-defined]


def test_no_live_balancer_strands_without_moving(world: dict[str, object]) -> None:
    Balancer.objects.update(state="down")
    assert reconcile_ownership() == []
    assert set(owners().values()) == {None}


def test_planned_failover_stands_until_failback(world: dict[str, object]) -> None:
    moves = plan_failover("eu", "us")
    assert [(m.replica, m.to_owner) for m in moves] == [("eu-r1", "us-lb")]
    assert Event.objects.get(kind="failover").data["planned"] is True
    assert reconcile_ownership() == []  # the controller leaves an operator's move alone
    assert owners()["eu-r1"] == "us-lb"
    plan_failback("eu")
    assert owners()["eu-r1"] is None
    assert Replica.objects.get(name="eu-r1").handover == ""


def test_planned_owner_dying_sends_replicas_home(world: dict[str, object]) -> None:
    plan_failover("eu", "us")
    set_state("us-lb", "down")
    reconcile_ownership()
    assert owners()["eu-r1"] is None
    assert owners()["us-r1"] == "eu-lb"


def test_operator_moves_refuse_what_cannot_work(world: dict[str, object]) -> None:
    with pytest.raises(FailoverError, match="same region"):
        plan_failover("eu", "eu")
    with pytest.raises(FailoverError, match="no region 'mars'"):
        plan_failover("mars", "eu")
    set_state("ap-lb", "down")
    with pytest.raises(FailoverError, match="no live balancer"):
        plan_failover("eu", "ap")
    set_state("eu-lb", "down")
    reconcile_ownership()
    with pytest.raises(FailoverError, match="home balancer is down"):
        plan_failback("eu")
    plan_failback("eu", force=True)
    assert owners()["eu-r1"] is None


def test_celery_task_runs_the_controller(world: dict[str, object]) -> None:
    set_state("ap-lb", "down")
    result = failover_balancers.apply().get()
    assert result == [
        {
            "replica": "ap-r1",
            "region": "ap",
            "kind": "failover",
            "from_owner": "home",
            "to_owner": "us-lb",
        }
    ]
