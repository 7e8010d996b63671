"""Build routing policies by name from a registry of (policy class, config class).

Parameters come from ServiceConfig.policy_params or a command's ``--policy``;
unknown names and unknown or mistyped parameters are refused with a clear message
rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from routing.core.policies.least_load import LeastLoadConfig, LeastLoadPolicy
from routing.core.policies.round_robin import RoundRobinConfig, RoundRobinPolicy
from routing.core.policy import Policy


class UnknownPolicyError(ValueError):
    pass


PolicyFactory = Callable[[Any], Policy]

_REGISTRY: dict[str, tuple[PolicyFactory, type[Any]]] = {
    "least_load": (LeastLoadPolicy, LeastLoadConfig),
    "round_robin": (RoundRobinPolicy, RoundRobinConfig),
}


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    try:
        factory, config_cls = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown routing policy {name!r}; choose one of: {', '.join(policy_names())}"
        ) from None
    return factory(_build_config(name, config_cls, params or {}))


def _build_config(name: str, config_cls: type[Any], params: Mapping[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise UnknownPolicyError(
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; known: {known}"
        )
    return config_cls(**params)
