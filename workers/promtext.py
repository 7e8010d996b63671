"""Compute what rollups need from Prometheus text (parsed by ``core.prom_text``).

Pure functions (no Django, no I/O) so the arithmetic is testable on its own: counter
deltas between two scrapes (a counter that went
down means the process restarted, and its current value is the delta, as
Prometheus' ``increase`` treats resets), and quantiles from histogram bucket deltas
with ``histogram_quantile``'s linear interpolation inside the bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from core.prom_text import Sample, parse

__all__ = ["Sample", "counter_deltas", "histogram_quantile", "parse", "series_from_key"]


def series_from_key(key: str) -> tuple[str, dict[str, str]]:
    """Inverse of ``Sample.key`` (label values never contain ``,`` or ``=`` here:
    they are model, replica, route and status names from configuration)."""
    name, _, inner = key.partition("|")
    labels = dict(pair.split("=", 1) for pair in inner.split(",") if "=" in pair)
    return name, labels


def counter_deltas(previous: Mapping[str, float], current: Mapping[str, float]) -> dict[str, float]:
    """Increase of every series since ``previous``; a reset counts from zero."""
    deltas = {}
    for key, value in current.items():
        before = previous.get(key, 0.0)
        deltas[key] = value - before if value >= before else value
    return deltas


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile from cumulative ``(upper_bound, count)`` bucket pairs.

    None when there were no observations.  A quantile in the ``+Inf`` bucket is
    reported as the highest finite bound (as Prometheus does)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound
