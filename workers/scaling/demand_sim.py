"""A day of demand against a scaling policy and SpotHedge, in virtual time.

``simulate_demand`` drives the very objects the live controller runs: a scaling
policy (``scalers``: ``request-rate`` or ``preserve``) says how many replicas, the
placement policy (SpotHedge) says spot or on-demand and where, ``reconcile`` launches
and terminates on the simulator's ``VirtualCloud`` (capacity from a spot trace,
billing from launch, ready after the cold start).

The demand is one day of a per-window series (ServeGen's requests per 10 minutes,
scaled so its peak window is ``peak_rps``), constant within a window.  Serving is a
**fluid model**, not a request-level simulation: ready replicas serve ``replica_rps``
each; what arrives beyond that waits in a backlog.  A request arriving in a step waits
``backlog / capacity`` and then takes ``base_ttft_s / (1 - rho)`` (``rho`` the step's
utilisation, capped at 0.99): TTFT grows as the fleet fills and explodes while it is
short.  Normalised by the mean prompt length (PreServe's P99 normalised latency; the
ServeGen language traces have no per-request lengths), the day's P99 is the arrivals-
weighted 99th percentile of the steps' TTFT, and SLO attainment the share of arrivals
whose TTFT is within ``slo_ttft_s`` (5x the unloaded TTFT: met up to rho = 0.8, so both
policies size replicas at ``target_utilization`` = 0.7 of ``replica_rps``).

The ``preserve`` policy gets, at each window's start, the forecast of the current and
the next window (``WorkloadModel``, fitted on the days before, taking each finished
window as it ends) turned into replicas at ``target_utilization`` of ``replica_rps``,
and the larger of the two (the next window's replicas warm at its start, the current
window's not cut).  Its look-ahead signal, in the fluid model, is the arrivals' share
of the ready fleet's capacity as each replica's KV usage over the next L iterations (a
full replica: a full cache); the backlog is not in it, as queued requests are in no
replica's map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.fleet import SPOT, ZoneOffer
from workers.scaling.instance_scaler import InstanceScalerConfig
from workers.scaling.reconcile import reconcile
from workers.scaling.registry import build_policy
from workers.scaling.scalers import ScalingSignals, build_scaler
from workers.scaling.simulate import VirtualCloud
from workers.scaling.traces import SpotTrace
from workers.scaling.workload_forecast import ForecasterConfig, WorkloadModel, fit

LOOKAHEAD = 100  # L iterations (PreServe: 100)
KV_TOKENS = 10_000  # a replica's KV capacity in the fluid model's units


@dataclass(frozen=True)
class DemandConfig:
    window_s: float = 600.0
    step_s: float = 30.0
    peak_rps: float = 16.0
    replica_rps: float = 2.0
    target_utilization: float = 0.7
    base_ttft_s: float = 0.4
    slo_ttft_s: float = 2.0
    mean_prompt_tokens: float = 1000.0
    cold_start_s: float = 183.0
    n_extra: int = 1
    min_replicas: int = 1
    max_replicas: int = 32
    upscale_delay_s: float = 300.0
    downscale_delay_s: float = 1200.0

    def __post_init__(self) -> None:
        if min(self.window_s, self.step_s, self.peak_rps, self.replica_rps) <= 0:
            raise ValueError("window, step, peak and replica rates must be positive")
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must lie in (0, 1]")

    def autoscaler(self) -> AutoscalerConfig:
        return AutoscalerConfig(
            target_qps_per_replica=self.replica_rps * self.target_utilization,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            upscale_delay_s=self.upscale_delay_s,
            downscale_delay_s=self.downscale_delay_s,
        )

    def scaler(self) -> InstanceScalerConfig:
        return InstanceScalerConfig(
            window_s=self.window_s,
            kv_capacity_tokens=KV_TOKENS,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
        )


@dataclass(frozen=True)
class DemandResult:
    scaler: str
    placement: str
    requests: float
    slo_attainment: float
    p99_ttft_s: float
    p99_normalized_ms_per_token: float
    cost: float
    replica_hours: float
    spot_share: float  # of replica-hours
    peak_replicas: int


def scale_day(
    history: Sequence[float], day: Sequence[float], peak_rps: float, window_s: float
) -> tuple[list[float], list[float]]:
    """Both in requests/s, scaled so the simulated day's peak window is ``peak_rps``."""
    peak = max(day)
    if peak <= 0:
        raise ValueError("the simulated day has no traffic")
    factor = peak_rps / (peak / window_s)
    return [v * factor / window_s for v in history], [v * factor / window_s for v in day]


