"""The provider the settings name, over the zones in the database."""

from __future__ import annotations

import time

from django.conf import settings

from fleet.models import Replica, Zone
from workers.providers.base import CloudProvider, Instance
from workers.providers.emulated import ColdStartModel, EmulatedCloudProvider, SpotMarket
from workers.providers.skypilot import SkyBridge, SkyPilotError, SkyPilotProvider, bridge_argv
from workers.providers.skypilot_plan import SkyPilotConfig, parse_zones
from workers.providers.static import StaticProvider
from workers.scaling.fleet import ZoneOffer
from workers.scaling.prices import load_aws_spot_prices
from workers.scaling.spot_sources import load_spot_traces
from workers.scaling.traces import PoissonSpotModel, SpotTrace
from workers.scaling_glue import LIVE_STATES


def zone_offers() -> list[ZoneOffer]:
    """Every zone with configured prices; a price-history folder overrides spot per zone."""
    s = settings
    spot = {}
    if s.MERIDIAN_CLOUD_SPOT_PRICE_DATA:
        spot = load_aws_spot_prices(
            s.MERIDIAN_CLOUD_SPOT_PRICE_DATA, s.MERIDIAN_CLOUD_INSTANCE_TYPE
        )
    return [
        ZoneOffer(
            z.name,
            z.region.name,
            spot.get(z.name, s.MERIDIAN_CLOUD_SPOT_PRICE),
            s.MERIDIAN_CLOUD_ON_DEMAND_PRICE,
        )
        for z in Zone.objects.select_related("region")
    ]


def _trace(zones: list[ZoneOffer]) -> SpotTrace | None:
    s = settings
    if s.MERIDIAN_CLOUD_SPOT_TRACE:
        return load_spot_traces(s.MERIDIAN_CLOUD_SPOT_TRACE)[0][0]
    if s.MERIDIAN_CLOUD_SPOT_PREEMPTIONS_PER_HOUR > 0:
        rate = s.MERIDIAN_CLOUD_SPOT_PREEMPTIONS_PER_HOUR
        model = PoissonSpotModel({z.name: rate for z in zones})
        return model.render(duration_s=7 * 24 * 3600.0)
    return None


def build_provider() -> CloudProvider:
    s = settings
    zones = zone_offers()
    if s.MERIDIAN_CLOUD_PROVIDER == "static":
        return StaticProvider(zones)
    if s.MERIDIAN_CLOUD_PROVIDER == "skypilot":
        return build_skypilot(zones)
    market = SpotMarket(
        _trace(zones), origin=time.time(), time_scale=s.MERIDIAN_CLOUD_TRACE_TIME_SCALE
    )
    cold = ColdStartModel(
        provision_s={
            "spot": s.MERIDIAN_CLOUD_PROVISION_S,
            "on-demand": s.MERIDIAN_CLOUD_PROVISION_S,
        },
        model_load_s=s.MERIDIAN_CLOUD_MODEL_LOAD_S,
    )
    # Emulated replicas hash blocks as a vLLM with PYTHONHASHSEED unset does.
    serve_args = ["--time-scale", str(s.MERIDIAN_CLOUD_SIM_TIME_SCALE)]
    return EmulatedCloudProvider(
        zones,
        market,
        cold,
        serve_args=serve_args,
        log_dir=s.VAR_DIR / "cloud",
        warning_s=s.MERIDIAN_CLOUD_PREEMPTION_WARNING_S,
    )


def skypilot_config(zones: str | None = None) -> SkyPilotConfig:
    """The provider's configuration; ``zones`` in place of MERIDIAN_SKYPILOT_ZONES."""
    s = settings
    return SkyPilotConfig(
        zones=parse_zones(s.MERIDIAN_SKYPILOT_ZONES if zones is None else zones),
        accelerators=s.MERIDIAN_SKYPILOT_ACCELERATORS,
        port=s.MERIDIAN_SKYPILOT_PORT,
        disk_size_gb=s.MERIDIAN_SKYPILOT_DISK_GB,
        image_id=s.MERIDIAN_SKYPILOT_IMAGE_ID,
        vllm_version=s.MERIDIAN_SKYPILOT_VLLM_VERSION,
    )


def skypilot_bridge() -> SkyBridge:
    """SkyPilot's SDK in its own environment; a missing one stops start-up, saying how."""
    python = settings.MERIDIAN_SKYPILOT_PYTHON
    if not python:
        raise SkyPilotError(
            "MERIDIAN_CLOUD_PROVIDER=skypilot needs MERIDIAN_SKYPILOT_PYTHON: the python of "
            "SkyPilot's environment (ops/install_skypilot.sh installs it and prints it)"
        )
    bridge = SkyBridge(bridge_argv(python))
    try:
        bridge.call("version")
    except SkyPilotError:
        bridge.close()
        raise
    return bridge


def build_skypilot(zones: list[ZoneOffer]) -> SkyPilotProvider:
    provider = SkyPilotProvider(skypilot_config(), zones, skypilot_bridge())
    # A restarted worker picks up the clusters its rows say are live.
    for row in Replica.objects.filter(provider=provider.name, state__in=LIVE_STATES):
        state = "provisioning" if row.state == Replica.State.PROVISIONING else "running"
        launched = row.launched_at.timestamp() if row.launched_at else time.time()
        provider.adopt(
            Instance(row.provider_handle, row.kind, row.zone.name, row.url, state, launched)
        )
    return provider
