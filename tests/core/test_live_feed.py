"""The live feed's pure arithmetic: per-balancer deltas to per-region numbers."""

from __future__ import annotations

from typing import Any

import pytest

from core.live_feed import (
    Counters,
    LiveRecord,
    ReplicaLive,
    counters_delta,
    decode_all,
    last_seen,
    latest_replicas,
    quantile,
    region_numbers,
    replica_row,
    series,
)

BUCKETS = (0.1, 0.5, 1.0)


def record(
    balancer: str,
    ts: float,
    *,
    requests: float = 0,
    prompt: float = 0,
    cached: float = 0,
    **kw: Any,
) -> LiveRecord:
    ttft = kw.pop("ttft", (0, 0, 0, 0))
    delta = Counters(
        requests=requests,
        prompt_tokens=prompt,
        cached_tokens=cached,
        forwarded_out=kw.pop("out", 0),
        ttft_counts=tuple(ttft),
    )
    return LiveRecord(balancer, "r", ts, kw.pop("seconds", 1.0), delta, ttft_buckets=BUCKETS, **kw)


def test_delta_is_growth_and_a_restart_counts_from_zero() -> None:
    before = Counters(requests=10, prompt_tokens=100, ttft_counts=(1, 2, 0, 0))
    now = Counters(requests=13, prompt_tokens=160, ttft_counts=(2, 3, 0, 0))
    grown = counters_delta(now, before)
    assert (grown.requests, grown.prompt_tokens, grown.ttft_counts) == (3, 60, (1, 1, 0, 0))
    restarted = Counters(requests=2, prompt_tokens=20, ttft_counts=(0, 1, 0, 0))
    assert counters_delta(restarted, before) == restarted
    assert counters_delta(now, None) == now


def test_quantile_interpolates_inside_the_bucket() -> None:
    assert quantile(0.5, BUCKETS, [0, 0, 0, 0]) is None
    # 4 in (0, 0.1], 4 in (0.1, 0.5]: the median is the first bucket's top.
    assert quantile(0.5, BUCKETS, [4, 4, 0, 0]) == pytest.approx(0.1)
    assert quantile(0.75, BUCKETS, [4, 4, 0, 0]) == pytest.approx(0.3)
    assert quantile(0.99, BUCKETS, [0, 0, 0, 5]) == 1.0  # +Inf: the highest bound


def test_region_rates_add_balancers_each_over_its_own_seconds() -> None:
    records = [
        record("a", 99.0, requests=10, prompt=1000, cached=500, seconds=1.0),
        record("a", 100.0, requests=10, prompt=1000, cached=700, seconds=1.0),
        # A late record covering 2 s: its growth is spread over its own interval.
        record("b", 100.0, requests=8, prompt=1000, cached=0, seconds=2.0),
    ]
    numbers = region_numbers(records, 100.5)
    assert numbers.rps == pytest.approx(10 + 4)
    assert numbers.hit_rate == pytest.approx(1200 / 3000, abs=1e-4)
    assert numbers.last_ts == 100.0


def test_gauges_come_from_each_balancers_latest_record() -> None:
    records = [
        record("a", 99.0, queue=7, waiting=9, inflight=3),
        record("a", 100.0, queue=1, waiting=2, inflight=4),
        record("b", 100.0, queue=2, waiting=0, inflight=1, oldest_wait_s=0.25),
    ]
    numbers = region_numbers(records, 100.0)
    assert (numbers.queue, numbers.waiting, numbers.inflight) == (3, 2, 5)
    assert numbers.oldest_wait_s == 0.25


def test_ttft_and_local_share_over_the_window() -> None:
    records = [
        record("a", 100.0, requests=4, ttft=(2, 2, 0, 0), out=1),
        record("a", 101.0, requests=4, ttft=(0, 4, 0, 0), out=1),
    ]
    numbers = region_numbers(records, 101.0)
    assert numbers.ttft_p50_s == pytest.approx(0.1 + 0.4 * (4 - 2) / 6, abs=1e-4)
    assert numbers.local_share == pytest.approx(0.75)
    assert numbers.forwarded_out == 2


def test_a_quiet_region_has_no_rates_and_says_since_when() -> None:
    numbers = region_numbers([record("a", 50.0, requests=5, prompt=10)], 100.0)
    assert numbers.rps is None and numbers.hit_rate is None
    assert numbers.last_ts == 50.0
    assert region_numbers([], 100.0).last_ts is None


def test_no_prompt_tokens_means_no_hit_rate_but_a_zero_rate() -> None:
    numbers = region_numbers([record("a", 100.0)], 100.0)
    assert numbers.rps == 0.0
    assert numbers.hit_rate is None


def test_series_has_a_point_per_step_with_records_and_gaps_elsewhere() -> None:
    records = [
        record("a", 1.0, requests=5, prompt=100, cached=50, queue=1, waiting=2),
        record("a", 2.0, requests=5, prompt=100, cached=50),
        record("a", 21.0, requests=2, prompt=100, cached=100),
    ]
    out = series(records, step_s=5.0)
    assert out["t"] == [5.0, 25.0]
    assert out["rps"] == [5.0, 2.0]
    assert out["hit_rate"] == [0.5, 1.0]
    assert out["queue"] == [0.0, 0.0]  # the step's latest gauges (a's second record)


def test_records_round_trip_and_bad_ones_are_skipped() -> None:
    row = ReplicaLive("r1", True, 2, 1, 3, 0.5, 0.25, 900, (1, 2), ({"kind": "k", "message": "m"},))
    original = record("a", 10.0, requests=3, replicas=(row,), ttft=(1, 0, 0, 0))
    decoded = decode_all([original.to_json(), b"not json", '{"balancer": "x"}'])
    assert decoded == [original]
    live = latest_replicas([*decoded, record("b", 5.0, replicas=(row,))])
    assert live["r1"][0] == "a"
    shown = replica_row("r1", live)
    assert shown is not None and shown["reported_by"] == "a" and shown["lookahead"] == (1, 2)
    assert replica_row("r2", live) is None
    assert last_seen(decoded) == {"a": 10.0}


def test_processes_of_one_balancer_add_up_and_say_when_they_route_alone() -> None:
    # Two processes behind one address, each 10 requests/s over its own one-second
    # intervals: the region serves 20/s, and holds both processes' requests in flight.
    records = [
        record("lb", t, requests=10, process=p, inflight=3, shared_degraded=(p == "p2"))
        for t in (1.0, 2.0, 3.0)
        for p in ("p1", "p2")
    ]
    numbers = region_numbers(records, now=3.0)
    assert numbers.rps == 20.0 and numbers.inflight == 6
    assert (numbers.processes, numbers.degraded) == (2, 1)
    (again,) = decode_all([records[1].to_json()])
    assert (again.process, again.shared_degraded) == ("p2", True)
