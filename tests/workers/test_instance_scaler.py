"""PreServe's instance scaler and the scaling-policy registry (how many; SpotHedge: where)."""

from __future__ import annotations

import pytest

from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.instance_scaler import (
    InstanceScaler,
    InstanceScalerConfig,
    InstanceScalerState,
    ScalerSignals,
    forecast_instances,
)
from workers.scaling.scalers import SCALERS, ScalingSignals, build_scaler
from workers.scaling.workload_forecast import InstanceCapacity

CAP = 1000
CONFIG = InstanceScalerConfig(window_s=600.0, kv_capacity_tokens=CAP, max_replicas=20)
L = 100


def busy(share_over: float) -> list[int]:
    """A look-ahead map over 95 % of the KV capacity in ``share_over`` of L iterations."""
    over = round(share_over * L)
    return [990] * over + [500] * (L - over)


def idle(peak: int) -> list[int]:
    return [peak] + [peak // 2] * (L - 1)


def step(state: InstanceScalerState, now: float, **kw: object) -> InstanceScalerState:
    signals = ScalerSignals(
        forecast_n=kw.get("forecast_n"),  # type: ignore[arg-type]
        reactive_n=kw.get("reactive_n", 1),  # type: ignore[arg-type]
        lookaheads=kw.get("lookaheads", []),  # type: ignore[arg-type]
    )
    return InstanceScaler(CONFIG).step(state, now, signals)


def test_an_instance_is_potentially_overloaded_above_95_percent_in_over_10_percent() -> None:
    scaler = InstanceScaler(CONFIG)
    assert not scaler.overloaded(busy(0.10))  # exactly 10 %: not more than 10 %
    assert scaler.overloaded(busy(0.11))
    assert not scaler.overloaded([950] * L)  # at 95 %, not above it
    assert not scaler.overloaded([])


def test_each_window_starts_at_the_forecast_n() -> None:
    state = step(InstanceScalerState(n_target=2), 600.0, forecast_n=5)
    assert (state.n_target, state.window) == (5, 1)
    # Later in the same window a new forecast is not applied again.
    assert step(state, 900.0, forecast_n=9).n_target == 5
    assert step(state, 1200.0, forecast_n=9).n_target == 9  # the next window's start


def test_one_more_instance_per_overloaded_instance_and_not_twice_while_it_starts() -> None:
    state = InstanceScalerState(n_target=3, window=1)
    maps = [busy(0.5), busy(0.2), idle(400)]
    grown = step(state, 700.0, lookaheads=maps)
    assert grown.n_target == 5
    # Beats later, the two new ones still cold-starting: the same three ready maps.
    assert step(grown, 760.0, lookaheads=maps).n_target == 5


def test_scale_down_only_when_all_stay_under_30_percent_and_once_per_window() -> None:
    state = InstanceScalerState(n_target=6, window=1)
    maps = [idle(200)] * 6  # 20 % peak each: 1.2 replicas' worth, packed to 30 % -> 4
    down = step(state, 700.0, lookaheads=maps)
    assert (down.n_target, down.scaled_down_in) == (4, 1)
    assert step(down, 800.0, lookaheads=[idle(100)] * 4).n_target == 4  # once per window
    assert step(down, 1300.0, forecast_n=None, lookaheads=[idle(100)] * 4).n_target == 2
    one_busy = [idle(200)] * 5 + [idle(400)]
    assert step(state, 700.0, lookaheads=one_busy).n_target == 6


def test_a_forecast_scale_down_is_the_windows_one_scale_down() -> None:
    state = step(InstanceScalerState(n_target=6, window=0), 600.0, forecast_n=4)
    assert (state.n_target, state.scaled_down_in) == (4, 1)
    assert step(state, 700.0, lookaheads=[idle(50)] * 4).n_target == 4


def test_never_below_the_reactive_n_nor_outside_the_bounds() -> None:
    state = InstanceScalerState(n_target=2, window=1)
    assert step(state, 700.0, reactive_n=7).n_target == 7
    assert step(state, 1200.0, forecast_n=50).n_target == 20
    assert step(state, 1200.0, forecast_n=0).n_target == 1


def test_the_state_survives_a_round_trip_and_junk_is_a_fresh_start() -> None:
    state = InstanceScalerState(n_target=4, window=3, scaled_down_in=2)
    assert InstanceScalerState.from_dict(state.to_dict(), 1) == state
    assert InstanceScalerState.from_dict({"n_target": "x"}, 3) == InstanceScalerState(3)


@pytest.mark.parametrize(
    "kwargs",
    [{"kv_capacity_tokens": 0}, {"overload_usage": 1.5}, {"min_replicas": 5, "max_replicas": 2}],
)
def test_bad_config_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        InstanceScalerConfig(**kwargs)  # type: ignore[arg-type]


def test_the_registry_offers_both_and_preserve_is_proactive_plus_reactive() -> None:
    assert set(SCALERS) == {"request-rate", "preserve"}
    autoscaler = AutoscalerConfig(target_qps_per_replica=1.0, upscale_delay_s=0.0)
    reactive = build_scaler("request-rate", autoscaler)
    preserve = build_scaler("preserve", autoscaler, CONFIG)
    quiet = ScalingSignals(qps=2.0, forecast_n=6)
    assert reactive.step({}, 1, 600.0, quiet)[0] == 2  # the forecast means nothing to it
    n, state = preserve.step({}, 1, 600.0, quiet)
    assert n == 6 and set(state) == {"autoscaler", "instance_scaler"}
    burst = ScalingSignals(qps=9.0, forecast_n=6)
    assert preserve.step(state, 6, 660.0, burst)[0] == 9  # the reactive floor
    with pytest.raises(ValueError, match="unknown scaling policy 'lstm'"):
        build_scaler("lstm", autoscaler)


def test_the_forecast_n_covers_the_windows_not_yet_past() -> None:
    capacity = InstanceCapacity(prompt=1000.0, decode=500.0, total=1200.0)
    entry = {"next_window": 10, "forecast": {"prompt": [1500.0, 3500.0], "decode": [100.0, 0.0]}}
    assert forecast_instances(entry, 10, capacity) == 4  # the next window's 3500 prompt
    assert forecast_instances(entry, 11, capacity) == 4
    # A beat late: window 10 is past, only window 11 counts (here the smaller one).
    low = {"next_window": 10, "forecast": {"prompt": [3500.0, 900.0], "decode": [0.0, 0.0]}}
    assert forecast_instances(low, 11, capacity) == 1
    assert forecast_instances(entry, 12, capacity) is None  # every window forecast is past
    assert forecast_instances({"next_window": "x"}, 10, capacity) is None
    assert forecast_instances({"next_window": 10, "forecast": {}}, 10, capacity) is None
