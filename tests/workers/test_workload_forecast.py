"""The workload forecaster on synthetic series whose truth the test computes."""

from __future__ import annotations

import math
import random

import pytest

from workers.scaling.forecast_eval import rolling_forecasts, summarize
from workers.scaling.workload_forecast import (
    ForecasterConfig,
    InstanceCapacity,
    WorkloadModel,
    fit,
    usable_periods,
)

DAY = 24  # short "days" keep the fits quick; the arithmetic is the same as 144


def truth(index: int, *, weekly: bool = True) -> float:
    """Tokens in window ``index``: a daily swing times a weekday/weekend factor."""
    daily = 1.0 + 0.6 * math.sin(2 * math.pi * index / DAY)
    week = 1.0 + (0.5 if (index // DAY) % 7 >= 5 else 0.0) if weekly else 1.0
    return 10_000.0 * daily * week


CONFIG = ForecasterConfig(periods=(DAY, 7 * DAY))


def test_a_seasonal_series_is_forecast_within_a_few_percent_two_windows_ahead() -> None:
    history = [truth(i) for i in range(21 * DAY)]
    model = fit(history, 0, CONFIG)
    assert {period for period, _ in model.profiles} == {DAY, 7 * DAY}
    ahead = model.forecast(2)
    for k, forecast in enumerate(ahead):
        expected = truth(21 * DAY + k)
        assert abs(forecast - expected) / expected < 0.03


def test_the_phase_comes_from_the_first_index_not_the_list_position() -> None:
    offset = 5 * DAY + 7
    history = [truth(offset + i, weekly=False) for i in range(4 * DAY)]
    model = fit(history, offset, ForecasterConfig(periods=(DAY,)))
    expected = truth(offset + 4 * DAY, weekly=False)
    assert abs(model.forecast(1)[0] - expected) / expected < 0.03


def test_observe_moves_the_level_with_a_step_change() -> None:
    history = [truth(i, weekly=False) for i in range(4 * DAY)]
    model = fit(history, 0, ForecasterConfig(periods=(DAY,)))
    for i in range(4 * DAY, 5 * DAY):
        model = model.observe(2 * truth(i, weekly=False))  # traffic doubled
    expected = 2 * truth(5 * DAY, weekly=False)
    assert model.next_index == 5 * DAY
    assert abs(model.forecast(1)[0] - expected) / expected < 0.1


def test_a_period_needs_two_cycles_of_history() -> None:
    assert usable_periods(14 * DAY, CONFIG) == (DAY,)
    assert usable_periods(14 * DAY + 1, CONFIG) == (DAY, 7 * DAY)
    model = fit([truth(i) for i in range(3 * DAY)], 0, CONFIG)
    assert [period for period, _ in model.profiles] in ([DAY], [])


def test_noise_without_a_season_falls_back_to_the_level_alone() -> None:
    rng = random.Random(7)
    level = 1000.0
    history = []
    for _ in range(6 * DAY):
        level *= math.exp(rng.gauss(0, 0.3))  # a random walk: no day in it
        history.append(level)
    model = fit(history, 0, ForecasterConfig(periods=(DAY,)))
    assert model.profiles == ()


def test_the_rolling_evaluation_scores_a_seasonal_series_well_and_a_shuffled_one_badly() -> None:
    series = [truth(i, weekly=False) for i in range(8 * DAY)]
    config = ForecasterConfig(periods=(DAY,))
    clean = summarize(rolling_forecasts(series, config, retrain_every=DAY))
    assert clean.windows == 4 * DAY - 1
    assert clean.mean_ape < 0.03
    shuffled = series[: 4 * DAY] + random.Random(1).sample(series[4 * DAY :], 4 * DAY)
    noisy = summarize(rolling_forecasts(shuffled, config, retrain_every=DAY))
    assert noisy.mean_ape > 5 * clean.mean_ape


def test_a_stored_model_reads_back_the_same() -> None:
    model = fit([truth(i) for i in range(3 * DAY)], 11, CONFIG)
    again = WorkloadModel.from_dict(model.to_dict())
    assert again == model
    with pytest.raises(ValueError, match="not a stored workload model"):
        WorkloadModel.from_dict(
            {"profiles": [[3, [0.0]]], "alpha": 0.5, "level": 1.0, "next_index": 1}
        )
    with pytest.raises(ValueError, match="not a stored workload model"):
        WorkloadModel.from_dict({"alpha": 0.5})


@pytest.mark.parametrize(
    ("series", "message"),
    [([1.0] * 5, "at least 12 windows"), ([1.0] * 20 + [-1.0], "non-negative")],
)
def test_bad_history_is_refused(series: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(series, 0, CONFIG)


def test_a_window_must_be_a_count() -> None:
    model = fit([truth(i) for i in range(2 * DAY)], 0, CONFIG)
    with pytest.raises(ValueError, match="finite count"):
        model.observe(float("nan"))


def test_instances_follow_the_tightest_of_prefill_decode_and_total() -> None:
    capacity = InstanceCapacity(prompt=1000.0, decode=200.0, total=1100.0)
    assert capacity.instances(prompt=2500.0, decode=100.0) == 3  # prefill bound
    assert capacity.instances(prompt=100.0, decode=700.0) == 4  # decode bound
    assert capacity.instances(prompt=900.0, decode=190.0) == 1
    assert capacity.instances(prompt=0.0, decode=0.0) == 0
    with pytest.raises(ValueError, match="positive"):
        InstanceCapacity(prompt=0.0, decode=1.0, total=1.0)