class _Forecast:
    """The workload model as the ``preserve`` policy sees it, window by window."""

    def __init__(self, history: Sequence[float], config: DemandConfig) -> None:
        day = round(86400 / config.window_s)
        self.model: WorkloadModel = fit(
            [v * config.window_s for v in history], 0, ForecasterConfig(periods=(day, 7 * day))
        )
        self.config = config

    def replicas(self) -> int:
        c = self.config
        per_replica = c.replica_rps * c.target_utilization * c.window_s
        return max(math.ceil(v / per_replica - 1e-9) for v in self.model.forecast(2))

    def finished(self, rps: float) -> None:
        self.model = self.model.observe(rps * self.config.window_s)


def simulate_demand(
    trace: SpotTrace,
    zones: list[ZoneOffer],
    history: Sequence[float],
    day: Sequence[float],
    scaler_name: str,
    config: DemandConfig,
    placement: str = "spothedge",
) -> DemandResult:
    """``history`` and ``day``: requests/s per window (``scale_day``); the trace must
    cover the day (``trace.duration_s``), else its last sample holds."""
    scaler = build_scaler(scaler_name, config.autoscaler(), config.scaler())
    policy = build_policy(placement, zones, n_extra=config.n_extra)
    cloud = VirtualCloud(trace, {z.name: z for z in zones}, config.cold_start_s)
    forecast = _Forecast(history, config) if scaler_name == "preserve" else None
    stored: dict[str, object] = {}
    n_target, backlog, peak = config.min_replicas, 0.0, 0
    samples: list[tuple[float, float]] = []  # (arrivals, ttft) per step
    end, t, window = len(day) * config.window_s, 0.0, -1
    while t < end:
        w = int(t // config.window_s)
        if forecast is not None and w != window and w > 0:
            forecast.finished(day[w - 1])
        window = w
        rate = day[w]
        cloud.now = t
        for zone in cloud.preempt():
            policy.spot_preempted(zone)
        for instance in cloud.newly_ready():
            if instance.kind == SPOT:
                policy.spot_ready(instance.zone)
        ready = cloud.fleet().ready()
        capacity = ready * config.replica_rps
        rho = min(1.0, (rate + backlog / config.step_s) / capacity) if capacity else 1.0
        # A look-ahead map holds the requests a replica runs, not the queue: the
        # arrivals' share of the fleet, a full replica a full cache.
        usage = min(1.0, rate / capacity) if capacity else 1.0
        signals = ScalingSignals(
            qps=rate,
            forecast_n=forecast.replicas() if forecast is not None else None,
            lookaheads=[[round(usage * KV_TOKENS)] * LOOKAHEAD] * ready,
        )
        n_target, stored = scaler.step(stored, config.min_replicas, t, signals)
        peak = max(peak, n_target)
        reconcile(policy, n_target, cloud.fleet(), cloud, now=t)
        wait = backlog / capacity if capacity else config.step_s
        ttft = wait + config.base_ttft_s / (1 - min(rho, 0.99))
        samples.append((rate * config.step_s, ttft))
        backlog = max(0.0, backlog + (rate - capacity) * config.step_s)
        t += config.step_s
    cloud.now = end
    return _result(scaler_name, placement, cloud, samples, peak, config)


def _result(
    scaler: str,
    placement: str,
    cloud: VirtualCloud,
    samples: list[tuple[float, float]],
    peak: int,
    config: DemandConfig,
) -> DemandResult:
    total = sum(n for n, _ in samples)
    ordered = sorted(samples, key=lambda s: s[1])
    seen, p99 = 0.0, ordered[-1][1]
    for n, ttft in ordered:
        seen += n
        if seen >= 0.99 * total:
            p99 = ttft
            break
    met = sum(n for n, ttft in samples if ttft <= config.slo_ttft_s)
    hours = spot_hours = cost = 0.0
    for i in cloud.instances.values():
        h = ((i.ended_at if i.ended_at is not None else cloud.now) - i.launched_at) / 3600
        offer = cloud.prices[i.zone]
        hours += h
        spot_hours += h if i.kind == SPOT else 0.0
        cost += h * (offer.spot_price if i.kind == SPOT else offer.on_demand_price)
    return DemandResult(
        scaler=scaler,
        placement=placement,
        requests=total,
        slo_attainment=met / total if total else 1.0,
        p99_ttft_s=p99,
        p99_normalized_ms_per_token=1000 * p99 / config.mean_prompt_tokens,
        cost=cost,
        replica_hours=hours,
        spot_share=spot_hours / hours if hours else 0.0,
        peak_replicas=peak,
    )
