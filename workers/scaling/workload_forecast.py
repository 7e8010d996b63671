"""Token density per window, forecast from its own history (PreServe §4.1).

PreServe forecasts, per service, the prompt and the decode tokens of each 10-minute
window with an mLSTM and reports 4-8 % mean APE on the Azure 2024 code and chat traces
(Table 1; 4.23 % on chat).  We do not train a recurrent network in a Celery worker.
The workload is a level times a daily and a weekly profile, so this module fits, on
``log1p`` of the series (a multiplicative season, errors relative as APE is):

* **MSTL** (statsmodels; Bandara et al. 2021): one STL pass per seasonal period, here
  144 windows (a day) and 1008 (a week), each period kept only when the history holds
  at least two of its cycles;
* **simple exponential smoothing** (statsmodels' Holt-Winters fit of alpha) on what is
  left, the deseasonalised level.

A fit takes about 2 s of one core on two weeks of windows (2,016), so the worker
retrains daily (as PreServe retrains its mLSTM) and between fits only moves the level
with each finished window (``WorkloadModel.observe``: one multiply-add), which is the
paper's online phase.  The forecast ``steps`` ahead is the level plus each period's
profile at that phase; ``steps=2`` is PreServe's Algorithm 2, which forecasts the
current window and then the next, at the beginning of the current one.

No I/O and no clock: inputs are numbers and window indices, outputs are numbers; the
glue (``workers.forecasting``) reads the rollups and stores the model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DAY_WINDOWS = 144  # 10-minute windows in a day
WEEK_WINDOWS = 7 * DAY_WINDOWS


@dataclass(frozen=True, slots=True)
class ForecasterConfig:
    """``periods``: seasonal periods in windows; one is used only with two cycles of
    history.  ``min_history``: fewer windows than this is too little to fit anything.
    ``holdout_share``: the recent share of the history that decides whether the
    season is used at all (0: always use it)."""

    periods: tuple[int, ...] = (DAY_WINDOWS, WEEK_WINDOWS)
    min_history: int = 12
    holdout_share: float = 0.2
    # A clean history makes every alpha fit; a level that never moves would then miss
    # a shift in traffic for good.  0.1 follows a step within about 20 windows.
    min_alpha: float = 0.1

    def __post_init__(self) -> None:
        if any(p < 2 for p in self.periods):
            raise ValueError(f"seasonal periods must be at least 2 windows, got {self.periods}")
        if self.min_history < 3:
            raise ValueError("min_history must be at least 3 windows")
        if not 0 <= self.holdout_share < 1:
            raise ValueError("holdout_share must lie in [0, 1)")
        if not 0 < self.min_alpha <= 1:
            raise ValueError("min_alpha must lie in (0, 1]")


@dataclass(frozen=True, slots=True)
class WorkloadModel:
    """A fitted series: profiles by phase (window index mod period), level, alpha.

    ``next_index`` is the window the level stands for: the first not yet observed.
    """

    profiles: tuple[tuple[int, tuple[float, ...]], ...]  # (period, value by phase)
    alpha: float
    level: float
    next_index: int

    def seasonal(self, index: int) -> float:
        return sum(values[index % period] for period, values in self.profiles)

    def forecast(self, steps: int = 1) -> tuple[float, ...]:
        """Windows ``next_index`` .. ``next_index + steps - 1``, in the series' units."""
        if steps < 1:
            raise ValueError("steps must be at least 1")
        return tuple(
            max(0.0, math.expm1(self.level + self.seasonal(self.next_index + k)))
            for k in range(steps)
        )

    def observe(self, value: float) -> WorkloadModel:
        """The window ``next_index`` finished with ``value``: move the level on."""
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"a window's tokens must be a finite count >= 0, got {value}")
        residual = math.log1p(value) - self.seasonal(self.next_index)
        level = self.alpha * residual + (1 - self.alpha) * self.level
        return WorkloadModel(self.profiles, self.alpha, level, self.next_index + 1)

    def to_dict(self) -> dict[str, object]:
        return {
            "profiles": [[period, list(values)] for period, values in self.profiles],
            "alpha": self.alpha,
            "level": self.level,
            "next_index": self.next_index,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> WorkloadModel:
        """ValueError for anything ``to_dict`` did not write."""
        raw, alpha, level, index = (
            data.get(k) for k in ("profiles", "alpha", "level", "next_index")
        )
        if not (
            isinstance(raw, list)
            and isinstance(alpha, float)
            and isinstance(level, float)
            and isinstance(index, int)
        ):
            raise ValueError("not a stored workload model: a field is missing or mistyped")
        try:
            profiles = tuple((int(p), tuple(float(v) for v in values)) for p, values in raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a stored workload model: {exc}") from None
        if any(len(values) != period for period, values in profiles):
            raise ValueError("not a stored workload model: a profile's length is not its period")
        return cls(profiles, alpha, level, index)


def usable_periods(n: int, config: ForecasterConfig) -> tuple[int, ...]:
    """The periods with more than two full cycles in ``n`` windows."""
    return tuple(sorted(p for p in config.periods if n > 2 * p))  # MSTL: p < n / 2


def fit(series: Sequence[float], first_index: int, config: ForecasterConfig) -> WorkloadModel:
    """Fit one series whose first window has index ``first_index`` (its phase).

    With seasonal periods usable, the last ``holdout_share`` of the history first
    decides whether the season helps: bursty traffic (ServeGen's batch clients) can
    make yesterday's profile a worse guide than the level alone, and then the
    seasonal model is not used.
    """
    values = np.asarray(series, dtype=float)
    if values.ndim != 1 or len(values) < config.min_history:
        raise ValueError(
            f"need at least {config.min_history} windows of history, got {len(values)}"
        )
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("token counts must be finite and non-negative")
    periods = usable_periods(len(values), config)
    holdout = int(len(values) * config.holdout_share)
    head = len(values) - holdout
    if periods and holdout >= 1 and usable_periods(head, config):
        seasonal = _fit_periods(values[:head], first_index, usable_periods(head, config), config)
        level_only = _fit_periods(values[:head], first_index, (), config)
        if _holdout_ape(level_only, values[head:]) <= _holdout_ape(seasonal, values[head:]):
            periods = ()
    return _fit_periods(values, first_index, periods, config)


def _holdout_ape(model: WorkloadModel, holdout: np.ndarray) -> float:
    """Mean APE two windows ahead (the scaler's lead) over ``holdout``'s windows with
    traffic, taking each window as seen."""
    total, count = 0.0, 0
    pending: float | None = None  # the forecast for this window, made two windows back
    # A recording gap or an outage (a window with a few requests) scores any forecast
    # of the usual level as a huge APE: such windows do not judge the season.
    floor = 0.1 * float(np.median(holdout))
    for value in holdout:
        if pending is not None and value > 0 and value >= floor:
            total += abs(pending - value) / value
            count += 1
        pending = model.forecast(2)[1]
        model = model.observe(float(value))
    return total / count if count else 0.0


def _fit_periods(
    values: np.ndarray, first_index: int, periods: tuple[int, ...], config: ForecasterConfig
) -> WorkloadModel:
    logged = np.log1p(values)
    profiles: list[tuple[int, tuple[float, ...]]] = []
    rest = logged
    if periods:
        seasonal = _mstl(logged, periods)
        rest = logged - seasonal.sum(axis=1)
        for k, period in enumerate(periods):
            tail = seasonal[-period:, k]
            # Indexed by absolute phase: the last cycle's window j has index first+n-p+j.
            start = (first_index + len(values) - period) % period
            profiles.append(
                (period, tuple(float(tail[(p - start) % period]) for p in range(period)))
            )
    alpha, level = _smooth(rest, config.min_alpha)
    return WorkloadModel(tuple(profiles), alpha, level, first_index + len(values))


def _statsmodels() -> tuple[Any, Any]:
    """MSTL and SimpleExpSmoothing, imported on first use (the balancer never needs them)."""
    from statsmodels.tsa.holtwinters import SimpleExpSmoothing
    from statsmodels.tsa.seasonal import MSTL

    return MSTL, SimpleExpSmoothing


def _mstl(logged: np.ndarray, periods: tuple[int, ...]) -> np.ndarray:
    mstl, _ = _statsmodels()
    # Robust LOESS: outage windows (no traffic), bursts and a weekend's step do not
    # bend the profiles.  statsmodels' default of 15 robustness passes costs 18 s on two
    # weeks of windows; 3 passes of 1 inner loop cost 2 s and fit as well.
    chosen = periods if len(periods) > 1 else periods[0]
    robust = {"robust": True, "outer_iter": 3, "inner_iter": 1}
    result = mstl(logged, periods=chosen, stl_kwargs=robust).fit()
    seasonal = np.asarray(result.seasonal, dtype=float)
    return seasonal.reshape(len(logged), -1)


def _smooth(rest: np.ndarray, min_alpha: float) -> tuple[float, float]:
    """Alpha and the final level of simple exponential smoothing over ``rest``."""
    _, simple_exp_smoothing = _statsmodels()
    if float(np.ptp(rest)) == 0.0:
        return max(0.5, min_alpha), float(
            rest[-1]
        )  # a flat series: any alpha, the level is the value
    with warnings.catch_warnings():
        # statsmodels warns about convergence on short or flat series; the fit stands.
        warnings.simplefilter("ignore")
        result = simple_exp_smoothing(rest, initialization_method="estimated").fit()
    alpha = float(result.params["smoothing_level"])
    level = float(np.asarray(result.level)[-1])
    return min(max(alpha, min_alpha), 1.0), level


@dataclass(frozen=True, slots=True)
class InstanceCapacity:
    """Tokens one instance serves per window within its SLO (PreServe profiles the
    maximum prefill, decode and total throughput of SLO-clean windows)."""

    prompt: float
    decode: float
    total: float

    def __post_init__(self) -> None:
        if min(self.prompt, self.decode, self.total) <= 0:
            raise ValueError(f"instance capacity must be positive, got {self}")

    def instances(self, prompt: float, decode: float) -> int:
        """PreServe Algorithm 2, line 5: max(P/mu_p, D/mu_d, (P+D)/mu_t), rounded up."""
        need = max(prompt / self.prompt, decode / self.decode, (prompt + decode) / self.total)
        return max(0, math.ceil(need - 1e-9))
