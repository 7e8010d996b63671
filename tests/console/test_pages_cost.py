"""The Cost page's arithmetic (console.cost_view), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.cost_view import PricedReplica, RegionLoad, savings_series, summarize

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def replica(region: str, kind: str, price: float, state: str = "ready") -> PricedReplica:
    return PricedReplica(region, kind, state, price)


def test_hourly_spend_and_both_savings() -> None:
    fleet = [
        replica("us", "on-demand", 4.0),
        replica("us", "spot", 1.0),
        replica("eu", "reserved", 2.0),
        replica("eu", "spot", 1.0, state="preempted"),  # not billed now
    ]
    loads = [RegionLoad("us", T0, 5.0), RegionLoad("eu", T0, 1.0), RegionLoad("us", T0, 2.0)]
    summary = summarize(fleet, loads, target_rps=2.0, spend_total=15.0)
    assert summary.hourly_by_region == {
        "eu": {"reserved": 2.0},
        "us": {"on-demand": 4.0, "spot": 1.0},
    }
    assert summary.hourly_total == 7.0
    assert summary.spend_total == 15.0  # the ledger's figure, passed through
    # Same 3 billed replicas all on-demand at $4: $12/h.
    assert summary.saving_vs_on_demand == pytest.approx((12 - 7) / 12)
    # Region-local peaks: us ⌈5/2⌉ = 3, eu 1 → 4 on-demand replicas = $16/h.
    assert summary.peak_replicas == {"eu": 1, "us": 3}
    assert summary.saving_vs_region_peak == pytest.approx((16 - 7) / 16)


def test_savings_accumulate_over_rollup_intervals() -> None:
    loads = [RegionLoad("us", T0 + timedelta(hours=h), 4.0) for h in range(3)]
    times, saved = savings_series(loads, hourly_now=1.0, price=2.0, target_rps=2.0)
    assert len(times) == 2
    # Baseline ⌈4/2⌉ x $2 = $4/h against $1/h: $3 saved per hour.
    assert saved == [3.0, 6.0]


def test_an_empty_fleet_has_no_saving_to_claim() -> None:
    summary = summarize([], [], target_rps=2.0, spend_total=0.0)
    assert summary.hourly_total == 0
    assert summary.saving_vs_on_demand is None
