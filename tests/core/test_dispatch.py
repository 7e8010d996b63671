"""The dispatch core's decisions, event by event, with no loop and no clock of its own.

A small world: replicas ``a``/``b``/``c`` of one model under SP-O with one slot
each (a held lease fills a replica), peers with reports recorded by hand, a
clock the test moves, and handles that are just request ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from core.availability import PushingConfig, PushingMode
from core.backoff import RetryBackoff
from core.dispatch import (
    DispatchCore,
    Failure,
    Refuse,
    Send,
    Ticket,
    Wait,
)
from core.engine_metrics import EngineLoad
from core.leases import Lease
from core.peers import Heartbeat
from core.pending_queue import RegionalQueues
from core.registry import build_policy, remote_policy_name
from core.remote import RemoteRouter
from core.router import LocalRouter
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from core.types import RequestDescriptor

MODEL = "m"
SP_O = PushingConfig(PushingMode.SP_O)
SP_P = PushingConfig(PushingMode.SP_P)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    clock: Clock
    local: LocalRouter
    remote: RemoteRouter
    queues: RegionalQueues[Ticket[str]]
    core: DispatchCore[str]
    left: set[str] = field(default_factory=set)
    offered: list[str] = field(default_factory=list)

    @property
    def now(self) -> float:
        return self.clock.now

    def arrive(self, rid: str, *, forwarded: bool = False) -> Send[str] | Wait[str] | Refuse[str]:
        descriptor = RequestDescriptor(rid, MODEL, prompt_tokens=16, forwarded=forwarded)
        return self.core.arrive(Ticket(descriptor, rid), self.now)

    def hold(self, name: str) -> Lease:
        """Fill replica ``name``'s one slot, as a request already running there."""
        target = self.local.target(name)
        assert target is not None
        return self.local.lease(RequestDescriptor("held", MODEL, 16), target)

    def report(self, peer: str, *, available: int = 1) -> None:
        """A peer's availability report: ``available`` replicas of the model, one healthy."""
        beat = Heartbeat(peer, peer, f"http://{peer}", 0.0, 1, available, 0, 0, {MODEL: available})
        self.remote.record_report(peer, beat)

    def waiting(self) -> list[str]:
        return [entry.payload.handle for entry in self.queues.for_model(MODEL)]


def world(
    replicas: tuple[str, ...] = ("a",),
    *,
    peers: tuple[PeerSpec, ...] = (),
    pushing: PushingConfig = SP_O,
    max_attempts: int = 3,
    queue_max_len: int = 8,
    queue_max_wait_s: float = 1.0,
    backoff: RetryBackoff | None = None,
) -> World:
    clock = Clock()
    local = LocalRouter(build_policy, max_outstanding=1, clock=clock)
    remote = RemoteRouter(
        build_policy, remote_policy_name, queue_buffer=1, max_age_s=2.0, clock=clock
    )
    spec = ModelSpec(
        MODEL, pushing=pushing, queue_max_len=queue_max_len, queue_max_wait_s=queue_max_wait_s
    )
    specs = [ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in replicas]
    local.apply(specs, {MODEL: spec})
    remote.apply(peers, {MODEL: spec})
    queues: RegionalQueues[Ticket[str]] = RegionalQueues()
    queues.configure({MODEL: (queue_max_len, queue_max_wait_s)})
    left: set[str] = set()
    offered: list[str] = []

    def alive(ticket: Ticket[str]) -> bool:
        offered.append(ticket.handle)  # the drain offered it a target
        return ticket.handle not in left

    core = DispatchCore(
        local,
        remote,
        queues,
        max_attempts=max_attempts,
        retry_after_s=2,
        probe_min_gap_s=0.02,
        alive=alive,
        backoff=backoff,
    )
    return World(clock, local, remote, queues, core, left, offered)


def sent(decision: object) -> Send[str]:
    assert isinstance(decision, Send), decision
    return decision


def refused(decision: object) -> tuple[int, str | None]:
    assert isinstance(decision, Refuse), decision
    return decision.error.status, decision.error.code


def drained(w: World) -> list[tuple[str, str]]:
    return [(s.ticket.handle, s.placement.label) for s in w.core.drain(w.now).sends]


NEAR = PeerSpec("near", "http://near", "eu", 80.0)
FAR = PeerSpec("far", "http://far", "ap", 150.0)


# -- arrivals -------------------------------------------------------------------------


def test_an_arrival_with_an_available_replica_is_sent_with_its_lease_taken() -> None:
    w = world(("a", "b"))
    send = sent(w.arrive("r1"))
    assert send.placement.label == "a" and not send.retry and send.waited is None
    assert send.ticket.tried == {"a"} and send.ticket.attempts == 1
    assert w.local.ledger.outstanding("a") == 1


