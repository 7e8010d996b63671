"""Django admin for everything Meridian stores, with the columns an operator scans for."""

from __future__ import annotations

from django.contrib import admin

from fleet.models import (
    ApiKey,
    Balancer,
    DrillRun,
    Event,
    MetricRollup,
    Region,
    RegionLatency,
    Replica,
    ServiceConfig,
    Zone,
)


class ZoneInline(admin.TabularInline):
    model = Zone
    extra = 0


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["name", "display_name", "zone_count", "replica_count"]
    search_fields = ["name", "display_name"]
    inlines = [ZoneInline]

    @admin.display(description="zones")
    def zone_count(self, obj: Region) -> int:
        return obj.zones.count()

    @admin.display(description="replicas")
    def replica_count(self, obj: Region) -> int:
        return obj.replicas.count()


@admin.register(RegionLatency)
class RegionLatencyAdmin(admin.ModelAdmin):
    list_display = ["source", "target", "rtt_ms"]
    list_filter = ["source", "target"]


@admin.register(Zone)
class ZoneAdmin(admin.ModelAdmin):
    list_display = ["name", "region"]
    list_filter = ["region"]
    search_fields = ["name"]


@admin.register(Balancer)
class BalancerAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "url", "state", "last_heartbeat", "health", "last_probe_at"]
    list_filter = ["state", "health", "region"]
    search_fields = ["name", "url"]
    readonly_fields = ["last_heartbeat", "last_probe_at", "consecutive_failures"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "region",
        "zone",
        "kind",
        "state",
        "hourly_price",
        "balancer",
        "handover",
        "model_name",
        "consecutive_failures",
        "last_probe_at",
        "provider",
        "launched_at",
        "terminated_at",
    ]
    list_filter = ["state", "kind", "handover", "region", "zone", "model_name", "provider"]
    search_fields = ["name", "url", "provider_handle"]
    list_select_related = ["region", "zone", "balancer"]
    # Billing timestamps and the provider handle are written by the scaling controller.
    readonly_fields = [
        "state_changed_at",
        "last_probe_at",
        "consecutive_failures",
        "created_at",
        "provider",
        "provider_handle",
        "terminated_at",
    ]


@admin.register(ServiceConfig)
class ServiceConfigAdmin(admin.ModelAdmin):
    list_display = [
        "model_name",
        "policy",
        "readiness_probe",
        "min_replicas",
        "max_replicas",
        "target_qps_per_replica",
        "queue_max_len",
        "queue_max_wait_s",
        "scaling_policy",
        "spot_extra",
        "target_replicas",
        "updated_at",
    ]
    list_filter = ["scaling_policy"]
    search_fields = ["model_name"]
    # N_tar and the zone lists are the controller's state; an operator reads them.
    readonly_fields = ["target_replicas", "scaling_state"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "created_at",
        "revoked",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent",
        "token_budget",
        "usage_requests",
        "usage_prompt_tokens",
        "usage_cached_tokens",
        "usage_completion_tokens",
    ]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]
    # The hash is useless to a person and must not be edited by hand.
    exclude = ["key_hash"]
    # Usage is rolled up from Redis (workers.key_usage); limits are edited here and
    # validated by ApiKey.clean.
    readonly_fields = [
        "prefix",
        "created_at",
        "usage_requests",
        "usage_prompt_tokens",
        "usage_cached_tokens",
        "usage_completion_tokens",
        "usage_updated_at",
    ]

    def has_add_permission(self, request: object) -> bool:
        # Keys are issued with `manage.py issue_api_key`, which shows the secret once.
        return False


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "severity", "subject", "message"]
    list_filter = ["severity", "kind"]
    search_fields = ["subject", "message"]
    date_hierarchy = "created_at"
    readonly_fields = ["created_at", "kind", "severity", "subject", "message", "data"]


@admin.register(MetricRollup)
class MetricRollupAdmin(admin.ModelAdmin):
    list_display = [
        "interval_end",
        "scope",
        "name",
        "requests",
        "errors",
        "throughput_tokens_s",
        "cached_token_ratio",
        "ttft_p50_s",
        "ttft_p90_s",
        "inflight",
        "waiting",
        "forwarded_in",
        "forwarded_out",
    ]
    list_filter = ["scope", "name"]
    date_hierarchy = "interval_end"

    # History written by the rollup task; editing it would only make it wrong.
    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(DrillRun)
class DrillRunAdmin(admin.ModelAdmin):
    list_display = [
        "started_at",
        "kind",
        "target",
        "outcome",
        "reaction_s",
        "bound_s",
        "succeeded_before",
        "retried_before",
        "failed_before",
        "succeeded_after",
        "retried_after",
        "failed_after",
    ]
    list_filter = ["kind", "outcome"]
    search_fields = ["target"]
    date_hierarchy = "started_at"

    # Drills are run with their management commands, which record them.
    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
