"""Console pages through Django's test client: staff only, every page renders the
topology, and the POST actions change what an operator expects (with Events)."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings
from django.test import Client

from core.cache_view_check import MISMATCH_ADVICE
from core.live_feed import FIELD, Counters, LiveRecord, ReplicaLive, stream_key
from fleet.models import Event, Region, RegionLatency, Replica, ServiceConfig
from ops.embedded_redis import EmbeddedRedis
from tests.support.processes import free_port

PAGES = [
    "/",
    "/console/charts",
    "/console/cost",
    "/console/replicas",
    "/console/regions",
    "/console/events",
    "/console/keys",
    "/console/drills",
    "/console/service",
    "/console/simulations",
]


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_pages_send_anonymous_users_to_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_every_page_shows_the_three_regions_or_their_replicas(staff: Client, path: str) -> None:
    html = staff.get(path).content.decode()
    assert 'id="live-status"' in html
    if path in {"/", "/console/replicas", "/console/regions", "/console/cost"}:
        for region in ("us-east", "eu-west", "ap-southeast"):
            assert region in html


@pytest.mark.django_db
def test_drills_page_offers_a_button_per_drill_command(staff: Client) -> None:
    html = staff.get("/console/drills").content.decode()
    for command in ("drill_preempt", "drill_kill_balancer", "drill_slow_replica"):
        assert f'data-drill="{command}"' in html
    assert 'value="--replica=us-east-r1"' in html  # a ready replica is a target


@pytest.mark.django_db
def test_drain_undrain_remove_change_state_and_record_events(staff: Client) -> None:
    for action, state in (("drain", "draining"), ("undrain", "ready"), ("remove", "terminated")):
        response = staff.post(f"/console/replicas/us-east-r1/{action}")
        assert response.status_code == 302
        assert Replica.objects.get(name="us-east-r1").state == state
    kinds = list(Event.objects.filter(subject="us-east-r1").values_list("kind", flat=True))
    assert {"replica_draining", "replica_undrained", "replica_removed"} <= set(kinds)


@pytest.mark.django_db
def test_actions_need_the_csrf_token(staff: Client) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.cookies = staff.cookies
    assert strict.post("/console/replicas/us-east-r1/drain").status_code == 403
    assert Replica.objects.get(name="us-east-r1").state == "ready"


@pytest.mark.django_db
def test_adding_a_replica_that_does_not_answer_is_refused(staff: Client) -> None:
    region = Region.objects.get(name="eu-west")
    response = staff.post(
        "/console/replicas",
        {
            "name": "eu-west-extra",
            "url": f"http://127.0.0.1:{free_port()}",
            "model_name": ServiceConfig.objects.get().model_name,
            "region": region.pk,
            "zone": region.zones.first().pk,
            "kind": "spot",
            "hourly_price": "1.5",
        },
    )
    assert response.status_code == 200
    assert "probe failed" in response.content.decode()
    assert not Replica.objects.filter(name="eu-west-extra").exists()


@pytest.mark.django_db
def test_policy_switch_records_an_event_and_bad_params_are_refused(staff: Client) -> None:
    config = ServiceConfig.objects.get()
    url = f"/console/service/{config.pk}/policy"
    bad = staff.post(url, {"model": config.model_name, "policy": "round_robin", "params": "[1]"})
    assert bad.status_code == 400
    ok = staff.post(url, {"model": config.model_name, "policy": "round_robin", "params": "{}"})
    assert ok.status_code == 302
    assert ServiceConfig.objects.get().policy == "round_robin"
    assert Event.objects.filter(kind="policy_changed", subject=config.model_name).exists()


@pytest.mark.django_db
def test_autoscaling_change_is_an_event_and_min_above_max_is_refused(staff: Client) -> None:
    config = ServiceConfig.objects.get()
    url = f"/console/service/{config.pk}/autoscaling"
    fields = {
        "min_replicas": 2,
        "max_replicas": 5,
        "target_qps_per_replica": 3.0,
        "upscale_delay_s": 60,
        "downscale_delay_s": 600,
        "queue_max_len": 100,
        "queue_max_wait_s": 10,
        "readiness_probe": "health",
        "scaler": "request-rate",
    }
    assert staff.post(url, {**fields, "min_replicas": 9}).status_code == 400
    assert staff.post(url, fields).status_code == 302
    assert ServiceConfig.objects.get().max_replicas == 5
    assert Event.objects.filter(kind="service_settings_changed").exists()


@pytest.mark.django_db
def test_the_preserve_scaler_is_chosen_on_the_service_page_and_needs_a_capacity(
    staff: Client,
) -> None:
    config = ServiceConfig.objects.get()
    url = f"/console/service/{config.pk}/autoscaling"
    page = staff.get("/console/service").content.decode()
    assert 'name="scaler"' in page and 'value="preserve"' in page
    fields = {
        "min_replicas": 1,
        "max_replicas": 8,
        "target_qps_per_replica": 2.0,
        "upscale_delay_s": 300,
        "downscale_delay_s": 1200,
        "queue_max_len": 1024,
        "queue_max_wait_s": 30,
        "readiness_probe": "health",
        "scaler": "preserve",
    }
    refused = staff.post(url, fields)
    assert refused.status_code == 400
    assert "needs the profiled per-replica capacity" in refused.content.decode()
    negative = {"replica_prompt_tokens_per_s": -1, "replica_decode_tokens_per_s": 50}
    assert (
        staff.post(url, {**fields, **negative, "replica_total_tokens_per_s": 60}).status_code == 400
    )
    capacity = {
        "replica_prompt_tokens_per_s": 400.0,
        "replica_decode_tokens_per_s": 50.0,
        "replica_total_tokens_per_s": 420.0,
    }
    assert staff.post(url, {**fields, **capacity}).status_code == 302
    saved = ServiceConfig.objects.get()
    assert saved.scaler == "preserve" and saved.replica_total_tokens_per_s == 420.0
    event = Event.objects.filter(kind="service_settings_changed").order_by("-id").first()
    assert event is not None and event.data["changed"]["scaler"] == ["request-rate", "preserve"]


@pytest.mark.django_db
def test_regions_page_creates_regions_and_sets_rtts(staff: Client) -> None:
    staff.post("/console/regions/new/region", {"name": "sa-east", "display_name": "São Paulo"})
    assert Region.objects.filter(name="sa-east").exists()
    staff.post(
        "/console/regions/new/latency", {"source": "sa-east", "target": "us-east", "rtt_ms": 120}
    )
    assert RegionLatency.objects.get(source__name="sa-east").rtt_ms == 120
    staff.post("/console/regions/region/sa-east", {"name": "sa-east", "display_name": "SP"})
    assert Region.objects.get(name="sa-east").display_name == "SP"


@pytest.mark.django_db
def test_history_carries_rollups_and_policy_changes(staff: Client) -> None:
    Event.record("policy_changed", "m: a -> b", subject="m")
    data = json.loads(staff.get("/console/charts/history?minutes=15").content)
    assert [c["message"] for c in data["policy_changes"]] == ["m: a -> b"]


@pytest.mark.django_db
def test_plotly_is_served_from_our_own_static_files() -> None:
    from django.contrib.staticfiles import finders

    found = finders.find("console/vendor/plotly.min.js")
    assert found is not None
    with open(found, "rb") as handle:
        assert b"plotly" in handle.read(4096).lower()


@pytest.mark.django_db
def test_replicas_page_shows_the_balancers_cache_warnings_in_plain_words(
    staff: Client, redis_server: EmbeddedRedis
) -> None:
    warning = {"kind": "cache_view_mismatch", "message": MISMATCH_ADVICE}
    row = ReplicaLive("us-east-r1", True, 0, 0, 0, None, None, warnings=(warning,))
    record = LiveRecord("us-east-lb", "us-east", 1.0, 1.0, Counters(), replicas=(row,))
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        # What the region's balancer appends to its live stream each second (alone:
        # a stack started earlier in the session may have left newer records).
        client.delete(stream_key("us-east"))
        client.xadd(stream_key("us-east"), {FIELD: record.to_json()})
        try:
            html = staff.get("/console/replicas").content.decode()
        finally:
            client.delete(stream_key("us-east"))
    assert 'data-warning="cache_view_mismatch"' in html
    assert "--enable-prompt-tokens-details" in html and "hash seed" in html
    assert html.count('data-warning="') == 1  # only the replica it concerns
