"""Rolling-origin evaluation of the workload forecaster, as PreServe §5.2.1 does it.

The series is split in time (``train_fraction``: PreServe uses 1:1).  The model is
fitted on the first part; then, window by window, it forecasts window ``t`` from the
windows up to ``t - lead`` (``lead=2`` is Algorithm 2: at the start of window i the
scaler needs window i+1), takes each finished window as the online phase does
(``observe``) and refits on everything seen every ``retrain_every`` windows (PreServe
retrains daily).  The absolute percentage error of a window is
``|forecast - truth| / truth``; windows with no traffic have no APE and are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.scaling.workload_forecast import DAY_WINDOWS, ForecasterConfig, WorkloadModel, fit


@dataclass(frozen=True, slots=True)
class WindowError:
    index: int
    truth: float
    forecast: float

    @property
    def ape(self) -> float:
        return abs(self.forecast - self.truth) / self.truth


@dataclass(frozen=True, slots=True)
class ApeSummary:
    windows: int
    mean_ape: float
    median_ape: float
    p90_ape: float
    max_ape: float


def rolling_forecasts(
    series: Sequence[float],
    config: ForecasterConfig,
    *,
    train_fraction: float = 0.5,
    retrain_every: int = DAY_WINDOWS,
    lead: int = 2,
) -> list[WindowError]:
    """One ``WindowError`` per test window with traffic."""
    if not 0 < train_fraction < 1:
        raise ValueError("train_fraction must lie strictly between 0 and 1")
    if lead < 1 or retrain_every < 1:
        raise ValueError("lead and retrain_every must be at least 1")
    split = int(len(series) * train_fraction)
    if split < config.min_history or split + lead > len(series):
        raise ValueError(f"{len(series)} windows are too few to split at {train_fraction}")
    model: WorkloadModel = fit(series[:split], 0, config)
    errors: list[WindowError] = []
    for target in range(split + lead - 1, len(series)):
        # Bring the model to "observed through target - lead".
        while model.next_index <= target - lead:
            seen = model.next_index + 1
            if (seen - split) % retrain_every == 0:
                model = fit(series[:seen], 0, config)
            else:
                model = model.observe(series[model.next_index])
        truth = float(series[target])
        if truth > 0:
            errors.append(WindowError(target, truth, model.forecast(lead)[-1]))
    return errors


def summarize(errors: Sequence[WindowError]) -> ApeSummary:
    if not errors:
        raise ValueError("no window with traffic to score")
    apes = sorted(e.ape for e in errors)
    n = len(apes)
    return ApeSummary(
        windows=n,
        mean_ape=sum(apes) / n,
        median_ape=apes[n // 2],
        p90_ape=apes[min(n - 1, int(0.9 * n))],
        max_ape=apes[-1],
    )


def persistence(
    series: Sequence[float], *, train_fraction: float = 0.5, lead: int = 2
) -> list[WindowError]:
    """The naive baseline on the same test windows: window ``t`` forecast as ``t - lead``."""
    split = int(len(series) * train_fraction)
    return [
        WindowError(t, float(series[t]), float(series[t - lead]))
        for t in range(split + lead - 1, len(series))
        if series[t] > 0
    ]


def above(errors: Sequence[WindowError], floor_share: float) -> list[WindowError]:
    """The windows whose truth is at least ``floor_share`` of the median truth: a
    recording gap or an outage (a window with a few requests) makes APE meaningless."""
    if not errors:
        return []
    truths = sorted(e.truth for e in errors)
    floor = floor_share * truths[len(truths) // 2]
    return [e for e in errors if e.truth >= floor]
