"""The live scaling loop (Django glue): provider notices → Replica rows; for every
ServiceConfig with a scaling policy, autoscaler → N_tar, placement → launches and
terminations, and one ``scaling.decision`` Event with its inputs whenever anything
changed, so an operator can see why the fleet looks the way it does.

Launched replicas start ``provisioning`` (billed from now), become ``starting`` when the
provider reports their process running, and ``ready`` through the ordinary readiness
probes (``workers.probes``); balancers pick them up on their next topology refresh.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.text import slugify

from fleet.models import Event, MetricRollup, Replica, ServiceConfig, Zone
from workers.providers.base import CloudProvider, LaunchSpec, Notice
from workers.scaling.autoscaler import AutoscalerConfig, AutoscalerState, RequestRateAutoscaler
from workers.scaling.fleet import SPOT, Fleet, FleetReplica
from workers.scaling.reconcile import reconcile
from workers.scaling.registry import build_policy

# Launched and billed.  A failed replica stays in the fleet (not ready) so the policy
# counts it, may terminate it, and gets it back when its probe recovers.
LIVE_STATES = (
    Replica.State.PROVISIONING,
    Replica.State.STARTING,
    Replica.State.READY,
    Replica.State.FAILED,
)


@dataclass
class ScaleDecision:
    service: str
    qps: float
    n_target: int
    ready_spot: int
    ready_on_demand: int
    launched: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def apply_notices(provider: CloudProvider, notices: list[Notice]) -> list[Replica]:
    """Record what the provider saw; the preempted replicas."""
    preempted = []
    for notice in notices:
        replica = Replica.objects.filter(
            provider=provider.name, provider_handle=notice.handle
        ).first()
        if replica is None:
            continue
        replica.state_changed_at = _dt(notice.at)
        if notice.event == "running":
            replica.state = Replica.State.STARTING
        else:
            replica.state = (
                Replica.State.PREEMPTED if notice.event == "preempted" else Replica.State.TERMINATED
            )
            replica.terminated_at = _dt(notice.at)
        replica.save(update_fields=["state", "state_changed_at", "terminated_at"])
        if replica.state == Replica.State.PREEMPTED:
            preempted.append(replica)
            Event.record(
                "replica.preempted",
                f"{replica.name}: spot preempted in {replica.zone.name}",
                subject=replica.name,
                severity="warning",
                zone=replica.zone.name,
            )
    return preempted


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


class _ProviderLauncher:
    """``Launcher`` over a provider: every launch and termination is a Replica row."""

    def __init__(self, provider: CloudProvider, service: ServiceConfig, now: datetime) -> None:
        self.provider, self.service, self.now = provider, service, now

    def launch(self, kind: str, zone: str) -> str | None:
        zone_row = Zone.objects.select_related("region").get(name=zone)
        base = slugify(f"{self.service.model_name}-{kind}-{zone}")[:72]
        name = f"{base}-{secrets.token_hex(3)}"  # unique without counting rows
        instance = self.provider.launch(
            LaunchSpec(self.service.model_name, name), zone, kind, self.now.timestamp()
        )
        if instance is None:
            return None
        Replica.objects.create(
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
        return instance.handle

    def terminate(self, handle: str) -> None:
        self.provider.terminate(handle, self.now.timestamp())
        Replica.objects.filter(provider=self.provider.name, provider_handle=handle).update(
            state=Replica.State.TERMINATED, state_changed_at=self.now, terminated_at=self.now
        )


def _fleet(service: ServiceConfig, provider: CloudProvider) -> tuple[Fleet, list[Replica]]:
    rows = list(
        Replica.objects.select_related("zone").filter(
            model_name=service.model_name, provider=provider.name, state__in=LIVE_STATES
        )
    )
    fleet = Fleet(
        tuple(
            FleetReplica(
                r.provider_handle,
                r.kind,
                r.zone.name,
                r.state == Replica.State.READY,
                (r.launched_at or r.created_at).timestamp(),
            )
            for r in rows
        )
    )
    return fleet, rows


def scale_service(
    service: ServiceConfig, provider: CloudProvider, now: datetime, preempted: list[Replica]
) -> ScaleDecision:
    state = dict(service.scaling_state or {})
    autoscaler = RequestRateAutoscaler(
        AutoscalerConfig(
            target_qps_per_replica=service.target_qps_per_replica,
            min_replicas=service.min_replicas,
            max_replicas=service.max_replicas,
            upscale_delay_s=service.upscale_delay_s,
            downscale_delay_s=service.downscale_delay_s,
        )
    )
    qps = service_qps(service, now)
    scaled = autoscaler.step(
        AutoscalerState.from_dict(
            state.get("autoscaler"), service.target_replicas or service.min_replicas
        ),
        now.timestamp(),
        qps,
    )
    placement_state = state.get("placement")
    policy = build_policy(
        service.scaling_policy,
        provider.zones(),
        n_extra=service.spot_extra,
        static_on_demand=service.static_on_demand,
        state=placement_state if isinstance(placement_state, dict) else None,
    )
    for replica in preempted:
        if replica.model_name == service.model_name and replica.kind == SPOT:
            policy.spot_preempted(replica.zone.name)
    fleet, rows = _fleet(service, provider)
    seen = set(state.get("ready_seen", []))
    for r in rows:
        if r.state == Replica.State.READY and r.kind == SPOT and r.provider_handle not in seen:
            policy.spot_ready(r.zone.name)
    result = reconcile(
        policy,
        scaled.n_target,
        fleet,
        _ProviderLauncher(provider, service, now),
        now=now.timestamp(),
    )
    decision = ScaleDecision(
        service=service.model_name,
        qps=qps,
        n_target=scaled.n_target,
        ready_spot=fleet.ready(SPOT),
        ready_on_demand=fleet.ready("on-demand"),
        launched=[f"{kind}@{zone}" for kind, zone, _ in result.launched],
        terminated=result.terminated,
        refused=[f"{kind}@{zone}" for kind, zone in result.refused],
    )
    changed = (
        bool(result.launched or result.terminated or preempted)
        or scaled.n_target != service.target_replicas
    )
    service.scaling_state = {
        "autoscaler": scaled.to_dict(),
        "placement": policy.snapshot(),
        # Bounded: only handles of replicas still live.
        "ready_seen": sorted(r.provider_handle for r in rows if r.state == Replica.State.READY),
        "mix": {"spot": result.target.spot, "on_demand": result.target.on_demand},
    }
    service.target_replicas = scaled.n_target
    service.save(update_fields=["scaling_state", "target_replicas", "updated_at"])
    if changed:
        _record(decision, result.target.spot, result.target.on_demand, policy.snapshot())
    return decision


def _record(
    decision: ScaleDecision, spot: int, on_demand: int, placement: dict[str, object]
) -> None:
    Event.record(
        "scaling.decision",
        f"{decision.service}: N_tar={decision.n_target}, mix {spot} spot + {on_demand} on-demand;"
        f" launched {len(decision.launched)}, terminated {len(decision.terminated)}",
        subject=decision.service,
        qps=round(decision.qps, 4),
        n_target=decision.n_target,
        ready_spot=decision.ready_spot,
        ready_on_demand=decision.ready_on_demand,
        target_spot=spot,
        target_on_demand=on_demand,
        launched=decision.launched,
        terminated=decision.terminated,
        refused=decision.refused,
        placement=placement,
    )


def scale_services(provider: CloudProvider, now: datetime | None = None) -> list[ScaleDecision]:
    """One beat: apply provider notices, then scale every service that has a policy."""
    moment = now or timezone.now()
    preempted = apply_notices(provider, provider.poll(moment.timestamp()))
    services = ServiceConfig.objects.exclude(scaling_policy=ServiceConfig.ScalingPolicy.NONE)
    if provider.name == "static":
        return []  # a static provider launches nothing; its replicas are the operator's
    return [scale_service(s, provider, moment, preempted) for s in services]
