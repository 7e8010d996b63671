"""One service's scaling step, pure: plain data in, decisions and state out.

No database, no settings: the step runs against ``ScriptedCloud``, and each beat
starts from the ``scaling_state`` the previous one returned, as the live loop
stores it on the ServiceConfig row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tests.support.scripted_cloud import ZONES, ScriptedCloud
from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.controller import Preemption, ServiceStep, ServiceView, step_service
from workers.scaling.fleet import ON_DEMAND, SPOT
from workers.scaling.instance_scaler import InstanceScalerConfig

VIEW = ServiceView(
    model_name="m",
    policy="spothedge",
    autoscaler=AutoscalerConfig(
        target_qps_per_replica=1.0, min_replicas=2, upscale_delay_s=30, downscale_delay_s=60
    ),
    spot_extra=1,
    static_on_demand=1,
    target_replicas=None,
    scaling_state={},
)


def beat(
    view: ServiceView,
    cloud: ScriptedCloud,
    *,
    now: float,
    qps: float = 0.0,
    preemptions: Sequence[Preemption] = (),
) -> tuple[ServiceStep, ServiceView]:
    """One step, and the view the next beat reads (what the glue would have saved)."""
    step = step_service(
        view, cloud.fleet(), ZONES, qps=qps, now=now, preemptions=preemptions, launcher=cloud
    )
    stored = replace(view, target_replicas=step.decision.n_target, scaling_state=step.scaling_state)
    return step, stored


def test_first_step_spreads_spot_and_falls_back_to_on_demand() -> None:
    cloud = ScriptedCloud()
    step, _ = beat(VIEW, cloud, now=0.0)
    assert step.decision.n_target == 2  # no traffic: min_replicas
    assert sorted(z for k, z in (d.split("@") for d in step.decision.launched) if k == SPOT) == [
        "zone1",
        "zone2",
        "zone3",
    ]
    assert cloud.count(ON_DEMAND) == 2  # nothing ready yet: min(N_tar, N_tar + N_extra - 0)
    assert step.scaling_state["mix"] == {"spot": 3, "on_demand": 2}
    assert step.changed


def test_fallback_ends_once_spot_is_ready_and_a_steady_fleet_is_quiet() -> None:
    cloud = ScriptedCloud()
    _, view = beat(VIEW, cloud, now=0.0)
    cloud.make_ready()
    step, view = beat(view, cloud, now=10.0)
    assert cloud.count(ON_DEMAND) == 0 and cloud.count(SPOT) == 3
    assert step.decision.ready_spot == 3 and len(step.decision.terminated) == 2

    step, _ = beat(view, cloud, now=20.0)
    assert not step.changed  # nothing launched, terminated, preempted; same N_tar
    assert step.decision.launched == [] and step.decision.terminated == []
    # The stored state stays bounded: terminated replicas have left it.
    assert step.scaling_state["ready_seen"] == sorted(cloud.live)


def test_a_preemption_of_this_service_moves_its_zone_and_launches_a_replacement() -> None:
    cloud = ScriptedCloud()
    _, view = beat(VIEW, cloud, now=0.0)
    cloud.make_ready()
    _, view = beat(view, cloud, now=10.0)
    (lost,) = cloud.lose_zone("zone1")
    step, view = beat(view, cloud, now=20.0, preemptions=[Preemption("m", SPOT, lost.zone)])
    assert step.placement["preempting"] == ["zone1"]
    assert step.changed
    # N_tar + N_extra spot again, away from the lost zone; on-demand covers the cold start.
    assert cloud.count(SPOT) == 3 and cloud.count(SPOT, "zone1") == 0
    assert cloud.count(ON_DEMAND) == 1  # min(2, 3 - 2 ready)


def test_another_services_preemption_leaves_this_one_alone() -> None:
    cloud = ScriptedCloud()
    _, view = beat(VIEW, cloud, now=0.0)
    step, _ = beat(view, cloud, now=10.0, preemptions=[Preemption("other", SPOT, "zone1")])
    assert step.placement["preempting"] == []
    assert not step.changed  # no scaling.decision Event for a fleet that did not move


def test_a_spot_replica_turning_ready_brings_its_zone_back() -> None:
    cloud = ScriptedCloud()
    cloud.capacity["zone2"] = 0
    step, view = beat(VIEW, cloud, now=0.0)
    assert step.decision.refused == ["spot@zone2"]
    assert step.placement["preempting"] == ["zone2"]
    cloud.capacity["zone2"] = 10
    # A replica in zone2 (e.g. launched before the zone ran dry) turns ready.
    cloud.launch(SPOT, "zone2")
    cloud.make_ready()
    step, view = beat(view, cloud, now=10.0)
    assert step.placement["preempting"] == []
    ready_seen = step.scaling_state["ready_seen"]
    assert isinstance(ready_seen, list) and any(h.startswith("spot-zone2-") for h in ready_seen)


def test_the_autoscaler_waits_out_its_delay_across_steps() -> None:
    cloud = ScriptedCloud()
    step, view = beat(VIEW, cloud, now=0.0, qps=4.0)
    assert step.decision.n_target == 2  # N_can = 4, but the upscale delay (30 s) runs
    step, view = beat(view, cloud, now=20.0, qps=4.0)
    assert step.decision.n_target == 2
    step, view = beat(view, cloud, now=30.0, qps=4.0)
    assert step.decision.n_target == 4 and step.changed
    assert view.target_replicas == 4


# --- the preserve scaler in the step ------------------------------------------------------

KV = 1000
PRESERVE = replace(
    VIEW,
    policy="on_demand",  # one replica per N: the counts below are N itself
    autoscaler=AutoscalerConfig(
        target_qps_per_replica=1.0, min_replicas=1, upscale_delay_s=0, downscale_delay_s=0
    ),
    scaler="preserve",
    instance_scaler=InstanceScalerConfig(window_s=600.0, kv_capacity_tokens=KV, min_replicas=1),
)
BUSY = (990,) * 50 + (500,) * 50  # above 95 % of the KV cache in half of the next L
CALM = (500,) * 100  # 50 %: neither overloaded nor under T_u (30 %)
IDLE = (100,) * 100  # 10 %: under T_u


def preserve_beat(
    view: ServiceView,
    cloud: ScriptedCloud,
    *,
    now: float,
    qps: float = 0.0,
    forecast_n: int | None = None,
    lookaheads: Sequence[Sequence[int]] = (),
    unmapped: int = 0,
) -> tuple[ServiceStep, ServiceView]:
    step = step_service(
        view,
        cloud.fleet(),
        ZONES,
        qps=qps,
        now=now,
        preemptions=(),
        launcher=cloud,
        forecast_n=forecast_n,
        lookaheads=lookaheads,
        unmapped=unmapped,
    )
    stored = replace(view, target_replicas=step.decision.n_target, scaling_state=step.scaling_state)
    return step, stored


def test_preserve_launches_the_forecast_n_a_window_before_the_ramp() -> None:
    proactive, reactive = ScriptedCloud(), ScriptedCloud()
    p_view, r_view = PRESERVE, replace(PRESERVE, scaler="request-rate")
    for now, qps, forecast in ((0.0, 1.0, 1), (600.0, 1.0, 4)):  # the ramp is a window ahead
        p_step, p_view = preserve_beat(p_view, proactive, now=now, qps=qps, forecast_n=forecast)
        r_step, r_view = preserve_beat(r_view, reactive, now=now, qps=qps, forecast_n=forecast)
    assert (p_step.decision.n_target, proactive.count(ON_DEMAND)) == (4, 4)
    assert (r_step.decision.n_target, reactive.count(ON_DEMAND)) == (1, 1)
    assert p_step.changed and p_step.decision.scaler == "preserve"
    assert p_step.decision.reason["forecast_n"] == 4
    assert p_step.decision.why == "forecast N=4 for window 1 -> N=4"
    assert r_step.decision.scaler == "request-rate" and "request rate 1.00/s" in r_step.decision.why
    # The stored state carries both: the reactive floor's and the instance scaler's.
    assert {"autoscaler", "instance_scaler", "placement"} <= set(p_step.scaling_state)


def test_preserve_adds_one_replica_for_one_overloaded_replica() -> None:
    cloud = ScriptedCloud()
    _, view = preserve_beat(PRESERVE, cloud, now=0.0, forecast_n=3)
    cloud.make_ready()
    step, view = preserve_beat(view, cloud, now=60.0, lookaheads=[BUSY, CALM, CALM])
    assert step.decision.n_target == 4 and len(step.decision.launched) == 1
    assert step.decision.reason["overloaded"] == 1
    assert step.decision.why == "1 of 3 ready replicas potentially overloaded +1 -> N=4"
    # The helper is still cold-starting: the same maps do not ask for another.
    step, _ = preserve_beat(view, cloud, now=120.0, lookaheads=[BUSY, CALM, CALM])
    assert step.decision.n_target == 4 and step.decision.launched == []


def test_preserve_scales_down_at_most_once_per_window_and_never_below_the_request_rate() -> None:
    cloud = ScriptedCloud()
    _, view = preserve_beat(PRESERVE, cloud, now=0.0, forecast_n=6)
    cloud.make_ready()
    # 6 replicas at 10 %: 0.6 replicas' worth, packed to 30 % -> 2.
    step, view = preserve_beat(view, cloud, now=60.0, lookaheads=[IDLE] * 6)
    assert step.decision.n_target == 2 and len(step.decision.terminated) == 4
    assert step.decision.reason["scaled_down_to"] == 2
    # Still idle, same window: the window's one scale-down is spent.
    step, view = preserve_beat(view, cloud, now=120.0, lookaheads=[(10,) * 100] * 2)
    assert step.decision.n_target == 2 and step.decision.terminated == []
    # The next window may scale down again, but not below the request-rate N (3 qps).
    step, view = preserve_beat(view, cloud, now=660.0, qps=3.0, lookaheads=[(10,) * 100] * 2)
    assert step.decision.n_target == 3 and step.decision.reason["reactive_floor"] is True


def test_preserve_does_not_scale_down_on_a_load_it_cannot_see() -> None:
    cloud = ScriptedCloud()
    _, view = preserve_beat(PRESERVE, cloud, now=0.0, forecast_n=4)
    cloud.make_ready()
    step, _ = preserve_beat(view, cloud, now=60.0, lookaheads=[IDLE] * 3, unmapped=1)
    assert step.decision.n_target == 4 and step.decision.terminated == []
    assert "1 ready replicas without a look-ahead map" in step.decision.why
