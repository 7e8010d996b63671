"""What one simulation run is: regions, replicas, clients, policy, timing knobs.

Every knob that production reads from a setting has the production default
here (``MERIDIAN_PROBE_INTERVAL_S`` 0.25 s, ``MERIDIAN_AVAILABILITY_INTERVAL_S``
0.3 s, ``MERIDIAN_AVAILABILITY_TTL_S`` 2 s, ``MERIDIAN_PROBE_STALE_S`` 2 s,
``MERIDIAN_PROBE_MIN_GAP_S`` 0.02 s, ``MERIDIAN_PEER_QUEUE_BUFFER`` τ = 1,
``MERIDIAN_REPLICA_MAX_OUTSTANDING`` 32, ``MERIDIAN_MAX_ATTEMPTS`` 3,
``MERIDIAN_RETRY_AFTER_S`` 1, ``MERIDIAN_KV_EVENTS_BATCH_S`` 0.1 s), and the
engine is ``sim.serve``'s default replica.  Inter-region RTTs default to the
demo's (us↔eu 80 ms, us↔ap 150 ms, eu↔ap 200 ms).

Deployments (SkyLB §5.1):

* ``regional``: one balancer per region owning that region's replicas, peers
  forward to each other (Algorithm 1's two layers): SkyLB, SkyLB-CH and
  Meridian's cost model;
* ``local``: one balancer per region, no forwarding (Figure 10's region-local);
* ``single``: one balancer in ``single_region`` owning every replica; clients
  elsewhere pay the RTT to it, and it pays the RTT to remote replicas: the
  paper's RR/LL/CH/SGL baselines ("a single load balancer in the US").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.predictors import SIM_PREDICTORS
from sim.engine import EngineConfig

MODEL = "meridian-demo"

# Short names the command accepts, as SkyLB's figures label them.
POLICY_ALIASES = {
    "rr": "round_robin",
    "ll": "least_load",
    "p2c": "power_of_two",
    "ch": "consistent_hash",
}
# Policies SkyLB deploys per region; the rest are single-balancer baselines (§5.1).
REGIONAL_POLICIES = frozenset({"skylb", "skylb_ch", "meridian"})
# Policies that price queued work and admit by it (``tokens`` pushing).
TOKEN_POLICIES = frozenset({"meridian"})
DEPLOYMENTS = ("auto", "regional", "local", "single")

DEMO_RTT_MS = {
    frozenset({"us-east", "eu-west"}): 80.0,
    frozenset({"us-east", "ap-southeast"}): 150.0,
    frozenset({"eu-west", "ap-southeast"}): 200.0,
}


class SimConfigError(ValueError):
    """A simulation option that cannot be used, with a message naming it."""


def canonical_policy(name: str) -> str:
    return POLICY_ALIASES.get(name.strip(), name.strip())


def parse_counts(text: str, what: str) -> dict[str, int]:
    """``us-east=4,eu-west=3`` → ``{"us-east": 4, "eu-west": 3}`` (order kept)."""
    counts: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        if not sep or not name.strip() or not raw.strip().isdigit():
            raise SimConfigError(f"--{what}: expected REGION=N[,REGION=N...], got {item!r}")
        counts[name.strip()] = int(raw)
    if not counts:
        raise SimConfigError(f"--{what}: name at least one region")
    return counts


def parse_rtts(text: str) -> dict[frozenset[str], float]:
    """``us-east:eu-west=80,us-east:ap-southeast=150`` → symmetric RTTs in ms."""
    rtts: dict[frozenset[str], float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        pair, sep, raw = item.partition("=")
        a, colon, b = pair.partition(":")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not sep or not colon or value < 0:
            raise SimConfigError(f"--rtt: expected A:B=MS[,...], got {item!r}")
        rtts[frozenset({a.strip(), b.strip()})] = value
    return rtts


@dataclass(frozen=True)
class TimingConfig:
    """Production's balancer timing (see the module docstring for the settings)."""

    probe_interval_s: float = 0.25
    probe_stale_s: float = 2.0
    probe_min_gap_s: float = 0.02
    availability_interval_s: float = 0.3
    availability_ttl_s: float = 2.0
    peer_queue_buffer: int = 1
    max_outstanding: int = 32
    max_attempts: int = 3
    retry_after_s: int = 1
    retry_backoff_s: float = 0.025
    retry_backoff_max_s: float = 0.5
    breaker_hold_down_s: float = 1.0
    breaker_max_hold_down_s: float = 30.0
    breaker_readmit_probes: int = 2
    queue_max_len: int = 1024
    queue_max_wait_s: float = 30.0
    # A /metrics probe's own round trip inside a region (loopback-ish).
    probe_rtt_s: float = 0.002
    # One-way latency between a client or replica and a balancer in the same region.
    local_one_way_s: float = 0.0005
    # MERIDIAN_KV_EVENTS_BATCH_S: queued KV events reach the cache map on this tick.
    kv_events_batch_s: float = 0.1


