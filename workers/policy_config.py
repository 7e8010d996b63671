"""Change a service's routing policy, validated exactly as the balancers will build it.

Balancers pick the new ServiceConfig up at their next topology refresh (seconds) and
rebuild only that model's policy; the change is an Event so an operator can line it
up with what the charts show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from core.availability import split_pushing_params
from core.block_identity import split_block_identity_params
from core.kv_events import split_kv_event_params
from core.registry import UnknownPolicyError, build_policy
from fleet.models import Event, ServiceConfig


class PolicyConfigError(ValueError):
    pass


def validate_policy(name: str, params: Mapping[str, Any]) -> None:
    """Raise ``PolicyConfigError`` unless a balancer could build this policy."""
    try:
        _, policy_params = split_pushing_params(params)
        # The balancer takes these out before building the policy, and checks them.
        _, policy_params = split_kv_event_params(policy_params)
        _, policy_params = split_block_identity_params(policy_params)
        build_policy(name, policy_params)
    except (UnknownPolicyError, ValueError, TypeError) as exc:
        raise PolicyConfigError(str(exc)) from exc


@transaction.atomic
def set_policy(model: str, name: str, params: Mapping[str, Any], *, actor: str) -> ServiceConfig:
    validate_policy(name, params)
    config = ServiceConfig.objects.select_for_update().filter(model_name=model).first()
    if config is None:
        known = ", ".join(ServiceConfig.objects.values_list("model_name", flat=True)) or "none"
        raise PolicyConfigError(f"no service for model {model!r} (configured: {known})")
    before = {"policy": config.policy, "params": config.policy_params}
    config.policy, config.policy_params = name, dict(params)
    config.save(update_fields=["policy", "policy_params", "updated_at"])
    Event.record(
        "policy_changed",
        f"{model}: routing policy {before['policy']} -> {name}",
        subject=model,
        before=before,
        after={"policy": name, "params": dict(params)},
        actor=actor,
    )
    return config
