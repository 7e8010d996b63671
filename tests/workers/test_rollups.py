"""Metric rollups from a balancer's /metrics and /internal/state, kept and published."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from fleet.models import MetricRollup
from ops.embedded_redis import EmbeddedRedis
from tests.support.http_server import FakeServer
from tests.support.rows import Rows
from workers.rollups import CHANNEL, LATEST_KEY, SCRAPE_KEY, prune_rollups, rollup_metrics

LB = "rollup-test-lb"


def metrics_text(local_ok: int, local_err: int, out: int, inn: int, tokens: int) -> str:
    lines = [
        "# TYPE meridian_requests_total counter",
        f'meridian_requests_total{{model="m",route="local",status="200"}} {local_ok}',
        f'meridian_requests_total{{model="m",route="local",status="502"}} {local_err}',
        f'meridian_requests_total{{model="m",route="local",status="499"}} {local_err}',
        f'meridian_requests_total{{model="m",route="forwarded_out",status="200"}} {out}',
        f'meridian_requests_total{{model="m",route="forwarded_in",status="200"}} {inn}',
        f'meridian_prompt_tokens_total{{replica="rt-r1"}} {tokens}',
        f'meridian_cached_prompt_tokens_total{{replica="rt-r1"}} {tokens // 2}',
        f'meridian_completion_tokens_total{{replica="rt-r1"}} {tokens // 4}',
        f'meridian_upstream_errors_total{{reason="connect",target="rt-r1"}} {local_err}',
        f'meridian_ttft_seconds_bucket{{le="0.1",model="m",route="local"}} {local_ok // 2}',
        f'meridian_ttft_seconds_bucket{{le="1.0",model="m",route="local"}} {local_ok}',
        f'meridian_ttft_seconds_bucket{{le="+Inf",model="m",route="local"}} {local_ok}',
        "meridian_inflight_requests 3",
        "meridian_queue_length 1",
    ]
    return "\n".join(lines) + "\n"


def state_json(requests: int) -> str:
    row = {"name": "rt-r1", "region": "us", "waiting": 2, "outstanding": 3, "requests": requests}
    return json.dumps({"balancer": LB, "replicas": [row]})


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.delete(SCRAPE_KEY.format(balancer=LB), LATEST_KEY.format(region="us"))
    yield client
    client.delete(SCRAPE_KEY.format(balancer=LB), LATEST_KEY.format(region="us"))
    client.close()


def serve(server: FakeServer, *, ok: int, err: int, out: int, inn: int, tokens: int) -> None:
    server.answer("GET", "/metrics", 200, metrics_text(ok, err, out, inn, tokens))
    server.answer("GET", "/internal/state", 200, state_json(ok + err))


@pytest.mark.django_db
def test_rollup_is_the_delta_between_two_scrapes(
    rows: Rows, fake_server: FakeServer, client: redis.Redis
) -> None:
    rows.balancer(LB, rows.region("us"), url=fake_server.url)
    serve(fake_server, ok=10, err=1, out=2, inn=4, tokens=400)
    first = rollup_metrics(client)
    assert first.scraped == [LB] and first.regions == []  # the first pass is the baseline
    assert not MetricRollup.objects.exists()

    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(CHANNEL)
    serve(fake_server, ok=30, err=3, out=5, inn=10, tokens=1200)
    rollup_metrics(client)

    region = MetricRollup.objects.get(scope="region", name="us")
    # Own requests: local (200s, 502s, client-closed 499s) + forwarded out; 499 is no error.
    assert (region.requests, region.errors) == (20 + 2 + 2 + 3, 2)
    assert (region.forwarded_out, region.forwarded_in) == (3, 6)
    assert (region.prompt_tokens, region.cached_tokens, region.completion_tokens) == (800, 400, 200)
    assert region.cached_token_ratio == pytest.approx(0.5)
    seconds = (region.interval_end - region.interval_start).total_seconds()
    assert region.throughput_tokens_s == pytest.approx(200 / seconds, rel=1e-3)
    assert (region.inflight, region.queue_length) == (3, 1)
    assert region.ttft_p50_s == pytest.approx(0.1) and 0.1 < region.ttft_p90_s < 1.0

    replica = MetricRollup.objects.get(scope="replica", name="rt-r1")
    assert (replica.requests, replica.errors, replica.waiting, replica.inflight) == (22, 2, 2, 3)

    latest = json.loads(client.get(LATEST_KEY.format(region="us")))
    assert latest["region"]["requests"] == 27 and latest["replicas"][0]["name"] == "rt-r1"
    message = _next_message(pubsub)
    assert json.loads(message["data"])["region"]["name"] == "us"
    pubsub.close()


def _next_message(pubsub: Any) -> dict[str, Any]:
    for _ in range(50):
        message = pubsub.get_message(timeout=0.1)
        if message is not None:
            return message  # type: ignore[no-any-return]
    raise AssertionError("nothing published on the rollups channel")


@pytest.mark.django_db
def test_unreachable_balancer_is_reported_and_keeps_its_baseline(
    rows: Rows, fake_server: FakeServer, client: redis.Redis
) -> None:
    rows.balancer(LB, rows.region("us"), url=fake_server.url)
    serve(fake_server, ok=10, err=0, out=0, inn=0, tokens=100)
    rollup_metrics(client)
    fake_server.answer("GET", "/metrics", 503, "")
    result = rollup_metrics(client)
    assert result.scraped == [] and "503" in result.failed[LB]
    serve(fake_server, ok=12, err=0, out=0, inn=0, tokens=100)
    rollup_metrics(client)
    assert MetricRollup.objects.get(scope="region").requests == 2


@pytest.mark.django_db
def test_prune_deletes_only_rollups_past_retention(rows: Rows) -> None:
    now = timezone.now()
    for age_s in (10, 7200):
        end = now - timedelta(seconds=age_s)
        MetricRollup.objects.create(
            scope="region", name="us", interval_start=end - timedelta(seconds=10), interval_end=end
        )
    assert prune_rollups(retention_s=3600) == 1
    assert MetricRollup.objects.count() == 1
