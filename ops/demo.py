"""The demo topology that `make run` seeds: three regions, two zones each, and
4 + 3 + 2 emulated replicas — unbalanced on purpose, as in SkyLB's evaluation, so
the small region has to forward at peak.

Prices are per replica-hour for one L4-class GPU and only need to be plausible:
reserved (committed-use) is the cheapest steady rate, spot the cheapest when it
lasts, on-demand the fallback; Asia-Pacific is priced ~15 % above the US.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

from core.registry import DEFAULT_POLICY
from fleet.models import Balancer, Region, RegionLatency, Replica, ServiceConfig, Zone

DEMO_MODEL = "meridian-demo"


@dataclass(frozen=True)
class RegionSpec:
    name: str
    display_name: str
    zones: tuple[str, str]
    # One entry per replica: (zone index, kind).
    replicas: tuple[tuple[int, str], ...]
    price_factor: Decimal


# Keyed by str: the specs above name kinds as plain strings, which Kind members equal.
BASE_PRICES: dict[str, Decimal] = {
    Replica.Kind.RESERVED: Decimal("0.5600"),
    Replica.Kind.ON_DEMAND: Decimal("0.8500"),
    Replica.Kind.SPOT: Decimal("0.3400"),
}

DEMO_REGIONS = (
    RegionSpec(
        "us-east",
        "US East",
        ("us-east-1a", "us-east-1b"),
        ((0, "reserved"), (1, "reserved"), (0, "on-demand"), (1, "spot")),
        Decimal("1.00"),
    ),
    RegionSpec(
        "eu-west",
        "EU West",
        ("eu-west-1a", "eu-west-1b"),
        ((0, "reserved"), (1, "reserved"), (1, "spot")),
        Decimal("1.08"),
    ),
    RegionSpec(
        "ap-southeast",
        "Asia Pacific (Singapore)",
        ("ap-southeast-1a", "ap-southeast-1b"),
        ((0, "reserved"), (1, "spot")),
        Decimal("1.15"),
    ),
)

# Round-trip times between regions, in ms (symmetric), roughly public inter-region RTTs.
DEMO_RTTS_MS = {
    ("us-east", "eu-west"): 80.0,
    ("us-east", "ap-southeast"): 150.0,
    ("eu-west", "ap-southeast"): 200.0,
}


@dataclass(frozen=True)
class DemoReplica:
    name: str
    region: str
    port: int


@dataclass(frozen=True)
class DemoBalancer:
    name: str
    region: str
    port: int


@dataclass(frozen=True)
class DemoTopology:
    host: str
    balancers: tuple[DemoBalancer, ...]
    replicas: tuple[DemoReplica, ...]

    def replicas_in(self, region: str) -> list[DemoReplica]:
        return [r for r in self.replicas if r.region == region]


def plan_demo(host: str, balancer_base_port: int, replica_base_port: int) -> DemoTopology:
    """Names and ports of the demo's balancers and replicas (no database access)."""
    balancers, replicas = [], []
    port = replica_base_port
    for index, spec in enumerate(DEMO_REGIONS, start=1):
        balancers.append(DemoBalancer(f"{spec.name}-lb", spec.name, balancer_base_port + index))
        for number in range(1, len(spec.replicas) + 1):
            port += 1
            replicas.append(DemoReplica(f"{spec.name}-r{number}", spec.name, port))
    return DemoTopology(host, tuple(balancers), tuple(replicas))


# Meridian's own policy: the cost model over replicas, peers and waiting.
DEMO_POLICY = DEFAULT_POLICY


@transaction.atomic
def seed_demo(topology: DemoTopology, *, policy: str = DEMO_POLICY) -> None:
    """Create or update the demo rows so they match ``topology``; idempotent.

    Replicas start in ``starting``: the readiness probe promotes them once they answer.
    """
    # Set on creation only: an operator's later choice survives restarts of the demo.
    ServiceConfig.objects.get_or_create(model_name=DEMO_MODEL, defaults={"policy": policy})
    regions = {spec.name: _seed_region(spec) for spec in DEMO_REGIONS}
    for (a, b), rtt in DEMO_RTTS_MS.items():
        for source, target in ((a, b), (b, a)):
            RegionLatency.objects.update_or_create(
                source=regions[source], target=regions[target], defaults={"rtt_ms": rtt}
            )
    for balancer in topology.balancers:
        Balancer.objects.update_or_create(
            name=balancer.name,
            defaults={
                "region": regions[balancer.region],
                "url": f"http://{topology.host}:{balancer.port}",
                "state": Balancer.State.UP,
            },
        )
    for spec in DEMO_REGIONS:
        _seed_replicas(spec, regions[spec.name], topology)


def _seed_region(spec: RegionSpec) -> Region:
    region, _ = Region.objects.update_or_create(
        name=spec.name, defaults={"display_name": spec.display_name}
    )
    for zone in spec.zones:
        Zone.objects.update_or_create(name=zone, defaults={"region": region})
    return region


def _seed_replicas(spec: RegionSpec, region: Region, topology: DemoTopology) -> None:
    zones = {z.name: z for z in region.zones.all()}
    planned = topology.replicas_in(spec.name)
    for (zone_index, kind), replica in zip(spec.replicas, planned, strict=True):
        Replica.objects.update_or_create(
            name=replica.name,
            defaults={
                "url": f"http://{topology.host}:{replica.port}",
                "model_name": DEMO_MODEL,
                "region": region,
                "zone": zones[spec.zones[zone_index]],
                "kind": kind,
                "hourly_price": (BASE_PRICES[kind] * spec.price_factor).quantize(Decimal("0.0001")),
                "state": Replica.State.STARTING,
                "balancer": None,
                "consecutive_failures": 0,
            },
        )
