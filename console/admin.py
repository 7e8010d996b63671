"""Django admin for everything Meridian stores, with the columns an operator scans for."""

from __future__ import annotations

from django.contrib import admin

from console.models import (
    ApiKey,
    Balancer,
    Event,
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
    list_display = ["name", "region", "url", "state", "last_heartbeat"]
    list_filter = ["state", "region"]
    search_fields = ["name", "url"]


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
        "model_name",
        "consecutive_failures",
        "last_probe_at",
    ]
    list_filter = ["state", "kind", "region", "zone", "model_name"]
    search_fields = ["name", "url"]
    list_select_related = ["region", "zone", "balancer"]
    readonly_fields = ["state_changed_at", "last_probe_at", "consecutive_failures", "created_at"]


@admin.register(ServiceConfig)
class ServiceConfigAdmin(admin.ModelAdmin):
    list_display = [
        "model_name",
        "policy",
        "min_replicas",
        "max_replicas",
        "target_qps_per_replica",
        "queue_max_len",
        "queue_max_wait_s",
        "updated_at",
    ]
    search_fields = ["model_name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "created_at", "revoked"]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]
    # The hash is useless to a person and must not be edited by hand.
    exclude = ["key_hash"]
    readonly_fields = ["prefix", "created_at"]

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
