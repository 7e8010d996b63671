"""The console's overview: every region with its balancer, replicas and recent events."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.models import Balancer, Event, Region, RegionLatency, Replica
from workers.cost import hourly_cost_by_region


@dataclass
class RegionCard:
    region: Region
    balancers: list[Balancer] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    latencies: list[RegionLatency] = field(default_factory=list)

    @property
    def ready_by_kind(self) -> dict[str, str]:
        total = Counter(r.kind for r in self.replicas)
        ready = Counter(r.kind for r in self.replicas if r.state == Replica.State.READY)
        return {kind: f"{ready[kind]}/{count}" for kind, count in sorted(total.items())}

    @property
    def ready_count(self) -> int:
        return sum(1 for r in self.replicas if r.state == Replica.State.READY)

    hourly_cost: float = 0.0  # workers.cost's rule: billed from launch to termination


def region_cards() -> list[RegionCard]:
    cards = {region.id: RegionCard(region) for region in Region.objects.all()}
    for balancer in Balancer.objects.all():
        cards[balancer.region_id].balancers.append(balancer)
    replicas = Replica.objects.exclude(state=Replica.State.TERMINATED).select_related(
        "zone", "balancer"
    )
    for replica in replicas:
        cards[replica.region_id].replicas.append(replica)
    for latency in RegionLatency.objects.select_related("target"):
        cards[latency.source_id].latencies.append(latency)
    hourly = hourly_cost_by_region(timezone.now())
    for card in cards.values():
        card.hourly_cost = float(hourly.get(card.region.name, 0))
    return list(cards.values())


@staff_member_required
def overview(request: HttpRequest) -> HttpResponse:
    context = {
        "cards": region_cards(),
        "events": Event.objects.all()[:25],
    }
    return render(request, "console/overview.html", context)
