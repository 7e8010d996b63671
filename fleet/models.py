"""Meridian's topology, configuration and history.

The request path never touches these tables: balancers read a snapshot of them
in the background (``routing.topology``) and route from memory.
"""

from __future__ import annotations

import hashlib
import secrets

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from core.key_limits import (
    BUDGET_PERIODS,
    DEFAULT_BUDGET_PERIOD,
    NO_LIMITS,
    KeyLimits,
    parse_models,
)


class Region(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=128, blank=True)

    class Meta:
        db_table = "console_region"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RegionLatency(models.Model):
    """Round-trip time between two regions; emulated on forwarding in demo mode and
    used to find the nearest live balancer."""

    source = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="latencies_out")
    target = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="latencies_in")
    rtt_ms = models.FloatField()

    class Meta:
        db_table = "console_regionlatency"
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="unique_region_pair")
        ]
        verbose_name_plural = "region latencies"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}: {self.rtt_ms:g} ms"


class Zone(models.Model):
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="zones")
    name = models.SlugField(max_length=64, unique=True)

    class Meta:
        db_table = "console_zone"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Balancer(models.Model):
    class State(models.TextChoices):
        UP = "up"
        DOWN = "down"

    class Health(models.TextChoices):
        UNKNOWN = "unknown"
        HEALTHY = "healthy"
        UNHEALTHY = "unhealthy"

    name = models.SlugField(max_length=64, unique=True)
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="balancers")
    url = models.URLField(help_text="Base URL peers and clients use, e.g. http://127.0.0.1:8101")
    # ``state`` comes from heartbeats in Redis (workers.balancers) and drives failover;
    # ``health`` from the control plane's own GET /health probe (workers.balancer_probes),
    # so a balancer that still beats but answers 503 is visible too.
    state = models.CharField(max_length=8, choices=State.choices, default=State.UP)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    health = models.CharField(max_length=12, choices=Health.choices, default=Health.UNKNOWN)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "console_balancer"
        ordering = ["region__name", "name"]

    def __str__(self) -> str:
        return self.name


