"""The live scaling loop's Django side: rows in, the pure step, decisions applied.

Each beat: provider notices become Replica rows; then for every ServiceConfig with a
scaling policy, its row, its launched replicas and its QPS become the plain data of
``workers.scaling.controller.step_service``, which launches and terminates through
``ProviderLauncher`` (a provider call and a Replica row each).  The step's state is
saved on the ServiceConfig, and one ``scaling.decision`` Event with its inputs is
recorded whenever anything changed, so an operator can see why the fleet looks the
way it does.

A service whose scaler is ``preserve`` also gets, each beat, the forecast's N for the
windows ahead (``preserve_forecast_n``: the stored ``all`` forecast of
``workers.forecasting`` over the service's profiled per-replica capacity) and each
ready replica's KV look-ahead map as its balancer last published it on the live feed
(``replica_lookaheads``: the ``ReplicaLive`` rows of ``routing.live_publish``, no
older than ``LOOKAHEAD_MAX_AGE_S``).  A missing forecast or map is a missing signal,
never an error: the scaler runs on what it has, and never below the request rate.

A service whose zones lie in two or more regions, each with a stored forecast
(``workers.forecasting``'s per-region entries), also gets ``regional_inputs``: each
region's forecast demand and the RTTs of ``RegionLatency``; the step then splits N
across the regions (``workers.scaling.regional``) and the placement policy places each
region's share within its zones.  A region without a forecast means no split: the
step places N as one fleet, as before.

Launched replicas start ``provisioning`` (billed from now), become ``starting`` when the
provider reports their process running, and ``ready`` through the ordinary readiness
probes (``workers.probes``); balancers pick them up on their next topology refresh.
"""

from __future__ import annotations

import logging
import math
import secrets
from datetime import UTC, datetime, timedelta
from typing import cast

import redis
from django.conf import settings
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.text import slugify

from core.live_feed import FIELD, decode_all, latest_replicas, stream_key
from core.policies.meridian import MeridianConfig
from fleet.models import Event, MetricRollup, RegionLatency, Replica, ServiceConfig, Zone
from workers import draining, forecasting
from workers.providers.base import PREEMPTION_WARNING, CloudProvider, Instance, LaunchSpec, Notice
from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.controller import (
    Preemption,
    ScaleDecision,
    ServiceStep,
    ServiceView,
    step_service,
)
from workers.scaling.drain import SCALE_DOWN
from workers.scaling.fleet import Fleet, FleetReplica, ZoneOffer
from workers.scaling.instance_scaler import InstanceScalerConfig, forecast_instances
from workers.scaling.regional import RegionalConfig, RegionalInputs, forecast_demand
from workers.scaling.workload_forecast import InstanceCapacity
from workers.task_policy import redis_client

logger = logging.getLogger(__name__)

# Launched and billed.  A failed replica stays in the fleet (not ready) so the policy
# counts it, may terminate it, and gets it back when its probe recovers.
LIVE_STATES = (
    Replica.State.PROVISIONING,
    Replica.State.STARTING,
    Replica.State.READY,
    Replica.State.FAILED,
)


def scale_services(provider: CloudProvider, now: datetime | None = None) -> list[ScaleDecision]:
    """One beat: apply provider notices, then scale every service that has a policy."""
    moment = now or timezone.now()
    preempted = apply_notices(provider, provider.poll(moment.timestamp()))
    if not provider.can_launch:
        return []  # e.g. a static provider: its replicas are the operator's
    preemptions = [Preemption(r.model_name, r.kind, r.zone.name) for r in preempted]
    services = ServiceConfig.objects.exclude(scaling_policy=ServiceConfig.ScalingPolicy.NONE)
    return [scale_service(s, provider, moment, preemptions) for s in services]


def scale_service(
    service: ServiceConfig, provider: CloudProvider, now: datetime, preemptions: list[Preemption]
) -> ScaleDecision:
    drains = draining.load_drains(service)
    draining.advance(drains, provider, now, draining.drain_config())
    launcher = ProviderLauncher(provider, service, now, drains)
    fleet = launched_fleet(service, provider)
    forecast_n, lookaheads, unmapped = preserve_signals(service, now)
    zones = provider.zones()
    step = step_service(
        service_view(service),
        fleet,
        zones,
        qps=service_qps(service, now),
        now=now.timestamp(),
        preemptions=preemptions,
        launcher=launcher,
        forecast_n=forecast_n,
        lookaheads=lookaheads,
        unmapped=unmapped,
        regional=regional_inputs(zones, now),
    )
    save_step(service, step, drains)
    if step.changed:
        record_decision(step, drained_first=launcher.drained)
    return step.decision


