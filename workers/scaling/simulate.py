"""Virtual-time replay of a spot trace against a placement policy (SkyServe §5.2).

The simulated cloud grants a spot launch in a zone while the trace's capacity there
exceeds the spot replicas already launched in it, and preempts the newest ones when
capacity drops below that.  On-demand always launches.  Every replica is ready
``cold_start_s`` after launch and billed from launch (clouds bill the cold start
too, §2.3).  Each step the cloud first applies preemptions and readiness, tells the
policy, then runs the same ``reconcile`` the live controller runs.

Availability is the share of time with at least ``N_tar`` ready replicas, counted
after the first ``cold_start_s`` (no policy can be ready earlier; the paper omits
on-demand from the availability plot for the same reason).  Cost is relative to
``N_tar`` on-demand replicas over the whole run (Figure 14b's normalisation); both
figures are ``workers.costing``'s, the rules the Cost page and ``/metrics/cost`` use,
with virtual second ``t`` at ``SIM_EPOCH + t``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from workers.costing import BilledReplica, Service, summarize
from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import SPOT, Fleet, FleetReplica, ZoneOffer
from workers.scaling.reconcile import reconcile
from workers.scaling.registry import build_policy
from workers.scaling.traces import SpotTrace

SIM_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # only differences of virtual time matter
SIM_MODEL = "simulated"


def at(t: float) -> datetime:
    return SIM_EPOCH + timedelta(seconds=t)


@dataclass(frozen=True)
class SimConfig:
    n_target: int = 4
    n_extra: int = 1
    static_on_demand: int = 1
    cold_start_s: float = 183.0  # SkyServe §2.3: provision + load Llama-2-7B on AWS
    step_s: float = 60.0  # capped at the trace's own gap so no sample is skipped
    # Preemption notice ahead of each capacity drop (0: none; AWS gives 120 s).  A warned
    # replica is drained: out of the fleet at once, its zone reported preempted, billed
    # until the drop lands (the conservative bill: live, an idle one ends sooner).
    warning_s: float = 0.0


@dataclass
class _Instance:
    handle: str
    kind: str
    zone: str
    launched_at: float
    ended_at: float | None = None
    announced_ready: bool = False
    warned_until: float | None = None  # warned of a preemption due then

    @property
    def warned(self) -> bool:
        return self.warned_until is not None


@dataclass
class SimResult:
    trace: str
    policy: str
    availability: float
    cost: float
    on_demand_cost: float
    preemptions: int
    launches: int
    relative_cost: float


@dataclass
class VirtualCloud:
    """The simulator's ``Launcher``: capacity from the trace, bills from launch."""

    trace: SpotTrace
    prices: Mapping[str, ZoneOffer]
    cold_start_s: float
    now: float = 0.0
    instances: dict[str, _Instance] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    preemptions: int = 0
    launches: int = 0

    def live(self) -> list[_Instance]:
        return [i for i in self.instances.values() if i.ended_at is None]

    def launch(self, kind: str, zone: str) -> str | None:
        if kind == SPOT:
            used = sum(1 for i in self.live() if i.kind == SPOT and i.zone == zone)
            if used >= self.trace.capacity(zone, self.now):
                return None
        handle = f"{kind}-{zone}-{next(self.counter)}"
        self.instances[handle] = _Instance(handle, kind, zone, self.now)
        self.launches += 1
        return handle

    def terminate(self, handle: str) -> None:
        self.instances[handle].ended_at = self.now

    def _doomed(self, zone: str, t: float) -> list[_Instance]:
        """Spot replicas in ``zone`` over its capacity at ``t``: warned first, then newest."""
        spot = sorted(
            (i for i in self.live() if i.kind == SPOT and i.zone == zone),
            key=lambda i: (i.warned, i.launched_at),
        )
        excess = len(spot) - self.trace.capacity(zone, t)
        return spot[len(spot) - excess :] if excess > 0 else []

    def preempt(self) -> list[str]:
        """End spot replicas over their zone's capacity; the zones of those not warned
        (a warned one's zone was reported with its warning)."""
        zones: list[str] = []
        for zone in sorted({i.zone for i in self.live() if i.kind == SPOT}):
            for victim in self._doomed(zone, self.now):
                victim.ended_at = self.now
                self.preemptions += 1
                if not victim.warned:
                    zones.append(zone)
        for spared in self.live():  # warned, and the drop never came: drained by now
            if spared.warned_until is not None and spared.warned_until <= self.now:
                spared.ended_at = self.now
        return zones

    def warn(self, lead_s: float) -> list[str]:
        """Warn the spot replicas a drop ``lead_s`` ahead will reclaim; their zones."""
        zones: list[str] = []
        for zone in sorted({i.zone for i in self.live() if i.kind == SPOT}):
            for victim in self._doomed(zone, self.now + lead_s):
                if not victim.warned:
                    victim.warned_until = self.now + lead_s
                    zones.append(zone)
        return zones

    def newly_ready(self) -> list[_Instance]:
        fresh = [i for i in self.live() if not i.announced_ready and self._ready(i)]
        for i in fresh:
            i.announced_ready = True
        return fresh

    def _ready(self, i: _Instance) -> bool:
        return self.now - i.launched_at >= self.cold_start_s

    def fleet(self) -> Fleet:
        return Fleet(
            tuple(
                FleetReplica(i.handle, i.kind, i.zone, self._ready(i), i.launched_at)
                for i in self.live()
                if not i.warned  # draining: out of the fleet, still billed
            )
        )

    def billed(self) -> list[BilledReplica]:
        """Every instance ever launched, as the cost module reads a fleet."""
        return [self._billed(i) for i in self.instances.values()]

    def _billed(self, i: _Instance) -> BilledReplica:
        offer = self.prices[i.zone]
        price = offer.spot_price if i.kind == SPOT else offer.on_demand_price
        return BilledReplica(
            name=i.handle,
            region=offer.region,
            kind=i.kind,
            model=SIM_MODEL,
            hourly_price=Decimal(str(price)),
            start=at(i.launched_at),
            end=None if i.ended_at is None else at(i.ended_at),
        )


