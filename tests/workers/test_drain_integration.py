"""Drain before scale-down, live: the emulated cloud's real replicas, a real balancer,
streams in flight.

Two on-demand replicas serve long streams through the balancer; the service is then
scaled to one.  The replica chosen for removal goes ``draining`` (no new request after
the balancer's next topology refresh) while it still holds streams, and is terminated
only once they are done: every stream, those it held and those sent during the drain,
ends with its ``[DONE]``.  A second test pins what happens past the drain deadline: the
replica is terminated anyway and the Event says how many requests were cut.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.models import ApiKey, Balancer, Event, Region, Replica, ServiceConfig, Zone
from tests.support.balancers import start_balancer, state
from tests.support.processes import ProcessGroup, free_port
from workers.draining import in_flight
from workers.probes import probe_replicas
from workers.providers.emulated import ColdStartModel, EmulatedCloudProvider, SpotMarket
from workers.scaling.fleet import ON_DEMAND, SPOT, ZoneOffer
from workers.scaling.traces import load_traces
from workers.scaling_glue import scale_services

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODEL = "meridian-drain"
ZONES = ("drain-a", "drain-b")


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[EmulatedCloudProvider]:
    provider = EmulatedCloudProvider(
        [ZoneOffer(z, "drain", spot_price=0.9, on_demand_price=3.0) for z in ZONES],
        SpotMarket(None, origin=0.0),
        ColdStartModel(provision_s={SPOT: 0.3, ON_DEMAND: 0.3}, model_load_s=0.3),
        # Modeled time at wall speed: a 300-token stream lasts several seconds.
        serve_args=["--time-scale", "1.0"],
        log_dir=tmp_path / "cloud",
    )
    yield provider
    provider.close()


@pytest.fixture
def drain_settings(settings: Any) -> Any:
    settings.MERIDIAN_TOPOLOGY_REFRESH_S = 0.5  # what start_balancer gives the balancer
    settings.MERIDIAN_DRAIN_SETTLE_S = 1.0
    settings.MERIDIAN_DRAIN_DEADLINE_S = 60.0
    return settings


class Stream(threading.Thread):
    """One streamed completion through the balancer; its status and every SSE line."""

    def __init__(self, url: str, key: str, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self.status: int | None = None
        self.lines: list[str] = []
        self.error = ""

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            with (
                httpx.Client(timeout=120, trust_env=False) as client,
                client.stream(
                    "POST", f"{self.url}/v1/completions", json=self.body, headers=headers
                ) as response,
            ):
                self.status = response.status_code
                self.lines = [line for line in response.iter_lines() if line]
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def done(self) -> bool:
        return self.status == 200 and bool(self.lines) and self.lines[-1] == "data: [DONE]"


def ready() -> list[Replica]:
    return list(Replica.objects.filter(model_name=MODEL, state=Replica.State.READY))


def beat_until(cloud: EmulatedCloudProvider, until: Callable[[], bool], what: str) -> None:
    """Beat the controller and the readiness probes (as Celery would) until ``until``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        scale_services(cloud)
        probe_replicas(timeout=2.0, failure_threshold=3)
        if until():
            return
        time.sleep(0.2)
    raise AssertionError(
        f"{what}: not reached in 60 s; replicas "
        f"{list(Replica.objects.values_list('name', 'state'))}"
    )


