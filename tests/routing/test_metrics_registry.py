"""The balancer's metrics registry renders valid Prometheus text."""

from __future__ import annotations

import pytest

from core.engine_metrics import parse_samples
from core.metrics import MetricsRegistry


def test_counters_gauges_and_histograms_render_in_exposition_format() -> None:
    r = MetricsRegistry()
    requests = r.counter("reqs_total", "Requests.", ["model", "status"])
    inflight = r.gauge("inflight", "In flight.")
    ttft = r.histogram("ttft_seconds", "TTFT.", ["model"], buckets=(0.1, 1.0))
    requests.inc("m", "200")
    requests.inc("m", "200")
    requests.inc("m", "429")
    inflight.set(3)
    ttft.observe(0.05, "m")
    ttft.observe(0.5, "m")
    ttft.observe(5.0, "m")
    text = r.render()
    assert "# TYPE reqs_total counter" in text
    assert 'reqs_total{model="m",status="200"} 2' in text
    assert "inflight 3" in text
    assert 'ttft_seconds_bucket{model="m",le="0.1"} 1' in text
    assert 'ttft_seconds_bucket{model="m",le="1"} 2' in text
    assert 'ttft_seconds_bucket{model="m",le="+Inf"} 3' in text
    assert 'ttft_seconds_count{model="m"} 3' in text
    assert parse_samples(text)["ttft_seconds_sum"] == [pytest.approx(5.55)]


def test_label_values_are_escaped() -> None:
    r = MetricsRegistry()
    r.counter("c_total", "C.", ["v"]).inc('a"b\\c\nd')
    assert 'c_total{v="a\\"b\\\\c\\nd"} 1' in r.render()


def test_gauge_replace_drops_departed_children() -> None:
    r = MetricsRegistry()
    g = r.gauge("outstanding", "O.", ["replica"])
    g.replace([(("a",), 1), (("b",), 2)])
    g.replace([(("b",), 0)])
    text = r.render()
    assert 'replica="a"' not in text and 'outstanding{replica="b"} 0' in text


def test_misuse_is_refused() -> None:
    r = MetricsRegistry()
    c = r.counter("c_total", "C.", ["a"])
    with pytest.raises(ValueError):
        c.inc()
    with pytest.raises(ValueError):
        c.inc("x", amount=-1)
    with pytest.raises(ValueError):
        r.counter("c_total", "again")
