"""`manage.py set_scaler`: the scaler is chosen per service, preserve with a capacity."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.models import Event, ServiceConfig


@pytest.mark.django_db
def test_preserve_needs_a_capacity_and_the_change_is_an_event() -> None:
    ServiceConfig.objects.create(model_name="m")
    with pytest.raises(CommandError, match="--prompt-tps --decode-tps --total-tps"):
        call_command("set_scaler", "m", "preserve")
    with pytest.raises(CommandError, match="must be positive"):
        call_command("set_scaler", "m", "preserve", "--prompt-tps", "0")
    assert ServiceConfig.objects.get().scaler == "request-rate"
    out = StringIO()
    call_command(
        "set_scaler",
        "m",
        "preserve",
        "--prompt-tps=400",
        "--decode-tps=50",
        "--total-tps=420",
        stdout=out,
    )
    assert out.getvalue().strip() == "m: scaler preserve"
    config = ServiceConfig.objects.get()
    assert (config.scaler, config.replica_decode_tokens_per_s) == ("preserve", 50.0)
    event = Event.objects.get(kind="service_settings_changed")
    assert event.data["changed"]["scaler"] == ["request-rate", "preserve"]
    call_command("set_scaler", "m", "request-rate", stdout=StringIO())  # capacity is kept
    assert ServiceConfig.objects.get().replica_prompt_tokens_per_s == 400.0
    with pytest.raises(CommandError, match="no service for model 'x'"):
        call_command("set_scaler", "x", "request-rate")
