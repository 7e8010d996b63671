"""``manage.py bench forecaster``: the workload forecaster's APE per window, PreServe's way.

    manage.py bench forecaster --servegen $SERVEGEN/language/m-large,$SERVEGEN/language/m-mid \\
        --azure $AZURE/AzureLLMInferenceTrace_conv.csv

``$SERVEGEN``: the ``data/`` folder of github.com/alibaba/ServeGen; ``$AZURE``: the
``data/`` folder of github.com/Azure/AzurePublicDataset (the 2023 traces).

Each trace is split 1:1 in time (PreServe §5.2.1); the model is fitted on the first
half, refitted daily (every 144 ten-minute windows) and forecasts each test window two
windows ahead (``--lead``, Algorithm 2).  Per trace and series (prompt, decode
tokens) the table gives mean, median, p90 and max APE over the windows with traffic,
the mean APE without windows under 10 % of the median (recording gaps: m-mid has
empty windows), the naive "same as ``lead`` windows ago" baseline on the same windows,
and PreServe's reported mLSTM mean APE beside it.  A second table gives the mean APE
per test day.  ``--json`` (default ``var/forecasts/ape.json``) keeps every window for
the console's Forecast page.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings

from workers.scaling.forecast_eval import (
    WindowError,
    above,
    persistence,
    rolling_forecasts,
    summarize,
)
from workers.scaling.workload_forecast import DAY_WINDOWS, ForecasterConfig
from workers.scaling.workload_traces import WindowSeries, azure_series, servegen_series

# PreServe Table 1 (mLSTM, Azure 2024, 10-minute windows): mean APE per service and series.
PAPER_MEAN_APE = "4.15-8.45 % (chat 4.15/4.30, code 7.74/8.45)"
GAP_SHARE = 0.1


def report_path() -> Path:
    return Path(settings.VAR_DIR) / "forecasts" / "ape.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servegen", default="", help="ServeGen model folder(s), comma-separated")
    parser.add_argument("--azure", default="", help="Azure LLM inference CSV(s), comma-separated")
    parser.add_argument(
        "--azure-window-s",
        type=float,
        default=60.0,
        help="Azure window (the 2023 trace is one hour long: 10-minute windows give six)",
    )
    parser.add_argument("--lead", type=int, default=2, help="windows ahead (Algorithm 2: 2)")
    parser.add_argument("--json", default="", help="where to keep every window (default var/)")


@dataclass(frozen=True)
class SeriesResult:
    trace: str
    series: str
    window_s: float
    lengths_known: bool
    errors: list[WindowError]
    baseline: list[WindowError]
    fit_cpu_s: float


def evaluate(trace: WindowSeries, lead: int) -> list[SeriesResult]:
    day = round(86400 / trace.window_s)
    # Daily and weekly seasons where the windows are 10 minutes; none on a one-hour trace.
    periods = (day, 7 * day) if trace.window_s == 600.0 else ()
    config = ForecasterConfig(periods=periods)
    retrain = DAY_WINDOWS if trace.window_s == 600.0 else len(trace.prompt)
    results = []
    for name, values in (("prompt", trace.prompt), ("decode", trace.decode)):
        started = time.process_time()
        errors = rolling_forecasts(values, config, retrain_every=retrain, lead=lead)
        cpu = time.process_time() - started
        base = persistence(values, lead=lead)
        results.append(
            SeriesResult(trace.name, name, trace.window_s, trace.lengths_known, errors, base, cpu)
        )
    return results


def load(options: dict[str, Any]) -> list[WindowSeries]:
    traces = [servegen_series(Path(p)) for p in _paths(options["servegen"])]
    traces += [azure_series(Path(p), options["azure_window_s"]) for p in _paths(options["azure"])]
    if not traces:
        raise ValueError("give --servegen FOLDER and/or --azure CSV")
    return traces


def _paths(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def format_table(results: list[SeriesResult]) -> str:
    header = (
        f"{'trace':<22} {'series':<7} {'window':>6} {'n':>5} {'mean':>7} {'median':>7}"
        f" {'p90':>7} {'max':>8} {'mean*':>7} {'naive':>7} {'cpu s':>6}"
    )
    rows = [header, "-" * len(header)]
    for r in results:
        s, gapless = summarize(r.errors), summarize(above(r.errors, GAP_SHARE))
        naive = summarize(above(r.baseline, GAP_SHARE))
        rows.append(
            f"{r.trace:<22} {r.series:<7} {r.window_s:>5.0f}s {s.windows:>5}"
            f" {s.mean_ape:>7.1%} {s.median_ape:>7.1%} {s.p90_ape:>7.1%} {s.max_ape:>8.1%}"
            f" {gapless.mean_ape:>7.1%} {naive.mean_ape:>7.1%} {r.fit_cpu_s:>6.1f}"
        )
    rows.append(
        f"mean*: windows >= {GAP_SHARE:.0%} of the median; naive: the window {{lead}} back,"
        f" same windows as mean*.  PreServe (mLSTM, Azure 2024): {PAPER_MEAN_APE}."
    )
    return "\n".join(rows)


def format_days(results: list[SeriesResult]) -> str:
    lines = ["mean APE by test day (windows >= 10 % of the median)"]
    for r in results:
        per_day = max(1, round(86400 / r.window_s))
        days: dict[int, list[float]] = {}
        for e in above(r.errors, GAP_SHARE):
            days.setdefault(e.index // per_day, []).append(e.ape)
        cells = " ".join(f"d{d}:{sum(v) / len(v):.1%}" for d, v in sorted(days.items()))
        lines.append(f"{r.trace:<22} {r.series:<7} {cells}")
    return "\n".join(lines)


def to_json(results: list[SeriesResult], lead: int) -> dict[str, object]:
    return {
        "lead": lead,
        "paper_mean_ape": PAPER_MEAN_APE,
        "series": [
            {
                "trace": r.trace,
                "series": r.series,
                "window_s": r.window_s,
                "lengths_known": r.lengths_known,
                "mean_ape": summarize(r.errors).mean_ape,
                "mean_ape_gapless": summarize(above(r.errors, GAP_SHARE)).mean_ape,
                "naive_mean_ape": summarize(above(r.baseline, GAP_SHARE)).mean_ape,
                "index": [e.index for e in r.errors],
                "truth": [e.truth for e in r.errors],
                "forecast": [e.forecast for e in r.errors],
            }
            for r in results
        ],
    }


def run(options: dict[str, Any], stdout: TextIO) -> None:
    lead = options["lead"]
    results = [r for trace in load(options) for r in evaluate(trace, lead)]
    stdout.write(format_table(results).replace("{lead}", str(lead)) + "\n\n")
    stdout.write(format_days(results) + "\n")
    path = Path(options["json"]) if options["json"] else report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results, lead)))
    stdout.write(f"\nwindows kept in {path}\n")
