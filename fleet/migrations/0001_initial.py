"""The fleet's models, moved from the console app with their tables unchanged."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    # The tables were created by the console app's migrations 0001-0004, when the models
    # lived there; they keep their names (``db_table``), so moving the models is a change
    # of Django's state only and an existing database keeps every row.
    dependencies = [
        ("console", "0004_drill_kinds"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="ApiKey",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=128)),
                        (
                            "prefix",
                            models.CharField(
                                help_text="First characters, to recognise a key", max_length=16
                            ),
                        ),
                        ("key_hash", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("revoked", models.BooleanField(default=False)),
                    ],
                    options={
                        "verbose_name": "API key",
                        "db_table": "console_apikey",
                    },
                ),
                migrations.CreateModel(
                    name="DrillRun",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("preempt", "Preempt"),
                                    ("kill-balancer", "Kill Balancer"),
                                    ("slow-replica", "Slow Replica"),
                                    ("partition", "Partition"),
                                    ("redis-outage", "Redis Outage"),
                                ],
                                max_length=16,
                            ),
                        ),
                        (
                            "target",
                            models.CharField(help_text="What the drill broke", max_length=256),
                        ),
                        (
                            "started_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("ended_at", models.DateTimeField(blank=True, null=True)),
                        ("reaction_s", models.FloatField(blank=True, null=True)),
                        (
                            "bound_s",
                            models.FloatField(help_text="Configured time routing had to react"),
                        ),
                        ("succeeded_before", models.PositiveIntegerField(default=0)),
                        ("retried_before", models.PositiveIntegerField(default=0)),
                        ("failed_before", models.PositiveIntegerField(default=0)),
                        ("succeeded_after", models.PositiveIntegerField(default=0)),
                        ("retried_after", models.PositiveIntegerField(default=0)),
                        ("failed_after", models.PositiveIntegerField(default=0)),
                        ("timeline", models.JSONField(blank=True, default=list)),
                        (
                            "outcome",
                            models.CharField(
                                choices=[
                                    ("running", "Running"),
                                    ("passed", "passed: routing reacted, nothing failed after it"),
                                    ("failed-after-reaction", "Failed After Reaction"),
                                    ("no-reaction", "routing did not react within the bound"),
                                    (
                                        "not-converged",
                                        "state did not converge after the fault cleared",
                                    ),
                                    ("aborted", "Aborted"),
                                ],
                                default="running",
                                max_length=24,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_drillrun",
                        "ordering": ["-started_at"],
                    },
                ),
                migrations.CreateModel(
                    name="Event",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("kind", models.CharField(db_index=True, max_length=64)),
                        (
                            "severity",
                            models.CharField(
                                choices=[
                                    ("info", "Info"),
                                    ("warning", "Warning"),
                                    ("error", "Error"),
                                ],
                                default="info",
                                max_length=8,
                            ),
                        ),
                        (
                            "subject",
                            models.CharField(
                                blank=True, help_text="What it happened to", max_length=128
                            ),
                        ),
                        ("message", models.TextField()),
                        ("data", models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        "db_table": "console_event",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="Region",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.SlugField(max_length=64, unique=True)),
                        ("display_name", models.CharField(blank=True, max_length=128)),
                    ],
                    options={
                        "db_table": "console_region",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="ServiceConfig",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("model_name", models.CharField(max_length=128, unique=True)),
                        ("policy", models.CharField(default="least_load", max_length=64)),
                        ("policy_params", models.JSONField(blank=True, default=dict)),
                        (
                            "readiness_probe",
                            models.CharField(
                                choices=[
                                    ("health", "GET /health"),
                                    ("completion", "POST /v1/completions, max_tokens=1"),
                                ],
                                default="health",
                                max_length=16,
                            ),
                        ),
                        ("min_replicas", models.PositiveIntegerField(default=1)),
                        ("max_replicas", models.PositiveIntegerField(default=16)),
                        ("target_qps_per_replica", models.FloatField(default=2.0)),
                        ("upscale_delay_s", models.PositiveIntegerField(default=300)),
                        ("downscale_delay_s", models.PositiveIntegerField(default=1200)),
                        ("queue_max_len", models.PositiveIntegerField(default=1024)),
                        ("queue_max_wait_s", models.FloatField(default=30.0)),
                        (
                            "scaling_policy",
                            models.CharField(
                                choices=[
                                    ("none", "none: operator-registered replicas only"),
                                    (
                                        "spothedge",
                                        "SpotHedge (placement, over-provisioning, fallback)",
                                    ),
                                    ("even_spread", "even spread"),
                                    ("round_robin", "round robin across zones"),
                                    ("static_mix", "static spot/on-demand mix"),
                                    ("on_demand", "on-demand only"),
                                ],
                                default="none",
                                max_length=16,
                            ),
                        ),
                        ("spot_extra", models.PositiveIntegerField(default=1)),
                        (
                            "static_on_demand",
                            models.PositiveIntegerField(
                                default=1, help_text="On-demand base of the static_mix policy"
                            ),
                        ),
                        ("qps_window_s", models.PositiveIntegerField(default=60)),
                        (
                            "reserved_hourly_price",
                            models.DecimalField(
                                decimal_places=4,
                                default=0,
                                help_text="Per replica; prices the region-local vs global peak comparison",
                                max_digits=10,
                            ),
                        ),
                        ("target_replicas", models.PositiveIntegerField(blank=True, null=True)),
                        ("scaling_state", models.JSONField(blank=True, default=dict)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        "db_table": "console_serviceconfig",
                    },
                ),
                migrations.CreateModel(
                    name="MetricRollup",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "scope",
                            models.CharField(
                                choices=[("region", "Region"), ("replica", "Replica")], max_length=8
                            ),
                        ),
                        (
                            "name",
                            models.CharField(help_text="Region or replica name", max_length=96),
                        ),
                        ("interval_start", models.DateTimeField()),
                        ("interval_end", models.DateTimeField(db_index=True)),
                        ("requests", models.PositiveIntegerField(default=0)),
                        ("errors", models.PositiveIntegerField(default=0)),
                        ("prompt_tokens", models.PositiveBigIntegerField(default=0)),
                        ("completion_tokens", models.PositiveBigIntegerField(default=0)),
                        ("cached_tokens", models.PositiveBigIntegerField(default=0)),
                        ("cached_token_ratio", models.FloatField(default=0.0)),
                        (
                            "throughput_tokens_s",
                            models.FloatField(
                                default=0.0,
                                help_text="Completion tokens per second over the interval",
                            ),
                        ),
                        (
                            "waiting",
                            models.PositiveIntegerField(
                                blank=True, help_text="Replica queue", null=True
                            ),
                        ),
                        ("inflight", models.PositiveIntegerField(default=0)),
                        ("queue_length", models.PositiveIntegerField(default=0)),
                        ("ttft_p50_s", models.FloatField(blank=True, null=True)),
                        ("ttft_p90_s", models.FloatField(blank=True, null=True)),
                        ("forwarded_in", models.PositiveIntegerField(default=0)),
                        ("forwarded_out", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "db_table": "console_metricrollup",
                        "ordering": ["-interval_end", "scope", "name"],
                        "indexes": [
                            models.Index(
                                fields=["scope", "name", "interval_end"],
                                name="console_met_scope_8c021c_idx",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Balancer",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.SlugField(max_length=64, unique=True)),
                        (
                            "url",
                            models.URLField(
                                help_text="Base URL peers and clients use, e.g. http://127.0.0.1:8101"
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[("up", "Up"), ("down", "Down")], default="up", max_length=8
                            ),
                        ),
                        ("last_heartbeat", models.DateTimeField(blank=True, null=True)),
                        (
                            "health",
                            models.CharField(
                                choices=[
                                    ("unknown", "Unknown"),
                                    ("healthy", "Healthy"),
                                    ("unhealthy", "Unhealthy"),
                                ],
                                default="unknown",
                                max_length=12,
                            ),
                        ),
                        ("last_probe_at", models.DateTimeField(blank=True, null=True)),
                        ("consecutive_failures", models.PositiveIntegerField(default=0)),
                        (
                            "region",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="balancers",
                                to="fleet.region",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_balancer",
                        "ordering": ["region__name", "name"],
                    },
                ),
                migrations.CreateModel(
                    name="Zone",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.SlugField(max_length=64, unique=True)),
                        (
                            "region",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="zones",
                                to="fleet.region",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_zone",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="RegionLatency",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("rtt_ms", models.FloatField()),
                        (
                            "source",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="latencies_out",
                                to="fleet.region",
                            ),
                        ),
                        (
                            "target",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="latencies_in",
                                to="fleet.region",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name_plural": "region latencies",
                        "db_table": "console_regionlatency",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("source", "target"), name="unique_region_pair"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Replica",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.SlugField(max_length=96, unique=True)),
                        (
                            "url",
                            models.URLField(help_text="Base URL of the OpenAI-compatible server"),
                        ),
                        ("model_name", models.CharField(max_length=128)),
                        (
                            "handover",
                            models.CharField(
                                blank=True,
                                choices=[
                                    ("", "none"),
                                    ("auto", "failover controller"),
                                    ("planned", "operator"),
                                ],
                                default="",
                                max_length=8,
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("reserved", "Reserved"),
                                    ("on-demand", "On Demand"),
                                    ("spot", "Spot"),
                                ],
                                default="reserved",
                                max_length=16,
                            ),
                        ),
                        (
                            "hourly_price",
                            models.DecimalField(decimal_places=4, default=0, max_digits=10),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("provisioning", "Provisioning"),
                                    ("starting", "Starting"),
                                    ("ready", "Ready"),
                                    ("draining", "Draining"),
                                    ("terminated", "Terminated"),
                                    ("preempted", "Preempted"),
                                    ("failed", "Failed"),
                                ],
                                default="provisioning",
                                max_length=16,
                            ),
                        ),
                        (
                            "state_changed_at",
                            models.DateTimeField(default=django.utils.timezone.now),
                        ),
                        ("last_probe_at", models.DateTimeField(blank=True, null=True)),
                        ("consecutive_failures", models.PositiveIntegerField(default=0)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("launched_at", models.DateTimeField(blank=True, null=True)),
                        ("terminated_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "provider",
                            models.CharField(
                                blank=True,
                                help_text="Who launched it (empty: registered by an operator)",
                                max_length=32,
                            ),
                        ),
                        ("provider_handle", models.CharField(blank=True, max_length=128)),
                        (
                            "balancer",
                            models.ForeignKey(
                                blank=True,
                                help_text="The balancer that routes to this replica (its region's, or a failover owner)",
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="replicas",
                                to="fleet.balancer",
                            ),
                        ),
                        (
                            "home_balancer",
                            models.ForeignKey(
                                blank=True,
                                help_text="The owner before a handover (empty: the balancers of its region)",
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="fleet.balancer",
                            ),
                        ),
                        (
                            "region",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="replicas",
                                to="fleet.region",
                            ),
                        ),
                        (
                            "zone",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="replicas",
                                to="fleet.zone",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_replica",
                        "ordering": ["region__name", "name"],
                        "indexes": [
                            models.Index(fields=["state"], name="console_rep_state_237d98_idx")
                        ],
                    },
                ),
            ],
        ),
    ]
