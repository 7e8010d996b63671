"""`manage.py plan_skypilot`: the SkyPilot provider's dry run prints the task and the
calls, launches nothing, and refuses bad input with a message that says what to fix."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from tests.support.skypilot import sky_python

ZONES = "aws/us-east-1/us-east-1a,gcp/us-central1/us-central1-a"


def plan(*args: str) -> str:
    out = io.StringIO()
    call_command("plan_skypilot", *args, stdout=out)
    return out.getvalue()


def test_the_dry_run_prints_the_pinned_task_and_every_call() -> None:
    text = plan("--zones", ZONES, "--zone", "us-east-1a", "--kind", "spot", "--replica", "r1")
    assert 'name: "mer-r1"' in text
    assert 'infra: "aws/us-east-1/us-east-1a"' in text and "use_spot: true" in text
    assert "sky.launch(task, cluster_name='mer-r1', retry_until_up=False" in text
    assert "6. scale-down: sky.down('mer-r1')" in text
    assert "as SkyPilot parsed it" not in text  # no --validate: no SkyPilot needed


@override_settings(MERIDIAN_SKYPILOT_ZONES=ZONES)
def test_the_zones_come_from_the_settings_when_not_given() -> None:
    text = plan("--zone", "us-central1-a", "--kind", "on-demand")
    assert 'infra: "gcp/us-central1/us-central1-a"' in text and "use_spot: false" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zone", "us-east-1a"], "no zones configured"),
        (["--zones", ZONES, "--zone", "eu-west-1a"], "not a configured SkyPilot zone"),
        (["--zones", "aws/us-east-1", "--zone", "us-east-1a"], "expected cloud/region/zone"),
        (["--zones", ZONES, "--zone", "us-east-1a", "--replica", "_."], "no letters or digits"),
    ],
)
def test_bad_input_says_what_to_fix(args: list[str], message: str) -> None:
    with override_settings(MERIDIAN_SKYPILOT_ZONES=""), pytest.raises(CommandError, match=message):
        plan(*args)


@override_settings(MERIDIAN_SKYPILOT_PYTHON="")
def test_validate_without_skypilots_environment_says_how_to_get_it() -> None:
    with pytest.raises(CommandError, match=r"ops/install_skypilot\.sh"):
        plan("--zones", ZONES, "--zone", "us-east-1a", "--validate")


def test_validate_prints_what_skypilot_itself_parsed() -> None:
    with override_settings(MERIDIAN_SKYPILOT_PYTHON=sky_python()):
        text = plan("--zones", ZONES, "--zone", "us-east-1a", "--validate")
    parsed = text.split("# as SkyPilot parsed it")[1]
    assert "# SkyPilot 0.14.1" in parsed
    assert "'cloud': 'AWS', 'region': 'us-east-1', 'zone': 'us-east-1a', 'use_spot': True" in parsed
