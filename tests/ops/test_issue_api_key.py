"""`manage.py issue_api_key`: limits as options, stored on the key; bad values refused."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import ApiKey, hash_api_key

pytestmark = pytest.mark.django_db


def _issue(*argv: str) -> tuple[ApiKey, str]:
    out = StringIO()
    call_command("issue_api_key", *argv, stdout=out)
    raw = out.getvalue().strip().splitlines()[-1]
    return ApiKey.objects.get(key_hash=hash_api_key(raw)), out.getvalue()


def test_a_key_without_options_has_no_limits() -> None:
    key, _ = _issue("plain")
    limits = key.limits()
    assert not limits.counted and not limits.allowed_models
    assert key.budget_period == "month"


def test_limits_are_stored_and_shown() -> None:
    key, out = _issue(
        "team-a",
        "--rpm", "60",
        "--tpm", "100_000",
        "--max-concurrent", "4",
        "--token-budget", "5000000",
        "--budget-period", "day",
        "--models", "m1, m2",
    )  # fmt: skip
    assert (key.requests_per_minute, key.tokens_per_minute, key.max_concurrent) == (60, 100_000, 4)
    assert (key.token_budget, key.budget_period) == (5_000_000, "day")
    assert key.allowed_models == ["m1", "m2"]
    assert "Limits: 60 requests/min; 100000 tokens/min; 4 concurrent" in out
    assert out.strip().splitlines()[-1].startswith(ApiKey.PREFIX)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rpm", "0"], "--rpm must be between 1 and"),
        (["--tpm", "lots"], "--tpm must be a whole number or 'none'; got 'lots'"),
        (["--max-concurrent", "-1"], "--max-concurrent must be between 1"),
        (["--token-budget", "2.5"], "--token-budget must be a whole number"),
        (["--budget-period", "year"], "budget_period must be one of hour, day, week, month"),
    ],
)
def test_bad_limits_are_a_clear_command_error(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("issue_api_key", "bad", *argv, stdout=StringIO())
    assert not ApiKey.objects.filter(name="bad").exists()


def test_model_clean_refuses_bad_limits() -> None:
    from django.core.exceptions import ValidationError

    key, _ = _issue("edited")
    key.budget_period = "year"
    with pytest.raises(ValidationError, match="budget_period must be one of"):
        key.full_clean()
    key.budget_period = "week"
    key.allowed_models = "m1"  # not a list
    with pytest.raises(ValidationError, match="allowed_models must be a list"):
        key.full_clean()
    key.allowed_models = ["m1", 3]
    with pytest.raises(ValidationError, match="allowed model names must be strings"):
        key.full_clean()
    key.allowed_models = ["b", " a", "b", ""]
    key.full_clean()  # normalised: trimmed, sorted, once each
    assert key.allowed_models == ["a", "b"]
