"""Each trust boundary of a balancer refuses a forged request.

In process, over the ``/v1`` application a balancer serves and a live runtime
(``tests.support.api_app``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import Client, override_settings

from routing.calls import HOP_HEADER, ROUTE_FORWARDED_IN, ROUTE_LOCAL
from routing.internal_auth import PEER_TOKEN_HEADER
from tests.support.api_app import AUTH, Api, serving_api
from tests.support.balancers import MODEL
from tests.support.processes import REPO_ROOT

TOKEN = "install-secret"
BODY = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with serving_api(internal_token=TOKEN) as served:
        yield served


def answered_route(api: Api, headers: list[tuple[bytes, bytes]]) -> str:
    """The route label the balancer counted the request under."""
    requests = api.runtime.metrics.requests
    before = {
        route: requests.value(MODEL, "200", route) for route in (ROUTE_LOCAL, ROUTE_FORWARDED_IN)
    }
    assert api.call("POST", "/v1/completions", BODY, AUTH + headers).status == 200
    (route,) = [r for r, n in before.items() if requests.value(MODEL, "200", r) > n]
    return route


def test_a_client_cannot_claim_to_be_a_forwarding_peer(api: Api) -> None:
    hop = (HOP_HEADER.lower().encode(), b"lb-eu")
    assert answered_route(api, [hop]) == ROUTE_LOCAL
    forged = (PEER_TOKEN_HEADER.lower().encode(), b"guessed")
    assert answered_route(api, [hop, forged]) == ROUTE_LOCAL


def test_a_peer_with_the_install_token_is_believed(api: Api) -> None:
    hop = (HOP_HEADER.lower().encode(), b"lb-eu")
    proof = (PEER_TOKEN_HEADER.lower().encode(), TOKEN.encode())
    assert answered_route(api, [hop, proof]) == ROUTE_FORWARDED_IN


@pytest.mark.parametrize(
    "authorization", [None, b"Bearer guessed", f"Bearer {TOKEN}x".encode(), TOKEN.encode()]
)
def test_internal_state_refuses_a_caller_without_the_token(
    api: Api, authorization: bytes | None
) -> None:
    headers = [] if authorization is None else [(b"authorization", authorization)]
    answer = api.call("GET", "/internal/state", b"", headers)
    assert answer.status == 401
    assert json.loads(answer.body)["error"]["code"] == "invalid_api_key"


def test_internal_state_answers_the_install_token(api: Api) -> None:
    answer = api.call(
        "GET", "/internal/state", b"", [(b"authorization", f"Bearer {TOKEN}".encode())]
    )
    assert answer.status == 200
    assert "replicas" in json.loads(answer.body)


@pytest.mark.parametrize("path", ["/admin/login/", "/", "/console/charts", "/metrics/cost"])
def test_a_balancer_serves_no_console_or_admin(client: Client, path: str) -> None:
    with override_settings(ROOT_URLCONF="meridian.urls_balancer"):
        assert client.get(path).status_code == 404
        # The data plane is still there.
        assert client.get("/v1/models").status_code != 404


@pytest.mark.parametrize(
    ("balancer", "urlconf"), [("lb-any", "meridian.urls_balancer"), ("", "meridian.urls")]
)
def test_a_process_loads_the_urlconf_of_its_role(balancer: str, urlconf: str) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "meridian.settings",
        "MERIDIAN_VAR_DIR": str(settings.VAR_DIR),
        "MERIDIAN_BALANCER": balancer,
    }
    shown = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.ROOT_URLCONF)"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.strip() == urlconf


def test_guessing_api_keys_is_held_down_per_source() -> None:
    wrong = [(b"authorization", b"Bearer mk-guess")]
    with serving_api(auth_failure_limit=3, internal_token=TOKEN) as api:
        statuses = [api.call("POST", "/v1/completions", BODY, wrong).status for _ in range(4)]
        assert statuses == [401, 401, 401, 429]
        held = api.call("POST", "/v1/completions", BODY, AUTH)  # the right key, same source
        assert held.status == 429
        assert json.loads(held.body)["error"]["code"] == "too_many_auth_failures"
        assert int(held.headers[b"retry-after"]) >= 1
        # A peer's forwards carry its clients' keys: its address is never held down.
        hop = [
            (HOP_HEADER.lower().encode(), b"lb-eu"),
            (PEER_TOKEN_HEADER.lower().encode(), TOKEN.encode()),
        ]
        assert api.call("POST", "/v1/completions", BODY, AUTH + hop).status == 200


def test_metrics_stay_scrapeable_until_a_metrics_token_is_set(api: Api) -> None:
    assert api.fetch("GET", "/metrics").status == 200
    with override_settings(MERIDIAN_METRICS_TOKEN="scrape-secret"):
        assert api.fetch("GET", "/metrics").status == 401
        assert (
            api.fetch("GET", "/metrics", b"", [(b"authorization", b"Bearer guessed")]).status == 401
        )
        scraper = [(b"authorization", b"Bearer scrape-secret")]
        assert api.fetch("GET", "/metrics", b"", scraper).status == 200


@pytest.mark.django_db
def test_cost_metrics_refuse_a_caller_without_credentials(client: Client) -> None:
    assert client.get("/metrics/cost").status_code == 401
    forged = client.get("/metrics/cost", headers={"Authorization": "Bearer guessed"})
    assert forged.status_code == 401
    with override_settings(MERIDIAN_METRICS_TOKEN="scrape-secret"):
        scraper = {"Authorization": "Bearer scrape-secret"}
        assert client.get("/metrics/cost", headers=scraper).status_code == 200
