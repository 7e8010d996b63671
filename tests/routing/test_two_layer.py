"""SkyLB's two-layer decision (Algorithm 1, HANDLEREQUEST) and the remote layer's
view of its peers, in pure code with a hand-driven clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.engine_metrics import EngineLoad
from core.peers import Heartbeat
from core.policy import Policy, PolicyBase
from core.registry import build_policy, remote_policy_name
from core.remote import RemoteRouter, nothing_available, place
from core.router import LocalRouter
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from core.types import RequestDescriptor, TargetState

MODEL = "m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SnapshotPolicy(PolicyBase):
    """A learning stand-in: remembers which peer each session went to, at select time."""

    name = "snapshot"

    def __init__(self) -> None:
        self.learned: dict[str, str] = {}
        self.completed: list[tuple[str, bool]] = []
        self.targets: list[Sequence[str]] = []

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        known = self.learned.get(request.session_key)
        choice = next((c for c in candidates if c.target_id == known), None)
        if choice is None:
            choice = min(candidates, key=lambda t: (t.extra["rtt_ms"], t.target_id))
        self.learned[request.session_key] = choice.target_id
        return choice

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        self.completed.append((target.target_id, ok))

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        self.targets.append(list(target_ids))


def _request(rid: str = "r", *, session: str = "s", forwarded: bool = False) -> RequestDescriptor:
    return RequestDescriptor(rid, MODEL, 10, session_key=session, forwarded=forwarded)


def _beat(name: str, *, available: int = 1, queue: int = 0) -> Heartbeat:
    return Heartbeat(name, name, f"http://{name}", 0.0, 1, available, 0, queue, {MODEL: available})


class World:
    def __init__(self, replicas: Sequence[str] = ("a",), cap: int = 1) -> None:
        self.clock = Clock()
        self.snapshot = SnapshotPolicy()
        self.local = LocalRouter(build_policy, max_outstanding=cap, clock=self.clock)
        models = {MODEL: ModelSpec(MODEL, "least_load")}
        specs = [ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in replicas]
        self.local.apply(specs, models)
        self.remote = RemoteRouter(
            self._build, lambda name: "snapshot", queue_buffer=1, max_age_s=2.0, clock=self.clock
        )
        peers = [PeerSpec("eu", "http://eu", "eu", 80.0), PeerSpec("ap", "http://ap", "ap", 150.0)]
        self.remote.apply(peers, models)
        self.wakes = 0
        self.local.on_change = self.remote.on_change = self._wake

    def _build(self, name: str, params: Mapping[str, Any]) -> Policy:
        assert name == "snapshot" and params == {}
        return self.snapshot

    def _wake(self) -> None:
        self.wakes += 1


def test_a_local_replica_wins_while_one_is_available() -> None:
    w = World()
    w.remote.record_report("eu", _beat("eu"))
    chosen = place(_request(), w.local, w.remote)
    assert chosen is not None and chosen.peer is None and chosen.target.target_id == "a"
    assert w.snapshot.learned == {}  # the remote layer was not consulted
    chosen.lease.release(ok=True)


def test_full_region_forwards_to_an_available_peer_and_the_snapshot_learns() -> None:
    w = World()
    held = place(_request("r0"), w.local, w.remote)  # fills the cap of 1
    assert held is not None and held.peer is None
    w.remote.record_report("eu", _beat("eu"))
    w.remote.record_report("ap", _beat("ap", available=3))
    w.snapshot.learned["s-ap"] = "ap"
    near = place(_request("r1"), w.local, w.remote)
    learned = place(_request("r2", session="s-ap"), w.local, w.remote)
    assert near is not None and near.peer is not None and near.target.target_id == "eu"
    assert learned is not None and learned.target.target_id == "ap"
    assert w.snapshot.learned["s"] == "eu"
    assert w.remote.ledger.total == 2 and w.local.ledger.total == 1
    near.lease.release(ok=True)
    assert w.snapshot.completed == [("eu", True)]
    for p in (held, learned):
        p.lease.release(ok=True)
    assert w.remote.ledger.total == 0 and w.local.ledger.total == 0


def test_a_forwarded_request_is_never_forwarded_again() -> None:
    w = World(replicas=())
    w.remote.record_report("eu", _beat("eu"))
    assert place(_request(forwarded=True), w.local, w.remote) is None
    assert w.remote.ledger.total == 0 and w.snapshot.learned == {}


def test_forwards_since_the_report_use_up_the_peers_available_replicas() -> None:
    w = World(replicas=())
    w.remote.record_report("eu", _beat("eu", available=1))
    first = place(_request("r1"), w.local, w.remote)
    assert first is not None and first.target.target_id == "eu"
    assert place(_request("r2"), w.local, w.remote) is None  # eu had room for one
    assert nothing_available(MODEL, w.local, w.remote)
    first.lease.release(ok=True)  # a finished forward gives it back
    second = place(_request("r3"), w.local, w.remote)
    assert second is not None and second.target.target_id == "eu"
    w.remote.record_report("eu", _beat("eu", available=2))  # a report starts the count over
    assert w.remote.candidates(MODEL) == [w.remote.link("eu").state]  # type: ignore[union-attr]
    second.lease.release(ok=False)


def test_stale_busy_queued_or_tried_peers_are_not_candidates() -> None:
    w = World(replicas=())
    w.remote.record_report("eu", _beat("eu", queue=2))  # queue over τ = 1
    w.remote.record_report("ap", _beat("ap", available=0))
    assert w.remote.candidates(MODEL) == [] and not w.remote.any_available(MODEL)
    assert w.remote.has_healthy(MODEL)
    w.remote.record_report("eu", _beat("eu", queue=1))  # at τ is still available
    assert [t.target_id for t in w.remote.candidates(MODEL)] == ["eu"]
    assert w.remote.candidates(MODEL, frozenset({"eu"})) == []
    w.clock.now += 2.5  # older than max_age_s
    assert w.remote.candidates(MODEL) == [] and not w.remote.has_healthy(MODEL)
    rows = {r["name"]: r for r in w.remote.view()}
    assert rows["eu"]["alive"] is False and rows["eu"]["rtt_ms"] == 80.0


def test_held_back_peers_serve_the_model_without_room_now() -> None:
    w = World(replicas=())
    w.remote.record_report("eu", _beat("eu", queue=2))  # queue over τ = 1
    w.remote.record_report("ap", _beat("ap", available=0))
    # Neither is a candidate, both serve the model: a forward would wait in their queue.
    assert w.remote.candidates(MODEL) == []
    assert [t.target_id for t in w.remote.peer_options(MODEL)[1]] == ["eu", "ap"]  # nearest first
    assert [t.target_id for t in w.remote.peer_options(MODEL, frozenset({"eu"}))[1]] == ["ap"]
    assert w.remote.peer_options("other-model")[1] == []
    # An available peer is a candidate, never held back.
    w.remote.record_report("eu", _beat("eu", queue=1))
    assert [t.target_id for t in w.remote.candidates(MODEL)] == ["eu"]
    assert [t.target_id for t in w.remote.peer_options(MODEL)[1]] == ["ap"]
    assert w.remote.peer_options(MODEL)[0] == w.remote.candidates(MODEL)
    w.clock.now += 2.5  # older than max_age_s: a stale report says nothing
    assert w.remote.peer_options(MODEL)[1] == []


def test_local_replica_freed_by_a_probe_or_completion_wins_again() -> None:
    w = World()
    w.local.record_probe("a", EngineLoad(running=0, waiting=0, kv_usage=0.0))
    w.remote.record_report("eu", _beat("eu"))
    first = place(_request("r1"), w.local, w.remote)
    assert first is not None and first.peer is None
    # SP-P: one push since the probe, nothing confirmed yet: the next one goes to eu.
    second = place(_request("r2"), w.local, w.remote)
    assert second is not None and second.target.target_id == "eu"
    wakes = w.wakes
    w.local.record_probe("a", EngineLoad(running=1, waiting=0, kv_usage=0.1))
    assert w.wakes == wakes + 1
    third = place(_request("r3"), w.local, w.remote)
    assert third is not None and third.peer is None  # home again
    for p in (first, second, third):
        p.lease.release(ok=True)
    assert w.wakes >= wakes + 4


def test_peer_set_changes_reach_the_remote_policy_and_outstanding_survives() -> None:
    w = World(replicas=())
    w.remote.record_report("eu", _beat("eu"))
    held = place(_request(), w.local, w.remote)
    assert held is not None
    models = {MODEL: ModelSpec(MODEL, "least_load")}
    w.remote.apply([PeerSpec("eu", "http://eu2", "eu", 70.0)], models)
    assert w.snapshot.targets[-1] == ["eu"]
    link = w.remote.link("eu")
    assert link is not None and link.state.outstanding == 1 and link.report is not None
    assert link.state.extra["rtt_ms"] == 70.0
    held.lease.release(ok=True)
    assert link.state.outstanding == 0


def test_the_skylb_snapshot_sends_a_shared_prefix_back_to_the_peer_it_went_to() -> None:
    clock = Clock()
    models = {MODEL: ModelSpec(MODEL, "skylb")}
    local = LocalRouter(build_policy, max_outstanding=1, clock=clock)
    local.apply([], models)  # a region with nothing local: every request is forwarded
    remote = RemoteRouter(
        build_policy, remote_policy_name, queue_buffer=1, max_age_s=2.0, clock=clock
    )
    remote.apply(
        [PeerSpec("eu", "http://eu", "eu", 80.0), PeerSpec("ap", "http://ap", "ap", 150.0)], models
    )
    assert remote.policy_name(MODEL) == "skylb"
    for name in ("eu", "ap"):
        remote.record_report(name, _beat(name, available=5))

    def forward(rid: str, blocks: tuple[int, ...]) -> str:
        request = RequestDescriptor(rid, MODEL, 16 * len(blocks), block_hashes=blocks)
        placed = place(request, local, remote)
        assert placed is not None and placed.peer is not None
        return placed.target.target_id

    first = forward("r1", (1, 2, 3))
    # The snapshot learned r1's prefix at select time: a prompt sharing it follows,
    # although the other peer now has fewer forwarded requests outstanding.
    assert forward("r2", (1, 2, 3, 4)) == first
    assert forward("r3", (7, 8, 9)) != first  # nothing shared: the least-loaded peer
