"""Read Prometheus text exposition with labels, and compute what rollups need from it.

Pure functions (no Django, no I/O) so the arithmetic is testable on its own: parsing
samples with their labels, counter deltas between two scrapes (a counter that went
down means the process restarted, and its current value is the delta, as
Prometheus' ``increase`` treats resets), and quantiles from histogram bucket deltas
with ``histogram_quantile``'s linear interpolation inside the bucket.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, name: str, default: str = "") -> str:
        return dict(self.labels).get(name, default)

    @property
    def key(self) -> str:
        """A stable string naming the series (kept in Redis between scrapes)."""
        inner = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.name}|{inner}"


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value)


def parse(text: str) -> list[Sample]:
    """Every sample of ``text``; lines that are not samples are skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_RE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = tuple(
            sorted((k, _unescape(v)) for k, v in _LABEL_RE.findall(match["labels"] or ""))
        )
        out.append(Sample(match["name"], labels, value))
    return out


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
