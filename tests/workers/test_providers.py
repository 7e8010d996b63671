"""Providers without processes: the emulated cloud's capacity, preemption and billing
clock (launch to end), and the static provider's refusal to launch."""

from __future__ import annotations

from decimal import Decimal

import pytest

from workers.providers.base import PREEMPTION_WARNING, LaunchSpec, ProviderRefused
from workers.providers.emulated import ColdStartModel, EmulatedCloudProvider, SpotMarket
from workers.providers.static import StaticProvider
from workers.scaling.fleet import ON_DEMAND, SPOT, ZoneOffer
from workers.scaling.traces import SpotTrace

ZONES = [ZoneOffer("z-a", "r", 0.9, 3.0), ZoneOffer("z-b", "r", 1.1, 3.0)]
SPEC = LaunchSpec("m", "m-1")


def provider(trace: SpotTrace | None) -> EmulatedCloudProvider:
    ports = iter(range(20000, 20100))
    cold = ColdStartModel(
        provision_s={SPOT: 30.0, ON_DEMAND: 60.0}, model_load_s=10.0, zone_extra_s={"z-b": 5.0}
    )
    return EmulatedCloudProvider(
        ZONES, SpotMarket(trace, origin=1000.0), cold, port_allocator=lambda: next(ports)
    )


def test_cold_start_is_provisioning_plus_model_load_per_kind_and_zone() -> None:
    cold = provider(None).cold_start
    assert cold.delay("z-a", SPOT) == 40.0
    assert cold.delay("z-b", ON_DEMAND) == 75.0


def test_spot_launch_refused_when_the_zone_is_full() -> None:
    trace = SpotTrace("t", 10.0, {"z-a": [1, 0], "z-b": [2, 2]}, binary=False)
    cloud = provider(trace)
    assert cloud.launch(SPEC, "z-a", SPOT, now=1000.0) is not None
    assert cloud.launch(SPEC, "z-a", SPOT, now=1001.0) is None  # capacity 1, used 1
    assert cloud.launch(SPEC, "z-a", ON_DEMAND, now=1001.0) is not None  # on-demand never runs out
    assert cloud.price("z-b", SPOT) == Decimal("1.1")


def test_capacity_drop_preempts_the_newest_spot_and_ends_its_billing() -> None:
    trace = SpotTrace("t", 10.0, {"z-b": [2, 2, 1]}, binary=False)
    cloud = provider(trace)
    first = cloud.launch(SPEC, "z-b", SPOT, now=1000.0)
    second = cloud.launch(SPEC, "z-b", SPOT, now=1002.0)
    assert first and second
    assert cloud.poll(1005.0) == []  # still provisioning, nothing preempted
    notices = cloud.poll(1020.0)  # trace index 2: capacity 1
    assert [(n.handle, n.event, n.zone) for n in notices] == [(second.handle, "preempted", "z-b")]
    by_handle = {i.handle: i for i in cloud.list()}
    assert (
        by_handle[second.handle].ended_at == 1020.0
        and by_handle[second.handle].state == "preempted"
    )
    assert by_handle[first.handle].state == "provisioning"
    cloud.terminate(first.handle, now=1030.0)
    assert {i.state for i in cloud.list()} == {"preempted", "terminated"}


def test_static_provider_never_launches_or_terminates() -> None:
    static = StaticProvider(ZONES)
    with pytest.raises(ProviderRefused):
        static.launch(SPEC, "z-a", SPOT, now=0.0)
    with pytest.raises(ProviderRefused):
        static.terminate("x", now=0.0)
    assert static.list() == [] and static.poll(0.0) == []
    assert static.price("z-a", ON_DEMAND) == Decimal("3.0")


def test_preemption_warning_comes_warning_s_ahead_and_the_warned_replica_goes_first() -> None:
    trace = SpotTrace("t", 10.0, {"z-b": [2, 2, 2, 1]}, binary=False)
    ports = iter(range(20100, 20200))
    cloud = EmulatedCloudProvider(
        ZONES,
        SpotMarket(trace, origin=1000.0),
        ColdStartModel(provision_s={SPOT: 300.0, ON_DEMAND: 300.0}, model_load_s=0.0),
        port_allocator=lambda: next(ports),
        warning_s=12.0,
    )
    first = cloud.launch(SPEC, "z-b", SPOT, now=1000.0)
    second = cloud.launch(SPEC, "z-b", SPOT, now=1001.0)
    assert first and second
    assert cloud.poll(1017.0) == []  # the drop at 1030 is more than 12 s away
    (warning,) = cloud.poll(1018.0)
    assert (warning.handle, warning.event, warning.zone) == (
        second.handle,
        PREEMPTION_WARNING,
        "z-b",
    )
    assert warning.at == 1018.0 and warning.preempt_at == 1030.0
    assert cloud.poll(1020.0) == []  # warned once
    (preempted,) = cloud.poll(1030.0)
    assert (preempted.handle, preempted.event) == (second.handle, "preempted")
    with pytest.raises(ValueError, match="warning_s must be >= 0"):
        EmulatedCloudProvider(ZONES, SpotMarket(None, 0.0), ColdStartModel(), warning_s=-1.0)
