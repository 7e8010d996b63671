"""Sibling processes behind one address: what they publish, how their reports merge,
how a process degrades to its own view and converges again, and how the router and
the policies use the merged view (global least-request, SP-P across processes, and a
prefix routed by a sibling)."""

from __future__ import annotations

import pytest

from core.engine_metrics import EngineLoad
from core.registry import build_policy
from core.router import LocalRouter
from core.shared_state import (
    MAX_BLOCKS_PER_ROUTE,
    ExchangePacer,
    LoggedRoute,
    ReplicaLoad,
    RouteRecord,
    SharedConfig,
    SharedStateError,
    SharedView,
    Step,
    SyncResult,
    decode_loads,
    decode_route,
    encode_loads,
    encode_route,
    merge_peer_loads,
)
from core.topology import ModelSpec, ReplicaSpec
from core.types import RequestDescriptor

MODEL = "m"


def _router(*names: str, policy: str = "least_load", cap: int = 4) -> LocalRouter:
    router = LocalRouter(build_policy, max_outstanding=cap, clock=lambda: 10.0)
    specs = [ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in names]
    router.apply(specs, {MODEL: ModelSpec(MODEL, policy)})
    return router


def _request(rid: str = "r", blocks: tuple[int, ...] = ()) -> RequestDescriptor:
    return RequestDescriptor(rid, MODEL, 16 * max(1, len(blocks)), block_hashes=blocks)


def _logged(entry: str, process: str, target: str, blocks: tuple[int, ...]) -> LoggedRoute:
    return LoggedRoute(entry, process, RouteRecord(MODEL, target, blocks))


# -- encoding -------------------------------------------------------------------------


def test_loads_and_routes_survive_a_round_trip() -> None:
    loads = {"a": ReplicaLoad(3, 1), "b": ReplicaLoad(0, 0)}
    assert decode_loads(encode_loads(loads)) == loads
    record = RouteRecord(MODEL, "a", (1, 0, 2**64 - 1))
    packed = encode_route(record)
    assert decode_route(packed) == record
    assert len(packed) == len(b"m\0a\0") + 8 * 3  # 8 bytes a block, not decimal digits


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (RouteRecord(MODEL, "a", (1, -2)), "unsigned 64-bit"),
        (RouteRecord(MODEL, "a", (2**64,)), "unsigned 64-bit"),
        (RouteRecord("m\0x", "a", (1,)), "without NUL"),
        (RouteRecord(MODEL, "", (1,)), "non-empty"),
    ],
)
def test_a_route_that_cannot_be_packed_is_refused(record: RouteRecord, message: str) -> None:
    with pytest.raises(SharedStateError, match=message):
        encode_route(record)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "must be an object"),
        ('{"a": [1]}', "two counts"),
        ('{"a": [-1, 0]}', "two counts"),
        ('{"a": [true, 0]}', "two counts"),
    ],
)
def test_a_bad_load_report_is_refused_with_a_clear_error(raw: str, message: str) -> None:
    with pytest.raises(SharedStateError, match=message):
        decode_loads(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not packed", "model NUL target NUL blocks"),
        (b"\0a\0", "non-empty"),
        (b"m\0a\0" + b"\1" * 7, "whole 64-bit words"),
        (b"m\0a\0" + b"\0" * 8 * (MAX_BLOCKS_PER_ROUTE + 1), "at most"),
        (b"\xff\0a\0", "UTF-8"),
    ],
)
def test_a_bad_route_record_is_refused_with_a_clear_error(raw: bytes, message: str) -> None:
    with pytest.raises(SharedStateError, match=message):
        decode_route(raw)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="peer_ttl_s"):
        SharedConfig(sync_s=1.0, peer_ttl_s=0.5)
    with pytest.raises(ValueError, match="at least 1"):
        SharedConfig(routes_maxlen=0)
    with pytest.raises(ValueError, match="idle_check_s"):
        SharedConfig(sync_s=0.05, idle_check_s=0.01)


# -- merge rules and the view -----------------------------------------------------------


def test_peer_load_is_the_sum_of_the_other_processes_snapshots() -> None:
    merged = merge_peer_loads(
        {"p2": {"a": ReplicaLoad(2, 1)}, "p3": {"a": ReplicaLoad(1, 0), "b": ReplicaLoad(4, 2)}}
    )
    assert merged == {"a": ReplicaLoad(3, 1), "b": ReplicaLoad(4, 2)}


def test_a_process_learns_its_siblings_routes_but_not_its_own() -> None:
    view = SharedView("p1")
    routes = [
        _logged("1-0", "p1", "a", (1, 2)),
        _logged("2-0", "p2", "b", (3, 4)),
    ]
    learned = view.on_success(5.0, SyncResult({}, routes, read=2, last_id="2-0"), sent=0)
    assert learned == [RouteRecord(MODEL, "b", (3, 4))]
    assert (view.cursor, view.degraded, view.caught_up) == ("2-0", False, True)


