"""The console in a real headless Chromium against a real stack: three regions of
emulated replicas with their balancers (publishing their live streams), the daphne
console, a Celery worker with beat and replayed traffic.

What a person would notice: logging in shows three regions; under traffic a region's
request rate and hit rate change without a reload; a policy switch shows up in the
events feed live; a drill button preempts a replica and its row and the feed say so;
an anonymous browser is sent to the login page and its WebSocket is refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from ops.embedded_redis import EmbeddedRedis
from ops.replay.service import demo_replay_argv
from tests.support import browser
from tests.support.cluster import Cluster, running_cluster
from tests.support.processes import ProcessGroup

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not browser.available(), reason="needs /usr/bin/chromium (make test installs it)"
    ),
]
if os.environ.get("CI") and not browser.available():
    # CI must exercise the console as a person would: a missing browser is a failure.
    pytest.fail("CI needs /usr/bin/chromium and chromium-driver", pytrace=False)

REGIONS = {"us-east": 2, "eu-west": 1, "ap-southeast": 1}
RTTS = {
    ("us-east", "eu-west"): 80.0,
    ("us-east", "ap-southeast"): 150.0,
    ("eu-west", "ap-southeast"): 160.0,
}
USER, PASSWORD = "browser-ops", "pw-for-browser-tests"


@dataclass
class Stack:
    cluster: Cluster
    console_url: str


@pytest.fixture(scope="module")
def stack(
    django_db_setup: None,
    django_db_blocker: Any,
    redis_server: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    from django.contrib.auth.models import User

    logs = tmp_path_factory.mktemp("console-browser")
    group = ProcessGroup(logs)
    with django_db_blocker.unblock(), running_cluster(group, redis_server.url, REGIONS, RTTS) as c:
        user = User.objects.create_superuser(USER, "", PASSWORD)
        env = {
            **c.env,
            "MERIDIAN_CELERY_QUEUE": f"console-browser-{logs.name}",
            "MERIDIAN_LIVE_PERIOD_S": "0.5",
            "MERIDIAN_ROLLUP_PERIOD_S": "1",
            "MERIDIAN_HEARTBEAT_TTL_S": "2",
            "MERIDIAN_TOPOLOGY_REFRESH_S": "0.5",
            "MERIDIAN_CLOUD_PROVIDER": "static",
            "MERIDIAN_API_KEY": c.key,
        }
        try:
            url = browser.start_console(group, env)
            browser.start_worker(group, env, logs)
            group.start(
                "replay",
                [sys.executable, "manage.py", *demo_replay_argv("us-east", rate=4.0)],
                env=env,
            )
            yield Stack(c, url)
        finally:
            group.stop_all()
            user.delete()


@pytest.fixture(scope="module")
def driver(stack: Stack) -> Iterator[WebDriver]:
    with browser.chromium() as d:
        browser.log_in(d, stack.console_url, USER, PASSWORD)
        yield d


def _live_value(d: WebDriver, region: str, field: str) -> str:
    return browser.text_of(d, f'.card[data-region="{region}"] [data-field="{field}"]')


def test_overview_shows_three_regions_whose_numbers_change_live(
    driver: WebDriver, stack: Stack
) -> None:
    driver.get(stack.console_url + "/")
    cards = driver.find_elements("css selector", ".card[data-region]")
    assert sorted(c.get_attribute("data-region") for c in cards) == sorted(REGIONS)
    driver.execute_script("window.__notReloaded = true;")
    seen: dict[str, set[str]] = {"rps": set(), "hit_rate": set()}

    def both_changed(d: WebDriver) -> bool:
        for field, values in seen.items():
            values.add(_live_value(d, "us-east", field))
        # Several distinct numbers each (not just "—" then one value): they move.
        return all(len(values - {"—"}) >= 2 for values in seen.values())

    browser.wait_for(driver, both_changed, "us-east request rate and hit rate changing", timeout=90)
    assert driver.execute_script("return window.__notReloaded === true;")
    assert browser.text_of(driver, "#live-status") == "live"


def test_policy_switch_appears_in_the_events_feed_live(driver: WebDriver, stack: Stack) -> None:
    driver.get(stack.console_url + "/")
    overview = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(stack.console_url + "/console/service")
    form = driver.find_element("css selector", "form[id^=policy-form]")
    Select(form.find_element("name", "policy")).select_by_value("least_load")
    form.find_element("css selector", "button[type=submit]").click()
    browser.wait_for(driver, lambda d: "policy least_load" in d.page_source, "policy applied")
    driver.close()
    driver.switch_to.window(overview)
    rows = browser.wait_for(
        driver,
        lambda d: browser.texts_of(d, '#events-feed tr[data-kind="policy_changed"]'),
        "policy_changed in the overview's events feed",
    )
    assert "round_robin -> least_load" in rows[0]


def test_drill_button_preempts_a_replica_and_the_overview_shows_it(
    driver: WebDriver, stack: Stack, django_db_blocker: Any
) -> None:
    driver.get(stack.console_url + "/")
    overview = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(stack.console_url + "/console/drills")
    form = driver.find_element("css selector", 'form[data-drill="drill_preempt"]')
    Select(form.find_element("name", "target")).select_by_value("--replica=us-east-r2")
    form.find_element("css selector", "button[type=submit]").click()
    browser.wait_for(
        driver,
        lambda d: "fault injected" in browser.text_of(d, "#drill-timeline"),
        "the drill's timeline streaming",
    )
    drills = driver.current_window_handle
    driver.switch_to.window(overview)
    browser.wait_for(
        driver,
        lambda d: (
            browser.text_of(d, 'tr[data-replica="us-east-r2"] [data-field="state"]')
            in {"preempted", "failed"}
        ),
        "us-east-r2 turning preempted",
    )
    feed = browser.wait_for(
        driver,
        lambda d: browser.texts_of(d, '#events-feed tr[data-kind="replica_preempted"]'),
        "replica_preempted in the events feed",
    )
    assert "us-east-r2" in feed[0]
    driver.switch_to.window(drills)
    browser.wait_for(
        driver,
        lambda d: "drill #" in browser.text_of(d, "#drill-timeline"),
        "the drill's outcome",
        timeout=60,
    )
    driver.close()
    driver.switch_to.window(overview)
    from fleet.models import DrillRun

    with django_db_blocker.unblock():  # the button ran the command's drill: same record
        run = DrillRun.objects.filter(kind=DrillRun.Kind.PREEMPT).first()
        assert run is not None and run.target == "us-east-r2"
        assert run.outcome != DrillRun.Outcome.RUNNING


@pytest.mark.django_db  # read-only; also makes pytest-django create the test database
def test_anonymous_browser_is_sent_to_login_and_its_socket_refused(stack: Stack) -> None:
    with browser.chromium() as anonymous:
        anonymous.get(stack.console_url + "/console/replicas")
        assert "/admin/login/" in anonymous.current_url
        outcome = anonymous.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            const ws = new WebSocket("ws://" + location.host + "/ws/live");
            let opened = false;
            ws.onopen = () => { opened = true; };
            ws.onclose = (e) => done({opened: opened, code: e.code});
            """
        )
        assert outcome["opened"] is False