# --- rows in -----------------------------------------------------------------------------


def service_view(service: ServiceConfig) -> ServiceView:
    return ServiceView(
        model_name=service.model_name,
        policy=service.scaling_policy,
        autoscaler=AutoscalerConfig(
            target_qps_per_replica=service.target_qps_per_replica,
            min_replicas=service.min_replicas,
            max_replicas=service.max_replicas,
            upscale_delay_s=service.upscale_delay_s,
            downscale_delay_s=service.downscale_delay_s,
        ),
        spot_extra=service.spot_extra,
        static_on_demand=service.static_on_demand,
        target_replicas=service.target_replicas,
        scaling_state=dict(service.scaling_state or {}),
        scaler=service.scaler,
        instance_scaler=InstanceScalerConfig(
            window_s=settings.MERIDIAN_FORECAST_WINDOW_S,
            kv_capacity_tokens=kv_capacity_tokens(service),
            min_replicas=service.min_replicas,
            max_replicas=service.max_replicas,
        ),
    )


# --- preserve's signals ------------------------------------------------------------------

# A look-ahead map older than this is not "now" (its balancer stopped publishing).
LOOKAHEAD_MAX_AGE_S = 30.0
# How many of a region's newest live records are read: a round of every balancer
# process of the region, with room to spare.
LOOKAHEAD_RECORDS = 64


def kv_capacity_tokens(service: ServiceConfig) -> int:
    """The replica's KV cache in tokens, as the service's routing policy sees it."""
    found = (service.policy_params or {}).get("kv_capacity_tokens")
    if isinstance(found, int) and not isinstance(found, bool) and found > 0:
        return found
    return MeridianConfig().kv_capacity_tokens


def replica_capacity(service: ServiceConfig, window_s: float) -> InstanceCapacity | None:
    """The service's profiled per-replica capacity per window; None while unset."""
    rates = (
        service.replica_prompt_tokens_per_s,
        service.replica_decode_tokens_per_s,
        service.replica_total_tokens_per_s,
    )
    if any(r is None or r <= 0 for r in rates):
        return None
    prompt, decode, total = (cast(float, r) * window_s for r in rates)
    return InstanceCapacity(prompt=prompt, decode=decode, total=total)


def preserve_signals(
    service: ServiceConfig, now: datetime
) -> tuple[int | None, list[tuple[int, ...]], int]:
    """The forecast N, the ready replicas' look-ahead maps and how many ready replicas
    have none (nothing under ``request-rate``; when Redis cannot be read, every ready
    replica is unmapped: the step runs without the signals and scales nothing down
    on a load it cannot see)."""
    if service.scaler != ServiceConfig.Scaler.PRESERVE:
        return None, [], 0
    try:
        with redis_client() as client:
            maps, unmapped = replica_lookaheads(client, service, now)
            return preserve_forecast_n(client, service, now), maps, unmapped
    except (redis.RedisError, OSError) as exc:
        logger.warning(
            "scaling %s: Redis unavailable (%s); no forecast or look-ahead", service, exc
        )
        return None, [], len(_ready_replicas(service))


def preserve_forecast_n(client: redis.Redis, service: ServiceConfig, now: datetime) -> int | None:
    """N for the windows ahead from the stored forecast of all regions together."""
    window_s = settings.MERIDIAN_FORECAST_WINDOW_S
    capacity = replica_capacity(service, window_s)
    stored = forecasting.load(client, forecasting.ALL)
    if capacity is None or stored is None or stored.get("window_s") != window_s:
        return None
    return forecast_instances(stored, math.floor(now.timestamp() / window_s), capacity)


def regional_inputs(zones: list[ZoneOffer], now: datetime) -> RegionalInputs | None:
    """Each region's forecast demand (``regional.forecast_demand`` of its stored entry)
    and the RTTs between them; None with fewer than two regions, or while a region has
    no current forecast or Redis cannot be read (the step places N as one fleet)."""
    regions = sorted({z.region for z in zones})
    if len(regions) < 2:
        return None
    window_s = settings.MERIDIAN_FORECAST_WINDOW_S
    now_window = math.floor(now.timestamp() / window_s)
    demand: dict[str, float] = {}
    try:
        with redis_client() as client:
            for region in regions:
                stored = forecasting.load(client, region)
                found = None
                if stored is not None and stored.get("window_s") == window_s:
                    found = forecast_demand(stored, now_window)
                if found is None:
                    return None
                demand[region] = found
    except (redis.RedisError, OSError) as exc:
        logger.warning("regional placement: Redis unavailable (%s); no split", exc)
        return None
    rows = RegionLatency.objects.filter(
        source__name__in=regions, target__name__in=regions
    ).values_list("source__name", "target__name", "rtt_ms")
    config = RegionalConfig(
        max_spill=settings.MERIDIAN_PLACEMENT_MAX_SPILL,
        rtt_budget_ms=settings.MERIDIAN_PLACEMENT_RTT_BUDGET_MS,
    )
    return RegionalInputs(demand, {(a, b): rtt for a, b, rtt in rows}, config)


