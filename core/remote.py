"""The remote layer of SkyLB's two-layer routing, and the decision between layers.

``RemoteRouter`` keeps what this balancer knows about its peers: their
availability reports (polled over HTTP from ``/internal/availability``, the
``Heartbeat`` shape), the RTT to each, the requests forwarded to each and not
finished, and one remote-layer policy per model (``remote_policy_name``:
SkyLB's snapshot trie of what this region forwarded, the balancer hash ring for
SkyLB-CH, else nearest-first).

A peer is *available* for a model (Algorithm 1, lines 9-15) when its latest
report is fresh, it has at least one available replica of the model, and its
queue does not exceed τ (``queue_buffer``).  As for replicas under SP-P, the
forwards sent since that report count against its available replicas: a burst
must not all go to a peer that had room for one (a finished forward gives one
back).  Freshness is judged by when *we* received the report, never by the
peer's clock.

``place`` is Algorithm 1's HANDLEREQUEST (§3.1): a local replica when one is
available, otherwise an available peer chosen by the remote policy, unless the
request was already forwarded to us (one hop at most: the peer queues it).
The policy records the choice at select time, which is how the snapshot trie
learns from each forward.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from core.leases import InflightLedger, Lease
from core.peers import Heartbeat
from core.policy import CostModel, Option, Policy
from core.prefix_digest import PrefixDigest
from core.router import Clock, LocalRouter, PolicyBuilder
from core.topology import ModelSpec, PeerSpec
from core.types import RequestDescriptor, TargetState


@dataclass(slots=True)
class PeerLink:
    """One peer balancer: where it is, what it last told us, what we sent since."""

    spec: PeerSpec
    state: TargetState
    report: Heartbeat | None = None
    received_at: float | None = None
    sent_since_report: dict[str, int] = field(default_factory=dict)

    def fresh(self, now: float, max_age_s: float) -> bool:
        return self.received_at is not None and now - self.received_at <= max_age_s

    def queue_for(self, model: str) -> int:
        return 0 if self.report is None else self.report.queue_for(model)

    def estimate_for(self, model: str) -> float:
        """The queueing seconds the peer reported for ``model`` (0 when it prices
        nothing: a peer without a cost model looks as good as its availability)."""
        return 0.0 if self.report is None else self.report.estimates.get(model, 0.0)

    def prices_for(self, model: str) -> tuple[float, float] | None:
        """Seconds per uncached prompt token and per output token the peer reported
        (None: it prices neither)."""
        if self.report is None:
            return None
        prefill = self.report.prefill_prices.get(model)
        decode = self.report.decode_prices.get(model)
        return None if prefill is None or decode is None else (prefill, decode)

    def digest_for(self, model: str) -> PrefixDigest | None:
        """What the peer said its replicas hold for ``model`` (None: it said nothing)."""
        return None if self.report is None else self.report.prefixes.get(model)

    def room_for(self, model: str) -> int:
        """Available replicas the report showed, less the forwards sent since."""
        if self.report is None:
            return 0
        return self.report.models.get(model, 0) - self.sent_since_report.get(model, 0)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes, with the slot already taken (released exactly once)."""

    target: TargetState
    lease: Lease
    peer: PeerLink | None = None
    # The engine priority the request carries to a local replica (``Choice.priority``).
    priority: int | None = None

    @property
    def label(self) -> str:
        return self.target.target_id


