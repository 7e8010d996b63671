"""Build routing policies by name from a registry of (policy class, config class).

Parameters come from ServiceConfig.policy_params or a command's ``--policy``;
unknown names and unknown or mistyped parameters are refused with a clear message
rather than silently ignored.  Every policy serves both of SkyLB's layers;
``remote_policy_name`` says which one a service's remote layer (peer balancers)
uses for a given local policy.

| name | module | what |
| --- | --- | --- |
| round_robin | policies.round_robin | cycle in id order |
| least_load | policies.least_load | fewest outstanding |
| power_of_two | policies.power_of_two | less loaded of two random picks |
| consistent_hash | policies.consistent_hash | ring hash on the session key |
| skylb_ch | policies.skylb_ch | ring hash skipping unavailable vnodes (SkyLB §3.2) |
| skylb | policies.skylb | longest prefix in a trie / regional snapshot (SkyLB §3.2) |
| sglang | policies.sglang | SGLang cache-aware: radix tree + balance thresholds |
| cache_map | policies.cache_map | push-based cache map, sticky least-loaded (002) |
| metrics_aware | policies.metrics_aware | queue / LoRA / KV filters (Higress, 001) |
| nearest | policies.nearest | lowest RTT peer (remote layer default) |
| meridian | policies.meridian | cost model over replicas, peers and waiting (default) |

``DEFAULT_POLICY`` is what a new service and the demo run.  ``default_pushing``
says which selective-pushing rule a policy runs when a service names none: the
cost model admits by queued prefill tokens (``tokens``), the others by SP-P.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from core.availability import PushingMode
from core.policies.cache_map import CacheMapConfig, CacheMapPolicy
from core.policies.consistent_hash import ConsistentHashConfig, ConsistentHashPolicy
from core.policies.least_load import LeastLoadConfig, LeastLoadPolicy
from core.policies.meridian import MeridianConfig, MeridianPolicy
from core.policies.metrics_aware import MetricsAwareConfig, MetricsAwarePolicy
from core.policies.nearest import NearestConfig, NearestPolicy
from core.policies.power_of_two import PowerOfTwoConfig, PowerOfTwoPolicy
from core.policies.round_robin import RoundRobinConfig, RoundRobinPolicy
from core.policies.sglang import SGLangConfig, SGLangPolicy
from core.policies.skylb import SkyLBConfig, SkyLBPolicy
from core.policies.skylb_ch import SkyLBCHConfig, SkyLBCHPolicy
from core.policy import Policy


class UnknownPolicyError(ValueError):
    pass


PolicyFactory = Callable[[Any], Policy]

_REGISTRY: dict[str, tuple[PolicyFactory, type[Any]]] = {
    "cache_map": (CacheMapPolicy, CacheMapConfig),
    "consistent_hash": (ConsistentHashPolicy, ConsistentHashConfig),
    "least_load": (LeastLoadPolicy, LeastLoadConfig),
    "meridian": (MeridianPolicy, MeridianConfig),
    "metrics_aware": (MetricsAwarePolicy, MetricsAwareConfig),
    "nearest": (NearestPolicy, NearestConfig),
    "power_of_two": (PowerOfTwoPolicy, PowerOfTwoConfig),
    "round_robin": (RoundRobinPolicy, RoundRobinConfig),
    "sglang": (SGLangPolicy, SGLangConfig),
    "skylb": (SkyLBPolicy, SkyLBConfig),
    "skylb_ch": (SkyLBCHPolicy, SkyLBCHConfig),
}

# Local policies whose remote layer runs the same algorithm over peer balancers
# (SkyLB Algorithm 1, lines 20 and 23): the snapshot trie and the balancer ring.
_SAME_ON_BOTH_LAYERS = frozenset({"skylb", "skylb_ch"})
REMOTE_DEFAULT = "nearest"
DEFAULT_POLICY = "meridian"
# Policies that price work in tokens and admit by it rather than by SP-P's budget.
_TOKEN_ADMISSION = frozenset({"meridian"})


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def remote_policy_name(local_name: str) -> str:
    """The policy a service's remote layer uses, given its local policy's name."""
    return local_name if local_name in _SAME_ON_BOTH_LAYERS else REMOTE_DEFAULT


def default_pushing(name: str) -> PushingMode:
    """The pushing rule policy ``name`` runs when the service names none."""
    return PushingMode.TOKENS if name in _TOKEN_ADMISSION else PushingMode.SP_P


def policy_defaults(name: str) -> dict[str, Any]:
    """The config knobs of policy ``name`` and their defaults."""
    _, config_cls = _lookup(name)
    return {f.name: f.default for f in dataclasses.fields(config_cls)}


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    factory, config_cls = _lookup(name)
    return factory(_build_config(name, config_cls, params or {}))


def _lookup(name: str) -> tuple[PolicyFactory, type[Any]]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown routing policy {name!r}; choose one of: {', '.join(policy_names())}"
        ) from None


def _build_config(name: str, config_cls: type[Any], params: Mapping[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise UnknownPolicyError(
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; known: {known}"
        )
    for key, value in params.items():
        _check_type(name, key, fields[key].default, value)
    try:
        return config_cls(**params)
    except ValueError as exc:
        raise UnknownPolicyError(f"policy {name!r}: {exc}") from None


def _check_type(name: str, key: str, default: Any, value: Any) -> None:
    """Refuse a value whose type differs from the default's (an int may stand for a float)."""
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise UnknownPolicyError(
            f"policy {name!r} parameter {key!r} must be {expected.__name__}, "
            f"got {type(value).__name__} {value!r}"
        )
