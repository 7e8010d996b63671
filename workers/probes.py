"""Replica readiness probes: the control plane's view of which replicas may take traffic.

Each replica is probed the way its model's ``ServiceConfig.readiness_probe`` says:
``health`` GETs ``/health``; ``completion`` POSTs a real one-token completion to
``/v1/completions`` (SkyServe's readiness probe: a server whose health endpoint
answers while its engine cannot generate is not ready).  A replica becomes
``ready`` on its first successful probe and ``failed`` after ``failure_threshold``
consecutive failed ones; a failed replica that answers
again goes back to ``ready``.  A probe that times out on a replica a balancer marks
as still answering its requests (``core.peers.serving_key``) is late, not failed: the
replica is busy, not down (``core.busy``), and failing it would take it out of routing,
and maybe out of the fleet, at its peak.  Each transition is an Event.  Balancers read the
states in their topology refresh, so a failed replica leaves routing within one
probe period plus one refresh.  (Balancers also probe their own replicas every few
hundred ms in-process; this slower probe is the durable record.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

import httpx
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from core.peers import serving_key
from fleet.models import Event, Replica, ServiceConfig
from workers.health import after_probe
from workers.task_policy import redis_client

logger = logging.getLogger(__name__)

# States whose replicas are probed; drained, terminated and preempted ones are not ours to revive.
PROBED_STATES = (Replica.State.STARTING, Replica.State.READY, Replica.State.FAILED)


@dataclass(frozen=True)
class ProbeResult:
    replica_id: int
    ok: bool
    detail: str
    # No answer within the timeout (neither a refusal nor an error status).
    timed_out: bool = False


@dataclass(frozen=True)
class ProbeTransition:
    replica: str
    old_state: str
    new_state: str


@dataclass(frozen=True)
class ProbeTarget:
    replica_id: int
    name: str
    url: str
    model: str
    mode: str  # a ServiceConfig.ReadinessProbe value


def _request(client: httpx.AsyncClient, target: ProbeTarget) -> Awaitable[httpx.Response]:
    base = target.url.rstrip("/")
    if target.mode == ServiceConfig.ReadinessProbe.COMPLETION:
        body = {"model": target.model, "prompt": "ping", "max_tokens": 1, "stream": False}
        return client.post(base + "/v1/completions", json=body)
    return client.get(base + "/health")


async def _probe_one(client: httpx.AsyncClient, target: ProbeTarget) -> ProbeResult:
    try:
        response = await _request(client, target)
    except httpx.TimeoutException as exc:
        return ProbeResult(target.replica_id, False, f"{type(exc).__name__}: {exc}", True)
    except httpx.HTTPError as exc:
        return ProbeResult(target.replica_id, False, f"{type(exc).__name__}: {exc}")
    if response.status_code == 200:
        return ProbeResult(target.replica_id, True, f"{target.mode} 200")
    return ProbeResult(target.replica_id, False, f"{target.mode} HTTP {response.status_code}")


async def _probe_all(targets: list[ProbeTarget], timeout: float) -> list[ProbeResult]:
    # trust_env=False: replica URLs are internal and must never go through an env proxy.
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        return await asyncio.gather(*(_probe_one(client, target) for target in targets))


def probe_url(url: str, model: str, mode: str, *, timeout: float) -> ProbeResult:
    """Probe one URL the way a replica of ``model`` would be probed (before it exists)."""
    (result,) = asyncio.run(_probe_all([ProbeTarget(0, "", url, model, mode)], timeout))
    return result


def probe_targets() -> list[ProbeTarget]:
    """Every probed replica with the readiness probe its model is configured for."""
    modes = dict(ServiceConfig.objects.values_list("model_name", "readiness_probe"))
    rows = Replica.objects.filter(state__in=PROBED_STATES).values_list(
        "id", "name", "url", "model_name"
    )
    default = ServiceConfig.ReadinessProbe.HEALTH
    return [
        ProbeTarget(rid, name, url, model, modes.get(model, default))
        for rid, name, url, model in rows
    ]


def probe_replicas(*, timeout: float = 2.0, failure_threshold: int = 2) -> list[ProbeTransition]:
    """Probe every live replica once, concurrently, and apply state transitions."""
    targets = probe_targets()
    if not targets:
        return []
    results = asyncio.run(_probe_all(targets, timeout))
    names = {t.replica_id: t.name for t in targets}
    serving = _serving([names[r.replica_id] for r in results if r.timed_out])
    transitions = []
    for result in results:
        if result.timed_out and names[result.replica_id] in serving:
            _note_late(result, names[result.replica_id])
            continue
        transition = _apply(result, failure_threshold)
        if transition is not None:
            transitions.append(transition)
    return transitions


def _serving(names: list[str]) -> set[str]:
    """Which of ``names`` a balancer marks as answering its requests now; none when
    Redis cannot say (then a timeout counts, as it would without the marks)."""
    if not names:
        return set()
    try:
        with redis_client() as client:
            marks = client.mget([serving_key(name) for name in names])
    except (RedisError, OSError) as exc:
        logger.warning("serving marks unreadable (%s): timed-out probes count as failures", exc)
        return set()
    return {name for name, mark in zip(names, marks, strict=True) if mark is not None}


def _note_late(result: ProbeResult, name: str) -> None:
    """A late probe of a busy replica: its time is recorded, its state and failure
    count are not touched."""
    Replica.objects.filter(id=result.replica_id).update(last_probe_at=timezone.now())
    logger.info(
        "replica %s: readiness probe late (%s), but it is serving: busy", name, result.detail
    )


def _apply(result: ProbeResult, failure_threshold: int) -> ProbeTransition | None:
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(id=result.replica_id).first()
        if replica is None or replica.state not in PROBED_STATES:
            return None  # removed or drained while we probed
        old_state = replica.state
        replica.last_probe_at = timezone.now()
        new_state, replica.consecutive_failures = after_probe(
            result.ok,
            current=old_state,
            failures=replica.consecutive_failures,
            threshold=failure_threshold,
            healthy=Replica.State.READY,
            unhealthy=Replica.State.FAILED,
        )
        fields = ["last_probe_at", "consecutive_failures"]
        if new_state != old_state:
            replica.state = new_state
            replica.state_changed_at = replica.last_probe_at
            fields += ["state", "state_changed_at"]
        # Only a state change is news to the balancers (fleet.topology_change).
        replica.save(update_fields=fields)
        if new_state == old_state:
            return None
        _record_transition(replica, old_state, result)
        return ProbeTransition(replica.name, old_state, new_state)


def _record_transition(replica: Replica, old_state: str, result: ProbeResult) -> None:
    if replica.state == Replica.State.READY:
        kind = "replica_recovered" if old_state == Replica.State.FAILED else "replica_ready"
        Event.record(kind, f"{replica.name} is ready", subject=replica.name, previous=old_state)
    else:
        Event.record(
            "probe_failed",
            f"{replica.name} failed {replica.consecutive_failures} probes: {result.detail}",
            subject=replica.name,
            severity=Event.Severity.WARNING,
            previous=old_state,
            detail=result.detail,
        )