def test_a_full_read_batch_is_not_yet_caught_up() -> None:
    view = SharedView("p1", SharedConfig(read_batch=2))
    routes = [_logged(f"{i}-0", "p2", "a", (i,)) for i in (1, 2)]
    view.on_success(1.0, SyncResult({}, routes, read=2, last_id="2-0"), sent=0)
    assert not view.caught_up
    view.on_success(1.1, SyncResult({}, [], read=0, last_id=None), sent=0)
    assert view.caught_up and view.cursor == "2-0"


def test_a_failure_degrades_to_the_local_view_and_keeps_the_routes_to_publish() -> None:
    view = SharedView("p1")
    peers = {"p2": {"a": ReplicaLoad(5, 1)}}
    view.on_success(1.0, SyncResult(peers, [], read=0), sent=0)
    assert view.peer_loads == {"a": ReplicaLoad(5, 1)} and view.peers == 1
    first, second = RouteRecord(MODEL, "a", (1,)), RouteRecord(MODEL, "b", (2,))
    view.record_route(first)
    sent = view.take_outbox()
    view.record_route(second)  # decided while the exchange was in flight
    view.on_failure(sent)
    assert view.degraded and view.peer_loads == {} and view.peers == 0
    assert view.take_outbox() == [first, second]  # order kept for when Redis returns
    assert view.staleness_s(4.0) == 3.0


def test_the_outbox_is_bounded_oldest_first_out() -> None:
    view = SharedView("p1", SharedConfig(outbox_max=2))
    for i in range(5):
        view.record_route(RouteRecord(MODEL, "a", (i,)))
    assert [r.blocks for r in view.take_outbox()] == [(3,), (4,)]
    assert view.dropped == 3


def test_an_overlong_route_is_cut_to_the_record_bound() -> None:
    view = SharedView("p1")
    view.record_route(RouteRecord(MODEL, "a", tuple(range(MAX_BLOCKS_PER_ROUTE + 10))))
    (record,) = view.take_outbox()
    assert len(record.blocks) == MAX_BLOCKS_PER_ROUTE


# -- the router on the merged view -------------------------------------------------------


def test_global_least_request_counts_the_siblings_requests() -> None:
    router = _router("a", "b")
    mine = router.select(_request("1")).target
    assert mine is not None and mine.target_id == "a"
    router.apply_peer_loads({"a": ReplicaLoad(3, 0)})  # a sibling keeps a busy
    router.lease(_request("1"), router.target("b"))  # type: ignore[arg-type]
    # Locally a: 0, b: 1; globally a: 3, b: 1.
    chosen = router.select(_request("2")).target
    assert chosen is not None and chosen.target_id == "b"
    assert router.local_loads() == {"a": ReplicaLoad(0, 0), "b": ReplicaLoad(1, 1)}
    router.apply_peer_loads({})  # degraded: the local view alone
    chosen = router.select(_request("3")).target
    assert chosen is not None and chosen.target_id == "a"


def test_siblings_pushes_count_against_the_sp_p_budget() -> None:
    router = _router("a", policy="least_load")
    router.record_probe("a", EngineLoad(running=0, waiting=0, kv_usage=0.0))
    assert router.any_available(MODEL)
    woken: list[int] = []
    router.on_change = lambda: woken.append(1)
    router.apply_peer_loads({"a": ReplicaLoad(1, 1)})  # a sibling pushed one since its probe
    assert not router.any_available(MODEL)
    router.apply_peer_loads({"a": ReplicaLoad(0, 0)})  # ...and it finished
    assert router.any_available(MODEL) and len(woken) == 2


def test_siblings_requests_count_against_the_sp_o_cap() -> None:
    router = _router("a", cap=2)  # no probe yet: SP-P falls back to SP-O's cap
    router.apply_peer_loads({"a": ReplicaLoad(2, 0)})
    assert router.select(_request()).target is None


def test_every_decision_with_blocks_is_offered_for_publishing() -> None:
    router = _router("a")
    records: list[RouteRecord] = []
    router.on_route = records.append
    target = router.target("a")
    assert target is not None
    router.lease(_request("1", (7, 8)), target)
    router.lease(_request("2"), target)  # no blocks: nothing to index
    assert records == [RouteRecord(MODEL, "a", (7, 8))]


@pytest.mark.parametrize("policy", ["skylb", "sglang", "meridian", "cache_map"])
def test_a_prefix_a_sibling_routed_steers_this_process(policy: str) -> None:
    router = _router("a", "b", "c", policy=policy)
    blocks = tuple(range(100, 140))
    # Make the sibling's choice the one load alone would not pick here.
    for name in ("a", "b", "c"):
        router.record_probe(name, EngineLoad(running=0, waiting=0, kv_usage=0.0))
    assert router.learn_route(RouteRecord(MODEL, "c", blocks))
    chosen = router.select(_request("x", blocks)).target
    assert chosen is not None and chosen.target_id == "c"


