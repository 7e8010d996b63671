"""The local layer of SkyLB's two-layer routing: pick a replica this balancer owns.

``LocalRouter`` keeps one ``TargetState`` per owned replica (kept across topology
refreshes, so probe data and health survive), one policy per model (rebuilt only
when its ServiceConfig changes, so stateful policies keep what they learned),
and the in-flight ledger.  A replica is a *candidate* for a request when it
serves the model, is healthy, was not already tried for this request, and has
fewer outstanding requests than the per-replica cap: SkyLB's SP-O availability
rule (§3.3), which keeps a burst from piling onto one replica between probes.

``select`` reports why nothing was picked, because the caller answers differently:
no healthy replica at all → try a peer, else 503; healthy but all at the cap →
try a peer, else 429.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from routing.core.engine_metrics import EngineLoad
from routing.core.leases import InflightLedger, Lease
from routing.core.policy import Policy
from routing.core.topology import ModelSpec, ReplicaSpec
from routing.core.types import RequestDescriptor, TargetState

PolicyBuilder = Callable[[str, Mapping[str, Any]], Policy]


@dataclass(frozen=True, slots=True)
class Selection:
    target: TargetState | None
    healthy: int
    available: int


@dataclass(slots=True)
class ReplicaUsage:
    """Token totals the balancer saw in this replica's responses."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def cached_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class LocalRouter:
    def __init__(self, build_policy: PolicyBuilder, *, max_outstanding: int) -> None:
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be at least 1")
        self.max_outstanding = max_outstanding
        self.ledger = InflightLedger()
        self._build_policy = build_policy
        self._targets: dict[str, TargetState] = {}
        self._policies: dict[str, tuple[ModelSpec, Policy]] = {}
        self._usage: dict[str, ReplicaUsage] = {}

    # -- topology -----------------------------------------------------------------------

    def apply(self, replicas: Iterable[ReplicaSpec], models: Mapping[str, ModelSpec]) -> None:
        """Adopt a new topology snapshot without losing what is known about replicas."""
        fresh: dict[str, TargetState] = {}
        for spec in replicas:
            target = self._targets.get(spec.name)
            if target is None:
                target = TargetState(target_id=spec.name, url=spec.url)
            target.url, target.model, target.kind = spec.url, spec.model, spec.kind
            target.region, target.zone = spec.region, spec.zone
            target.outstanding = self.ledger.outstanding(spec.name)
            fresh[spec.name] = target
        self._targets = fresh
        self._usage = {name: self._usage.get(name, ReplicaUsage()) for name in fresh}
        self._policies = {name: self._policy_for(spec) for name, spec in models.items()}

    def _policy_for(self, spec: ModelSpec) -> tuple[ModelSpec, Policy]:
        current = self._policies.get(spec.name)
        if current is not None and current[0] == spec:
            return current
        return spec, self._build_policy(spec.policy, spec.policy_params)

    def targets(self) -> list[TargetState]:
        return sorted(self._targets.values(), key=lambda t: t.target_id)

    def target(self, name: str) -> TargetState | None:
        return self._targets.get(name)

    def usage(self, name: str) -> ReplicaUsage:
        return self._usage.get(name, ReplicaUsage())

    def policy_name(self, model: str) -> str | None:
        entry = self._policies.get(model)
        return entry[1].name if entry else None

    # -- selection ----------------------------------------------------------------------

    def select(
        self, request: RequestDescriptor, exclude: frozenset[str] = frozenset()
    ) -> Selection:
        healthy = [
            t
            for t in self._targets.values()
            if t.model == request.model and t.healthy and t.target_id not in exclude
        ]
        available = [t for t in healthy if t.outstanding < self.max_outstanding]
        entry = self._policies.get(request.model)
        target = entry[1].select(request, available) if entry and available else None
        return Selection(target, len(healthy), len(available))

    def lease(self, request: RequestDescriptor, target: TargetState) -> Lease:
        """Take an outstanding slot; its release tells the model's policy how it went."""
        entry = self._policies.get(request.model)

        def _done(lease: Lease, ok: bool) -> None:
            if entry is not None:
                entry[1].on_complete(request, lease.target, ok)

        return self.ledger.acquire(target, request.request_id, _done)

    def counts(self, model: str | None = None) -> tuple[int, int]:
        """(healthy, available) replicas, for one model or all."""
        chosen = [t for t in self._targets.values() if model is None or t.model == model]
        healthy = [t for t in chosen if t.healthy]
        return len(healthy), sum(1 for t in healthy if t.outstanding < self.max_outstanding)

    def available_by_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self._targets.values():
            ok = t.healthy and t.outstanding < self.max_outstanding
            out[t.model] = out.get(t.model, 0) + int(ok)
        return out

    # -- health and load feedback ---------------------------------------------------------

    def mark_failed(self, name: str) -> None:
        """An upstream call failed before its first byte: stop routing to it at once."""
        target = self._targets.get(name)
        if target is not None:
            target.healthy = False
            target.consecutive_failures += 1

    def record_probe(self, name: str, load: EngineLoad) -> None:
        target = self._targets.get(name)
        if target is None:
            return
        target.healthy = True
        target.consecutive_failures = 0
        target.running, target.waiting, target.kv_usage = load.running, load.waiting, load.kv_usage
        if load.prefix_hit_rate is not None:
            target.extra["prefix_hit_rate"] = load.prefix_hit_rate

    def record_probe_failure(self, name: str, threshold: int) -> bool:
        """Count a failed probe; True when this one made the replica unhealthy."""
        target = self._targets.get(name)
        if target is None:
            return False
        target.consecutive_failures += 1
        if target.healthy and target.consecutive_failures >= threshold:
            target.healthy = False
            return True
        return False

    def record_usage(self, name: str, prompt: int, cached: int, completion: int) -> None:
        usage = self._usage.get(name)
        if usage is None:
            return
        usage.requests += 1
        usage.prompt_tokens += prompt
        usage.cached_tokens += cached
        usage.completion_tokens += completion