class RemoteRouter:
    def __init__(
        self,
        build_policy: PolicyBuilder,
        remote_policy_name: Callable[[str], str],
        *,
        queue_buffer: int,
        max_age_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self.queue_buffer = queue_buffer
        self.max_age_s = max_age_s
        self.clock = clock
        self.ledger = InflightLedger()
        self.on_change: Callable[[], None] | None = None
        self._build_policy = build_policy
        self._remote_policy_name = remote_policy_name
        self._links: dict[str, PeerLink] = {}
        self._policies: dict[str, tuple[str, Mapping[str, Any], Policy]] = {}

    # -- topology and reports -----------------------------------------------------------

    def apply(self, peers: Iterable[PeerSpec], models: Mapping[str, ModelSpec]) -> None:
        """Adopt the peer list and the models' remote policies, keeping reports."""
        fresh: dict[str, PeerLink] = {}
        for spec in peers:
            link = self._links.get(spec.name)
            if link is None:
                link = PeerLink(spec, TargetState(target_id=spec.name, url=spec.url))
            link.spec = spec
            link.state.url, link.state.region = spec.url, spec.region
            link.state.extra["rtt_ms"] = spec.rtt_ms
            link.state.outstanding = self.ledger.outstanding(spec.name)
            fresh[spec.name] = link
        changed = set(fresh) != set(self._links)
        self._links = fresh
        ids = sorted(fresh)
        policies: dict[str, tuple[str, Mapping[str, Any], Policy]] = {}
        for model, model_spec in models.items():
            name = self._remote_policy_name(model_spec.policy)
            # Same-named layers (skylb, skylb_ch) share the service's parameters.
            params = dict(model_spec.policy_params) if name == model_spec.policy else {}
            current = self._policies.get(model)
            if current is not None and (current[0], dict(current[1])) == (name, params):
                policies[model] = current
                if changed:
                    current[2].on_targets_changed(ids)
                continue
            policy = self._build_policy(name, params)
            policy.on_targets_changed(ids)
            policies[model] = (name, params, policy)
        self._policies = policies
        self._notify()

    def record_report(self, name: str, report: Heartbeat) -> None:
        """A peer answered its availability poll: the count of sends starts over."""
        link = self._links.get(name)
        if link is None:
            return
        link.report = report
        link.received_at = self.clock()
        link.sent_since_report = {}
        self._notify()

    def links(self) -> list[PeerLink]:
        return sorted(self._links.values(), key=lambda link: (_rtt(link.spec), link.spec.name))

    def link(self, name: str) -> PeerLink | None:
        return self._links.get(name)

    def policy_name(self, model: str) -> str | None:
        entry = self._policies.get(model)
        return entry[2].name if entry else None

    # -- availability and selection -----------------------------------------------------

    def is_available(self, link: PeerLink, model: str, now: float) -> bool:
        # Algorithm 1, line 12, with the forwards since the report subtracted.
        return (
            link.fresh(now, self.max_age_s)
            and link.room_for(model) > 0
            and link.queue_for(model) <= self.queue_buffer
        )

    def candidates(self, model: str, exclude: AbstractSet[str] = frozenset()) -> list[TargetState]:
        """Available peers for ``model`` as targets, nearest first."""
        now = self.clock()
        return [
            self._as_target(link, model)
            for link in self.links()
            if link.spec.name not in exclude and self.is_available(link, model, now)
        ]

    def peer_options(
        self, model: str, exclude: AbstractSet[str] = frozenset()
    ) -> tuple[list[TargetState], list[TargetState]]:
        """The available peers for ``model`` and the held-back ones (serving it, no
        replica admitting or a queue past τ: a request forwarded there waits in that
        region's queue), each nearest first, in one pass over the links.  A cost
        model weighs both (``CostModel.choose``'s ``held_back_peers``)."""
        now = self.clock()
        available: list[TargetState] = []
        held_back: list[TargetState] = []
        for link in self.links():
            if link.spec.name in exclude:
                continue
            if self.is_available(link, model, now):
                available.append(self._as_target(link, model))
            elif self._serves(link, model, now):
                held_back.append(self._as_target(link, model))
        return available, held_back

    @staticmethod
    def _as_target(link: PeerLink, model: str) -> TargetState:
        """The peer as a target for ``model``, with what its report says of it."""
        state = link.state
        state.waiting = link.queue_for(model)
        state.extra["estimate_s"] = link.estimate_for(model)
        state.extra["healthy_replicas"] = float(link.report.healthy_replicas if link.report else 0)
        prices = link.prices_for(model)
        if prices is None:
            state.extra.pop("prefill_s_per_token", None)
            state.extra.pop("decode_s_per_token", None)
        else:
            state.extra["prefill_s_per_token"] = prices[0]
            state.extra["decode_s_per_token"] = prices[1]
        return state

    def digests(self, model: str, peers: Iterable[TargetState]) -> dict[str, PrefixDigest]:
        """What each of ``peers`` said its replicas hold for ``model``, where it said."""
        out: dict[str, PrefixDigest] = {}
        for peer in peers:
            link = self._links.get(peer.target_id)
            digest = link.digest_for(model) if link is not None else None
            if digest is not None:
                out[peer.target_id] = digest
        return out

    def any_available(self, model: str) -> bool:
        now = self.clock()
        return any(self.is_available(link, model, now) for link in self._links.values())

    def has_healthy(self, model: str) -> bool:
        """Some fresh peer has a healthy replica of ``model`` (busy, maybe)."""
        now = self.clock()
        return any(self._serves(link, model, now) for link in self._links.values())

    def _serves(self, link: PeerLink, model: str, now: float) -> bool:
        """A fresh report with a healthy replica of ``model`` (busy, maybe)."""
        return (
            link.fresh(now, self.max_age_s)
            and link.report is not None
            and link.report.healthy_replicas > 0
            and model in link.report.models
        )

    def select(
        self, request: RequestDescriptor, exclude: AbstractSet[str] = frozenset()
    ) -> TargetState | None:
        entry = self._policies.get(request.model)
        candidates = self.candidates(request.model, exclude)
        if entry is None or not candidates:
            return None
        return entry[2].select(request, candidates)

    def lease(self, request: RequestDescriptor, target: TargetState) -> Lease:
        """Count one forward against the peer; its release tells the remote policy."""
        entry = self._policies.get(request.model)
        link = self._links.get(target.target_id)
        if link is not None:
            sent = link.sent_since_report
            sent[request.model] = sent.get(request.model, 0) + 1

        def _done(lease: Lease, ok: bool) -> None:
            current = self._links.get(lease.target.target_id)
            if current is not None and current.sent_since_report.get(request.model, 0) > 0:
                current.sent_since_report[request.model] -= 1
            if entry is not None:
                entry[2].on_complete(request, lease.target, ok)
            self._notify()

        return self.ledger.acquire(target, request.request_id, _done)

    def view(self) -> list[dict[str, Any]]:
        """Each peer as ``/internal/state`` shows it (the routing view, HTTP-polled)."""
        now = self.clock()
        rows = []
        for link in self.links():
            beat, fresh = link.report, link.fresh(now, self.max_age_s)
            rows.append(
                {
                    "name": link.spec.name,
                    "region": link.spec.region,
                    "url": link.spec.url,
                    "rtt_ms": None if math.isinf(_rtt(link.spec)) else link.spec.rtt_ms,
                    "alive": fresh,
                    "report_age_s": (
                        None if link.received_at is None else round(now - link.received_at, 3)
                    ),
                    "healthy_replicas": beat.healthy_replicas if fresh and beat else 0,
                    "available_replicas": beat.available_replicas if fresh and beat else 0,
                    "inflight": beat.inflight if fresh and beat else 0,
                    "queue": beat.queue if fresh and beat else 0,
                    "models": dict(beat.models) if fresh and beat else {},
                    # What it says it holds, per model: sampled block hashes and stride.
                    "prefixes": (
                        {
                            m: {"hashes": len(d.hashes), "stride": d.stride}
                            for m, d in beat.prefixes.items()
                        }
                        if fresh and beat
                        else {}
                    ),
                    "forwarded_outstanding": link.state.outstanding,
                }
            )
        return rows

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()


def place(
    request: RequestDescriptor,
    local: LocalRouter,
    remote: RemoteRouter,
    *,
    tried: AbstractSet[str] = frozenset(),
    tried_peers: AbstractSet[str] = frozenset(),
    waited_s: float = 0.0,
    queued_ahead: int = 0,
) -> Placement | None:
    """SkyLB Algorithm 1, HANDLEREQUEST: local first, else an available peer, else wait.

    A model whose policy prices options itself (``CostModel``) is placed by
    ``place_by_cost`` instead: replicas, peers and waiting weighed together."""
    cost_model = local.cost_model(request.model)
    if cost_model is not None:
        return place_by_cost(
            cost_model, request, local, remote, tried=tried, tried_peers=tried_peers,
            waited_s=waited_s, queued_ahead=queued_ahead,
        )  # fmt: skip
    target = local.select(request, tried).target
    if target is not None:
        return Placement(target, local.lease(request, target))
    if request.forwarded:
        return None  # one hop at most: the peer that forwarded it is full
    peer = remote.select(request, tried_peers)
    if peer is None:
        return None
    return Placement(peer, remote.lease(request, peer), remote.link(peer.target_id))


def place_by_cost(
    cost_model: CostModel,
    request: RequestDescriptor,
    local: LocalRouter,
    remote: RemoteRouter,
    *,
    tried: AbstractSet[str],
    tried_peers: AbstractSet[str],
    waited_s: float,
    queued_ahead: int,
) -> Placement | None:
    """The cost model's choice among this region's replicas (available or held
    back), its peers (available or held back; none for a request forwarded here:
    one hop) and waiting; None means wait in the queue."""
    options = local.options(request, tried)
    peers: list[TargetState] = []
    held_back: list[TargetState] = []
    if not request.forwarded:
        peers, held_back = remote.peer_options(request.model, tried_peers)
    choice = cost_model.choose(
        request, options.available, options.held_back, peers,
        held_back_peers=held_back, waited_s=waited_s, queued_ahead=queued_ahead,
        peer_prefixes=remote.digests(request.model, [*peers, *held_back]),
    )  # fmt: skip
    target = choice.target
    if target is None or choice.option is Option.WAIT:
        return None
    if choice.option is Option.PEER:
        return Placement(target, remote.lease(request, target), remote.link(target.target_id))
    return Placement(target, local.lease(request, target), priority=choice.priority)


def nothing_available(model: str, local: LocalRouter, remote: RemoteRouter) -> bool:
    """No target of either layer could take a request for ``model`` right now."""
    return not local.any_available(model) and not remote.any_available(model)


def _rtt(spec: PeerSpec) -> float:
    return math.inf if math.isnan(spec.rtt_ms) else spec.rtt_ms


def worth_waiting(
    request: RequestDescriptor, local: LocalRouter, remote: RemoteRouter, tried: AbstractSet[str]
) -> bool:
    """Whether a request nothing can take now should queue: something healthy could
    take it once available again (a replica not yet tried, or, for a request not
    forwarded to us, a peer with healthy replicas); otherwise it is refused at once."""
    if any(
        t.model == request.model and t.healthy and t.target_id not in tried for t in local.targets()
    ):
        return True
    return not request.forwarded and remote.has_healthy(request.model)


def availability_report(
    *,
    balancer: str,
    region: str,
    url: str,
    ts: float,
    local: LocalRouter,
    remote: RemoteRouter,
    queue_lengths: Mapping[str, int],
) -> Heartbeat:
    """This balancer's availability for peers (Algorithm 1, lines 9-10): available
    replicas and queue length per model, with totals, and for models priced by a
    cost model the seconds a request would queue here (``estimates``)."""
    healthy, available = local.counts()
    prices = local.prices()
    # An empty digest is news too: the peer then prices this region as holding
    # nothing, not by what it forwarded here.
    digests = local.digests()
    return Heartbeat(
        balancer=balancer,
        region=region,
        url=url,
        ts=ts,
        healthy_replicas=healthy,
        available_replicas=available,
        inflight=local.ledger.total + remote.ledger.total,
        queue=sum(queue_lengths.values()),
        models=local.available_by_model(),
        queues=dict(queue_lengths),
        estimates={m: s for m, s in local.estimates().items() if math.isfinite(s)},
        prefill_prices={m: p[0] for m, p in prices.items() if math.isfinite(p[0])},
        decode_prices={m: p[1] for m, p in prices.items() if math.isfinite(p[1])},
        prefixes=digests,
    )
