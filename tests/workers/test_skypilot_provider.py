"""SkyPilotProvider against the installed SkyPilot SDK, its API server faked in memory.

The provider runs its real bridge protocol to a child process of SkyPilot's own
environment (``ops/install_skypilot.sh``); there ``tests/workers/sky_fake_api.py``
replaces SkyPilot's API server only: the SDK functions keep their real signatures
(``create_autospec``), the task is a real ``sky.Task``, and the answers are SkyPilot's
own objects and exceptions.  The engine behind a cluster's endpoint is a real replica
process on loopback, so readiness is the real ``GET /health``.  No network, no cloud.

Where SkyPilot's environment is not installed these tests skip with a note, except
under CI, where that fails the run.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from fleet.models import Event, Replica, ServiceConfig, Zone
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port
from tests.support.rows import Rows
from tests.support.skypilot import sky_python
from workers.providers.base import LaunchSpec, Notice
from workers.providers.factory import build_provider
from workers.providers.skypilot import (
    SkyBridge,
    SkyPilotError,
    SkyPilotProvider,
    bridge_argv,
    engine_ready,
)
from workers.providers.skypilot_plan import SkyPilotConfig, parse_zones, task_config
from workers.scaling.fleet import ON_DEMAND, SPOT, ZoneOffer
from workers.scaling_glue import apply_notices, scale_services

FAKE_API = Path(__file__).with_name("sky_fake_api.py")
CONFIG = SkyPilotConfig(
    parse_zones("aws/us-east-1/us-east-1a,gcp/us-central1/us-central1-a"), port=8000
)
PINNED_SPOT = {
    "cloud": "AWS",
    "region": "us-east-1",
    "zone": "us-east-1a",
    "use_spot": True,
    "accelerators": {"L4": 1},
    "ports": ["5557-5558", "8000"],  # SkyPilot merges ports into ranges
}
OFFERS = [
    ZoneOffer("us-east-1a", "us-east-1", 0.35, 0.98),
    ZoneOffer("us-central1-a", "us-central1", 0.28, 0.85),
]


@pytest.fixture(scope="module")
def python() -> str:
    return sky_python()


@pytest.fixture(scope="module")
def real_bridge(python: str) -> Iterator[SkyBridge]:
    bridge = SkyBridge(bridge_argv(python))
    yield bridge
    bridge.close()


@pytest.fixture(scope="module")
def fake_bridge(python: str) -> Iterator[SkyBridge]:
    """One fake API server for the module (SkyPilot's import takes seconds); each test
    launches clusters of its own names."""
    bridge = SkyBridge([python, "-P", str(FAKE_API)])
    yield bridge
    bridge.close()


NAMES = itertools.count(1)


@pytest.fixture
def name() -> str:
    return f"r{next(NAMES)}"


@pytest.fixture
def provider(fake_bridge: SkyBridge) -> SkyPilotProvider:
    return SkyPilotProvider(CONFIG, OFFERS, fake_bridge)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path / "logs")
    yield group
    group.stop_all()


def cloud(provider: SkyPilotProvider, action: str, **fields: Any) -> dict[str, Any]:
    return provider.bridge.call("_cloud", action=action, **fields)


def calls(provider: SkyPilotProvider, fn: str, cluster: str) -> list[dict[str, Any]]:
    """The SDK calls ``fn`` made about ``cluster``."""
    return [
        c
        for c in cloud(provider, "calls")["calls"]
        if c["fn"] == fn
        and cluster in (c.get("cluster_name"), c.get("cluster"), *c.get("cluster_names", ()))
    ]


def test_the_real_bridge_reports_the_installed_release(real_bridge: SkyBridge) -> None:
    assert real_bridge.call("version")["version"] == "0.14.1"
    with pytest.raises(SkyPilotError, match="unknown op"):
        real_bridge.call("format_disk")


def test_skypilot_parses_the_rendered_task_into_pinned_resources(real_bridge: SkyBridge) -> None:
    spot = real_bridge.call("render", task=task_config(CONFIG, "m", "r1", "us-east-1a", SPOT))
    od_task = task_config(CONFIG, "m", "r2", "us-central1-a", ON_DEMAND)
    od = real_bridge.call("render", task=od_task)
    assert spot["resources"] == [PINNED_SPOT]
    assert od["resources"][0]["cloud"] == "GCP" and od["resources"][0]["use_spot"] is False
    assert od["config"]["name"] == "mer-r2" and od["config"]["envs"]["MODEL"] == "m"


def test_a_task_skypilot_refuses_is_an_error_that_says_why(real_bridge: SkyBridge) -> None:
    task = task_config(CONFIG, "m", "r1", "us-east-1a", SPOT)
    task["resources"]["accelerators"] = "L4:many"
    with pytest.raises(SkyPilotError, match=r"SkyPilot render: .*L4:many"):
        real_bridge.call("render", task=task)


def test_launch_submits_one_pinned_cluster_and_returns_at_once(
    provider: SkyPilotProvider, name: str
) -> None:
    instance = provider.launch(LaunchSpec("m", name), "us-east-1a", SPOT, now=100.0)
    assert instance is not None
    assert (instance.handle, instance.state, instance.launched_at) == (
        f"mer-{name}",
        "provisioning",
        100.0,
    )
    (launch,) = calls(provider, "launch", f"mer-{name}")
    assert launch["kwargs"] == {
        "retry_until_up": False,
        "down": True,
        "idle_minutes_to_autostop": None,
    }
    assert launch["resources"] == PINNED_SPOT
    assert launch["task"]["envs"] == {"MODEL": "m", "PORT": "8000"}
    assert provider.poll(now=110.0) == []  # the launch request is still running


def test_a_call_that_does_not_fit_the_sdk_signature_is_refused(
    provider: SkyPilotProvider, name: str
) -> None:
    task = task_config(CONFIG, "m", name, "us-east-1a", SPOT)
    with pytest.raises(SkyPilotError, match="TypeError"):
        provider.bridge.call("launch", task=task, kwargs={"cluster_name": name, "zone": "x"})


def test_running_once_up_and_the_engine_answers_health(
    provider: SkyPilotProvider, processes: ProcessGroup, name: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    provider.launch(LaunchSpec("m", name), "us-east-1a", SPOT, now=100.0)
    cloud(provider, "finish", cluster=f"mer-{name}", outcome="up", endpoint=f"127.0.0.1:{port}")
    # Cluster UP, engine still loading (nothing listens yet): provisioning.
    assert provider.poll(now=200.0) == []
    assert provider.list()[0].url == url
    processes.python("engine", "-m", "sim.serve", "--model", "m", "--replica", f"{name}={port}")
    eventually(lambda: engine_ready(url), what="engine up", timeout=60.0)
    (notice,) = provider.poll(now=300.0)
    assert (notice.handle, notice.event, notice.url) == (f"mer-{name}", "running", url)
    assert (notice.zone, notice.at) == ("us-east-1a", 300.0)
    assert provider.list()[0].state == "running"
    assert provider.poll(now=310.0) == []
    (endpoints,) = calls(provider, "endpoints", f"mer-{name}")
    assert endpoints["port"] == 8000


def test_a_launch_without_capacity_reports_the_zone_preempted(
    provider: SkyPilotProvider, name: str
) -> None:
    provider.launch(LaunchSpec("m", name), "us-east-1a", SPOT, now=100.0)
    cloud(provider, "finish", cluster=f"mer-{name}", outcome="no-capacity", zone="us-east-1a")
    (notice,) = provider.poll(now=130.0)
    assert (notice.event, notice.zone, notice.at) == ("preempted", "us-east-1a", 130.0)
    (instance,) = provider.list()
    assert (instance.state, instance.ended_at) == ("preempted", 130.0)
    assert provider.poll(now=140.0) == []  # ended: no longer asked about


def test_a_launch_nothing_could_satisfy_is_no_preemption(
    provider: SkyPilotProvider, name: str
) -> None:
    provider.launch(LaunchSpec("m", name), "us-east-1a", SPOT, now=100.0)
    cloud(provider, "finish", cluster=f"mer-{name}", outcome="infeasible")
    (notice,) = provider.poll(now=130.0)
    assert (notice.event, notice.zone) == ("terminated", "us-east-1a")


def test_a_reclaimed_spot_cluster_is_a_preemption(
    provider: SkyPilotProvider, processes: ProcessGroup, name: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes.python("engine", "-m", "sim.serve", "--model", "m", "--replica", f"{name}={port}")
    eventually(lambda: engine_ready(url), what="engine up", timeout=60.0)
    provider.launch(LaunchSpec("m", name), "us-east-1a", SPOT, now=100.0)
    cloud(provider, "finish", cluster=f"mer-{name}", outcome="up", endpoint=f"127.0.0.1:{port}")
    assert [n.event for n in provider.poll(now=200.0)] == ["running"]
    cloud(provider, "reclaim", cluster=f"mer-{name}")
    (notice,) = provider.poll(now=900.0)
    assert (notice.event, notice.at) == ("preempted", 900.0)
    status = calls(provider, "status", f"mer-{name}")[-1]
    assert (status["cluster_names"], status["refresh"]) == ([f"mer-{name}"], "AUTO")


def test_terminate_downs_the_cluster_and_stops_its_billing(
    provider: SkyPilotProvider, name: str
) -> None:
    provider.launch(LaunchSpec("m", name), "us-central1-a", ON_DEMAND, now=100.0)
    provider.terminate(f"mer-{name}", now=150.0)
    assert len(calls(provider, "down", f"mer-{name}")) == 1
    (instance,) = provider.list()
    assert (instance.state, instance.ended_at, instance.kind) == ("terminated", 150.0, ON_DEMAND)
    assert provider.poll(now=160.0) == []


def test_zones_need_a_priced_zone_row_each(provider: SkyPilotProvider) -> None:
    assert [z.name for z in provider.zones()] == ["us-east-1a", "us-central1-a"]
    assert str(provider.price("us-central1-a", SPOT)) == "0.28"
    with pytest.raises(ValueError, match="without a Zone row"):
        SkyPilotProvider(CONFIG, OFFERS[:1], provider.bridge)


def test_a_bridge_that_died_is_started_again(real_bridge: SkyBridge) -> None:
    real_bridge.process.kill()
    real_bridge.process.wait()
    assert real_bridge.call("version")["version"] == "0.14.1"


def test_a_bridge_that_does_not_answer_is_ended() -> None:
    silent = [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(60)"]
    bridge = SkyBridge(silent, timeout_s=0.5)
    try:
        with pytest.raises(SkyPilotError, match="no answer from the SkyPilot bridge to 'status'"):
            bridge.call("status", clusters=["mer-x"])
        assert bridge.process.returncode is not None  # not left to answer the next call
    finally:
        bridge.close()


def test_a_missing_interpreter_is_a_clear_error() -> None:
    with pytest.raises(SkyPilotError, match="cannot start SkyPilot's interpreter"):
        SkyBridge(["/nonexistent/python", "-P", str(FAKE_API)])


def test_the_setting_builds_it_and_it_adopts_the_live_rows(rows: Rows, python: str) -> None:
    region = rows.region("us-east-1")
    url = "http://10.0.0.5:8000"
    launched = datetime(2026, 1, 1, tzinfo=UTC)
    live = dict(provider="skypilot", kind=SPOT, launched_at=launched)
    rows.replica("a", region, url=url, provider_handle="mer-a", **live)
    rows.replica("b", region, state=Replica.State.PROVISIONING, provider_handle="mer-b", **live)
    rows.replica("c", region, state=Replica.State.TERMINATED, provider_handle="mer-c", **live)
    with override_settings(
        MERIDIAN_CLOUD_PROVIDER="skypilot",
        MERIDIAN_SKYPILOT_PYTHON=python,
        MERIDIAN_SKYPILOT_ZONES="aws/us-east-1/us-east-1-1a",
    ):
        provider = build_provider()
    try:
        assert isinstance(provider, SkyPilotProvider)
        assert [z.name for z in provider.zones()] == ["us-east-1-1a"]
        adopted = {i.handle: (i.state, i.url, i.launched_at) for i in provider.list()}
        assert adopted == {
            "mer-a": ("running", url, launched.timestamp()),
            "mer-b": ("provisioning", "http://127.0.0.1:1/b", launched.timestamp()),
        }
    finally:
        provider.close()


@override_settings(
    MERIDIAN_CLOUD_PROVIDER="skypilot",
    MERIDIAN_SKYPILOT_PYTHON="",
    MERIDIAN_SKYPILOT_ZONES="aws/us-east-1/us-east-1-1a",
)
def test_the_setting_without_skypilots_environment_stops_start_up(rows: Rows) -> None:
    with pytest.raises(SkyPilotError, match="needs MERIDIAN_SKYPILOT_PYTHON"):
        build_provider()


def test_a_running_notice_gives_the_row_the_clusters_address(
    rows: Rows, provider: SkyPilotProvider
) -> None:
    region = rows.region("us-east-1")
    row = rows.replica(
        "d", region, state=Replica.State.PROVISIONING, provider="skypilot", provider_handle="mer-d"
    )
    notice = Notice("mer-d", "running", "us-east-1-1a", 1000.0, url="http://10.0.0.7:8000")
    assert apply_notices(provider, [notice]) == []
    row.refresh_from_db()
    assert (row.state, row.url) == (Replica.State.STARTING, "http://10.0.0.7:8000")


@pytest.mark.django_db
def test_the_scaling_loop_launches_watches_and_loses_replicas_through_skypilot(
    rows: Rows, fake_bridge: SkyBridge, processes: ProcessGroup
) -> None:
    region = rows.region("us-east-1")
    # Three zones: SpotHedge keeps a preempted zone aside only while two others remain.
    prices = {"us-east-1-1a": 0.3, "us-east-1-1b": 0.4, "us-east-1-1c": 0.5}
    for zone in list(prices)[1:]:
        Zone.objects.create(region=region, name=zone)
    config = SkyPilotConfig(parse_zones(",".join(f"aws/us-east-1/{z}" for z in prices)))
    offers = [ZoneOffer(z, "us-east-1", p, 1.0) for z, p in prices.items()]
    provider = SkyPilotProvider(config, offers, fake_bridge)
    ServiceConfig.objects.create(model_name="m", scaling_policy="spothedge", min_replicas=1)
    now = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

    scale_services(provider, now)
    launched = list(Replica.objects.filter(provider="skypilot"))
    assert {r.kind for r in launched} == {SPOT, ON_DEMAND}
    for row in launched:
        (call,) = calls(provider, "launch", row.provider_handle)
        assert call["resources"]["use_spot"] == (row.kind == SPOT)
        assert call["resources"]["zone"] == row.zone.name
        assert (row.state, row.url) == (Replica.State.PROVISIONING, "")

    spot = next(r for r in launched if r.kind == SPOT)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes.python("engine", "-m", "sim.serve", "--model", "m", "--replica", f"r={port}")
    eventually(lambda: engine_ready(url), what="engine up", timeout=60.0)
    address = f"127.0.0.1:{port}"
    cloud(provider, "finish", cluster=spot.provider_handle, outcome="up", endpoint=address)
    scale_services(provider, now + timedelta(seconds=10))
    spot.refresh_from_db()
    assert (spot.state, spot.url) == (Replica.State.STARTING, url)

    cloud(provider, "reclaim", cluster=spot.provider_handle)
    scale_services(provider, now + timedelta(seconds=20))
    spot.refresh_from_db()
    assert spot.state == Replica.State.PREEMPTED
    assert spot.terminated_at == now + timedelta(seconds=20)
    assert Event.objects.filter(kind="replica.preempted", subject=spot.name).exists()
    placement = ServiceConfig.objects.get().scaling_state["placement"]
    assert placement["preempting"] == [spot.zone.name]
    # Its replacement is a new cluster in another zone.
    new = Replica.objects.filter(kind=SPOT, state=Replica.State.PROVISIONING).exclude(pk=spot.pk)
    assert new.exists() and spot.zone.name not in {r.zone.name for r in new}
