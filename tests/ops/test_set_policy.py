from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Event, ServiceConfig
from ops.demo import DEMO_MODEL, DEMO_POLICY
from tests.support.demo_fleet import seed_demo_fleet
from workers.policy_config import PolicyConfigError, validate_policy


@pytest.fixture
def service(db: None) -> ServiceConfig:
    seed_demo_fleet()
    return ServiceConfig.objects.get(model_name=DEMO_MODEL)


def test_the_demo_service_routes_with_meridians_own_policy(service: ServiceConfig) -> None:
    assert service.policy == DEMO_POLICY == "meridian"


def test_set_policy_stores_typed_params_and_records_the_change(service: ServiceConfig) -> None:
    call_command(
        "set_policy", DEMO_MODEL, "skylb_ch", "--param", "vnodes=64", "--param", "pushing=sp-o"
    )
    service.refresh_from_db()
    assert (service.policy, service.policy_params) == (
        "skylb_ch",
        {"vnodes": 64, "pushing": "sp-o"},
    )
    event = Event.objects.get(kind="policy_changed")
    assert event.data["before"]["policy"] == "meridian"
    assert event.data["after"] == {
        "policy": "skylb_ch",
        "params": {"vnodes": 64, "pushing": "sp-o"},
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "unknown routing policy"),
        (["skylb", "--param", "vnodes=64"], "vnodes"),
        (["least_load", "--param", "pushing=sometimes"], "pushing"),
        (["least_load", "--param", "novalue"], "key=value"),
    ],
)
def test_bad_policies_are_refused_and_nothing_changes(
    service: ServiceConfig, args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("set_policy", DEMO_MODEL, *args)
    service.refresh_from_db()
    assert service.policy == "meridian"
    assert not Event.objects.filter(kind="policy_changed").exists()


def test_unknown_model_is_named_in_the_error(service: ServiceConfig) -> None:
    with pytest.raises(CommandError, match="no service for model 'gpt-x'"):
        call_command("set_policy", "gpt-x", "least_load")


def test_block_identity_and_kv_events_are_checked_apart_from_the_policys_knobs() -> None:
    params = {
        "block_identity": {"mode": "vllm", "hash_algo": "sha256_cbor", "hash_seed": "42"},
        "kv_events": {"r1": "tcp://10.0.0.1:5557"},
        "speculative_ttl_s": 5,
    }
    validate_policy("cache_map", params)
    with pytest.raises(PolicyConfigError, match=r"block_identity\.mode"):
        validate_policy("cache_map", {"block_identity": {"mode": "xxhash"}})
