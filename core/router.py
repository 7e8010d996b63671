"""The local layer of SkyLB's two-layer routing: pick a replica this balancer owns.

``LocalRouter`` keeps one ``TargetState`` per owned replica (kept across topology
refreshes, so probe data and health survive), one policy per model (rebuilt only
when its ServiceConfig changes, so stateful policies keep what they learned),
one ``ProbeMark`` per replica for selective pushing, one circuit ``Breaker`` per
replica (``core.breaker``: after a failure a hold-down, then consecutive
good probes readmit it), and the in-flight ledger.

A replica is a *candidate* for a request when it serves the model, is healthy,
was not already tried for this request, and is *available* under the model's
pushing mode (``core.availability``: SP-P by default, SP-O or blind;
SkyLB §3.3).  For a request naming a LoRA adapter, candidates narrow to the best
affinity tier (``core.lora``).  The policy only ever chooses among
candidates.

``select`` reports why nothing was picked, because the caller answers
differently: no healthy replica at all → try a peer, else 503; healthy but
none available → try a peer, else queue.  Every change that may make a replica
available (a probe, a finished request, a topology change) calls ``on_change``
so the glue can hand queued requests out at once, without polling.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

from core.availability import (
    AvailabilityLimits,
    ProbeMark,
    PushingConfig,
    is_available,
    probe_would_help,
)
from core.breaker import Breaker, BreakerConfig
from core.busy import grace_left
from core.engine_metrics import EngineLoad
from core.event_keys import CacheEventSink
from core.leases import InflightLedger, Lease
from core.lora import lora_affinity
from core.policy import CostModel, Policy, RouteLearner
from core.prefix_digest import PrefixDigest
from core.shared_state import ReplicaLoad, RouteRecord
from core.topology import ModelSpec, ReplicaSpec
from core.types import RTT_KEY, RequestDescriptor, TargetState

_Answer = TypeVar("_Answer")

PolicyBuilder = Callable[[str, Mapping[str, Any]], Policy]
Clock = Callable[[], float]
_DEFAULT_PUSHING = PushingConfig()
# A replica never probed, for ``is_available`` (which only reads it): not one per call.
_NO_MARK = ProbeMark()


@dataclass(frozen=True, slots=True)
class Options:
    """What a cost model chooses among locally (``LocalRouter.options``)."""

    available: list[TargetState]
    held_back: list[TargetState]


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
    def __init__(
        self,
        build_policy: PolicyBuilder,
        *,
        max_outstanding: int,
        probe_stale_s: float = 2.0,
        breaker: BreakerConfig | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be at least 1")
        self.limits = AvailabilityLimits(max_outstanding, probe_stale_s)
        self.ledger = InflightLedger()
        self.clock = clock
        self.breaker_config = breaker or BreakerConfig()
        # Called after anything that may make a replica available (queue wake-up).
        self.on_change: Callable[[], None] | None = None
        # Called with every decision's route, for sibling processes (routing.shared_state).
        self.on_route: Callable[[RouteRecord], None] | None = None
        self._build_policy = build_policy
        self._targets: dict[str, TargetState] = {}
        self._marks: dict[str, ProbeMark] = {}
        self._breakers: dict[str, Breaker] = {}
        self._policies: dict[str, tuple[ModelSpec, Policy]] = {}
        self._usage: dict[str, ReplicaUsage] = {}
        self._cost_models: dict[str, CostModel] = {}
        self._learners: dict[str, RouteLearner] = {}

    @property
    def max_outstanding(self) -> int:
        return self.limits.max_outstanding

    # -- topology -----------------------------------------------------------------------

    def apply(self, replicas: Iterable[ReplicaSpec], models: Mapping[str, ModelSpec]) -> None:
        """Adopt a new topology snapshot without losing what is known about replicas."""
        before = self._ids_by_model()
        fresh: dict[str, TargetState] = {}
        for spec in replicas:
            target = self._targets.get(spec.name)
            if target is None:
                target = TargetState(target_id=spec.name, url=spec.url)
            target.url, target.model, target.kind = spec.url, spec.model, spec.kind
            target.region, target.zone = spec.region, spec.zone
            target.extra[RTT_KEY] = spec.rtt_ms
            target.outstanding = self.ledger.outstanding(spec.name)
            fresh[spec.name] = target
        self._targets = fresh
        self._marks = {name: self._marks.get(name, ProbeMark()) for name in fresh}
        self._breakers = {
            name: self._breakers.get(name) or Breaker(self.breaker_config) for name in fresh
        }
        self._usage = {name: self._usage.get(name, ReplicaUsage()) for name in fresh}
        old_policies = self._policies
        self._policies = {name: self._policy_for(spec) for name, spec in models.items()}
        # Checked once here: a runtime Protocol check is too slow for every decision.
        self._cost_models = {
            name: policy
            for name, (_, policy) in self._policies.items()
            if isinstance(policy, CostModel)
        }
        self._learners = {
            name: policy
            for name, (_, policy) in self._policies.items()
            if isinstance(policy, RouteLearner)
        }
        after = self._ids_by_model()
        for model, (_, policy) in self._policies.items():
            rebuilt = old_policies.get(model, (None, None))[1] is not policy
            if rebuilt or before.get(model) != after.get(model):
                policy.on_targets_changed(after.get(model, []))
        # A rebuilt cost model or a new replica learns the usage already probed.
        for model, cost_model in self._cost_models.items():
            for name in after.get(model, []):
                cost_model.observe_probe(name, self._targets[name].kv_usage)
        self._notify()

    def _policy_for(self, spec: ModelSpec) -> tuple[ModelSpec, Policy]:
        current = self._policies.get(spec.name)
        if current is not None and current[0] == spec:
            return current
        if current is not None and _same_policy(current[0], spec):
            return spec, current[1]  # only pushing or queue bounds changed: keep what it learned
        return spec, self._build_policy(spec.policy, spec.policy_params)

    def _ids_by_model(self) -> dict[str, list[str]]:
        ids: dict[str, list[str]] = {}
        for name in sorted(self._targets):
            ids.setdefault(self._targets[name].model, []).append(name)
        return ids

    def targets(self) -> list[TargetState]:
        return sorted(self._targets.values(), key=lambda t: t.target_id)

    def target(self, name: str) -> TargetState | None:
        return self._targets.get(name)

    def usage(self, name: str) -> ReplicaUsage:
        return self._usage.get(name, ReplicaUsage())

    def breaker(self, name: str) -> Breaker | None:
        return self._breakers.get(name)

    def mark(self, name: str) -> ProbeMark | None:
        return self._marks.get(name)

    def policy(self, model: str) -> Policy | None:
        """The model's policy object (KV events feed the cache-map one directly)."""
        entry = self._policies.get(model)
        return entry[1] if entry else None

    def kv_sink(self, model: str) -> CacheEventSink | None:
        """Where ``model``'s KV events go (``Policy.kv_sink``); None: nowhere."""
        policy = self.policy(model)
        return policy.kv_sink if policy else None

    def policy_name(self, model: str) -> str | None:
        policy = self.policy(model)
        return policy.name if policy else None

    def model_spec(self, model: str) -> ModelSpec | None:
        entry = self._policies.get(model)
        return entry[0] if entry else None

    def pushing(self, model: str) -> PushingConfig:
        entry = self._policies.get(model)
        return entry[0].pushing if entry else _DEFAULT_PUSHING

    # -- availability and selection -----------------------------------------------------

    def is_available(self, target: TargetState, now: float | None = None) -> bool:
        mark = self._marks.get(target.target_id) or _NO_MARK
        at = self.clock() if now is None else now
        cost_model = self._cost_models.get(target.model)
        admits = cost_model.admits if cost_model is not None else None
        return is_available(target, mark, self.pushing(target.model), self.limits, at, admits)

    def select(
        self, request: RequestDescriptor, exclude: AbstractSet[str] = frozenset()
    ) -> Selection:
        healthy = [
            t
            for t in self._targets.values()
            if t.model == request.model and t.healthy and t.target_id not in exclude
        ]
        now = self.clock()
        # ``is_available`` per target, with the model's lookups done once per request.
        entry = self._policies.get(request.model)
        pushing = entry[0].pushing if entry else _DEFAULT_PUSHING
        cost_model = self._cost_models.get(request.model)
        admits = cost_model.admits if cost_model is not None else None
        marks, limits = self._marks, self.limits
        available = [
            t
            for t in healthy
            if is_available(t, marks.get(t.target_id) or _NO_MARK, pushing, limits, now, admits)
        ]
        # LoRA affinity narrows what every policy chooses from (core.lora).
        preferred = lora_affinity(available, request.lora)
        target = entry[1].select(request, preferred) if entry and preferred else None
        return Selection(target, len(healthy), len(available))

    def options(
        self, request: RequestDescriptor, exclude: AbstractSet[str] = frozenset()
    ) -> Options:
        """Healthy replicas of the request's model not yet tried, split into those
        available now (narrowed by LoRA affinity) and those held back."""
        now = self.clock()
        available: list[TargetState] = []
        held_back: list[TargetState] = []
        for t in self.targets():
            if t.model != request.model or not t.healthy or t.target_id in exclude:
                continue
            (available if self.is_available(t, now) else held_back).append(t)
        return Options(lora_affinity(available, request.lora), held_back)

    def observe_first_token(self, request: RequestDescriptor, name: str, ttft_s: float) -> None:
        """The balancer saw ``request``'s first token from replica ``name``.  When
        that made the replica admit again, the requests waiting for it are woken."""
        cost_model = self._cost_models.get(request.model)
        if cost_model is not None and cost_model.observe_first_token(request, name, ttft_s):
            self._notify()

    def observe_finish(
        self, request: RequestDescriptor, name: str, decode_s: float, output_tokens: int
    ) -> None:
        """``request`` ended on ``name`` with ``output_tokens`` after its first token."""
        cost_model = self._cost_models.get(request.model)
        if cost_model is not None:
            cost_model.observe_finish(request, name, decode_s, output_tokens)

    def estimates(self) -> dict[str, float]:
        """Per model priced by a cost model: seconds a new request would queue here."""
        return self._ask_cost_models(lambda model, mine: model.region_estimate(mine))

    def prices(self) -> dict[str, tuple[float, float]]:
        """Per model priced by a cost model: seconds per uncached prompt token and
        per output token here."""
        return self._ask_cost_models(lambda model, mine: model.region_prices(mine))

    def digests(self) -> dict[str, PrefixDigest]:
        """Per model priced by a cost model: what this region's replicas hold, for
        peers (``core.prefix_digest``)."""
        return self._ask_cost_models(lambda model, mine: model.region_digest(mine))

    def _ask_cost_models(
        self, ask: Callable[[CostModel, list[TargetState]], _Answer]
    ) -> dict[str, _Answer]:
        """``ask`` each model's cost model about that model's replicas (the report's
        per-model fields)."""
        out: dict[str, _Answer] = {}
        for name, cost_model in self._cost_models.items():
            mine = [t for t in self._targets.values() if t.model == name]
            out[name] = ask(cost_model, mine)
        return out

    def cost_model(self, model: str) -> CostModel | None:
        """The model's policy when it prices options itself (``place`` asks it)."""
        return self._cost_models.get(model)

    def any_available(self, model: str) -> bool:
        now = self.clock()
        return any(t.model == model and self.is_available(t, now) for t in self._targets.values())

    def lease(self, request: RequestDescriptor, target: TargetState) -> Lease:
        """Take an outstanding slot; its release tells the model's policy how it went."""
        entry = self._policies.get(request.model)
        mark = self._marks.get(target.target_id)
        if mark is not None:
            mark.on_push()
        if self.on_route is not None and request.block_hashes:
            self.on_route(RouteRecord(request.model, target.target_id, request.block_hashes))

        def _done(lease: Lease, ok: bool) -> None:
            current = self._marks.get(lease.target.target_id)
            if current is not None:
                current.on_finish()
            if entry is not None:
                entry[1].on_complete(request, lease.target, ok)
            self._notify()

        return self.ledger.acquire(target, request.request_id, _done)

    def counts(self, model: str | None = None) -> tuple[int, int]:
        """(healthy, available) replicas, for one model or all."""
        now = self.clock()
        chosen = [t for t in self._targets.values() if model is None or t.model == model]
        healthy = [t for t in chosen if t.healthy]
        return len(healthy), sum(1 for t in healthy if self.is_available(t, now))

    def available_by_model(self) -> dict[str, int]:
        now = self.clock()
        out: dict[str, int] = {}
        for t in self._targets.values():
            out[t.model] = out.get(t.model, 0) + int(self.is_available(t, now))
        return out

    def reprobe_candidates(self, model: str, min_age_s: float) -> list[str]:
        """Healthy SP-P replicas of ``model`` held back only by probe news at least
        ``min_age_s`` old: worth probing again now while requests wait."""
        now = self.clock()
        out = []
        for t in self._targets.values():
            mark = self._marks.get(t.target_id)
            if t.model != model or mark is None:
                continue
            old = mark.probed_at is None or now - mark.probed_at >= min_age_s
            if old and probe_would_help(t, mark, self.pushing(model), self.limits, now):
                out.append(t.target_id)
        return sorted(out)

    # -- sibling processes (core.shared_state) ------------------------------------

    def local_loads(self) -> dict[str, ReplicaLoad]:
        """This process's own load per replica: what it publishes to its siblings."""
        return {
            name: ReplicaLoad(
                self.ledger.outstanding(name),
                mark.unconfirmed if (mark := self._marks.get(name)) else 0,
            )
            for name in sorted(self._targets)
        }

    def apply_peer_loads(self, loads: Mapping[str, ReplicaLoad]) -> None:
        """Adopt siblings' merged load ({} drops it: the local view only)."""
        changed = False
        for name, target in self._targets.items():
            load = loads.get(name)
            outstanding, unconfirmed = (load.outstanding, load.unconfirmed) if load else (0, 0)
            if (target.peer_outstanding, target.peer_unconfirmed) != (outstanding, unconfirmed):
                target.peer_outstanding, target.peer_unconfirmed = outstanding, unconfirmed
                changed = True
        if changed:
            self._notify()  # a sibling's finished request may free a replica

    def learn_route(self, record: RouteRecord) -> bool:
        """Teach the model's policy a sibling's decision; False when it cannot learn it
        (a replica or model this process does not know, or a policy without a prefix
        structure)."""
        target = self._targets.get(record.target)
        learner = self._learners.get(record.model)
        if target is None or learner is None or target.model != record.model:
            return False
        learner.learn_route(record.blocks, record.target)
        return True

    # -- health and load feedback ---------------------------------------------------------

    def mark_failed(self, name: str) -> None:
        """An upstream call failed before its first byte: stop routing to it at once,
        and open its breaker (a hold-down, then trial probes readmit it)."""
        target = self._targets.get(name)
        if target is not None:
            target.healthy = False
            target.consecutive_failures += 1
            self._breakers[name].failed(self.clock())

    def record_probe(self, name: str, load: EngineLoad) -> None:
        target = self._targets.get(name)
        if target is None:
            return
        now = self.clock()
        # The load is news either way; only the breaker says whether it takes requests.
        target.healthy = self._breakers[name].probe_ok(now)
        target.late_probes = 0
        if target.healthy:
            target.consecutive_failures = 0
        target.running, target.waiting, target.kv_usage = load.running, load.waiting, load.kv_usage
        target.lora = load.lora
        cost_model = self._cost_models.get(target.model)
        if cost_model is not None:
            cost_model.observe_probe(name, load.kv_usage)
        if load.prefix_hit_rate is not None:
            target.extra["prefix_hit_rate"] = load.prefix_hit_rate
        mark = self._marks.get(name)
        if mark is not None:
            mark.on_probe(
                now,
                running=load.running,
                waiting=load.waiting,
                outstanding=target.outstanding,
            )
        self._notify()

    def record_probe_failure(self, name: str, threshold: int) -> bool:
        """Count a failed probe; True when this one made the replica unhealthy."""
        target = self._targets.get(name)
        if target is None:
            return False
        target.consecutive_failures += 1
        breaker = self._breakers[name]
        if target.healthy and target.consecutive_failures >= threshold:
            target.healthy = False
            breaker.failed(self.clock())
            return True
        breaker.probe_failed(self.clock())
        return False

    def excuse_late_probe(self, name: str, silent_for_s: float | None, grace_s: float) -> bool:
        """A probe of ``name`` timed out; True when that is lateness, not a failure
        (``core.busy``): the replica answered this balancer's requests
        ``silent_for_s`` ago, within ``grace_s``.  The probe counts as late
        (``late_probes``); its load numbers stay as they were and age
        (``AvailabilityLimits.probe_stale_s``); neither the failure count nor the
        breaker moves.  False: count it as a failure (``record_probe_failure``)."""
        target = self._targets.get(name)
        if target is None or grace_left(silent_for_s, grace_s) <= 0:
            return False
        target.late_probes += 1
        return True

    def record_usage(self, name: str, prompt: int, cached: int, completion: int) -> None:
        usage = self._usage.get(name)
        if usage is None:
            return
        usage.requests += 1
        usage.prompt_tokens += prompt
        usage.cached_tokens += cached
        usage.completion_tokens += completion

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _same_policy(a: ModelSpec, b: ModelSpec) -> bool:
    return (a.policy, dict(a.policy_params)) == (b.policy, dict(b.policy_params))
