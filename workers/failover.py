"""Balancer failover (SkyLB §4.2): hand a dead balancer's replicas to the nearest
live balancer, and hand them back when it recovers.

The controller (``reconcile_ownership``, run by Celery beat and right after a
heartbeat sync that saw a transition) looks at every replica:

* served at home and home is down → hand over to the nearest live balancer
  (``handover=auto``, home remembered in ``home_balancer``);
* handed over by the controller and home is up again → hand back;
* handed over (by anyone) to a balancer that is now down → home if it is up,
  else the nearest live balancer (SkyLB tolerates concurrent balancer failures).

Operator moves (``plan_failover`` / ``plan_failback``, the ``failover`` and
``failback`` commands) set ``handover=planned``; the controller leaves those alone
while their owner is up, so a planned move is not undone by the next beat.

Balancers pick ownership up at their next topology refresh (the request path never
reads the database).  Each move is one Event per (from, to) group, with the inputs
the decision was made from: states, last heartbeats and the RTT.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import transaction

from fleet.models import Balancer, Event, Region, Replica
from workers.ownership import LatencyMap, home_is_live, is_live, nearest_live_balancer

logger = logging.getLogger(__name__)

HOME = "home"


class FailoverError(ValueError):
    """An operator move that cannot be made (unknown region, nobody live to take it)."""


@dataclass(frozen=True)
class Move:
    replica: str
    region: str
    kind: str  # failover | failback
    from_owner: str  # a balancer name or HOME
    to_owner: str


@dataclass
class _Plan:
    moves: list[Move] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)


def _owner_name(balancer_id: int | None, by_id: dict[int, Balancer]) -> str:
    return by_id[balancer_id].name if balancer_id in by_id else HOME


def reconcile_ownership() -> list[Move]:
    """One controller pass; returns the moves it made."""
    with transaction.atomic():
        balancers = list(Balancer.objects.select_related("region"))
        by_id = {b.id: b for b in balancers}
        latencies = LatencyMap.load()
        plan = _Plan()
        replicas = Replica.objects.select_for_update().select_related("region")
        for replica in replicas.exclude(state=Replica.State.TERMINATED):
            _decide(replica, by_id, latencies, plan)
        if plan.stranded:
            # Logged, not an Event: it repeats every beat until a balancer comes back.
            logger.warning("no live balancer can take %s", ", ".join(plan.stranded))
        _record_moves(plan.moves, by_id, latencies)
    return plan.moves


def _decide(
    replica: Replica, by_id: dict[int, Balancer], latencies: LatencyMap, plan: _Plan
) -> None:
    home_live = home_is_live(replica, by_id)
    owner = by_id.get(replica.balancer_id) if replica.balancer_id else None
    if replica.handover == Replica.Handover.NONE:
        if not home_live:
            _hand_over(replica, by_id, latencies, plan, home=replica.balancer_id)
        return
    if is_live(owner) and (replica.handover == Replica.Handover.PLANNED or not home_live):
        return  # a planned move stands while its owner is up; an auto one until home is
    if home_live:
        _hand_back(replica, by_id, plan)
    else:
        _hand_over(replica, by_id, latencies, plan, home=replica.home_balancer_id)


def _hand_over(
    replica: Replica,
    by_id: dict[int, Balancer],
    latencies: LatencyMap,
    plan: _Plan,
    *,
    home: int | None,
) -> None:
    exclude = frozenset(b for b in (home, replica.balancer_id) if b is not None)
    target = nearest_live_balancer(replica.region_id, by_id.values(), latencies, exclude=exclude)
    if target is None:
        plan.stranded.append(replica.name)
        return
    move = Move(
        replica.name,
        replica.region.name,
        "failover",
        _owner_name(replica.balancer_id, by_id),
        target.name,
    )
    replica.balancer, replica.home_balancer_id = target, home
    replica.handover = Replica.Handover.AUTO
    replica.save(update_fields=["balancer", "home_balancer", "handover"])
    plan.moves.append(move)


def _hand_back(replica: Replica, by_id: dict[int, Balancer], plan: _Plan) -> None:
    home = replica.home_balancer_id
    move = Move(
        replica.name,
        replica.region.name,
        "failback",
        _owner_name(replica.balancer_id, by_id),
        _owner_name(home, by_id),
    )
    replica.balancer_id, replica.home_balancer_id = home, None
    replica.handover = Replica.Handover.NONE
    replica.save(update_fields=["balancer", "home_balancer", "handover"])
    plan.moves.append(move)


def _balancer_facts(balancer: Balancer) -> dict[str, object]:
    beat = balancer.last_heartbeat.isoformat() if balancer.last_heartbeat else None
    return {
        "name": balancer.name,
        "region": balancer.region.name,
        "state": balancer.state,
        "last_heartbeat": beat,
    }


def _record_moves(
    moves: list[Move], by_id: dict[int, Balancer], latencies: LatencyMap, *, planned: bool = False
) -> None:
    groups: dict[tuple[str, str, str], list[Move]] = defaultdict(list)
    for move in moves:
        groups[(move.kind, move.from_owner, move.to_owner)].append(move)
    by_name = {b.name: b for b in by_id.values()}
    for (kind, source, target), group in groups.items():
        regions = sorted({m.region for m in group})
        involved = [by_name[n] for n in (source, target) if n in by_name]
        rtt = _rtt_ms(regions, by_name.get(target), latencies)
        why = "by the operator" if planned else "by the failover controller"
        Event.record(
            kind,
            f"{len(group)} replica(s) of {', '.join(regions)} moved from {source} to {target} "
            f"{why}" + (f" ({rtt:g} ms away)" if rtt is not None else ""),
            subject=", ".join(regions),
            severity=Event.Severity.WARNING if kind == "failover" else Event.Severity.INFO,
            replicas=[m.replica for m in group],
            from_owner=source,
            to_owner=target,
            regions=regions,
            rtt_ms=rtt,
            planned=planned,
            balancers=[_balancer_facts(b) for b in involved],
        )


def _rtt_ms(regions: list[str], target: Balancer | None, latencies: LatencyMap) -> float | None:
    if target is None or len(regions) != 1:
        return None
    region_id = Region.objects.filter(name=regions[0]).values_list("id", flat=True).first()
    if region_id is None:
        return None
    rtt = latencies.rtt(region_id, target.region_id)
    return None if rtt == float("inf") else rtt


# -- operator moves --------------------------------------------------------------------


def plan_failover(from_region: str, to_region: str) -> list[Move]:
    """Move every replica of ``from_region`` to a live balancer of ``to_region``."""
    if from_region == to_region:
        raise FailoverError("--from and --to name the same region")
    with transaction.atomic():
        source = _region(from_region)
        target = _live_balancer_in(_region(to_region))
        by_id = {b.id: b for b in Balancer.objects.select_related("region")}
        moves = []
        for replica in Replica.objects.select_for_update().filter(region=source):
            if replica.balancer_id == target.id:
                continue
            moves.append(
                Move(
                    replica.name,
                    from_region,
                    "failover",
                    _owner_name(replica.balancer_id, by_id),
                    target.name,
                )
            )
            if replica.handover == Replica.Handover.NONE:
                replica.home_balancer_id = replica.balancer_id
            replica.balancer, replica.handover = target, Replica.Handover.PLANNED
            replica.save(update_fields=["balancer", "home_balancer", "handover"])
        _record_moves(moves, by_id, LatencyMap.load(), planned=True)
    return moves


def plan_failback(region: str, *, force: bool = False) -> list[Move]:
    """Return every handed-over replica of ``region`` home; refuse while home is down
    unless ``force`` (the replicas would then serve nobody until it is up)."""
    with transaction.atomic():
        home_region = _region(region)
        by_id = {b.id: b for b in Balancer.objects.select_related("region")}
        replicas = Replica.objects.select_for_update().select_related("region")
        plan = _Plan()
        for replica in replicas.filter(region=home_region).exclude(handover=""):
            if not force and not home_is_live(replica, by_id):
                raise FailoverError(
                    f"{replica.name}'s home balancer is down; fail back with --force "
                    "only if you accept that nobody routes to it until the balancer is up"
                )
            _hand_back(replica, by_id, plan)
        _record_moves(plan.moves, by_id, LatencyMap.load(), planned=True)
    return plan.moves


def _region(name: str) -> Region:
    region = Region.objects.filter(name=name).first()
    if region is None:
        known = ", ".join(Region.objects.values_list("name", flat=True)) or "none"
        raise FailoverError(f"no region {name!r} (known: {known})")
    return region


def _live_balancer_in(region: Region) -> Balancer:
    live = [b for b in region.balancers.order_by("name") if is_live(b)]
    if not live:
        raise FailoverError(f"{region.name} has no live balancer to take the replicas")
    return live[0]
