"""The provider the settings name, over the zones in the database."""

from __future__ import annotations

import time

from django.conf import settings

from fleet.models import Zone
from workers.providers.base import CloudProvider
from workers.providers.emulated import ColdStartModel, EmulatedCloudProvider, SpotMarket
from workers.providers.static import StaticProvider
from workers.scaling.fleet import ZoneOffer
from workers.scaling.prices import load_aws_spot_prices
from workers.scaling.spot_sources import load_spot_traces
from workers.scaling.traces import PoissonSpotModel, SpotTrace


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