def test_a_newcomer_never_overtakes_requests_already_waiting() -> None:
    w = world()
    held = w.hold("a")
    assert isinstance(w.arrive("r1"), Wait)
    held.release(ok=True)  # a is free, but the drain has not run yet
    assert isinstance(w.arrive("r2"), Wait)
    assert drained(w) == [("r1", "a")]
    assert w.waiting() == ["r2"]


def test_nothing_available_but_something_healthy_waits_until_a_drain_places_it() -> None:
    w = world()
    held = w.hold("a")
    assert isinstance(w.arrive("r1"), Wait)
    assert drained(w) == []
    w.clock.now += 0.25
    held.release(ok=True)
    (send,) = w.core.drain(w.now).sends
    assert (send.placement.label, send.retry) == ("a", False)
    assert send.waited == pytest.approx(0.25)
    assert w.waiting() == []


def test_a_full_queue_refuses_with_429() -> None:
    w = world(queue_max_len=1)
    w.hold("a")
    assert isinstance(w.arrive("r1"), Wait)
    assert refused(w.arrive("r2")) == (429, "queue_full")
    assert w.waiting() == ["r1"]


def test_nothing_healthy_anywhere_is_refused_at_once_not_queued() -> None:
    w = world(replicas=())
    assert refused(w.arrive("r1")) == (503, "no_healthy_replica")
    assert w.waiting() == []


def test_no_local_room_forwards_to_the_nearest_available_peer() -> None:
    w = world(peers=(FAR, NEAR))
    w.report("near")
    w.report("far")
    w.hold("a")
    send = sent(w.arrive("r1"))
    assert send.placement.label == "near" and send.placement.peer is not None
    assert send.ticket.tried_peers == {"near"} and w.remote.ledger.total == 1


def test_a_forwarded_request_waits_for_a_local_replica_never_a_peer() -> None:
    w = world(peers=(NEAR,))
    w.report("near")
    held = w.hold("a")
    assert isinstance(w.arrive("r1", forwarded=True), Wait)
    held.release(ok=True)
    assert drained(w) == [("r1", "a")]


def test_a_forwarded_request_with_no_local_replica_is_refused() -> None:
    w = world(replicas=(), peers=(NEAR,))
    w.report("near")
    assert refused(w.arrive("r1", forwarded=True)) == (503, "no_healthy_replica")


# -- failures and retries ---------------------------------------------------------------


def test_a_broken_replica_is_marked_and_the_retry_goes_elsewhere() -> None:
    w = world(("a", "b"))
    ticket = sent(w.arrive("r1")).ticket
    send = sent(w.core.failed(ticket, Failure("HTTP 500", 500), w.now))
    assert send.placement.label == "b" and send.retry
    target = w.local.target("a")
    assert target is not None and not target.healthy
    assert w.local.ledger.outstanding("a") == 0 and w.local.ledger.outstanding("b") == 1


def test_each_retry_waits_a_jittered_backoff_from_the_injected_source() -> None:
    half = RetryBackoff(base_s=0.1, max_s=1.0, uniform=lambda: 0.5)
    w = world(("a", "b", "c"), backoff=half)
    first = sent(w.arrive("r1"))
    assert first.delay_s == 0.0  # a first attempt goes at once
    second = sent(w.core.failed(first.ticket, Failure("HTTP 500", 500), w.now))
    third = sent(w.core.failed(second.ticket, Failure("reset"), w.now))
    assert (second.delay_s, third.delay_s) == (0.05, 0.1)  # half of 0.1, then of 0.2


def test_a_busy_replica_is_skipped_but_not_marked_unhealthy() -> None:
    w = world(("a", "b"))
    ticket = sent(w.arrive("r1")).ticket
    send = sent(w.core.failed(ticket, Failure("HTTP 429", 429, capacity=True), w.now))
    target = w.local.target("a")
    assert send.placement.label == "b" and target is not None and target.healthy


def test_a_retry_overtakes_the_queue_and_waits_at_its_front() -> None:
    w = world(("a", "b"))
    held = w.hold("a")
    first = sent(w.arrive("r1"))
    assert first.placement.label == "b"
    assert isinstance(w.arrive("r2"), Wait)
    busy = Failure("HTTP 429", 429, capacity=True)
    assert isinstance(w.core.failed(first.ticket, busy, w.now), Wait)
    assert w.waiting() == ["r1", "r2"]  # it arrived before r2
    held.release(ok=True)
    sends = w.core.drain(w.now).sends
    assert [(s.ticket.handle, s.placement.label, s.retry) for s in sends] == [
        ("r1", "a", True),
        ("r2", "b", False),
    ]


