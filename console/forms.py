"""Forms behind the console's POST actions (each rendered with the CSRF token)."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.conf import settings

from core.registry import policy_names
from fleet.models import Balancer, Region, RegionLatency, Replica, ServiceConfig, Zone


class RegionForm(forms.ModelForm):
    class Meta:
        model = Region
        fields = ["name", "display_name"]


class ZoneForm(forms.ModelForm):
    class Meta:
        model = Zone
        fields = ["region", "name"]


class BalancerForm(forms.ModelForm):
    # Loopback and internal URLs are plain http; Django 6 would assume https.
    url = forms.URLField(assume_scheme="http", help_text="e.g. http://127.0.0.1:8101")

    class Meta:
        model = Balancer
        fields = ["name", "region", "url"]


class LatencyForm(forms.Form):
    """Set (create or replace) the RTT of one ordered region pair."""

    source = forms.ModelChoiceField(Region.objects.all(), to_field_name="name")
    target = forms.ModelChoiceField(Region.objects.all(), to_field_name="name")
    rtt_ms = forms.FloatField(min_value=0.0, label="RTT (ms)")

    def save(self) -> RegionLatency:
        data = self.cleaned_data
        latency, _ = RegionLatency.objects.update_or_create(
            source=data["source"], target=data["target"], defaults={"rtt_ms": data["rtt_ms"]}
        )
        return latency


class AddReplicaForm(forms.ModelForm):
    """A replica by URL: probed (its model's readiness probe) before it is saved, and
    saved as ``starting``, so it takes traffic only once the control plane's probe
    marks it ready (SkyServe's readiness rule)."""

    url = forms.URLField(assume_scheme="http", help_text="OpenAI-compatible server base URL")

    class Meta:
        model = Replica
        fields = ["name", "url", "model_name", "region", "zone", "kind", "hourly_price"]

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        zone, region = data.get("zone"), data.get("region")
        if zone and region and zone.region_id != region.id:
            self.add_error("zone", f"{zone} is in {zone.region}, not {region}")
        if data.get("url") and data.get("model_name") and not self.errors:
            self._probe(data["url"], data["model_name"])
        return data

    def _probe(self, url: str, model: str) -> None:
        # The prober (httpx) loads when a replica form is validated, not with the
        # URLconf that every manage.py command imports for its checks.
        from workers.probes import probe_url

        config = ServiceConfig.objects.filter(model_name=model).first()
        mode = config.readiness_probe if config else ServiceConfig.ReadinessProbe.HEALTH
        result = probe_url(url, model, mode, timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2)
        if not result.ok:
            self.add_error("url", f"probe failed: {result.detail}")

    def save(self, commit: bool = True) -> Replica:
        replica: Replica = super().save(commit=False)
        replica.state = Replica.State.STARTING
        if commit:
            replica.save()
        return replica


class PolicyForm(forms.Form):
    model = forms.ModelChoiceField(ServiceConfig.objects.all(), to_field_name="model_name")
    policy = forms.ChoiceField(choices=())
    params = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}), help_text="JSON object"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Declared a ChoiceField above; ``fields`` only knows it as a Field.
        policy = cast(forms.ChoiceField, self.fields["policy"])
        policy.choices = [(name, name) for name in policy_names()]

    def clean_params(self) -> dict[str, Any]:
        raw = self.cleaned_data.get("params") or "{}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("parameters must be a JSON object")
        return value


# A replica's profiled capacity (tokens/s within its SLO): the preserve scaler's N.
CAPACITY_FIELDS = (
    "replica_prompt_tokens_per_s",
    "replica_decode_tokens_per_s",
    "replica_total_tokens_per_s",
)


class AutoscalingForm(forms.ModelForm):
    class Meta:
        model = ServiceConfig
        fields = [
            "min_replicas",
            "max_replicas",
            "target_qps_per_replica",
            "upscale_delay_s",
            "downscale_delay_s",
            "queue_max_len",
            "queue_max_wait_s",
            "readiness_probe",
            "scaler",
            *CAPACITY_FIELDS,
        ]

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("max_replicas", "must be at least min_replicas")
        for name in CAPACITY_FIELDS:
            value = data.get(name)
            if value is not None and value <= 0:
                self.add_error(name, "must be positive (or empty: not profiled)")
            elif value is None and data.get("scaler") == ServiceConfig.Scaler.PRESERVE:
                self.add_error(name, "the preserve scaler needs the profiled per-replica capacity")
        return data
