"""Each drill's plan: what to break, how to tell routing reacted, and its time bound.

Bounds come from the configured periods (this process's settings, which ``make run``
shares with the balancers and the worker), plus one poll and
``MERIDIAN_DRILL_SLACK_S`` for scheduling noise:

* preempt: the replica is marked ``preempted`` at injection, so every balancer drops
  it at its next topology refresh (its in-process probe usually notices sooner);
* kill-balancer: the heartbeat expires (TTL), the next heartbeat sync marks the
  balancer down and runs the failover controller, and the balancer that takes over
  adopts the replicas at its next topology refresh (or the killed balancer is back
  first, restarted, and routes to them itself);
* slow-replica: the in-process probe sees the queue build (``failure_threshold``
  probe intervals) or the outstanding count grows at the next dispatch, and
  load-aware selection sends the next requests elsewhere: the replica's share of
  what the balancers dispatch falls (``TrafficMovedAway``).
"""

from __future__ import annotations

from django.conf import settings

from fleet.models import Balancer, DrillRun, Replica
from ops.drills.faults import kill_balancer, loopback_port, set_fault
from ops.drills.reactions import TrafficMovedAway, replicas_left_routing, replicas_taken_over
from ops.drills.runner import DrillPlan
from workers.ownership import balancers_serving
from workers.replica_states import mark_preempted


def _margin() -> float:
    return settings.MERIDIAN_DRILL_POLL_INTERVAL_S + settings.MERIDIAN_DRILL_SLACK_S


def preempt_bound() -> float:
    return settings.MERIDIAN_TOPOLOGY_REFRESH_S + _margin()


def kill_balancer_bound() -> float:
    s = settings
    return (
        s.MERIDIAN_HEARTBEAT_TTL_S
        + s.MERIDIAN_BALANCER_SYNC_PERIOD_S
        + s.MERIDIAN_TOPOLOGY_REFRESH_S
        + _margin()
    )


def slow_replica_bound() -> float:
    s = settings
    return s.MERIDIAN_PROBE_INTERVAL_S * s.MERIDIAN_PROBE_FAILURE_THRESHOLD + _margin()


def _serving_urls(replicas: list[Replica]) -> list[str]:
    balancers = list(Balancer.objects.all())
    return sorted({b.url for r in replicas for b in balancers_serving(r, balancers)})


def preempt_plan(replicas: list[Replica]) -> DrillPlan:
    names = [r.name for r in replicas]

    def inject() -> str:
        for replica in replicas:
            set_fault(replica.url, "die")
        mark_preempted(replicas, reason="drill_preempt")
        return f"die on {', '.join(names)}; marked preempted"

    return DrillPlan(
        kind=DrillRun.Kind.PREEMPT,
        target=", ".join(names),
        bound_s=preempt_bound(),
        inject=inject,
        check=replicas_left_routing(_serving_urls(replicas), names),
    )


def kill_balancer_plan(balancer: Balancer) -> DrillPlan:
    loopback_port(balancer.url)  # refuse before anything is recorded or broken
    ready = Replica.objects.filter(state=Replica.State.READY)
    owned = [r for r in ready if balancer in balancers_serving(r, [balancer])]
    # The killed URL is watched too: whatever answers there after the kill is a new
    # process (a supervisor restarted it before failover was needed), which also
    # serves the region's clients again.
    urls = Balancer.objects.values_list("url", flat=True)

    def inject() -> str:
        killed = kill_balancer(balancer.url)
        return f"SIGKILL {balancer.name} (pid {killed.pid}: {killed.command[:80]})"

    return DrillPlan(
        kind=DrillRun.Kind.KILL_BALANCER,
        target=balancer.name,
        bound_s=kill_balancer_bound(),
        inject=inject,
        check=replicas_taken_over(urls, [r.name for r in owned]),
    )


# Requests dispatched since the fault before a share can say traffic moved: fewer
# and one request more or less to the slowed replica swings its share.
SLOW_REPLICA_MIN_DISPATCHED = 8


def slow_replica_plan(replica: Replica, *, factor: float, duration_s: float) -> DrillPlan:
    moved = TrafficMovedAway(
        _serving_urls([replica]), replica.name, min_dispatched=SLOW_REPLICA_MIN_DISPATCHED
    )

    def inject() -> str:
        moved.mark()
        set_fault(replica.url, "slow", factor=factor)
        return f"{replica.name} {factor:g}x slower for {duration_s:g}s"

    def restore() -> str:
        set_fault(replica.url, "none")
        return f"{replica.name} at normal speed"

    return DrillPlan(
        kind=DrillRun.Kind.SLOW_REPLICA,
        target=f"{replica.name} x{factor:g}",
        bound_s=slow_replica_bound(),
        inject=inject,
        check=moved,
        restore=restore,
        hold_s=duration_s,
    )
