"""Workload forecasts from the metric rollups, kept in Redis (PreServe §4.1, the glue).

Each run (the ``forecast_workload`` beat, one per window) reads the region rollups of
the last ``history_s``, sums their prompt and completion tokens per window (windows
numbered from the Unix epoch, so a window's phase is its time of day and weekday in
UTC), and per region and for all regions together (``ALL``):

* refits the prompt and the decode model (``workers.scaling.workload_forecast.fit``)
  when the stored ones are older than ``retrain_s`` or missing;
* otherwise moves the stored models on by the windows that finished since
  (``observe``), which costs nothing;
* stores the models, the forecast of the current and the next window, and the last
  day of actuals (for the console's plot) under ``meridian:forecast:<scope>``.

The rollups only ever hold ``MERIDIAN_ROLLUP_RETENTION_S`` of history: weekly
seasonality needs two weeks of it.  A window with no rollup at all counts as a window
with no traffic (the stack was down, nobody was served).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from fleet.models import MetricRollup
from workers.scaling.workload_forecast import ForecasterConfig, WorkloadModel, fit

logger = logging.getLogger(__name__)

FORECAST_KEY = "meridian:forecast:{scope}"
ALL = "all"
PLOT_WINDOWS_S = 86400.0  # actuals kept beside the forecast for the console's plot


@dataclass(frozen=True)
class ForecastSettings:
    window_s: float = 600.0
    history_s: float = 7 * 86400.0
    retrain_s: float = 86400.0

    def config(self) -> ForecasterConfig:
        """Daily and weekly periods in windows (a window must divide a day)."""
        day = 86400.0 / self.window_s
        if day != int(day):
            raise ValueError(f"a forecast window of {self.window_s} s does not divide a day")
        return ForecasterConfig(periods=(int(day), 7 * int(day)))


@dataclass(frozen=True)
class WindowTotals:
    """Token sums of consecutive windows ``first .. first + len - 1``."""

    first: int
    prompt: tuple[float, ...]
    decode: tuple[float, ...]


@dataclass(frozen=True)
class ScopeForecast:
    scope: str
    refitted: bool
    next_window: int  # the first window not yet observed: the current one
    prompt: tuple[float, ...]  # forecast of windows next_window and next_window + 1
    decode: tuple[float, ...]


def window_totals(
    rows: Iterable[tuple[datetime, int, int]], window_s: float, before: int
) -> WindowTotals | None:
    """(interval_end, prompt, completion) rows summed per window, up to ``before``
    (exclusive, the unfinished window); None without a finished window."""
    prompt: dict[int, float] = defaultdict(float)
    decode: dict[int, float] = defaultdict(float)
    for end, p, d in rows:
        index = math.floor(end.timestamp() / window_s)
        if index < before:
            prompt[index] += p
            decode[index] += d
    if not prompt:
        return None
    first = min(prompt)
    span = range(first, before)
    return WindowTotals(first, tuple(prompt[i] for i in span), tuple(decode[i] for i in span))


def _rows(since: datetime) -> dict[str, list[tuple[datetime, int, int]]]:
    by_scope: dict[str, list[tuple[datetime, int, int]]] = defaultdict(list)
    query = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REGION, interval_end__gte=since
    ).values_list("name", "interval_end", "prompt_tokens", "completion_tokens")
    for name, end, p, d in query:
        by_scope[name].append((end, p, d))
        by_scope[ALL].append((end, p, d))
    return by_scope


def load(client: redis.Redis, scope: str) -> dict[str, object] | None:
    raw = client.get(FORECAST_KEY.format(scope=scope))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _models(stored: Mapping[str, object] | None) -> tuple[WorkloadModel, WorkloadModel] | None:
    if stored is None:
        return None
    prompt, decode = stored.get("prompt_model"), stored.get("decode_model")
    if not isinstance(prompt, dict) or not isinstance(decode, dict):
        return None
    try:
        return WorkloadModel.from_dict(prompt), WorkloadModel.from_dict(decode)
    except ValueError:
        return None  # an older or corrupt entry: refit


def _bring_up(model: WorkloadModel, totals: tuple[float, ...], first: int) -> WorkloadModel:
    for index in range(model.next_index, first + len(totals)):
        model = model.observe(totals[index - first])
    return model


def forecast_scope(
    client: redis.Redis,
    scope: str,
    totals: WindowTotals,
    now_window: int,
    settings: ForecastSettings,
) -> ScopeForecast | None:
    """Refit or move on one scope's models and store them; None with too little history."""
    config = settings.config()
    stored = load(client, scope)
    models = _models(stored)
    fitted_at = stored.get("fitted_window") if stored else None
    retrain = max(1, round(settings.retrain_s / settings.window_s))
    fresh = isinstance(fitted_at, int) and now_window - fitted_at < retrain
    usable = models is not None and totals.first <= min(m.next_index for m in models)
    if models is not None and fresh and usable:
        prompt = _bring_up(models[0], totals.prompt, totals.first)
        decode = _bring_up(models[1], totals.decode, totals.first)
        refitted, fitted_window = False, fitted_at
    else:
        if len(totals.prompt) < config.min_history:
            return None
        prompt = fit(totals.prompt, totals.first, config)
        decode = fit(totals.decode, totals.first, config)
        refitted, fitted_window = True, now_window
    result = ScopeForecast(
        scope, refitted, prompt.next_index, prompt.forecast(2), decode.forecast(2)
    )
    keep = int(PLOT_WINDOWS_S / settings.window_s)
    entry = {
        "scope": scope,
        "window_s": settings.window_s,
        "fitted_window": fitted_window,
        "next_window": result.next_window,
        "forecast": {"prompt": list(result.prompt), "decode": list(result.decode)},
        "actual": {
            "first": totals.first + max(0, len(totals.prompt) - keep),
            "prompt": list(totals.prompt[-keep:]),
            "decode": list(totals.decode[-keep:]),
        },
        "prompt_model": prompt.to_dict(),
        "decode_model": decode.to_dict(),
    }
    ttl = int(max(settings.retrain_s, settings.window_s) * 2)
    client.set(FORECAST_KEY.format(scope=scope), json.dumps(entry), ex=ttl)
    return result


def forecast_workload(
    client: redis.Redis, *, now: float, settings: ForecastSettings
) -> list[ScopeForecast]:
    """One pass over every region and over all of them together."""
    now_window = math.floor(now / settings.window_s)
    since = datetime.fromtimestamp(now - settings.history_s, tz=UTC)
    results = []
    for scope, rows in sorted(_rows(since).items()):
        totals = window_totals(rows, settings.window_s, now_window)
        if totals is None:
            continue
        found = forecast_scope(client, scope, totals, now_window, settings)
        if found is None:
            logger.info("forecast %s: %d windows, too few to fit", scope, len(totals.prompt))
        else:
            results.append(found)
    return results
