"""Prometheus text with labels, counter deltas across resets, histogram quantiles."""

from __future__ import annotations

import pytest

from workers.promtext import counter_deltas, histogram_quantile, parse, series_from_key


def test_parse_keeps_labels_and_skips_comments() -> None:
    text = (
        "# HELP meridian_requests_total Finished requests.\n"
        "# TYPE meridian_requests_total counter\n"
        'meridian_requests_total{model="m",route="local",status="200"} 7\n'
        'weird{label="a \\"quoted\\" b"} 1 1700000000\n'
        "meridian_inflight_requests 2\n"
        "not a sample line\n"
    )
    samples = parse(text)
    assert [s.name for s in samples] == [
        "meridian_requests_total",
        "weird",
        "meridian_inflight_requests",
    ]
    first = samples[0]
    assert first.label("route") == "local" and first.value == 7
    assert samples[1].label("label") == 'a "quoted" b'
    assert series_from_key(first.key) == (
        "meridian_requests_total",
        {"model": "m", "route": "local", "status": "200"},
    )


def test_counter_deltas_count_a_reset_from_zero() -> None:
    deltas = counter_deltas({"a": 10, "b": 50}, {"a": 15, "b": 3, "c": 2})
    assert deltas == {"a": 5, "b": 3, "c": 2}


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 10.0), (float("inf"), 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (5 - 2) / 4)
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.5 + 0.5 * (9 - 6) / 4)
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    # Everything above the last finite bound: the bound is the best estimate.
    assert histogram_quantile(0.9, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0