def test_after_max_attempts_a_broken_target_makes_it_a_502() -> None:
    w = world(("a", "b", "c"), max_attempts=2)
    ticket = sent(w.arrive("r1")).ticket
    sent(w.core.failed(ticket, Failure("refused"), w.now))
    refusal = w.core.failed(ticket, Failure("reset"), w.now)
    assert refused(refusal) == (502, "upstream_error")
    assert isinstance(refusal, Refuse) and "2 replica(s)" in refusal.error.message
    assert "reset" in refusal.error.message
    assert w.local.ledger.total == 0


def test_every_replica_broken_is_a_502_not_a_wait() -> None:
    w = world(("a", "b"))
    ticket = sent(w.arrive("r1")).ticket
    sent(w.core.failed(ticket, Failure("HTTP 500", 500), w.now))
    assert refused(w.core.failed(ticket, Failure("HTTP 503", 503), w.now)) == (
        502,
        "upstream_error",
    )
    assert w.waiting() == []


def test_every_replica_busy_is_a_429_at_capacity() -> None:
    w = world()
    ticket = sent(w.arrive("r1")).ticket
    busy = Failure("HTTP 429", 429, capacity=True)
    assert refused(w.core.failed(ticket, busy, w.now)) == (429, "capacity_exceeded")


def test_a_refusing_peer_falls_through_to_the_next_nearest() -> None:
    w = world(replicas=(), peers=(FAR, NEAR))
    w.report("near")
    w.report("far")
    ticket = sent(w.arrive("r1")).ticket
    send = sent(w.core.failed(ticket, Failure("HTTP 503", 503), w.now))
    assert send.placement.label == "far" and ticket.tried_peers == {"near", "far"}
    assert w.remote.ledger.total == 1  # the refused forward's slot came back


def test_a_refused_forward_waits_for_the_local_replica_it_did_not_try() -> None:
    w = world(peers=(NEAR,))
    w.report("near")
    held = w.hold("a")
    ticket = sent(w.arrive("r1")).ticket
    assert isinstance(w.core.failed(ticket, Failure("HTTP 503", 503), w.now), Wait)
    held.release(ok=True)
    assert drained(w) == [("r1", "a")]


def test_a_failure_after_the_first_byte_still_marks_the_replica() -> None:
    w = world(("a", "b"))
    ticket = sent(w.arrive("r1")).ticket
    w.core.finished(ticket, ok=False, failure=Failure("failed mid-stream"))
    target = w.local.target("a")
    assert target is not None and not target.healthy and w.local.ledger.total == 0
    w.core.finished(ticket, ok=False)  # a second settle is harmless
    assert w.local.ledger.total == 0


# -- clients that leave -----------------------------------------------------------------


def test_cancel_while_queued_takes_it_out_and_says_how_long_it_waited() -> None:
    w = world()
    held = w.hold("a")
    wait = w.arrive("r1")
    assert isinstance(wait, Wait)
    w.clock.now += 0.5
    assert w.core.cancel(wait.ticket, w.now) == pytest.approx(0.5)
    held.release(ok=True)
    assert w.waiting() == [] and drained(w) == []


def test_cancel_after_a_drain_placed_it_gives_the_slot_back() -> None:
    w = world()
    held = w.hold("a")
    wait = w.arrive("r1")
    assert isinstance(wait, Wait)
    held.release(ok=True)
    assert drained(w) == [("r1", "a")]
    assert w.core.cancel(wait.ticket, w.now) is None
    assert w.local.ledger.total == 0


def test_a_drain_skips_a_request_whose_client_left() -> None:
    w = world()
    held = w.hold("a")
    assert isinstance(w.arrive("r1"), Wait)
    assert isinstance(w.arrive("r2"), Wait)
    w.left.add("r1")
    held.release(ok=True)
    assert drained(w) == [("r2", "a")]
    assert w.waiting() == ["r1"]  # its own cancel takes it out


# -- the drain --------------------------------------------------------------------------


def test_a_drain_stops_offering_once_nothing_is_available() -> None:
    w = world()
    held = w.hold("a")
    for rid in ("r1", "r2", "r3"):
        assert isinstance(w.arrive(rid), Wait)
    assert drained(w) == [] and w.offered == []  # nothing available: nobody offered
    held.release(ok=True)
    assert drained(w) == [("r1", "a")]
    assert w.offered == ["r1"]  # a is taken again: r2 and r3 are not even offered


