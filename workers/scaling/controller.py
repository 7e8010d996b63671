"""One scaling step for one service: plain data in, decisions and state to store out.

``step_service`` runs, for one service on one beat:

1. the service's scaling policy (``scalers``) says how many: ``request-rate``
   (SkyServe's autoscaler, the default: the QPS over the service's window gives
   N_tar, with the up/down delays carried in the stored state) or ``preserve``
   (PreServe's instance scaler: the forecast N at each window's start, one more
   replica per potentially overloaded one from the replicas' KV look-ahead maps,
   at most one scale-down per window, never below the request-rate N);
2. the placement policy, rebuilt from its stored snapshot and told what happened
   since the last beat: spot preemptions, and spot replicas that have become ready
   (SpotHedge's Algorithm 1 moves zones between Z_A and Z_P on exactly these);
3. ``reconcile``: terminate the excess, launch the deficit, spot first and the
   on-demand fallback after, through a ``Launcher``;
4. the ``ScaleDecision`` to report, the ``scaling_state`` to store, and whether an
   operator should hear about it (an Event).

The launcher is the only thing the step calls out to: a spot launch that finds no
capacity sends the next one to another zone within the same step (Algorithm 1), so
the loop must hear each launch's outcome as it goes.  The live glue
(``workers.scaling_glue``) passes a launcher backed by the cloud provider and the
Replica rows; the simulator drives the same ``reconcile`` with its virtual cloud.
Everything else here is arithmetic on frozen inputs, and ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import ON_DEMAND, SPOT, Fleet, Launcher, MixTarget, ZoneOffer
from workers.scaling.instance_scaler import InstanceScalerConfig
from workers.scaling.reconcile import ReconcileResult, reconcile
from workers.scaling.regional import RegionalInputs, RegionSplit, split_replicas
from workers.scaling.registry import build_policy
from workers.scaling.scalers import ScalingOutcome, ScalingSignals, build_scaler


@dataclass(frozen=True)
class ServiceView:
    """What a step needs of a service's configuration and of its stored state."""

    model_name: str
    policy: str
    autoscaler: AutoscalerConfig
    spot_extra: int
    static_on_demand: int
    target_replicas: int | None  # N_tar stored by the previous step (None: never scaled)
    scaling_state: Mapping[str, object]
    scaler: str = "request-rate"  # how many (``scalers``); ``policy`` says where
    instance_scaler: InstanceScalerConfig = field(default_factory=InstanceScalerConfig)


@dataclass(frozen=True)
class Preemption:
    """A replica the provider reported preempted since the last beat."""

    model_name: str
    kind: str
    zone: str


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
    scaler: str = "request-rate"  # the scaling policy that decided N_tar
    why: str = ""  # its reason in one line
    reason: dict[str, object] = field(default_factory=dict)  # the same as plain data
    regions: dict[str, object] = field(default_factory=dict)  # the regional split, if any


@dataclass(frozen=True)
class ServiceStep:
    decision: ScaleDecision
    target: MixTarget  # the mix reconcile aimed for: spot, and the on-demand fallback
    placement: dict[str, object]  # the policy's snapshot after the step
    scaling_state: dict[str, object]  # store it; the next step starts from it
    changed: bool  # launches, terminations, preemptions or a new N_tar: worth an Event


def step_service(
    view: ServiceView,
    fleet: Fleet,
    zones: Sequence[ZoneOffer],
    *,
    qps: float,
    now: float,
    preemptions: Sequence[Preemption],
    launcher: Launcher,
    forecast_n: int | None = None,
    lookaheads: Sequence[Sequence[int]] = (),
    unmapped: int = 0,
    regional: RegionalInputs | None = None,
) -> ServiceStep:
    """One beat for one service; ``fleet`` holds its launched replicas (dead ones left
    out), ``preemptions`` every one the provider reported (other services' are ignored).
    ``forecast_n`` (the forecast's N for the windows ahead, None: no forecast) and
    ``lookaheads`` (each ready replica's anticipated KV tokens per iteration, and
    ``unmapped``: how many ready replicas have no known map) feed the ``preserve``
    scaler; ``request-rate`` reads the QPS only.  ``regional`` (each region's forecast
    demand, None: none known) splits N across regions (``regional``), and the policy
    places each region's share within its zones; without it N is placed as one fleet."""
    mine = [p for p in preemptions if p.model_name == view.model_name]
    scaled = decide_n(view, now, ScalingSignals(qps, forecast_n, tuple(lookaheads), unmapped))
    split = _split(view, zones, scaled.n_target, regional)
    if split is None:
        policy = restore_policy(view, zones, fleet, mine)
        result = reconcile(policy, scaled.n_target, fleet, launcher, now=now)
        placement = policy.snapshot()
        by_region: dict[str, object] | None = None
    else:
        result, by_region = reconcile_regions(view, zones, fleet, mine, split, launcher, now)
        stored = view.scaling_state.get("placement")
        placement = dict(stored) if isinstance(stored, Mapping) else {}
    changed = bool(result.launched or result.terminated or mine)
    decision = _decision(view.model_name, qps, scaled.n_target, fleet, result)
    decision.scaler, decision.why, decision.reason = view.scaler, scaled.describe, scaled.reason
    state = next_state(scaled.state, placement, fleet, result.target)
    if split is not None and by_region is not None:
        decision.regions = split.as_data()
        state["placement_by_region"] = by_region
        changed = changed or view.scaling_state.get("regions") != split.counts
        state["regions"] = dict(split.counts)
    return ServiceStep(
        decision=decision,
        target=result.target,
        placement=placement,
        scaling_state=state,
        changed=changed or scaled.n_target != view.target_replicas,
    )


