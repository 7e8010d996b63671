"""Who routes to what: the read side of balancer failover.

A balancer routes to the replicas whose ``balancer`` is it, plus the replicas of its
own region with no owner (``routing.topology``).  A replica's *home* is where it is
served when nothing has failed: its region's balancers, or the balancer it was
pinned to.  After a handover (``Replica.handover`` set) the home is remembered in
``home_balancer`` so that failback restores it exactly.

"Nearest" means the lowest ``RegionLatency.rtt_ms`` from the replica's region, read
in either direction (operators often enter a pair once; a row measured from the
region wins), with the same region at 0 ms — SkyLB §4.2 hands a failed balancer's
replicas to the geographically closest one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.models import Balancer, Region, RegionLatency, Replica


@dataclass(frozen=True)
class LatencyMap:
    """Round-trip times between regions by region id."""

    measured: dict[tuple[int, int], float]

    @classmethod
    def load(cls) -> LatencyMap:
        rows = RegionLatency.objects.values_list("source_id", "target_id", "rtt_ms")
        return cls({(source, target): rtt for source, target, rtt in rows})

    def rtt(self, source: int, target: int) -> float:
        if source == target:
            return 0.0
        forward = self.measured.get((source, target))
        if forward is not None:
            return forward
        return self.measured.get((target, source), math.inf)


def is_live(balancer: Balancer | None) -> bool:
    return balancer is not None and balancer.state == Balancer.State.UP


def nearest_live_balancer(
    region_id: int,
    balancers: Iterable[Balancer],
    latencies: LatencyMap,
    *,
    exclude: frozenset[int] = frozenset(),
) -> Balancer | None:
    """The live balancer closest to ``region_id``; a live one with no RTT row still
    beats none (stranded replicas serve nobody)."""
    live = [b for b in balancers if is_live(b) and b.id not in exclude]
    return min(live, key=lambda b: (latencies.rtt(region_id, b.region_id), b.name), default=None)


def home_is_live(replica: Replica, balancers_by_id: dict[int, Balancer]) -> bool:
    """Whether the place this replica is served from when nothing has failed is up."""
    pinned = replica.home_balancer_id if replica.handover else replica.balancer_id
    if pinned is not None:
        return is_live(balancers_by_id.get(pinned))
    return any(is_live(b) and b.region_id == replica.region_id for b in balancers_by_id.values())


@dataclass(frozen=True)
class RegionRoute:
    """Where clients of a region should send requests now, and why."""

    region: str
    balancer: Balancer | None
    reason: str  # local | failover | nearest | none


def region_routes(
    regions: Iterable[Region], balancers: list[Balancer], replicas: Iterable[Replica]
) -> dict[str, RegionRoute]:
    """For each region: a live local balancer; else the live balancer that took over
    most of its replicas; else the nearest live one; else none."""
    latencies = LatencyMap.load()
    by_id = {b.id: b for b in balancers}
    owners: dict[int, Counter[int]] = {}
    for replica in replicas:
        owner = by_id.get(replica.balancer_id or 0)
        if owner is not None and is_live(owner) and owner.region_id != replica.region_id:
            owners.setdefault(replica.region_id, Counter())[owner.id] += 1
    routes = {}
    for region in regions:
        routes[region.name] = _route(region, balancers, by_id, owners.get(region.id), latencies)
    return routes


def _route(
    region: Region,
    balancers: list[Balancer],
    by_id: dict[int, Balancer],
    owners: Counter[int] | None,
    latencies: LatencyMap,
) -> RegionRoute:
    local = [b for b in balancers if b.region_id == region.id and is_live(b)]
    if local:
        return RegionRoute(region.name, min(local, key=lambda b: b.name), "local")
    if owners:
        owner_id, _ = owners.most_common(1)[0]
        return RegionRoute(region.name, by_id[owner_id], "failover")
    nearest = nearest_live_balancer(region.id, balancers, latencies)
    return RegionRoute(region.name, nearest, "nearest" if nearest else "none")


def serving_balancer_url(region_name: str) -> str | None:
    """The URL a client of ``region_name`` should use now (drills' traffic follows it)."""
    regions = list(Region.objects.filter(name=region_name))
    if not regions:
        return None
    balancers = list(Balancer.objects.all())
    replicas = Replica.objects.filter(region=regions[0]).only("region_id", "balancer_id")
    route = region_routes(regions, balancers, replicas)[region_name]
    return route.balancer.url if route.balancer else None


def balancers_serving(replica: Replica, balancers: Iterable[Balancer]) -> list[Balancer]:
    """The balancers whose routing set includes ``replica`` (if it is routable)."""
    if replica.balancer_id is not None:
        return [b for b in balancers if b.id == replica.balancer_id]
    return [b for b in balancers if b.region_id == replica.region_id]
