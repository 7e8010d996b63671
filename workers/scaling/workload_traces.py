"""Per-window demand from the shared workload traces, for the forecaster and the simulator.

* **ServeGen** (Alibaba Bailian, ``language/<model>/chunk-<id>-trace.csv``): per
  client, one row per 600 s window: ``window_start_s, rate, cv, iat_dist, p1, p2``,
  ``rate`` in requests/s.  A model's requests in a window are the sum over its clients
  of ``rate * 600``.  m-large and m-mid come without their length distributions, so
  their prompt and decode token densities are the request count times a fixed mean
  length: the APE of either density is the APE of the request count.
* **Azure LLM inference 2023** (``TIMESTAMP,ContextTokens,GeneratedTokens``): one row
  per request; prompt and decode tokens are summed per window.  The conversation
  trace covers one hour, so it is bucketed into shorter windows than 10 minutes.

A file in another format is refused with the format that was expected.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

SERVEGEN_WINDOW_S = 600.0
SERVEGEN_FORMAT = "ServeGen chunk-<id>-trace.csv: window_start_s,rate,cv,iat_dist,param1,param2"
AZURE_FORMAT = "Azure LLM inference CSV with header TIMESTAMP,ContextTokens,GeneratedTokens"


@dataclass(frozen=True)
class WindowSeries:
    """Demand per window, windows ``0 .. n-1`` from the trace's start."""

    name: str
    window_s: float
    requests: tuple[float, ...]
    prompt: tuple[float, ...]  # tokens; None-free: a fixed mean length when unknown
    decode: tuple[float, ...]
    lengths_known: bool


def servegen_requests(folder: Path) -> tuple[float, ...]:
    """Requests per 600 s window summed over every client file in ``folder``."""
    files = sorted(folder.glob("chunk-*-trace.csv"))
    if not files:
        raise ValueError(f"{folder}: no chunk-*-trace.csv files; expected {SERVEGEN_FORMAT}")
    total: dict[int, float] = defaultdict(float)
    for path in files:
        with path.open(newline="") as handle:
            for line, row in enumerate(csv.reader(handle), start=1):
                try:
                    start, rate = float(row[0]), float(row[1]) if row[1] else 0.0
                except (IndexError, ValueError):
                    raise ValueError(
                        f"{path}:{line}: not a ServeGen rate row; expected {SERVEGEN_FORMAT}"
                    ) from None
                total[int(start // SERVEGEN_WINDOW_S)] += rate * SERVEGEN_WINDOW_S
    return tuple(total.get(i, 0.0) for i in range(max(total) + 1))


def servegen_series(
    folder: Path, *, mean_prompt: float = 1000.0, mean_decode: float = 250.0
) -> WindowSeries:
    requests = servegen_requests(folder)
    return WindowSeries(
        name=f"servegen/{folder.name}",
        window_s=SERVEGEN_WINDOW_S,
        requests=requests,
        prompt=tuple(r * mean_prompt for r in requests),
        decode=tuple(r * mean_decode for r in requests),
        lengths_known=False,
    )


def azure_series(path: Path, window_s: float) -> WindowSeries:
    """Requests, prompt and decode tokens per ``window_s`` from the first request on."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{path}: header {header!r}; expected {AZURE_FORMAT}")
        for line, row in enumerate(reader, start=2):
            try:
                # Seven fractional digits: Python's parser takes six.
                stamp = datetime.fromisoformat(row[0][:26]).timestamp()
                rows.append((stamp, int(row[1]), int(row[2])))
            except (IndexError, ValueError):
                raise ValueError(
                    f"{path}:{line}: not a request row; expected {AZURE_FORMAT}"
                ) from None
    if not rows:
        raise ValueError(f"{path}: no requests")
    start = min(r[0] for r in rows)
    n = math.floor((max(r[0] for r in rows) - start) / window_s) + 1
    requests, prompt, decode = [0.0] * n, [0.0] * n, [0.0] * n
    for stamp, context, generated in rows:
        i = math.floor((stamp - start) / window_s)
        requests[i] += 1
        prompt[i] += context
        decode[i] += generated
    # The last window is cut short by the end of the recording: it is left out.
    return WindowSeries(
        name=f"azure/{path.stem.rsplit('_', 1)[-1]}",
        window_s=window_s,
        requests=tuple(requests[:-1]),
        prompt=tuple(prompt[:-1]),
        decode=tuple(decode[:-1]),
        lengths_known=True,
    )
