"""Meridian's topology, configuration and history.

The request path never touches these tables: balancers read a snapshot of them
in the background (``routing.topology``) and route from memory.
"""

from __future__ import annotations

import hashlib
import secrets

from django.db import models
from django.utils import timezone


class Region(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=128, blank=True)

    class Meta:
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
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Balancer(models.Model):
    class State(models.TextChoices):
        UP = "up"
        DOWN = "down"

    name = models.SlugField(max_length=64, unique=True)
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="balancers")
    url = models.URLField(help_text="Base URL peers and clients use, e.g. http://127.0.0.1:8101")
    state = models.CharField(max_length=8, choices=State.choices, default=State.UP)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
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
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.RESERVED)
    hourly_price = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROVISIONING)
    state_changed_at = models.DateTimeField(default=timezone.now)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["region__name", "name"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.name


class ServiceConfig(models.Model):
    """One served model: its routing policy and autoscaling knobs."""

    model_name = models.CharField(max_length=128, unique=True)
    policy = models.CharField(max_length=64, default="least_load")
    policy_params = models.JSONField(default=dict, blank=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=16)
    target_qps_per_replica = models.FloatField(default=2.0)
    upscale_delay_s = models.PositiveIntegerField(default=300)
    downscale_delay_s = models.PositiveIntegerField(default=1200)
    queue_max_len = models.PositiveIntegerField(default=1024)
    queue_max_wait_s = models.FloatField(default=30.0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.model_name


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

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str) -> tuple[ApiKey, str]:
        """Create a key and return it with the raw secret (not stored anywhere)."""
        raw = cls.PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(name=name, prefix=raw[:10], key_hash=hash_api_key(raw))
        return key, raw


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
