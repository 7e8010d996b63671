"""A small metrics registry that renders the Prometheus text exposition format.

The balancer needs a handful of counters, gauges and histograms, updated from one
event loop, so this avoids prometheus_client's process-global registry (which
would make every balancer in a test process share numbers) and its locks.  Each
family keeps one child per label-value tuple; families are bounded by what the
label values can be (models, replicas, status codes, routes), all of which come
from configuration, never from request content.
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TypeVar

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Family(ABC):
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)

    def _key(self, labels: Sequence[str]) -> tuple[str, ...]:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        key = labels if type(labels) is tuple else tuple(labels)
        for value in key:
            if type(value) is not str:
                return tuple(str(v) for v in key)
        # Already strings (every label on the request path): no second tuple per call.
        return key

    def _label_text(self, key: tuple[str, ...], extra: tuple[tuple[str, str], ...] = ()) -> str:
        pairs = [*zip(self.labelnames, key, strict=True), *extra]
        if not pairs:
            return ""
        inner = ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)
        return "{" + inner + "}"

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    @abstractmethod
    def lines(self) -> list[str]:
        """The family's samples in Prometheus text, one per line."""


class Counter(_Family):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        """Every child's label values and count (for summaries such as the live feed)."""
        return list(self._values.items())

    def total(self) -> float:
        return sum(self._values.values())

    def lines(self) -> list[str]:
        return [
            f"{self.name}{self._label_text(k)} {_num(v)}" for k, v in sorted(self._values.items())
        ]


class Gauge(_Family):
    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, *labels: str) -> None:
        self._values[self._key(labels)] = value

    def value(self, *labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def replace(self, values: Iterable[tuple[tuple[str, ...], float]]) -> None:
        """Set the whole family at once, dropping children not given (departed replicas)."""
        self._values = {self._key(labels): value for labels, value in values}

    def lines(self) -> list[str]:
        return [
            f"{self.name}{self._label_text(k)} {_num(v)}" for k, v in sorted(self._values.items())
        ]


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labelnames)
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError("histogram buckets must be a non-empty increasing sequence")
        self.buckets = tuple(buckets)
        # Per child: counts per bucket (non-cumulative; +Inf last), sum.
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        # The first bucket with ``value <= bound``; NaN, above no bound, goes to +Inf.
        buckets = self.buckets
        index = len(buckets) if math.isnan(value) else bisect.bisect_left(buckets, value)
        counts[index] += 1
        self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, *labels: str) -> int:
        return sum(self._counts.get(self._key(labels), ()))

    def merged_counts(self) -> tuple[int, ...]:
        """Per-bucket counts (non-cumulative, +Inf last) summed over every child."""
        merged = [0] * (len(self.buckets) + 1)
        for counts in self._counts.values():
            merged = [a + b for a, b in zip(merged, counts, strict=True)]
        return tuple(merged)

    def lines(self) -> list[str]:
        out: list[str] = []
        for key in sorted(self._counts):
            running = 0
            for bound, count in zip((*self.buckets, math.inf), self._counts[key], strict=True):
                running += count
                le = (("le", _num(bound)),)
                out.append(f"{self.name}_bucket{self._label_text(key, le)} {running}")
            out.append(f"{self.name}_sum{self._label_text(key)} {_num(self._sums[key])}")
            out.append(f"{self.name}_count{self._label_text(key)} {running}")
        return out


_F = TypeVar("_F", bound=_Family)


class MetricsRegistry:
    """Families by name, rendered in registration order."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._register(Counter(name, help_text, labelnames))

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._register(Gauge(name, help_text, labelnames))

    def histogram(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        return self._register(Histogram(name, help_text, labelnames, buckets))

    def render(self) -> str:
        out: list[str] = []
        for family in self._families.values():
            out.extend(family.header())
            out.extend(family.lines())
        return "\n".join(out) + "\n"

    def _register(self, family: _F) -> _F:
        if family.name in self._families:
            raise ValueError(f"metric {family.name} registered twice")
        self._families[family.name] = family
        return family


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
