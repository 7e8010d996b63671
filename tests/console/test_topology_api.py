"""GET /internal/topology: who serves each region, balancer states, replica owners."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.test import Client

from fleet.models import ApiKey, Balancer
from workers.failover import reconcile_ownership


def get(client: Client, **headers: str) -> Any:
    return client.get("/internal/topology", headers=headers)


def test_refuses_without_key_or_staff_session(client: Client, demo_fleet: None) -> None:
    assert get(client).status_code == 401
    assert get(client, Authorization="Bearer mk-not-a-key").status_code == 401
    key, raw = ApiKey.issue("revoked")
    ApiKey.objects.filter(pk=key.pk).update(revoked=True)
    response = get(client, Authorization=f"Bearer {raw}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    User.objects.create_user("viewer", "", "pw-for-tests")  # not staff
    client.login(username="viewer", password="pw-for-tests")
    assert get(client).status_code == 401
    assert client.post("/internal/topology").status_code == 405


def test_api_key_sees_each_region_served_locally(client: Client, demo_fleet: None) -> None:
    _, raw = ApiKey.issue("client")
    body = get(client, Authorization=f"Bearer {raw}").json()
    routes = {r["name"]: (r["serving_balancer"], r["route"]) for r in body["regions"]}
    assert routes == {
        "us-east": ("us-east-lb", "local"),
        "eu-west": ("eu-west-lb", "local"),
        "ap-southeast": ("ap-southeast-lb", "local"),
    }
    lb = {b["name"]: b for b in body["balancers"]}
    assert lb["eu-west-lb"]["url"] == "http://127.0.0.1:8102"
    assert sorted(lb["eu-west-lb"]["routes_to"]) == ["eu-west-r1", "eu-west-r2", "eu-west-r3"]
    replica = next(r for r in body["replicas"] if r["name"] == "eu-west-r1")
    assert (replica["owner"], replica["served_by"]) == (None, ["eu-west-lb"])


def test_dead_region_points_its_clients_at_the_takeover_balancer(
    client: Client, demo_fleet: None
) -> None:
    Balancer.objects.filter(name="ap-southeast-lb").update(state="down")
    reconcile_ownership()
    User.objects.create_user("ops", "", "pw-for-tests", is_staff=True)
    client.login(username="ops", password="pw-for-tests")
    body = get(client).json()
    ap = next(r for r in body["regions"] if r["name"] == "ap-southeast")
    # us-east is 150 ms from ap-southeast, eu-west 200 ms: the nearest live one takes over.
    assert (ap["serving_balancer"], ap["serving_url"], ap["route"]) == (
        "us-east-lb",
        "http://127.0.0.1:8101",
        "failover",
    )
    lb = {b["name"]: b for b in body["balancers"]}
    assert lb["ap-southeast-lb"]["state"] == "down"
    assert {"ap-southeast-r1", "ap-southeast-r2"} <= set(lb["us-east-lb"]["routes_to"])
    replica = next(r for r in body["replicas"] if r["name"] == "ap-southeast-r2")
    assert (replica["owner"], replica["handover"], replica["served_by"]) == (
        "us-east-lb",
        "auto",
        ["us-east-lb"],
    )
