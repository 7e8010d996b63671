"""The one interface every routing policy implements, and a base class for it.

A policy picks a target for a request among candidates the balancer already
filtered to the targets *available right now* (healthy, not yet tried for this
request, and passing SkyLB's SP-P/SP-O availability rule, §3.3), and hears
about completions so stateful policies (prefix tries, cache maps) can learn.
A policy never returns a target outside ``candidates``.

The same classes serve both of SkyLB's layers (§3.1): locally the targets are
replicas, remotely they are peer balancers; a policy only sees ``target_id``s.

``on_targets_changed`` tells a policy the full set of targets it may ever be
asked about (replica added or removed, peer set changed): hash rings rebuild
from it, tries and cache maps drop what they hold for targets that left.

Policies hold no globals: each balancer builds its own instances from the
registry (``core.registry``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from core.event_keys import CacheEventSink
from core.prefix_digest import PrefixDigest
from core.types import RequestDescriptor, TargetState


class Policy(Protocol):
    name: str
    # Where the engines' KV events go (``core.event_keys.apply_events``), read by the
    # live consumer and the simulator alike; None: this policy takes none.
    kv_sink: CacheEventSink | None

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        """The target for ``request``, or None when no candidate should take it."""
        ...

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        """Called once per routed request when it finishes, fails or is cancelled."""
        ...

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        """The complete set of known targets, after any change to it."""
        ...


class Option(StrEnum):
    REPLICA = "replica"
    PEER = "peer"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Choice:
    """A cost model's decision: where the request goes (None: wait) and what it
    expects that to cost in seconds; for engines that schedule by priority (vLLM's
    ``--scheduling-policy priority``), the ``priority`` the request should carry
    there (None: send none)."""

    option: Option
    target: TargetState | None
    cost_s: float
    priority: int | None = None


@runtime_checkable
class CostModel(Protocol):
    """A policy that weighs local replicas, peer regions and waiting together.

    ``core.remote.place`` asks such a policy to ``choose`` instead of
    running Algorithm 1's local-first rule, and its token ``admits`` replaces
    SP-P's push budget when the service pushes by ``tokens``.  Timings come from
    the dispatch core (``observe_first_token``/``observe_finish``), KV usage from
    the prober (``observe_probe``); no clock here.
    """

    name: str

    def choose(
        self,
        request: RequestDescriptor,
        available: Sequence[TargetState],
        held_back: Sequence[TargetState],
        peers: Sequence[TargetState],
        *,
        held_back_peers: Sequence[TargetState] = (),
        waited_s: float = 0.0,
        queued_ahead: int = 0,
        peer_prefixes: Mapping[str, PrefixDigest] | None = None,
    ) -> Choice:
        """The cheapest option; ``held_back``: healthy replicas not admitting now;
        ``peers``: available peer regions; ``held_back_peers``: peers serving the
        model with no room now (a forward waits in their queue); ``peer_prefixes``:
        what the peers said they hold, by peer id."""
        ...

    def admits(self, target: TargetState) -> bool:
        """The admission limit: may ``target`` take one more request now?"""
        ...

    def waives_admission(self, waited_s: float) -> bool:
        """A request that waited this long goes to a held-back replica anyway."""
        ...

    @property
    def engines_reorder(self) -> bool:
        """The engines order their waiting queues themselves (by cached prefix), so
        the balancer's first-come queue holds back only what they would too."""
        ...

    def served_ahead(self, request: RequestDescriptor) -> bool:
        """The engines would serve ``request`` ahead of colder waiting requests: it
        may pass the balancer's queue and is priced as soon as it comes."""
        ...

    def region_estimate(self, targets: Sequence[TargetState]) -> float:
        """Seconds a typical new request would wait here before its own prefill
        (queued prefill or KV room, for peers' reports)."""
        ...

    def region_prices(self, targets: Sequence[TargetState]) -> tuple[float, float]:
        """Seconds one uncached prompt token and one output token cost here, the
        delay each adds to the requests decoding here included (for peers' reports)."""
        ...

    def region_digest(self, targets: Sequence[TargetState]) -> PrefixDigest:
        """What ``targets`` hold, sampled for peers' reports (``prefix_digest``)."""
        ...

    def observe_first_token(
        self, request: RequestDescriptor, target_id: str, ttft_s: float
    ) -> bool:
        """The first token of ``request`` reached the balancer ``ttft_s`` after sending.
        True when its prefill leaving the queue made ``target_id`` admit again, so a
        request waiting for it can go now."""
        ...

    def observe_finish(
        self, request: RequestDescriptor, target_id: str, decode_s: float, output_tokens: int
    ) -> None:
        """``request`` produced ``output_tokens`` in ``decode_s`` after its first token."""
        ...

    def observe_probe(self, target_id: str, kv_usage: float) -> None:
        """A probe of ``target_id`` read its KV usage (``TargetState.kv_usage``)."""
        ...


@runtime_checkable
class RouteLearner(Protocol):
    """A policy with a prefix structure that can learn a sibling process's decision.

    ``core.shared_state`` replays the routes of the other processes behind
    the same address through this, so each policy's own structure (with its own
    bound and eviction rule) is the local view of the shared prefix index."""

    def learn_route(self, blocks: Sequence[int], target_id: str) -> None:
        """``blocks`` (a chained block-hash path) was just sent to ``target_id``."""
        ...


class PolicyBase(ABC):
    """No-op ``on_complete``/``on_targets_changed`` so stateless policies stay small."""

    name: str = ""
    kv_sink: CacheEventSink | None = None

    @abstractmethod
    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        """The target for ``request``, or None when no candidate should take it."""

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        return None

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        return None


def load_key(target: TargetState) -> tuple[int, int, int, str]:
    """The order "least loaded first" means everywhere in the core.

    Outstanding requests come first because this balancer updates them on every
    dispatch and completion (its sibling processes' too, through the shared view);
    the probe's waiting/running counts are up to one probe interval old, so they
    only break ties; the id makes the order total
    (tests and the simulator rely on determinism).
    """
    return (target.global_outstanding, target.waiting, target.running, target.target_id)


def least_loaded(candidates: Iterable[TargetState]) -> TargetState | None:
    """The least-loaded candidate by ``load_key``, or None when there is none."""
    return min(candidates, key=load_key, default=None)