def test_a_route_to_an_unknown_replica_or_model_is_not_learned() -> None:
    router = _router("a", policy="skylb")
    assert not router.learn_route(RouteRecord(MODEL, "gone", (1, 2)))
    assert not router.learn_route(RouteRecord("other-model", "a", (1, 2)))
    assert not _router("a").learn_route(RouteRecord(MODEL, "a", (1, 2)))  # least_load


# -- pacing ---------------------------------------------------------------------------------

PACED = SharedConfig(sync_s=0.05, peer_ttl_s=3.0, idle_check_s=0.4)


def _idle(pacer: ExchangePacer, now: float) -> Step:
    return pacer.step(now, local_changed=False, degraded=False)


def test_the_first_tick_a_local_change_or_a_degraded_view_runs_the_full_exchange() -> None:
    pacer = ExchangePacer(PACED)
    assert _idle(pacer, 0.0) is Step.FULL  # never exchanged
    pacer.on_full(0.0, version=7)
    assert pacer.step(0.01, local_changed=True, degraded=False) is Step.FULL
    assert pacer.step(0.01, local_changed=False, degraded=True) is Step.FULL
    assert _idle(pacer, 0.01) is Step.WAIT


def test_an_idle_process_checks_ever_less_often_up_to_the_idle_period() -> None:
    pacer = ExchangePacer(PACED)
    pacer.on_full(0.0, version=7)
    now, gaps = 0.0, []
    while now < 2.9:  # short of the heartbeat (1 s) ... then heartbeats continue it
        now = round(now + 0.05, 2)  # one tick every sync period
        step = _idle(pacer, now)
        if step is Step.FULL:  # the heartbeat
            assert now - (pacer.last_full or 0.0) >= PACED.heartbeat_s
            pacer.on_full(now, version=7)
        elif step is Step.CHECK:
            gaps.append(pacer.interval)
            assert pacer.on_check(now, version=7) is Step.WAIT
    assert gaps[:4] == [0.05, 0.1, 0.2, 0.4] and set(gaps[4:]) == {0.4} and pacer.idle
    assert pacer.full_runs == 3  # t=0 and two heartbeats (every peer_ttl / 3) in 2.9 s
    assert pacer.checks <= 4 + 2.9 / 0.4  # far fewer than one per tick


def test_a_sibling_publishing_ends_the_quiet_spell_and_brings_back_the_fast_period() -> None:
    pacer = ExchangePacer(SharedConfig(sync_s=0.05, peer_ttl_s=6.0, idle_check_s=0.4))
    pacer.on_full(0.0, version=7)
    for now in (0.05, 0.16, 0.37, 0.78):  # each a tick just past the check's due time
        assert _idle(pacer, now) is Step.CHECK
        assert pacer.on_check(now, version=7) is Step.WAIT
    assert pacer.idle and _idle(pacer, 0.8) is Step.WAIT
    assert _idle(pacer, 1.19) is Step.CHECK
    assert pacer.on_check(1.19, version=8) is Step.FULL  # the counter moved
    pacer.on_full(1.2, version=8)
    assert not pacer.idle and pacer.next_check == pytest.approx(1.25)
    # While the sibling stays busy, a due tick runs the exchange without the GET first.
    assert _idle(pacer, 1.25) is Step.FULL
    pacer.on_full(1.25, version=9)
    assert _idle(pacer, 1.3) is Step.FULL  # it moved again: still hot
    pacer.on_full(1.3, version=9)  # nothing new: back to cheap checks
    assert not pacer.hot and _idle(pacer, 1.35) is Step.CHECK
    assert pacer.on_check(1.35, version=None) is Step.FULL  # an unreadable counter: exchange


def test_pacing_off_runs_the_full_exchange_every_tick() -> None:
    pacer = ExchangePacer(SharedConfig(idle_check_s=0.0))
    pacer.on_full(0.0, version=1)
    assert all(_idle(pacer, t / 20) is Step.FULL for t in range(1, 10))
    assert SharedConfig(idle_check_s=0.0).heartbeat_s == SharedConfig().sync_s


def test_a_heartbeat_that_moved_nothing_keeps_the_backoff_and_the_loop_sleeps_till_due() -> None:
    pacer = ExchangePacer(PACED)
    assert pacer.delay_s(0.0, degraded=False) == PACED.sync_s  # never exchanged
    pacer.on_full(0.0, version=7)
    for now in (0.05, 0.16, 0.37, 0.78):
        assert _idle(pacer, now) is Step.CHECK and pacer.on_check(now, 7) is Step.WAIT
    assert pacer.delay_s(0.8, degraded=False) == pytest.approx(0.2)  # heartbeat at 1.0
    assert pacer.delay_s(0.8, degraded=True) == PACED.sync_s  # retry every period
    assert _idle(pacer, 1.0) is Step.FULL
    pacer.on_full(1.0, version=7)  # nothing moved: still idle, next check 0.4 s on
    assert pacer.idle and pacer.delay_s(1.0, degraded=False) == pytest.approx(0.4)
    pacer.on_full(1.1, version=9)  # this process published (or news came): fast again
    assert not pacer.idle and pacer.delay_s(1.1, degraded=False) == pytest.approx(PACED.sync_s)
