"""Topology rows for tests that run inside the test's transaction (no child process
reads them): regions with a zone, latencies, balancers, replicas."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.models import Balancer, Region, RegionLatency, Replica, Zone


@dataclass
class Rows:
    """Creates rows inside the test's transaction (unit tests, no child processes)."""

    def region(self, name: str) -> Region:
        region = Region.objects.create(name=name)
        Zone.objects.create(region=region, name=f"{name}-1a")
        return region

    def rtt(self, a: Region, b: Region, ms: float) -> None:
        RegionLatency.objects.create(source=a, target=b, rtt_ms=ms)
        RegionLatency.objects.create(source=b, target=a, rtt_ms=ms)

    def balancer(self, name: str, region: Region, *, state: str = "up", url: str = "") -> Balancer:
        return Balancer.objects.create(
            name=name, region=region, url=url or f"http://127.0.0.1:1/{name}", state=state
        )

    def replica(self, name: str, region: Region, *, url: str = "", **fields: object) -> Replica:
        defaults: dict[str, object] = {"state": Replica.State.READY, "model_name": "m"}
        return Replica.objects.create(
            name=name,
            url=url or f"http://127.0.0.1:1/{name}",
            region=region,
            zone=region.zones.get(),
            **{**defaults, **fields},
        )