def test_a_drain_passes_over_a_forwarded_request_to_give_a_peer_the_next_one() -> None:
    w = world(peers=(NEAR,))
    w.report("near", available=0)  # alive, but full
    w.hold("a")
    assert isinstance(w.arrive("r1", forwarded=True), Wait)
    assert isinstance(w.arrive("r2"), Wait)
    w.report("near", available=1)
    assert drained(w) == [("r2", "near")]
    assert w.waiting() == ["r1"]


def test_a_drain_names_sp_p_replicas_held_back_by_an_old_probe_for_a_reprobe() -> None:
    w = world(pushing=SP_P)
    w.local.record_probe("a", EngineLoad(running=1, waiting=2, kv_usage=0.5))
    assert isinstance(w.arrive("r1"), Wait)
    assert w.core.drain(w.now).probe == []  # the probe is brand new
    w.clock.now += 0.05
    assert w.core.drain(w.now).probe == ["a"]
    w.local.record_probe("a", EngineLoad(running=1, waiting=0, kv_usage=0.5))
    result = w.core.drain(w.now)
    assert [s.ticket.handle for s in result.sends] == ["r1"] and result.probe == []


# -- deadlines --------------------------------------------------------------------------


def test_a_request_past_its_deadline_is_refused_with_503() -> None:
    w = world(queue_max_wait_s=1.0)
    w.hold("a")
    wait = w.arrive("r1")
    assert isinstance(wait, Wait)
    deadline = w.core.timer()
    assert deadline == pytest.approx(w.now + 1.0)
    (refusal,) = w.core.expire(deadline)
    assert refused(refusal) == (503, "queue_timeout")
    assert refusal.waited == pytest.approx(1.0) and refusal.ticket is wait.ticket
    assert w.waiting() == []


def test_the_timer_is_armed_only_for_an_earlier_deadline() -> None:
    w = world(queue_max_wait_s=1.0)
    w.hold("a")
    w.arrive("r1")
    assert w.core.timer() == pytest.approx(101.0)
    w.clock.now += 0.5
    w.arrive("r2")
    assert w.core.timer() is None  # the timer armed for r1 fires first and re-arms
    w.queues.configure({MODEL: (8, 0.1)})  # the service's bound shrank
    r3 = w.arrive("r3")
    assert isinstance(r3, Wait)
    assert w.core.timer() == pytest.approx(100.6)  # earlier: arm (a driver may cancel 101.0)
    w.core.cancel(r3.ticket, w.now)
    assert w.core.expire(100.6) == []  # nothing due any more
    assert w.core.timer() == pytest.approx(101.0)
    assert [r.ticket.handle for r in w.core.expire(101.0)] == ["r1"]
    assert w.core.timer() == pytest.approx(101.5)
    assert w.core.expire(101.0) == []  # the superseded 101.0 timer, fired in virtual time
    assert w.waiting() == ["r2"]


def test_the_core_refuses_a_nonsense_attempt_budget() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        DispatchCore(
            LocalRouter(build_policy, max_outstanding=1),
            RemoteRouter(build_policy, remote_policy_name, queue_buffer=1, max_age_s=1.0),
            RegionalQueues(),
            max_attempts=0,
            retry_after_s=1,
            probe_min_gap_s=0.0,
        )


# -- the load forecast (PreServe) ---------------------------------------------------


def test_a_sent_request_enters_its_replicas_map_and_leaves_it_on_completion() -> None:
    w = world(("a",))
    send = sent(w.arrive("r1"))
    # No predictor runs here: the descriptor carries no prediction (the policy keeps
    # its own estimate), and the map takes the "none" predictor's figure.
    assert send.ticket.request.predicted_output_tokens is None
    ahead = w.core.forecast.anticipator("a")
    assert "r1" in ahead
    assert ahead.lookahead()[0] == 16  # its prompt, at the first iteration
    w.core.finished(send.ticket, ok=True, output_tokens=40, now=w.now)
    assert "r1" not in ahead
    (snapshot,) = w.core.forecast.snapshot()
    assert snapshot.tally.completed == 1
    assert snapshot.tally.actual_tokens == 40


def test_a_failed_attempt_leaves_the_map_and_the_retry_enters_the_next_one() -> None:
    w = world(("a", "b"))
    first = sent(w.arrive("r1"))
    retry = sent(w.core.failed(first.ticket, Failure("reset"), w.now))
    assert "r1" not in w.core.forecast.anticipator(first.placement.label)
    assert "r1" in w.core.forecast.anticipator(retry.placement.label)
    w.core.finished(retry.ticket, ok=False)
    assert "r1" not in w.core.forecast.anticipator(retry.placement.label)
    assert all(s.tally.completed == 0 for s in w.core.forecast.snapshot())