class Replica(models.Model):
    class Kind(models.TextChoices):
        RESERVED = "reserved"
        ON_DEMAND = "on-demand"
        SPOT = "spot"

    class State(models.TextChoices):
        PROVISIONING = "provisioning"
        STARTING = "starting"
        READY = "ready"
        DRAINING = "draining"
        TERMINATED = "terminated"
        PREEMPTED = "preempted"
        FAILED = "failed"

    class Handover(models.TextChoices):
        NONE = "", "none"
        AUTO = "auto", "failover controller"
        PLANNED = "planned", "operator"

    # Replicas in these states may receive new requests.
    ROUTABLE_STATES = frozenset({State.READY})

    name = models.SlugField(max_length=96, unique=True)
    url = models.URLField(help_text="Base URL of the OpenAI-compatible server")
    model_name = models.CharField(max_length=128)
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="replicas")
    zone = models.ForeignKey(Zone, on_delete=models.CASCADE, related_name="replicas")
    balancer = models.ForeignKey(
        Balancer,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="replicas",
        help_text="The balancer that routes to this replica (its region's, or a failover owner)",
    )
    # Why ``balancer`` points elsewhere than home, and where home is (NULL: its region's
    # balancers), so failback restores exactly what failover replaced (SkyLB §4.2).
    handover = models.CharField(
        max_length=8, choices=Handover.choices, default=Handover.NONE, blank=True
    )
    home_balancer = models.ForeignKey(
        Balancer,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The owner before a handover (empty: the balancers of its region)",
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.RESERVED)
    hourly_price = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROVISIONING)
    state_changed_at = models.DateTimeField(default=timezone.now)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # Billing: clouds bill from launch, cold start included (SkyServe §2.3), until the
    # instance is gone.  Empty ``launched_at`` (operator-registered rows) bills from
    # ``created_at``.
    launched_at = models.DateTimeField(null=True, blank=True)
    terminated_at = models.DateTimeField(null=True, blank=True)
    provider = models.CharField(
        max_length=32, blank=True, help_text="Who launched it (empty: registered by an operator)"
    )
    provider_handle = models.CharField(max_length=128, blank=True)

    class Meta:
        db_table = "console_replica"
        ordering = ["region__name", "name"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.name


class ServiceConfig(models.Model):
    """One served model: its routing policy and autoscaling knobs."""

    model_name = models.CharField(max_length=128, unique=True)
    policy = models.CharField(max_length=64, default="meridian")
    policy_params = models.JSONField(default=dict, blank=True)

    class ReadinessProbe(models.TextChoices):
        HEALTH = "health", "GET /health"
        COMPLETION = "completion", "POST /v1/completions, max_tokens=1"

    # SkyServe's readiness probe may be a real request: a replica whose /health says 200
    # but whose engine cannot generate is not ready.
    readiness_probe = models.CharField(
        max_length=16, choices=ReadinessProbe.choices, default=ReadinessProbe.HEALTH
    )
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=16)
    target_qps_per_replica = models.FloatField(default=2.0)
    upscale_delay_s = models.PositiveIntegerField(default=300)
    downscale_delay_s = models.PositiveIntegerField(default=1200)
    queue_max_len = models.PositiveIntegerField(default=1024)
    queue_max_wait_s = models.FloatField(default=30.0)

    class ScalingPolicy(models.TextChoices):
        NONE = "none", "none: operator-registered replicas only"
        SPOTHEDGE = "spothedge", "SpotHedge (placement, over-provisioning, fallback)"
        EVEN_SPREAD = "even_spread", "even spread"
        ROUND_ROBIN = "round_robin", "round robin across zones"
        STATIC_MIX = "static_mix", "static spot/on-demand mix"
        ON_DEMAND = "on_demand", "on-demand only"

    scaling_policy = models.CharField(
        max_length=16, choices=ScalingPolicy.choices, default=ScalingPolicy.NONE
    )
    # SkyServe §3.2's N_extra: spot replicas over N_tar as a preemption buffer.
    spot_extra = models.PositiveIntegerField(default=1)
    static_on_demand = models.PositiveIntegerField(
        default=1, help_text="On-demand base of the static_mix policy"
    )
    qps_window_s = models.PositiveIntegerField(default=60)
    reserved_hourly_price = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        default=0,
        help_text="Per replica; prices the region-local vs global peak comparison",
    )

    # How many replicas (the placement policy above says where): SkyServe's request-rate
    # autoscaler, or PreServe's instance scaler over the workload forecast and the
    # replicas' KV look-ahead (docs/scaling.md).  Preserve needs the profiled capacity.
    class Scaler(models.TextChoices):
        REQUEST_RATE = "request-rate", "request rate (reactive, QPS)"
        PRESERVE = "preserve", "PreServe (forecast + KV look-ahead, never below request rate)"

    scaler = models.CharField(max_length=16, choices=Scaler.choices, default=Scaler.REQUEST_RATE)
    replica_prompt_tokens_per_s = models.FloatField(
        null=True, blank=True, help_text="Profiled: prompt tokens/s one replica serves in SLO"
    )
    replica_decode_tokens_per_s = models.FloatField(
        null=True, blank=True, help_text="Profiled: decode tokens/s one replica serves in SLO"
    )
    replica_total_tokens_per_s = models.FloatField(
        null=True, blank=True, help_text="Profiled: prompt + decode tokens/s of one replica"
    )
    # The autoscaler's N_tar and the policy's zone lists between beats (an operator can
    # read why the fleet looks the way it does).
    target_replicas = models.PositiveIntegerField(null=True, blank=True)
    scaling_state = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "console_serviceconfig"

    def __str__(self) -> str:
        return self.model_name

    def save_recording_changes(self, before: dict[str, object], actor: str) -> None:
        """Save, and record a ``service_settings_changed`` Event naming every field that
        differs from ``before`` (field -> value as it was), so the service page's history
        says who changed what, from the console or a command alike."""
        self.save()
        changed = {
            name: [was, getattr(self, name)]
            for name, was in before.items()
            if getattr(self, name) != was
        }
        if changed:
            Event.record(
                "service_settings_changed",
                f"{self}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
                subject=self.model_name,
                changed=changed,
                actor=actor,
            )


def hash_api_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKey(models.Model):
    """A client API key; only its SHA-256 is stored, the raw key is shown once."""

    PREFIX = "mk-"

    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise a key")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    revoked = models.BooleanField(default=False)
    # Limits (core.key_limits), held across every balancer through Redis; empty: none.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests of this key in flight at once"
    )
    token_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Tokens (prompt + completion) per budget period"
    )
    budget_period = models.CharField(
        max_length=8,
        choices=[(p, p) for p in BUDGET_PERIODS],
        default=DEFAULT_BUDGET_PERIOD,
        help_text="Fixed UTC periods; a month is 30 days",
    )
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="Model names this key may use; empty: all"
    )
    # Usage since the key was issued, rolled up from Redis (workers.key_usage).
    usage_requests = models.BigIntegerField(default=0)
    usage_prompt_tokens = models.BigIntegerField(default=0)
    usage_cached_tokens = models.BigIntegerField(default=0)
    usage_completion_tokens = models.BigIntegerField(default=0)
    usage_updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "console_apikey"
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str, limits: KeyLimits = NO_LIMITS) -> tuple[ApiKey, str]:
        """Create a key and return it with the raw secret (not stored anywhere)."""
        raw = cls.PREFIX + secrets.token_urlsafe(32)
        key = cls(name=name, prefix=raw[:10], key_hash=hash_api_key(raw))
        key.set_limits(limits)
        key.save()
        return key, raw

    def set_limits(self, limits: KeyLimits) -> None:
        self.requests_per_minute = limits.requests_per_minute
        self.tokens_per_minute = limits.tokens_per_minute
        self.max_concurrent = limits.max_concurrent
        self.token_budget = limits.token_budget
        self.budget_period = limits.budget_period
        self.allowed_models = sorted(limits.allowed_models)

    def limits(self) -> KeyLimits:
        """The limits as the balancer enforces them; bad stored values raise ValueError."""
        if not isinstance(self.allowed_models, list):
            raise ValueError(
                f"allowed_models must be a list of model names; got {self.allowed_models!r}"
            )
        return KeyLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            max_concurrent=self.max_concurrent,
            token_budget=self.token_budget,
            budget_period=self.budget_period,
            allowed_models=parse_models(self.allowed_models),
        )

    def clean(self) -> None:
        super().clean()
        try:
            self.limits()
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        if self.allowed_models != sorted(set(self.allowed_models)):
            self.allowed_models = sorted(parse_models(self.allowed_models))


