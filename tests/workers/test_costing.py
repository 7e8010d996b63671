"""The one cost module's rules (workers.costing), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from workers.costing import (
    BilledReplica,
    CostSummary,
    RegionLoad,
    Service,
    peak_provisioning,
    summarize,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HOUR_AGO = NOW - timedelta(hours=1)
CONFIGURED_ON_DEMAND = Decimal("3.06")


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def replica(
    name: str,
    region: str,
    kind: str,
    price: str,
    *,
    start: float = -120,
    end: float | None = None,
    model: str = "m",
) -> BilledReplica:
    return BilledReplica(
        name, region, kind, model, Decimal(price), at(start), None if end is None else at(end)
    )


def summary_of(
    replicas: list[BilledReplica],
    services: list[Service] | None = None,
    loads: list[RegionLoad] | None = None,
) -> CostSummary:
    return summarize(
        replicas,
        [Service("m", target_replicas=None)] if services is None else services,
        loads or [],
        window_start=HOUR_AGO,
        now=NOW,
        on_demand_price=CONFIGURED_ON_DEMAND,
    )


def test_rate_now_counts_every_replica_billed_now_by_region_and_kind() -> None:
    summary = summary_of(
        [
            replica("us-od", "us", "on-demand", "4"),
            replica("us-spot", "us", "spot", "1", start=-1),  # still provisioning: billed
            replica("eu-res", "eu", "reserved", "2"),
            replica("eu-spot", "eu", "spot", "1", end=-5),  # preempted: not billed now
        ]
    )
    assert summary.hourly_by_region == {
        "eu": {"reserved": Decimal("2")},
        "us": {"on-demand": Decimal("4"), "spot": Decimal("1")},
    }
    assert summary.hourly_total == Decimal("7")


def test_spend_is_per_second_from_launch_inside_the_window() -> None:
    summary = summary_of(
        [
            replica("old", "us", "spot", "0.9", start=-90),  # only the window's hour: $0.90
            replica("fallback", "us", "on-demand", "3", start=-50, end=-30),  # 1/3 h: $1
            replica("gone", "eu", "spot", "1", start=-200, end=-100),  # before the window
        ]
    )
    assert summary.by_replica == {"old": Decimal("0.9"), "fallback": Decimal("1")}
    assert summary.by_kind == {"spot": Decimal("0.9"), "on-demand": Decimal("1")}
    assert summary.total == Decimal("1.9")


def test_all_on_demand_reference_uses_the_autoscalers_target_and_the_price_paid() -> None:
    fleet = [
        replica("spot", "us", "spot", "1"),
        replica("od", "us", "on-demand", "2.5", start=-50, end=-30),
        replica("od-dear", "eu", "on-demand", "4", start=-20, end=-10),
    ]
    summary = summary_of(fleet, [Service("m", target_replicas=3)])
    # 3 on-demand replicas for an hour at the cheapest on-demand price paid, $2.50.
    assert (summary.n_target, summary.on_demand_price) == (3, Decimal("2.5"))
    assert summary.on_demand_reference == Decimal("7.5")
    spend = Decimal(1) + Decimal("2.5") / 3 + Decimal(4) / 6
    assert summary.total == spend
    assert summary.savings_vs_on_demand == (Decimal("7.5") - spend) / Decimal("7.5")


def test_registered_replicas_are_the_baseline_of_a_service_without_a_target() -> None:
    fleet = [
        replica("a", "us", "spot", "1"),
        replica("b", "eu", "reserved", "1"),
        replica("c", "eu", "spot", "1", end=-30),  # ended: not part of today's capacity
        replica("x", "eu", "spot", "1", model="other"),  # another model's replica
    ]
    summary = summary_of(fleet)
    # No on-demand billed: the configured price, for the 2 replicas of "m" billed now.
    assert (summary.n_target, summary.on_demand_price) == (2, CONFIGURED_ON_DEMAND)
    assert summary.on_demand_reference == 2 * CONFIGURED_ON_DEMAND


def test_peak_provisioning_sums_regions_per_interval() -> None:
    qps = {0: {"us": 10.0, "eu": 1.0, "ap": 1.0}, 1: {"us": 1.0, "eu": 10.0, "ap": 1.0}}
    peak = peak_provisioning(qps, target_qps_per_replica=2.0)
    assert (peak.regional_replicas, peak.global_replicas) == (5 + 5 + 1, 6)
    assert peak.by_region == {"ap": 1, "eu": 5, "us": 5}


def test_region_local_peaks_against_the_global_peak() -> None:
    # us peaks in the first interval, eu in the second (SkyLB Figure 2's offset diurnals).
    loads = [
        RegionLoad(at(-20), "us", 5.0),
        RegionLoad(at(-20), "eu", 1.0),
        RegionLoad(at(-10), "us", 1.0),
        RegionLoad(at(-10), "eu", 3.0),
    ]
    fleet = [replica("r", "us", "reserved", "1.2")]
    summary = summary_of(fleet, [Service("m", None, target_qps_per_replica=2.0)], loads)
    # Regions: us ⌈5/2⌉ + eu ⌈3/2⌉ = 5; globally ⌈6/2⌉ = 3.
    assert summary.peak.by_region == {"eu": 2, "us": 3}
    assert summary.peak.global_replicas == 3
    assert summary.savings_vs_region_peak == Decimal(2) / 5
    # No configured reserved price: the reserved price the fleet paid prices both.
    assert summary.reserved_price == Decimal("1.2")
    assert (summary.regional_peak_cost, summary.global_peak_cost) == (Decimal(6), Decimal("3.6"))


def test_a_configured_reserved_price_wins() -> None:
    loads = [RegionLoad(at(-10), "us", 4.0)]
    services = [Service("m", 2, target_qps_per_replica=2.0, reserved_hourly_price=Decimal("1.5"))]
    summary = summary_of([replica("r", "us", "reserved", "9")], services, loads)
    assert summary.reserved_price == Decimal("1.5")
    assert summary.regional_peak_cost == Decimal(3)


def test_savings_accumulate_to_the_headline_figure() -> None:
    fleet = [
        replica("spot", "us", "spot", "1"),
        replica("od", "us", "on-demand", "3", start=-30, end=-15),
    ]
    summary = summary_of(fleet, [Service("m", target_replicas=1)])
    points = [(round((t - NOW).total_seconds() / 60), saved) for t, saved in summary.savings_series]
    # Reference $3/h; billed $1/h, then $4/h for 15 minutes, then $1/h again.
    assert points == [
        (-60, Decimal(0)),
        (-30, Decimal(1)),
        (-15, Decimal("0.75")),
        (0, Decimal("1.25")),
    ]
    assert points[-1][1] == summary.on_demand_reference - summary.total


def test_an_empty_fleet_has_no_saving_to_claim() -> None:
    summary = summary_of([], services=[])
    assert summary.hourly_total == 0 and summary.total == 0
    assert summary.savings_vs_on_demand is None
    assert summary.savings_vs_region_peak is None
    assert summary.cost_ratio is None
