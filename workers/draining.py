"""Drains of provider-launched replicas: the glue around ``workers.scaling.drain``.

A scale-down (``DrainingLauncher.terminate`` on a ready replica) or a provider's
preemption warning (``warn``) puts the replica's row in ``draining`` at once, which
takes it out of every balancer's topology at its next refresh, and records the drain
in its service's ``scaling_state["draining"]`` (handle -> since when, why).  Each
scaling beat, ``advance`` asks every drained replica's ``/metrics`` how many requests
it still holds and terminates it through the provider when the pure verdict says so,
with an Event either way: ``replica.drained`` (nothing cut) or
``replica.drain_deadline`` (a warning naming how many requests were cut).

Replicas an operator drains (``manage.py drain_replica``) are not in that map, so the
scaling loop never terminates them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import UTC, datetime

import httpx
from django.conf import settings

from core.engine_metrics import MetricsFormatError, parse_engine_load
from fleet.models import Event, Replica, ServiceConfig
from workers.providers.base import CloudProvider
from workers.scaling.drain import (
    SCALE_DOWN,
    Drain,
    DrainConfig,
    Verdict,
    drains_from_state,
    drains_to_state,
    judge,
)

DRAIN_KEY = "draining"
Drains = MutableMapping[str, Drain]


def drain_config() -> DrainConfig:
    """From the settings; settling lasts at least one balancer topology refresh."""
    s = settings
    settle = max(s.MERIDIAN_DRAIN_SETTLE_S, s.MERIDIAN_TOPOLOGY_REFRESH_S)
    return DrainConfig(settle_s=settle, deadline_s=max(settle, s.MERIDIAN_DRAIN_DEADLINE_S))


def load_drains(service: ServiceConfig) -> dict[str, Drain]:
    return drains_from_state((service.scaling_state or {}).get(DRAIN_KEY))


def store_drains(state: dict[str, object], drains: Drains) -> dict[str, object]:
    """``state`` with the drains in it (a scaling step rebuilds its state without them)."""
    return {**state, DRAIN_KEY: drains_to_state(drains)}


def in_flight(url: str, *, timeout: float = 2.0) -> int | None:
    """Requests the replica holds (running + waiting); None when that is unknown (a
    timeout, an error status, a page that is not an engine's).  A refused connection
    is 0: nothing listens there, so nothing runs there."""
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            response = client.get(url.rstrip("/") + "/metrics")
        response.raise_for_status()
        load = parse_engine_load(response.text)
    except httpx.ConnectError:
        return 0
    except (httpx.HTTPError, MetricsFormatError):
        return None
    return load.running + load.waiting


def start(replica: Replica, drains: Drains, *, reason: str, now: datetime) -> Drain:
    """Take ``replica`` out of routing now and remember to terminate it once drained."""
    drain = Drain(replica.provider_handle, now.timestamp(), reason)
    previous = replica.state
    replica.state, replica.state_changed_at = Replica.State.DRAINING, now
    replica.save(update_fields=["state", "state_changed_at"])
    drains[drain.handle] = drain
    Event.record(
        "replica.draining",
        f"{replica.name}: draining ({reason}); no new requests, in-flight ones finish",
        subject=replica.name,
        severity="warning" if reason != SCALE_DOWN else "info",
        reason=reason,
        previous=previous,
        zone=replica.zone.name,
    )
    return drain


def warn(replica: Replica, *, at: datetime, preempt_at: datetime | None) -> bool:
    """A preemption warning for ``replica``: drain it (its service's map) at once.

    False when it was not serving (not ready: nothing to drain, the policy still hears
    of the preemption when it lands) or is already draining."""
    Event.record(
        "replica.preemption_warning",
        f"{replica.name}: spot preemption announced in {replica.zone.name}",
        subject=replica.name,
        severity="warning",
        zone=replica.zone.name,
        preempt_at=preempt_at.isoformat() if preempt_at else None,
    )
    service = ServiceConfig.objects.filter(model_name=replica.model_name).first()
    if replica.state != Replica.State.READY or service is None:
        return False
    drains = load_drains(service)
    start(replica, drains, reason="preemption-warning", now=at)
    service.scaling_state = store_drains(dict(service.scaling_state or {}), drains)
    service.save(update_fields=["scaling_state", "updated_at"])
    return True


def advance(
    drains: Drains, provider: CloudProvider, now: datetime, config: DrainConfig
) -> list[str]:
    """Terminate every drained replica whose verdict says so; the handles terminated.

    A drain whose row is no longer ``draining`` (preempted meanwhile, undrained or
    removed by an operator) is forgotten without a call to the provider."""
    done = []
    for handle, drain in sorted(drains.items()):
        replica = (
            Replica.objects.select_related("zone")
            .filter(provider=provider.name, provider_handle=handle)
            .first()
        )
        if replica is None or replica.state != Replica.State.DRAINING:
            del drains[handle]
            continue
        count = in_flight(replica.url)
        verdict = judge(drain, now.timestamp(), count, config)
        if verdict is Verdict.WAIT:
            continue
        provider.terminate(handle, now.timestamp())
        replica.state, replica.state_changed_at, replica.terminated_at = (
            Replica.State.TERMINATED,
            now,
            now,
        )
        replica.save(update_fields=["state", "state_changed_at", "terminated_at"])
        _record_end(replica, drain, verdict, count, now)
        del drains[handle]
        done.append(handle)
    return done


def _record_end(
    replica: Replica, drain: Drain, verdict: Verdict, count: int | None, now: datetime
) -> None:
    took = round(now.timestamp() - drain.started_at, 3)
    if verdict is Verdict.DRAINED:
        Event.record(
            "replica.drained",
            f"{replica.name}: drained in {took} s ({drain.reason}), terminated",
            subject=replica.name,
            reason=drain.reason,
            drain_s=took,
        )
        return
    cut = "an unknown number of" if count is None else str(count)
    Event.record(
        "replica.drain_deadline",
        f"{replica.name}: drain deadline passed after {took} s ({drain.reason});"
        f" terminated, cutting {cut} request(s) in flight",
        subject=replica.name,
        severity="warning",
        reason=drain.reason,
        drain_s=took,
        cut=count,
    )


def from_timestamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)
