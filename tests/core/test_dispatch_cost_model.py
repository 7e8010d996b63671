"""The cost model through the dispatch core: admission by tokens, waiting on a
held-back replica until its first token comes back, forwarding, heartbeats.

Replicas ``a``/``b`` of one model, ``tokens`` pushing with an admission limit
of 1,000 queued prefill tokens, a clock the test moves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from core.availability import PushingConfig, PushingMode
from core.dispatch import SERVED_AHEAD_LOOKUPS, DispatchCore, Send, Ticket, Wait
from core.peers import Heartbeat
from core.pending_queue import RegionalQueues
from core.registry import build_policy, remote_policy_name
from core.remote import RemoteRouter, availability_report
from core.router import LocalRouter
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from core.types import RequestDescriptor

MODEL = "m"
NEAR = PeerSpec("near", "http://near", "eu", 80.0)


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def build(
    replicas: tuple[str, ...],
    peers: tuple[PeerSpec, ...] = (),
    *,
    engine_queue: str = "fcfs",
    kv_capacity_tokens: int = 32_768,
) -> tuple[Clock, LocalRouter, RemoteRouter, DispatchCore[str]]:
    clock = Clock()
    local = LocalRouter(build_policy, max_outstanding=32, clock=clock)
    remote = RemoteRouter(
        build_policy, remote_policy_name, queue_buffer=1, max_age_s=2.0, clock=clock
    )
    spec = ModelSpec(
        MODEL,
        policy="meridian",
        policy_params={
            "admission_tokens": 1000,
            "decode_weight": 0.0,
            "engine_queue": engine_queue,
            "kv_capacity_tokens": kv_capacity_tokens,
        },
        pushing=PushingConfig(PushingMode.TOKENS),
    )
    names = [ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in replicas]
    local.apply(names, {MODEL: spec})
    remote.apply(peers, {MODEL: spec})
    queues: RegionalQueues[Ticket[str]] = RegionalQueues()
    queues.configure({MODEL: (16, 30.0)})
    core = DispatchCore(local, remote, queues, max_attempts=3, retry_after_s=1, probe_min_gap_s=0)
    return clock, local, remote, core


def ticket(rid: str, tokens: int, *, forwarded: bool = False) -> Ticket[str]:
    blocks = tuple(range(1, tokens // 16 + 1))  # every prompt shares one document
    return Ticket(RequestDescriptor(rid, MODEL, tokens, blocks, forwarded=forwarded), rid)


def sent_to(decision: object) -> str:
    assert isinstance(decision, Send), decision
    return decision.placement.label


def test_a_held_back_replica_admits_again_when_its_first_token_returns() -> None:
    clock, local, _, core = build(("a",))
    big = ticket("big", 1600)
    assert sent_to(core.arrive(big, clock.now)) == "a"
    # 1,600 tokens queued on a: over the limit, so the next one waits.
    assert isinstance(core.arrive(ticket("next", 1632), clock.now), Wait)
    assert core.drain(clock.now).sends == []
    clock.now += 0.9
    core.first_token(big, clock.now)  # the prefill is done: a admits again
    (send,) = core.drain(clock.now).sends
    assert (send.ticket.handle, send.placement.label) == ("next", "a")
    assert send.waited == pytest.approx(0.9)
    # The TTFT taught the policy a's prefill rate: 0.9 s - 31 ms over 1,600 tokens.
    policy = local.cost_model(MODEL)
    assert policy is not None and policy.region_estimate(local.targets()) > 0


def test_an_overdue_drain_offers_the_policy_only_what_is_due_once_nothing_is_available() -> None:
    clock, local, _, core = build(("a",))
    policy = local.cost_model(MODEL)
    assert policy is not None
    offered: list[str] = []
    choose = policy.choose

    def recording(request: RequestDescriptor, *args: Any, **kwargs: Any) -> Any:
        offered.append(request.request_id)
        return choose(request, *args, **kwargs)

    policy.choose = recording  # type: ignore[method-assign]
    assert sent_to(core.arrive(ticket("big", 1600), clock.now)) == "a"  # a held back
    assert isinstance(core.arrive(ticket("old", 320), clock.now), Wait)
    clock.now += 0.3  # past the wait limit (0.25 s): old is due, young is not
    assert isinstance(core.arrive(ticket("young", 320), clock.now), Wait)
    offered.clear()
    (send,) = core.drain(clock.now).sends
    assert (send.ticket.handle, send.placement.label) == ("old", "a")
    # Nothing is available and young has not waited its limit: the policy is not asked.
    assert offered == ["old"]
    clock.now += 0.3
    assert [s.ticket.handle for s in core.drain(clock.now).sends] == ["young"]


def test_behind_longest_prefix_engines_a_cached_prompt_passes_the_queue() -> None:
    # SGLang's engines serve the waiting request with the most cached prompt first,
    # so a request a held-back replica caches goes there at once, past the cold
    # requests waiting here, and a drain with nothing available places it too.
    clock, local, _, core = build(("a",), engine_queue="lpm")
    policy = local.cost_model(MODEL)
    assert policy is not None and policy.engines_reorder
    assert sent_to(core.arrive(ticket("big", 1600), clock.now)) == "a"  # a held back
    cold = Ticket(RequestDescriptor("cold", MODEL, 800, tuple(range(500, 550))), "cold")
    assert isinstance(core.arrive(cold, clock.now), Wait)
    assert sent_to(core.arrive(ticket("turn", 1632), clock.now)) == "a"  # 1,600 cached
    # A sibling process routes another document to a while one of its turns waits
    # here: nothing is available, yet the drain places the turn and leaves cold.
    doc = Ticket(RequestDescriptor("doc", MODEL, 640, tuple(range(900, 940))), "doc")
    assert isinstance(core.arrive(doc, clock.now), Wait)
    policy.learn_route(tuple(range(900, 940)), "a")  # type: ignore[attr-defined]
    (send,) = core.drain(clock.now).sends
    assert (send.ticket.handle, send.placement.label) == ("doc", "a")
    assert [e.payload.handle for e in core.queues.for_model(MODEL)] == ["cold"]
    # Before first-come engines (vLLM's) the same turn waits behind cold.
    clock, local, _, core = build(("a",))
    assert sent_to(core.arrive(ticket("big", 1600), clock.now)) == "a"
    assert isinstance(core.arrive(ticket("cold", 320), clock.now), Wait)
    assert isinstance(core.arrive(ticket("turn", 1632), clock.now), Wait)


def test_a_drain_looks_up_so_many_prefixes_behind_a_long_queue_and_no_more() -> None:
    clock, local, _, core = build(("a",), engine_queue="lpm")
    core.queues.configure({MODEL: (SERVED_AHEAD_LOOKUPS + 8, 30.0)})
    policy = local.cost_model(MODEL)
    assert policy is not None
    looked: list[str] = []
    served_ahead = policy.served_ahead

    def counting(request: RequestDescriptor) -> bool:
        looked.append(request.request_id)
        return served_ahead(request)

    policy.served_ahead = counting  # type: ignore[method-assign]
    assert sent_to(core.arrive(ticket("big", 1600), clock.now)) == "a"  # a held back
    for i in range(SERVED_AHEAD_LOOKUPS):
        cold = range(10_000 + 100 * i, 10_020 + 100 * i)
        assert isinstance(
            core.arrive(
                Ticket(RequestDescriptor(f"c{i}", MODEL, 320, tuple(cold)), f"c{i}"), clock.now
            ),
            Wait,
        )
    doc = Ticket(RequestDescriptor("doc", MODEL, 640, tuple(range(900, 940))), "doc")
    assert isinstance(core.arrive(doc, clock.now), Wait)
    policy.learn_route(tuple(range(900, 940)), "a")  # type: ignore[attr-defined]
    looked.clear()
    # Every lookup went to the cold entries ahead of doc: it waits for the next drain
    # with room to spare, or for its patience to run out.
    assert core.drain(clock.now).sends == []
    assert len(looked) == SERVED_AHEAD_LOOKUPS and "doc" not in looked
    clock.now += 0.3
    assert "doc" in [s.ticket.handle for s in core.drain(clock.now).sends]


def test_a_first_token_that_reopens_a_replica_wakes_the_driver_and_no_other_does() -> None:
    clock, local, _, core = build(("a",))
    woken: list[float] = []
    local.on_change = lambda: woken.append(clock.now)
    small, big = ticket("small", 320), ticket("big", 1600)
    assert sent_to(core.arrive(small, clock.now)) == "a"
    assert sent_to(core.arrive(big, clock.now)) == "a"  # 320 queued: under the limit
    assert isinstance(core.arrive(ticket("next", 1632), clock.now), Wait)
    clock.now += 0.2
    core.first_token(small, clock.now)  # 1,600 still queued: a admits no more than before
    assert woken == []
    clock.now += 0.7
    core.first_token(big, clock.now)  # nothing queued: the waiting request can go now
    assert woken == [clock.now]
    core.first_token(big, clock.now + 0.1)  # a duplicate changes nothing
    assert woken == [clock.now]
    assert [s.ticket.handle for s in core.drain(clock.now).sends] == ["next"]


def test_the_cost_model_sticks_to_the_prefix_and_spreads_cold_work() -> None:
    clock, _, _, core = build(("a", "b"))
    first = ticket("first", 640)
    assert sent_to(core.arrive(first, clock.now)) == "a"
    core.first_token(first, clock.now + 0.4)
    # The follow-up shares 640 cached tokens on a: a is cheaper than cold b.
    assert sent_to(core.arrive(ticket("follow", 704), clock.now)) == "a"
    # A cold prompt behind a's queued work goes to idle b.
    cold = Ticket(RequestDescriptor("cold", MODEL, 800, tuple(range(500, 550))), "cold")
    assert sent_to(core.arrive(cold, clock.now)) == "b"


def test_forwarding_happens_when_the_peer_beats_waiting_and_never_twice() -> None:
    clock, local, remote, core = build(("a",), (NEAR,))
    beat = Heartbeat("near", "eu", "http://near", 0.0, 1, 1, 0, 0, {MODEL: 1}, estimates={MODEL: 0})
    remote.record_report("near", beat)
    assert sent_to(core.arrive(ticket("big", 8000), clock.now)) == "a"
    # a queues 8,000 tokens (4 s); the peer is 80 ms plus its own empty queue away.  A
    # cold prompt, which a holds nothing of, goes to the cheaper peer ...
    cold = Ticket(RequestDescriptor("r1", MODEL, 300, tuple(range(900, 918))), "r1")
    assert sent_to(core.arrive(cold, clock.now)) == "near"
    # ... while one that a caches part of stays for its holder until the wait limit
    # (prefix affinity: a forward would copy the prefix into the peer's cache).
    assert isinstance(core.arrive(ticket("held", 300), clock.now), Wait)
    # A request forwarded here may not go on to another peer: it waits.
    assert isinstance(core.arrive(ticket("r2", 300, forwarded=True), clock.now), Wait)
    report = availability_report(
        balancer="us", region="us", url="http://us", ts=clock.now,
        local=local, remote=remote, queue_lengths={MODEL: 1},
    )  # fmt: skip
    # The region tells its peers how long a new request would queue for prefill.
    assert report.estimates[MODEL] == pytest.approx(8000 * 0.53e-3)
    assert Heartbeat.from_json(report.to_json()).estimates == report.estimates
    # And what one uncached prompt token costs here (nothing decodes yet: the rate alone),
    # and one output token (decode terms are off in this service: nothing).
    assert report.prefill_prices[MODEL] == pytest.approx(0.53e-3)
    assert report.decode_prices[MODEL] == 0.0
    beat = Heartbeat.from_json(report.to_json())
    assert (beat.prefill_prices, beat.decode_prices) == (
        report.prefill_prices,
        report.decode_prices,
    )


def test_a_peers_reported_prices_reach_the_cost_model_and_go_with_them() -> None:
    _, _, remote, _ = build(("a",), (NEAR,))
    priced = Heartbeat(
        "near", "eu", "http://near", 0.0, 1, 1, 0, 0, {MODEL: 1},
        estimates={MODEL: 0.5}, prefill_prices={MODEL: 2e-3}, decode_prices={MODEL: 0.04},
    )  # fmt: skip
    remote.record_report("near", priced)
    (peer,) = remote.candidates(MODEL)
    assert (peer.extra["prefill_s_per_token"], peer.extra["decode_s_per_token"]) == (2e-3, 0.04)
    # A later report without prices (an older peer) leaves none behind.
    remote.record_report("near", replace(priced, prefill_prices={}, decode_prices={}))
    (peer,) = remote.candidates(MODEL)
    assert "prefill_s_per_token" not in peer.extra
    assert "decode_s_per_token" not in peer.extra


def test_a_region_reports_what_its_replicas_hold_and_peers_forward_by_it() -> None:
    clock, local, remote, core = build(("a",))
    doc = ticket("doc", 4096)  # 256 blocks
    assert sent_to(core.arrive(doc, clock.now)) == "a"
    core.first_token(doc, clock.now + 2.2)  # prefilled: nothing queues there now
    report = availability_report(
        balancer="eu", region="eu", url="http://eu", ts=clock.now,
        local=local, remote=remote, queue_lengths={},
    )  # fmt: skip
    digest = report.prefixes[MODEL]
    assert digest.held_blocks(doc.request.block_hashes) == 256
    beat = Heartbeat.from_json(report.to_json())
    assert beat.prefixes == report.prefixes
    # In another region, the same document asked for again.  Nothing here holds it:
    # told nothing, an idle local replica beats a cold prefill 80 ms away ...
    told = replace(beat, balancer="near", models={MODEL: 1})
    clock2, _, remote2, core2 = build(("b",), (NEAR,))
    remote2.record_report("near", replace(told, prefixes={}))
    assert remote2.digests(MODEL, remote2.candidates(MODEL)) == {}
    assert sent_to(core2.arrive(ticket("cold", 4160), clock2.now)) == "b"
    # ... while a peer that says it holds the document is cheaper by its prefill.
    clock3, _, remote3, core3 = build(("b",), (NEAR,))
    remote3.record_report("near", told)
    assert sent_to(core3.arrive(ticket("again", 4160), clock3.now)) == "near"


def test_a_document_held_by_a_peer_with_no_room_is_forwarded_to_wait_there() -> None:
    # The peer holds a 4,096-token document (its digest says so), and its one replica
    # queues 1,200 tokens of other prefill: over the admission limit, so the peer
    # reports no room and Algorithm 1 would not forward there at all.
    clock, local, remote, core = build(("a",))
    doc = ticket("doc", 4096)
    assert sent_to(core.arrive(doc, clock.now)) == "a"
    core.first_token(doc, clock.now + 2.2)
    other = Ticket(RequestDescriptor("other", MODEL, 1200, tuple(range(700, 775))), "other")
    assert sent_to(core.arrive(other, clock.now)) == "a"
    report = availability_report(
        balancer="near", region="eu", url="http://near", ts=clock.now,
        local=local, remote=remote, queue_lengths={MODEL: 0},
    )  # fmt: skip
    assert report.models == {MODEL: 0}
    clock2, _, remote2, core2 = build(("b",), (NEAR,))
    remote2.record_report("near", Heartbeat.from_json(report.to_json()))
    assert remote2.candidates(MODEL) == []
    assert [p.target_id for p in remote2.peer_options(MODEL)[1]] == ["near"]
    # The document's next request goes to wait for the peer's replica (80 ms, then
    # 1,200 queued tokens), not cold onto idle b (4,160 tokens of prefill) ...
    assert sent_to(core2.arrive(ticket("again", 4160), clock2.now)) == "near"
    # ... while a prompt the peer holds nothing of stays here.
    cold = Ticket(RequestDescriptor("cold", MODEL, 800, tuple(range(900, 950))), "cold")
    assert sent_to(core2.arrive(cold, clock2.now)) == "b"


def test_a_send_carries_the_priority_the_cost_model_gave_it() -> None:
    """Engines that schedule by priority (vLLM's ``--scheduling-policy priority``): the
    placement says what the driver puts in the request; other engines get none."""
    clock, _, _, core = build(("a",), engine_queue="priority", kv_capacity_tokens=600)
    cold = core.arrive(ticket("cold", 640), clock.now)  # a cold copy larger than the cache
    assert isinstance(cold, Send) and cold.placement.priority == 1
    core.first_token(cold.ticket, clock.now)
    core.finished(cold.ticket, ok=True, now=clock.now, output_tokens=8)
    warm = core.arrive(ticket("warm", 960), clock.now)  # the first 640 tokens cached at a
    assert isinstance(warm, Send) and warm.placement.priority == 0
    clock, _, _, fcfs = build(("a",))
    plain = fcfs.arrive(ticket("plain", 640), clock.now)
    assert isinstance(plain, Send) and plain.placement.priority is None