def _ready_replicas(service: ServiceConfig) -> list[tuple[str, str]]:
    return list(
        Replica.objects.filter(
            model_name=service.model_name, state=Replica.State.READY
        ).values_list("name", "region__name")
    )


def replica_lookaheads(
    client: redis.Redis, service: ServiceConfig, now: datetime
) -> tuple[list[tuple[int, ...]], int]:
    """The look-ahead map of each ready replica of the service, from the newest live
    record (of any balancer) that reports it, and how many ready replicas no recent
    record reports.  A reported replica with nothing anticipated has an empty map."""
    ready = _ready_replicas(service)
    raws: list[bytes] = []
    for region in sorted({region for _, region in ready}):
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            client.xrevrange(stream_key(region), count=LOOKAHEAD_RECORDS),
        )
        raws.extend(f[FIELD.encode()] for _, f in entries if FIELD.encode() in f)
    since = now.timestamp() - LOOKAHEAD_MAX_AGE_S
    live = latest_replicas(r for r in decode_all(raws) if r.ts >= since)
    maps = [live[name][2].lookahead for name, _ in ready if name in live]
    return maps, len(ready) - len(maps)


def launched_fleet(service: ServiceConfig, provider: CloudProvider) -> Fleet:
    rows = Replica.objects.select_related("zone").filter(
        model_name=service.model_name, provider=provider.name, state__in=LIVE_STATES
    )
    return Fleet(tuple(_fleet_replica(r) for r in rows))


def _fleet_replica(row: Replica) -> FleetReplica:
    launched = (row.launched_at or row.created_at).timestamp()
    ready = row.state == Replica.State.READY
    return FleetReplica(row.provider_handle, row.kind, row.zone.name, ready, launched)


def service_qps(service: ServiceConfig, now: datetime) -> float:
    """Requests per second to the service's replicas over its QPS window (replica rollups)."""
    window = max(1, service.qps_window_s)
    since = now - timedelta(seconds=window)
    names = Replica.objects.filter(
        Q(terminated_at__isnull=True) | Q(terminated_at__gt=since), model_name=service.model_name
    ).values_list("name", flat=True)
    total = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REPLICA,
        name__in=list(names),
        interval_end__gt=since,
        interval_end__lte=now,
    ).aggregate(n=Sum("requests"))["n"]
    return float(total or 0) / window


# --- provider notices --------------------------------------------------------------------


def apply_notices(provider: CloudProvider, notices: list[Notice]) -> list[Replica]:
    """Record what the provider saw; the replicas the placement policy should count as
    preempted: those warned of a preemption (drained at once, so the policy replaces
    them before they go) and those preempted without a warning."""
    preempted = []
    for notice in notices:
        replica = Replica.objects.filter(
            provider=provider.name, provider_handle=notice.handle
        ).first()
        if replica is None:
            continue
        if notice.event == PREEMPTION_WARNING:
            preempt_at = None if notice.preempt_at is None else _dt(notice.preempt_at)
            draining.warn(replica, at=_dt(notice.at), preempt_at=preempt_at)
            preempted.append(replica)
            continue
        _apply_notice(replica, notice)
        if replica.state == Replica.State.PREEMPTED:
            _record_preemption(replica)
            if not _was_warned(replica):  # else the policy heard of it with its warning
                preempted.append(replica)
    return preempted


def _was_warned(replica: Replica) -> bool:
    return Event.objects.filter(kind="replica.preemption_warning", subject=replica.name).exists()


def _apply_notice(replica: Replica, notice: Notice) -> None:
    replica.state_changed_at = _dt(notice.at)
    replica.url = notice.url or replica.url
    if notice.event == "running":
        replica.state = Replica.State.STARTING
    else:
        preempted = notice.event == "preempted"
        replica.state = Replica.State.PREEMPTED if preempted else Replica.State.TERMINATED
        replica.terminated_at = _dt(notice.at)
    replica.save(update_fields=["state", "state_changed_at", "terminated_at", "url"])