def wait_for(until: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def fleet(
    processes: ProcessGroup, env: dict[str, str], replicas: int, name: str
) -> tuple[str, str]:
    """A region, its balancer and an on-demand service of ``replicas``; (url, api key)."""
    region = Region.objects.create(name="drain")
    for zone in ZONES:
        Zone.objects.create(region=region, name=zone)
    port = free_port()
    Balancer.objects.create(name=name, region=region, url=f"http://127.0.0.1:{port}")
    ServiceConfig.objects.create(
        model_name=MODEL,
        scaling_policy="on_demand",
        min_replicas=replicas,
        max_replicas=replicas,
        upscale_delay_s=0,
        downscale_delay_s=0,
    )
    _, key = ApiKey.issue("drain")
    return start_balancer(processes, env, name, port), key


def balancer_routes_to(url: str, replicas: list[Replica]) -> None:
    """Wait until the balancer's topology holds ``replicas``, each healthy."""
    names = {r.name for r in replicas}

    def seen() -> bool:
        healthy = {r["name"] for r in state(url)["replicas"] if r["healthy"]}
        return names <= healthy

    wait_for(seen, f"the balancer routes to {sorted(names)}")


def scale_to(n: int) -> None:
    ServiceConfig.objects.filter(model_name=MODEL).update(min_replicas=n, max_replicas=n)


def test_scale_down_drains_a_replica_with_streams_in_flight_and_loses_none(
    cloud: EmulatedCloudProvider,
    processes: ProcessGroup,
    django_subprocess_env: dict[str, str],
    drain_settings: Any,
) -> None:
    url, key = fleet(processes, django_subprocess_env, 2, "drain-lb")
    beat_until(cloud, lambda: len(ready()) == 2, "two replicas ready")
    replicas = ready()
    balancer_routes_to(url, replicas)
    first = [Stream(url, key, f"stream {i}: tell me a story", 300) for i in range(8)]
    for stream in first:
        stream.start()
        time.sleep(0.1)
    wait_for(lambda: all((in_flight(r.url) or 0) > 0 for r in replicas), "streams on both replicas")

    scale_to(1)
    scale_services(cloud)
    victim = Replica.objects.get(model_name=MODEL, state=Replica.State.DRAINING)
    held = in_flight(victim.url)
    assert held is not None and held > 0, "the replica chosen for removal holds streams"
    assert victim.terminated_at is None  # billed and serving until drained
    # Sent after the drain began: the balancer routes them to the survivor once it has
    # refreshed its topology; before that, the drain's settle time keeps the victim up.
    second = [Stream(url, key, f"late {i}: a short one", 40) for i in range(4)]
    for stream in second:
        stream.start()
    beat_until(
        cloud,
        lambda: Replica.objects.get(pk=victim.pk).state == Replica.State.TERMINATED,
        "the drained replica terminated",
    )
    for stream in first + second:
        stream.join(timeout=60)

    lost = [(s.body["prompt"], s.status, s.error, s.lines[-1:]) for s in first + second]
    assert [item for item, s in zip(lost, first + second, strict=True) if not s.done] == []
    assert all(s.done for s in first), "every stream that was in flight completed"
    drained = Event.objects.get(kind="replica.drained", subject=victim.name)
    assert drained.data["reason"] == "scale-down" and drained.data["drain_s"] >= 1.0
    assert not Event.objects.filter(kind="replica.drain_deadline").exists()
    starts = Event.objects.filter(kind="replica.draining", subject=victim.name)
    assert [e.data["reason"] for e in starts] == ["scale-down"]
    survivor = Replica.objects.get(model_name=MODEL, state=Replica.State.READY)
    assert survivor.pk != victim.pk and survivor.pk in {r.pk for r in replicas}


def test_past_the_drain_deadline_the_replica_is_terminated_and_the_cut_is_recorded(
    cloud: EmulatedCloudProvider,
    processes: ProcessGroup,
    django_subprocess_env: dict[str, str],
    drain_settings: Any,
) -> None:
    drain_settings.MERIDIAN_DRAIN_DEADLINE_S = 2.0
    url, key = fleet(processes, django_subprocess_env, 1, "drain-deadline-lb")
    beat_until(cloud, lambda: len(ready()) == 1, "one replica ready")
    (replica,) = ready()
    balancer_routes_to(url, [replica])
    endless = Stream(url, key, "a very long story", 5000)  # minutes at wall speed
    endless.start()
    wait_for(lambda: (in_flight(replica.url) or 0) > 0, "the stream is running")

    scale_to(0)
    beat_until(
        cloud,
        lambda: Replica.objects.get(pk=replica.pk).state == Replica.State.TERMINATED,
        "terminated at the deadline",
    )
    endless.join(timeout=60)
    cut = Event.objects.get(kind="replica.drain_deadline", subject=replica.name)
    assert cut.severity == "warning" and cut.data["cut"] == 1 and cut.data["drain_s"] >= 2.0
    assert not endless.done  # the stream was cut: it never saw its [DONE]


def test_preemption_warning_drains_the_replica_so_its_streams_finish_before_the_loss(
    cloud: EmulatedCloudProvider,
    processes: ProcessGroup,
    django_subprocess_env: dict[str, str],
    drain_settings: Any,
    tmp_path: Path,
) -> None:
    url, key = fleet(processes, django_subprocess_env, 2, "drain-warn-lb")
    ServiceConfig.objects.update(scaling_policy="spothedge", spot_extra=0)

    def settled() -> bool:  # two spot replicas ready, the start-up fallback gone
        fallback = Replica.objects.filter(kind=ON_DEMAND, terminated_at__isnull=True)
        return [r.kind for r in ready()] == [SPOT, SPOT] and not fallback.exists()

    beat_until(cloud, settled, "two spot replicas ready")
    replicas = ready()
    balancer_routes_to(url, replicas)
    streams = [Stream(url, key, f"warned {i}: tell me a story", 300) for i in range(6)]
    for stream in streams:
        stream.start()
        time.sleep(0.1)
    wait_for(lambda: all((in_flight(r.url) or 0) > 0 for r in replicas), "streams on both replicas")
    # The victim's zone loses its spot capacity 20 s from now; the cloud warns 15 s ahead.
    victim = replicas[0]
    trace = {
        "metadata": {"gap_seconds": 1},
        "data": [1] * 20 + [0] * 600,
    }
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / f"{victim.zone.name}_v100_1.json").write_text(json.dumps(trace))
    cloud.warning_s = 15.0
    cloud.market = SpotMarket(load_traces(folder)[0], origin=time.time())

    def warned() -> bool:
        return Replica.objects.get(pk=victim.pk).state == Replica.State.DRAINING

    beat_until(cloud, warned, "the warned replica draining")
    held = in_flight(victim.url)
    assert held is not None and held > 0, "the warned replica holds streams"
    beat_until(
        cloud,
        lambda: (
            Replica.objects.get(pk=victim.pk).state
            in (Replica.State.TERMINATED, Replica.State.PREEMPTED)
        ),
        "the warned replica gone",
    )
    for stream in streams:
        stream.join(timeout=60)

    assert [s.body["prompt"] for s in streams if not s.done] == []
    gone = Replica.objects.get(pk=victim.pk)
    # Drained and terminated before the cloud reclaimed it: nothing was cut.
    assert gone.state == Replica.State.TERMINATED
    assert Event.objects.filter(kind="replica.preemption_warning", subject=victim.name).exists()
    drained = Event.objects.get(kind="replica.drained", subject=victim.name)
    assert drained.data["reason"] == "preemption-warning"
    # Its replacement was launched with the warning, not after the loss.
    replacement = Replica.objects.filter(model_name=MODEL).exclude(pk__in=[r.pk for r in replicas])
    assert replacement.exists()
    assert min(r.launched_at for r in replacement) < gone.terminated_at