# The time to first token goodput counts as served in time (``--ttft-slo``), a chat
# user's patience for the first token (docs/simulator.md explains the choice); a
# policy that prices missing it is held to the same one.
DEFAULT_TTFT_SLO_S = 2.0


@dataclass(frozen=True)
class SimConfig:
    """One run: ``replicas`` and ``clients`` are per region, in region order."""

    workload: str
    policy: str
    replicas: Mapping[str, int]
    clients: Mapping[str, int] = field(default_factory=dict)
    rate: Mapping[str, float] = field(default_factory=dict)
    deployment: str = "auto"
    pushing: str = "auto"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    single_region: str = ""
    rtt_ms: Mapping[frozenset[str], float] = field(default_factory=lambda: dict(DEMO_RTT_MS))
    default_rtt_ms: float = 150.0
    seed: int = 0
    duration_s: float | None = None
    max_requests: int | None = None
    drain_s: float = 600.0
    # Balancers run (probe, poll peers) this long before clients send: production
    # balancers are up long before traffic, and a cold one refuses what it cannot
    # place yet.  Durations and budgets count from the end of the warm-up.
    warmup_s: float = 1.0
    time_scale: float = 1.0
    speed: float = 1.0
    # Closed loop: clients start evenly over this many seconds (0: all at once).
    ramp_s: float = 0.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    sample_interval_s: float = 1.0
    # The balancers' response-length predictor (core.predictors): none, oracle
    # (the engine's true length), session-mean or learned.  "none" by default: the
    # learned one costs wall time on long runs and no stock policy reads it.
    length_predictor: str = "none"
    # The TTFT SLO goodput counts (``--ttft-slo``), given to a policy that prices
    # missing it (``slo_defaults`` in ``sim.des.world``).
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S

    def __post_init__(self) -> None:
        if self.length_predictor not in SIM_PREDICTORS:
            choices = ", ".join(SIM_PREDICTORS)
            raise SimConfigError(f"--length-predictor must be one of {choices}")
        if self.deployment not in DEPLOYMENTS:
            raise SimConfigError(f"--deployment must be one of {', '.join(DEPLOYMENTS)}")
        if not self.replicas or any(n < 0 for n in self.replicas.values()):
            raise SimConfigError("--replicas: give each region a count of at least 0")
        if sum(self.replicas.values()) < 1:
            raise SimConfigError("--replicas: at least one replica in all")
        unknown = set(self.clients) | set(self.rate)
        unknown -= set(self.replicas)
        if unknown:
            raise SimConfigError(f"clients in regions without a balancer: {sorted(unknown)}")
        if self.clients and self.rate:
            raise SimConfigError("give either --clients (closed loop) or --rate (open loop)")
        if self.duration_s is None and self.max_requests is None:
            raise SimConfigError("give --duration or --requests so the run ends")
        if self.time_scale <= 0 or self.speed <= 0:
            raise SimConfigError("--time-scale and --speed must be positive")
        if not self.ttft_slo_s > 0:
            raise SimConfigError("--ttft-slo must be positive")
        if not self.ramp_s >= 0:
            raise SimConfigError("--ramp must be at least 0 s")
        if self.ramp_s and not self.clients:
            raise SimConfigError("--ramp spreads closed-loop clients' starts: give --clients")
        if self.single_region and self.single_region not in self.replicas:
            raise SimConfigError(f"--single-region {self.single_region!r} has no replicas entry")

    @property
    def regions(self) -> list[str]:
        return list(self.replicas)

    @property
    def effective_deployment(self) -> str:
        if self.deployment != "auto":
            return self.deployment
        return "regional" if self.policy in REGIONAL_POLICIES else "single"

    @property
    def effective_pushing(self) -> str:
        """SkyLB pushes selectively (SP-P); the paper's baselines push blindly (§5.1);
        Meridian's cost model admits by queued prefill tokens."""
        if self.pushing != "auto":
            return self.pushing
        if self.policy in TOKEN_POLICIES:
            return "tokens"
        return "sp-p" if self.policy in REGIONAL_POLICIES else "blind"

    @property
    def home_region(self) -> str:
        return self.single_region or self.regions[0]

    def rtt_s(self, a: str, b: str) -> float:
        """Round trip between two regions, in seconds (0 inside a region)."""
        if a == b:
            return 2 * self.timing.local_one_way_s
        ms = self.rtt_ms.get(frozenset({a, b}), self.default_rtt_ms)
        return ms / 1000.0

    def one_way_s(self, a: str, b: str) -> float:
        return self.rtt_s(a, b) / 2

    def rtt_ms_between(self, a: str, b: str) -> float:
        value = self.rtt_s(a, b) * 1000.0
        return value if math.isfinite(value) else math.inf