def _record_preemption(replica: Replica) -> None:
    Event.record(
        "replica.preempted",
        f"{replica.name}: spot preempted in {replica.zone.name}",
        subject=replica.name,
        severity="warning",
        zone=replica.zone.name,
    )


# --- decisions applied -------------------------------------------------------------------


class ProviderLauncher:
    """``Launcher`` over a provider: every launch and termination is a Replica row.

    A ready replica is drained rather than terminated (``workers.draining``): it leaves
    routing now and the provider terminates it once nothing runs on it (or at the drain
    deadline); one that is not ready serves nothing and is terminated at once."""

    def __init__(
        self,
        provider: CloudProvider,
        service: ServiceConfig,
        now: datetime,
        drains: draining.Drains | None = None,
    ) -> None:
        self.provider, self.service, self.now = provider, service, now
        self.drains: draining.Drains = {} if drains is None else drains
        self.drained: list[str] = []  # handles this step drained instead of terminating

    def launch(self, kind: str, zone: str) -> str | None:
        name = replica_name(self.service.model_name, kind, zone)
        spec = LaunchSpec(self.service.model_name, name)
        instance = self.provider.launch(spec, zone, kind, self.now.timestamp())
        if instance is None:
            return None
        self._create_row(name, kind, zone, instance)
        return instance.handle

    def terminate(self, handle: str) -> None:
        replica = (
            Replica.objects.select_related("zone")
            .filter(provider=self.provider.name, provider_handle=handle)
            .first()
        )
        if replica is not None and replica.state == Replica.State.READY:
            draining.start(replica, self.drains, reason=SCALE_DOWN, now=self.now)
            self.drained.append(handle)
            return
        self.provider.terminate(handle, self.now.timestamp())
        # Saved row by row, not QuerySet.update: the save is what tells the balancers
        # (fleet.topology_change).
        for row in Replica.objects.filter(provider=self.provider.name, provider_handle=handle):
            row.state = Replica.State.TERMINATED
            row.state_changed_at = row.terminated_at = self.now
            row.save(update_fields=["state", "state_changed_at", "terminated_at"])

    def _create_row(self, name: str, kind: str, zone: str, instance: Instance) -> Replica:
        zone_row = Zone.objects.select_related("region").get(name=zone)
        return Replica.objects.create(
            name=name,
            url=instance.url,
            model_name=self.service.model_name,
            region=zone_row.region,
            zone=zone_row,
            kind=kind,
            hourly_price=self.provider.price(zone, kind),
            state=Replica.State.PROVISIONING,
            state_changed_at=self.now,
            launched_at=_dt(instance.launched_at),
            provider=self.provider.name,
            provider_handle=instance.handle,
        )


def replica_name(model_name: str, kind: str, zone: str) -> str:
    base = slugify(f"{model_name}-{kind}-{zone}")[:72]
    return f"{base}-{secrets.token_hex(3)}"  # unique without counting rows


def save_step(
    service: ServiceConfig, step: ServiceStep, drains: draining.Drains | None = None
) -> None:
    service.scaling_state = draining.store_drains(step.scaling_state, drains or {})
    service.target_replicas = step.decision.n_target
    service.save(update_fields=["scaling_state", "target_replicas", "updated_at"])


def record_decision(step: ServiceStep, drained_first: list[str] | None = None) -> None:
    """``drained_first``: the handles of ``terminated`` that were ready, so are drained."""
    d, target = step.decision, step.target
    drained = drained_first or []
    Event.record(
        "scaling.decision",
        f"{d.service}: {d.scaler}: {d.why}; mix {target.spot} spot + {target.on_demand}"
        f" on-demand; launched {len(d.launched)}, terminated {len(d.terminated)}"
        f" ({len(drained)} draining first)" + (f"; {d.regions['why']}" if d.regions else ""),
        subject=d.service,
        qps=round(d.qps, 4),
        n_target=d.n_target,
        ready_spot=d.ready_spot,
        ready_on_demand=d.ready_on_demand,
        target_spot=target.spot,
        target_on_demand=target.on_demand,
        launched=d.launched,
        terminated=d.terminated,
        refused=d.refused,
        draining=drained,
        placement=step.placement,
        scaler=d.scaler,
        why=d.why,
        reason=d.reason,
        regions=d.regions,
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)