class Event(models.Model):
    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=64, db_index=True)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    subject = models.CharField(max_length=128, blank=True, help_text="What it happened to")
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "console_event"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.kind} {self.subject}"

    @classmethod
    def record(
        cls, kind: str, message: str, *, subject: str = "", severity: str = "info", **data: object
    ) -> Event:
        return cls.objects.create(
            kind=kind, message=message, subject=subject, severity=severity, data=data
        )


class MetricRollup(models.Model):
    """One interval's traffic for a region or a replica, from the balancers' counters.

    Counters are deltas between two scrapes of each balancer's ``/metrics`` (the
    interval is ``interval_start`` to ``interval_end``); gauges (in-flight, queue,
    waiting) are the values at the end of it.  Written by ``workers.rollups`` every
    ``MERIDIAN_ROLLUP_PERIOD_S`` and pruned after ``MERIDIAN_ROLLUP_RETENTION_S``.
    """

    class Scope(models.TextChoices):
        REGION = "region"
        REPLICA = "replica"

    scope = models.CharField(max_length=8, choices=Scope.choices)
    name = models.CharField(max_length=96, help_text="Region or replica name")
    interval_start = models.DateTimeField()
    interval_end = models.DateTimeField(db_index=True)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    cached_token_ratio = models.FloatField(default=0.0)
    throughput_tokens_s = models.FloatField(
        default=0.0, help_text="Completion tokens per second over the interval"
    )
    waiting = models.PositiveIntegerField(null=True, blank=True, help_text="Replica queue")
    inflight = models.PositiveIntegerField(default=0)
    queue_length = models.PositiveIntegerField(default=0)
    ttft_p50_s = models.FloatField(null=True, blank=True)
    ttft_p90_s = models.FloatField(null=True, blank=True)
    forwarded_in = models.PositiveIntegerField(default=0)
    forwarded_out = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "console_metricrollup"
        ordering = ["-interval_end", "scope", "name"]
        indexes = [models.Index(fields=["scope", "name", "interval_end"])]

    def __str__(self) -> str:
        return f"{self.scope} {self.name} @ {self.interval_end:%H:%M:%S}"


class DrillRun(models.Model):
    """One failure drill: what was broken, when routing reacted, what clients saw.

    Request counts are split at the reaction point by when each request was *sent*:
    a request sent after routing reacted must not fail (the drill's pass criterion).
    """

    class Kind(models.TextChoices):
        PREEMPT = "preempt"
        KILL_BALANCER = "kill-balancer"
        SLOW_REPLICA = "slow-replica"
        PARTITION = "partition"
        REDIS_OUTAGE = "redis-outage"

    class Outcome(models.TextChoices):
        RUNNING = "running"
        PASSED = "passed", "passed: routing reacted, nothing failed after it"
        FAILED_AFTER_REACTION = "failed-after-reaction"
        NO_REACTION = "no-reaction", "routing did not react within the bound"
        NOT_CONVERGED = "not-converged", "state did not converge after the fault cleared"
        ABORTED = "aborted"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=256, help_text="What the drill broke")
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    reaction_s = models.FloatField(null=True, blank=True)
    bound_s = models.FloatField(help_text="Configured time routing had to react")
    succeeded_before = models.PositiveIntegerField(default=0)
    retried_before = models.PositiveIntegerField(default=0)
    failed_before = models.PositiveIntegerField(default=0)
    succeeded_after = models.PositiveIntegerField(default=0)
    retried_after = models.PositiveIntegerField(default=0)
    failed_after = models.PositiveIntegerField(default=0)
    timeline = models.JSONField(default=list, blank=True)
    outcome = models.CharField(max_length=24, choices=Outcome.choices, default=Outcome.RUNNING)

    class Meta:
        db_table = "console_drillrun"
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.target} ({self.outcome})"


class TopologyChange(models.Model):
    """One row whose ``token`` is drawn again whenever something a balancer's topology
    snapshot reads changes (``fleet.topology_change``), so an idle balancer's refresh
    reads this row instead of every table."""

    token = models.BigIntegerField(default=0)

    class Meta:
        db_table = "fleet_topologychange"

    def __str__(self) -> str:
        return f"topology token {self.token}"