def simulate(
    trace: SpotTrace, policy_name: str, zones: list[ZoneOffer], config: SimConfig
) -> SimResult:
    """Replay ``trace`` under ``policy_name``; zones are the trace's, priced by ``zones``."""
    policy = build_policy(
        policy_name, zones, n_extra=config.n_extra, static_on_demand=config.static_on_demand
    )
    cloud = VirtualCloud(trace, {z.name: z for z in zones}, config.cold_start_s)
    end = trace.duration_s
    available = measured = 0.0
    t = 0.0
    while t < end:
        cloud.now = t
        _step(cloud, policy, config.n_target, config.warning_s)
        dt = min(config.step_s, trace.gap_s, end - t)
        if t >= config.cold_start_s:
            measured += dt
            available += dt if cloud.fleet().ready() >= config.n_target else 0.0
        t += dt
    # The cheapest zone's on-demand price stands in when the run bought no on-demand.
    cost = summarize(
        cloud.billed(),
        [Service(SIM_MODEL, target_replicas=config.n_target)],
        [],
        window_start=at(0.0),
        now=at(end),
        on_demand_price=Decimal(str(min(z.on_demand_price for z in zones))),
    )
    return SimResult(
        trace=trace.name,
        policy=policy_name,
        availability=available / measured if measured else 0.0,
        cost=float(cost.total),
        on_demand_cost=float(cost.on_demand_reference),
        preemptions=cloud.preemptions,
        launches=cloud.launches,
        relative_cost=float(cost.cost_ratio or 0),
    )


def _step(
    cloud: VirtualCloud, policy: PlacementPolicy, n_target: int, warning_s: float = 0.0
) -> None:
    for zone in cloud.preempt():
        policy.spot_preempted(zone)
    for zone in cloud.warn(warning_s) if warning_s > 0 else []:
        policy.spot_preempted(zone)
    for instance in cloud.newly_ready():
        if instance.kind == SPOT:
            policy.spot_ready(instance.zone)
    reconcile(policy, n_target, cloud.fleet(), cloud, now=cloud.now)
