"""Turn counter deltas from balancers' ``/metrics`` into region and replica rollups.

Pure (no Django, no I/O).  Definitions, so every view shows the same numbers:

* region ``requests``: requests this region's balancers finished for their own
  clients (routes ``local`` and ``forwarded_out``); ``forwarded_in`` (served here
  for a peer) and ``forwarded_out`` are counted separately.
* ``errors``: of those, answers that were neither 2xx nor 499 (the client left).
* tokens: what the region's (or the replica's) replicas served, from the usage in
  their responses; ``cached_token_ratio`` = cached / prompt tokens.
* ``throughput_tokens_s``: completion tokens per second over the interval.
* TTFT quantiles: from ``meridian_ttft_seconds`` bucket deltas of the region's own
  requests, summed over models (``histogram_quantile``'s interpolation).
* gauges (in-flight, queue, waiting) are the values at the end of the interval.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from workers.promtext import histogram_quantile, series_from_key

OWN_ROUTES = frozenset({"local", "forwarded_out"})
REPLICA_REQUESTS = "state:requests"  # the per-replica request count from /internal/state


@dataclass
class RollupRow:
    scope: str
    name: str
    interval_start: float
    interval_end: float
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_token_ratio: float = 0.0
    throughput_tokens_s: float = 0.0
    waiting: int | None = None
    inflight: int = 0
    queue_length: int = 0
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    forwarded_in: int = 0
    forwarded_out: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def finish(self) -> RollupRow:
        seconds = max(self.interval_end - self.interval_start, 1e-9)
        self.cached_token_ratio = (
            self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        )
        self.throughput_tokens_s = self.completion_tokens / seconds
        return self


@dataclass
class BalancerInterval:
    """One balancer's counters over one interval, and its gauges at the end of it."""

    balancer: str
    region: str
    start: float
    end: float
    deltas: dict[str, float]
    gauges: dict[str, float] = field(default_factory=dict)
    replicas: list[dict[str, Any]] = field(default_factory=list)


_TOKEN_FIELDS = {
    "meridian_prompt_tokens_total": "prompt_tokens",
    "meridian_cached_prompt_tokens_total": "cached_tokens",
    "meridian_completion_tokens_total": "completion_tokens",
}


def _is_error(status: str) -> bool:
    return not status.startswith("2") and status != "499"


def _add_request(row: RollupRow, labels: dict[str, str], n: int) -> None:
    route = labels.get("route", "local")
    if route == "forwarded_in":
        row.forwarded_in += n
        return
    if route == "forwarded_out":
        row.forwarded_out += n
    if route in OWN_ROUTES:
        row.requests += n
        row.errors += n if _is_error(labels.get("status", "200")) else 0


def region_rollups(intervals: Iterable[BalancerInterval]) -> list[RollupRow]:
    """One row per region, summing its balancers."""
    rows: dict[str, RollupRow] = {}
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for interval in intervals:
        row = rows.get(interval.region)
        if row is None:
            row = rows[interval.region] = RollupRow(
                "region", interval.region, interval.start, interval.end
            )
        row.interval_start = min(row.interval_start, interval.start)
        row.interval_end = max(row.interval_end, interval.end)
        row.inflight += round(interval.gauges.get("meridian_inflight_requests", 0))
        row.queue_length += round(interval.gauges.get("meridian_queue_length", 0))
        for key, delta in interval.deltas.items():
            name, labels = series_from_key(key)
            n = round(delta)
            if name == "meridian_requests_total":
                _add_request(row, labels, n)
            elif name in _TOKEN_FIELDS:
                setattr(row, _TOKEN_FIELDS[name], getattr(row, _TOKEN_FIELDS[name]) + n)
            elif name == "meridian_ttft_seconds_bucket" and labels.get("route") in OWN_ROUTES:
                buckets[interval.region][float(labels.get("le", "inf"))] += delta
    for region, row in rows.items():
        pairs = list(buckets[region].items())
        row.ttft_p50_s = histogram_quantile(0.5, pairs)
        row.ttft_p90_s = histogram_quantile(0.9, pairs)
    return [row.finish() for row in rows.values()]


def replica_rollups(intervals: Iterable[BalancerInterval]) -> list[RollupRow]:
    """One row per replica any balancer routes to (a replica shared by two balancers
    of a region sums both balancers' traffic)."""
    rows: dict[str, RollupRow] = {}
    for interval in intervals:
        for state in interval.replicas:
            name = str(state.get("name", ""))
            if not name:
                continue
            row = rows.get(name)
            if row is None:
                row = rows[name] = RollupRow(
                    "replica", name, interval.start, interval.end, waiting=0
                )
            row.waiting = (row.waiting or 0) + int(state.get("waiting") or 0)
            row.inflight += int(state.get("outstanding") or 0)
        for key, delta in interval.deltas.items():
            _add_replica_counter(rows, key, round(delta))
    return [row.finish() for row in rows.values()]


def _add_replica_counter(rows: dict[str, RollupRow], key: str, n: int) -> None:
    name, labels = series_from_key(key)
    if name == "meridian_upstream_errors_total":
        row = rows.get(labels.get("target", ""))
        if row is not None:
            row.errors += n
        return
    row = rows.get(labels.get("replica", ""))
    if row is None:
        return
    if name == REPLICA_REQUESTS:
        row.requests += n
    elif name in _TOKEN_FIELDS:
        setattr(row, _TOKEN_FIELDS[name], getattr(row, _TOKEN_FIELDS[name]) + n)