def _split(
    view: ServiceView, zones: Sequence[ZoneOffer], n_target: int, regional: RegionalInputs | None
) -> RegionSplit | None:
    """The regional split over the regions the service has zones in (a region with
    zones but no forecast: no split, the step is the one-fleet step)."""
    if regional is None:
        return None
    regions = sorted({z.region for z in zones})
    if any(r not in regional.demand for r in regions):
        return None
    inputs = replace(regional, demand={r: regional.demand[r] for r in regions})
    return split_replicas(n_target, inputs, view.autoscaler.max_replicas)


def reconcile_regions(
    view: ServiceView,
    zones: Sequence[ZoneOffer],
    fleet: Fleet,
    preemptions: Sequence[Preemption],
    split: RegionSplit,
    launcher: Launcher,
    now: float,
) -> tuple[ReconcileResult, dict[str, object]]:
    """Each region's share reconciled by the service's policy over that region's zones
    and replicas, from that region's stored snapshot.  The over-provisioning
    (``spot_extra``) and the static on-demand count go to the region holding the most
    (ties by name), so the fleet carries them once, as without a split.  A replica in
    a zone no longer offered belongs to no region and is left as it is."""
    region_of = {z.name: z.region for z in zones}
    stored = view.scaling_state.get("placement_by_region")
    states = stored if isinstance(stored, Mapping) else {}
    lead = min(split.counts, key=lambda r: (-split.counts[r], r))
    merged = ReconcileResult(target=MixTarget(0, 0))
    snapshots: dict[str, object] = {}
    for region in sorted(split.counts):
        state = states.get(region)
        local = replace(
            view,
            spot_extra=view.spot_extra if region == lead else 0,
            static_on_demand=view.static_on_demand if region == lead else 0,
            scaling_state={**view.scaling_state, "placement": state},
        )
        here = Fleet(tuple(r for r in fleet.replicas if region_of.get(r.zone) == region))
        mine = [p for p in preemptions if region_of.get(p.zone) == region]
        policy = restore_policy(local, [z for z in zones if z.region == region], here, mine)
        result = reconcile(policy, split.counts[region], here, launcher, now=now)
        snapshots[region] = policy.snapshot()
        merged.target = MixTarget(
            merged.target.spot + result.target.spot,
            merged.target.on_demand + result.target.on_demand,
        )
        merged.launched += result.launched
        merged.refused += result.refused
        merged.terminated += result.terminated
    return merged, snapshots


def decide_n(view: ServiceView, now: float, signals: ScalingSignals) -> ScalingOutcome:
    """The service's scaling policy over its stored state: N_tar, the state, why."""
    scaler = build_scaler(view.scaler, view.autoscaler, view.instance_scaler)
    fallback = view.target_replicas or view.autoscaler.min_replicas
    return scaler.decide(view.scaling_state, fallback, now, signals)


def restore_policy(
    view: ServiceView,
    zones: Sequence[ZoneOffer],
    fleet: Fleet,
    preemptions: Sequence[Preemption],
) -> PlacementPolicy:
    """The service's policy as the last step left it, told what happened since
    (``preemptions`` of this service's replicas)."""
    stored = view.scaling_state.get("placement")
    policy = build_policy(
        view.policy,
        zones,
        n_extra=view.spot_extra,
        static_on_demand=view.static_on_demand,
        state=stored if isinstance(stored, Mapping) else None,
    )
    for preemption in preemptions:
        if preemption.kind == SPOT:
            policy.spot_preempted(preemption.zone)
    # A spot replica is "ready" to the policy once: the first beat that sees it so.
    seen = set(_strings(view.scaling_state.get("ready_seen")))
    for replica in fleet.replicas:
        if replica.ready and replica.kind == SPOT and replica.handle not in seen:
            policy.spot_ready(replica.zone)
    return policy


def next_state(
    scaled: Mapping[str, object], placement: dict[str, object], fleet: Fleet, target: MixTarget
) -> dict[str, object]:
    """``scaled``: the scaling policy's state (its autoscaler's, and the instance
    scaler's under ``preserve``)."""
    return {
        **scaled,
        "placement": placement,
        # Bounded: only handles of replicas still launched.
        "ready_seen": sorted(r.handle for r in fleet.replicas if r.ready),
        "mix": {"spot": target.spot, "on_demand": target.on_demand},
    }


def _decision(
    service: str, qps: float, n_target: int, fleet: Fleet, result: ReconcileResult
) -> ScaleDecision:
    return ScaleDecision(
        service=service,
        qps=qps,
        n_target=n_target,
        ready_spot=fleet.ready(SPOT),
        ready_on_demand=fleet.ready(ON_DEMAND),
        launched=[f"{kind}@{zone}" for kind, zone, _ in result.launched],
        terminated=list(result.terminated),
        refused=[f"{kind}@{zone}" for kind, zone in result.refused],
    )


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
