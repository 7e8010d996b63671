"""Local replica selection: health, the per-replica cap, exclusions, and state kept
across topology refreshes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from core.availability import PushingConfig, PushingMode
from core.breaker import BreakerConfig
from core.engine_metrics import EngineLoad
from core.policies.least_load import LeastLoadPolicy
from core.policies.meridian import MeridianPolicy
from core.policy import Policy
from core.registry import build_policy
from core.router import LocalRouter
from core.topology import ModelSpec, ReplicaSpec
from core.types import RequestDescriptor

MODEL = "m"


def _spec(name: str, model: str = MODEL) -> ReplicaSpec:
    return ReplicaSpec(name, f"http://{name}", model, "us", "us-1", "reserved")


def _request(rid: str = "r") -> RequestDescriptor:
    return RequestDescriptor(request_id=rid, model=MODEL, prompt_tokens=10)


def _router(*names: str, cap: int = 2, policy: str = "least_load") -> LocalRouter:
    router = LocalRouter(build_policy, max_outstanding=cap)
    router.apply([_spec(n) for n in names], {MODEL: ModelSpec(MODEL, policy)})
    return router


def test_least_outstanding_replica_is_chosen_and_leases_count() -> None:
    router = _router("a", "b")
    first = router.select(_request()).target
    assert first is not None and first.target_id == "a"
    router.lease(_request(), first)
    second = router.select(_request()).target
    assert second is not None and second.target_id == "b"


def test_replicas_at_the_cap_are_not_candidates() -> None:
    router = _router("a", cap=1)
    target = router.select(_request()).target
    assert target is not None
    lease = router.lease(_request(), target)
    busy = router.select(_request())
    assert (busy.target, busy.healthy, busy.available) == (None, 1, 0)
    lease.release(ok=True)
    assert router.select(_request()).target is target


def test_failed_replica_is_held_down_then_readmitted_by_consecutive_good_probes() -> None:
    clock = [100.0]
    router = LocalRouter(
        build_policy,
        max_outstanding=2,
        breaker=BreakerConfig(hold_down_s=1.0, readmit_after=2),
        clock=lambda: clock[0],
    )
    router.apply([_spec("a"), _spec("b")], {MODEL: ModelSpec(MODEL, "least_load")})
    router.mark_failed("a")
    chosen = router.select(_request()).target
    assert chosen is not None and chosen.target_id == "b"
    a = router.target("a")
    assert a is not None
    good = EngineLoad(running=0, waiting=0, kv_usage=0.1)
    for at, healthy in ((100.5, False), (101.0, False), (101.25, True)):
        clock[0] = at  # held down, first trial probe, second trial probe
        router.record_probe("a", good)
        assert a.healthy is healthy, at
    assert a.consecutive_failures == 0 and a.kv_usage == 0.1


def test_a_failed_trial_probe_holds_a_flapping_replica_down_longer() -> None:
    clock = [0.0]
    router = LocalRouter(
        build_policy,
        max_outstanding=2,
        breaker=BreakerConfig(hold_down_s=1.0, readmit_after=2),
        clock=lambda: clock[0],
    )
    router.apply([_spec("a")], {MODEL: ModelSpec(MODEL, "least_load")})
    good = EngineLoad(running=0, waiting=0, kv_usage=0.0)
    router.mark_failed("a")
    clock[0] = 1.0
    router.record_probe("a", good)  # half-open: one good trial
    router.record_probe_failure("a", threshold=2)  # the next fails: open again, 2 s
    breaker = router.breaker("a")
    assert breaker is not None and breaker.open_until == 3.0
    clock[0] = 2.9
    router.record_probe("a", good)
    assert router.select(_request()).target is None


def test_excluded_replicas_are_not_retried() -> None:
    router = _router("a", "b")
    assert router.select(_request(), frozenset({"a", "b"})).target is None
    chosen = router.select(_request(), frozenset({"a"})).target
    assert chosen is not None and chosen.target_id == "b"


def test_probe_failures_mark_unhealthy_at_the_threshold() -> None:
    router = _router("a")
    assert router.record_probe_failure("a", threshold=2) is False
    assert router.record_probe_failure("a", threshold=2) is True
    selection = router.select(_request())
    assert (selection.target, selection.healthy) == (None, 0)


def test_a_timed_out_probe_of_a_replica_still_answering_is_late_not_failed() -> None:
    router = _router("a")
    for late in (1, 2, 3):  # past the failure threshold of 2, and still healthy
        assert router.excuse_late_probe("a", silent_for_s=0.5, grace_s=3.0) is True
        target = router.target("a")
        assert target is not None and (target.late_probes, target.healthy) == (late, True)
        assert target.consecutive_failures == 0
    chosen = router.select(_request()).target
    assert chosen is not None and chosen.target_id == "a"
    router.record_probe("a", EngineLoad(running=1, waiting=0, kv_usage=0.1))
    assert target.late_probes == 0  # an answer in time ends the lateness


def test_a_timed_out_probe_gets_no_excuse_once_the_replica_is_quiet_too() -> None:
    router = _router("a")
    assert router.excuse_late_probe("a", silent_for_s=3.0, grace_s=3.0) is False
    assert router.excuse_late_probe("a", silent_for_s=None, grace_s=3.0) is False  # never heard
    assert router.excuse_late_probe("a", silent_for_s=0.0, grace_s=0.0) is False  # 0: off
    assert router.excuse_late_probe("a", silent_for_s=2.99, grace_s=3.0) is True
    assert router.excuse_late_probe("gone", silent_for_s=0.1, grace_s=3.0) is False
    target = router.target("a")
    assert target is not None and target.late_probes == 1 and target.healthy


def test_other_models_replicas_are_not_candidates() -> None:
    router = LocalRouter(build_policy, max_outstanding=4)
    router.apply([_spec("a", "other")], {MODEL: ModelSpec(MODEL), "other": ModelSpec("other")})
    assert router.select(_request()).target is None
    assert router.available_by_model() == {"other": 1}


def test_a_replica_abroad_carries_its_round_trip_to_the_policies() -> None:
    router = LocalRouter(build_policy, max_outstanding=2)
    models = {MODEL: ModelSpec(MODEL, "meridian")}
    far = ReplicaSpec("far", "http://far", MODEL, "eu", "eu-1", "reserved", rtt_ms=80.0)
    router.apply([_spec("near"), far], models)
    assert {t.target_id: t.extra["rtt_ms"] for t in router.targets()} == {"far": 80.0, "near": 0.0}
    # A refresh with a new measurement replaces it.
    router.apply([_spec("near"), replace(far, rtt_ms=95.0)], models)
    target = router.target("far")
    assert target is not None and target.extra["rtt_ms"] == 95.0


def test_refresh_keeps_probe_data_outstanding_and_policy_state() -> None:
    built: list[str] = []

    def builder(name: str, params: Mapping[str, Any]) -> Policy:
        built.append(name)
        return build_policy(name, params)

    router = LocalRouter(builder, max_outstanding=4)
    models = {MODEL: ModelSpec(MODEL, "round_robin")}
    router.apply([_spec("a")], models)
    target = router.target("a")
    assert target is not None
    router.record_probe("a", EngineLoad(running=3, waiting=1, kv_usage=0.5))
    lease = router.lease(_request(), target)
    router.apply([_spec("a"), _spec("b")], dict(models))
    kept = router.target("a")
    assert kept is target and (kept.running, kept.outstanding) == (3, 1)
    assert built == ["round_robin"]  # same ServiceConfig: same policy object
    lease.release(ok=True)
    assert kept.outstanding == 0
    router.apply([_spec("a")], {MODEL: ModelSpec(MODEL, "least_load")})
    assert built == ["round_robin", "least_load"]


def test_departed_replica_with_a_running_request_releases_cleanly() -> None:
    router = _router("a")
    target = router.target("a")
    assert target is not None
    lease = router.lease(_request(), target)
    router.apply([], {MODEL: ModelSpec(MODEL)})
    lease.release(ok=True)
    assert router.ledger.total == 0


def test_usage_gives_the_cached_token_ratio() -> None:
    router = _router("a")
    router.record_usage("a", prompt=100, cached=0, completion=5)
    router.record_usage("a", prompt=100, cached=80, completion=5)
    assert router.usage("a").cached_ratio == pytest.approx(0.4)


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LocalRouter(build_policy, max_outstanding=0)


def _sp_router(*names: str, pushing: PushingConfig, clock: list[float]) -> LocalRouter:
    router = LocalRouter(build_policy, max_outstanding=2, probe_stale_s=1.0, clock=lambda: clock[0])
    router.apply([_spec(n) for n in names], {MODEL: ModelSpec(MODEL, pushing=pushing)})
    return router


def test_sp_p_router_holds_a_replica_whose_probe_shows_waiting_requests() -> None:
    clock = [10.0]
    router = _sp_router("a", "b", pushing=PushingConfig(PushingMode.SP_P), clock=clock)
    router.record_probe("a", EngineLoad(running=4, waiting=1, kv_usage=0.9))
    router.record_probe("b", EngineLoad(running=0, waiting=0, kv_usage=0.0))
    first = router.select(_request())
    assert first.target is not None and first.target.target_id == "b"
    assert (first.healthy, first.available) == (2, 1)
    lease = router.lease(_request(), first.target)
    # b took its one push since the probe; a still shows a waiting request.
    assert router.select(_request()).target is None
    assert router.reprobe_candidates(MODEL, min_age_s=0.0) == ["a", "b"]
    assert router.reprobe_candidates(MODEL, min_age_s=0.5) == []  # probed just now
    lease.release(ok=True)
    assert router.select(_request()).target is first.target
    clock[0] += 2.0  # probes stale: SP-O's cap (2) decides, a is available again
    assert router.counts(MODEL) == (2, 2)


def test_blind_router_pushes_past_any_cap_and_pushing_change_keeps_the_policy() -> None:
    clock = [0.0]
    built: list[str] = []

    def builder(name: str, params: Mapping[str, Any]) -> Policy:
        built.append(name)
        return build_policy(name, params)

    router = LocalRouter(builder, max_outstanding=1, clock=lambda: clock[0])
    blind = ModelSpec(MODEL, "round_robin", pushing=PushingConfig(PushingMode.BLIND))
    router.apply([_spec("a")], {MODEL: blind})
    leases = []
    for i in range(3):
        target = router.select(_request(str(i))).target
        assert target is not None
        leases.append(router.lease(_request(str(i)), target))
    assert router.available_by_model() == {MODEL: 1}
    router.apply([_spec("a")], {MODEL: ModelSpec(MODEL, "round_robin")})
    assert built == ["round_robin"]
    assert router.select(_request()).target is None  # SP-P without a probe: the cap of 1
    for lease in leases:
        lease.release(ok=True)


def test_policies_hear_the_target_set_and_changes_wake_the_queue() -> None:
    seen: list[list[str]] = []
    wakes: list[int] = []

    class Recording(LeastLoadPolicy):
        def on_targets_changed(self, target_ids: Sequence[str]) -> None:
            seen.append(list(target_ids))

    router = LocalRouter(lambda name, params: Recording(), max_outstanding=2)
    router.on_change = lambda: wakes.append(1)
    models = {MODEL: ModelSpec(MODEL)}
    router.apply([_spec("b"), _spec("a")], models)
    router.apply([_spec("b"), _spec("a")], models)  # nothing changed: no call
    router.apply([_spec("a")], models)
    assert seen == [["a", "b"], ["a"]]
    router.record_probe("a", EngineLoad(running=0, waiting=0, kv_usage=0.0))
    target = router.target("a")
    assert target is not None
    router.lease(_request(), target).release(ok=True)
    assert len(wakes) == 5  # three applies, one probe, one completion


def test_a_cost_model_hears_every_probe_and_a_rebuilt_one_what_was_probed() -> None:
    router = _router("a", "b", policy="meridian")
    router.record_probe("a", EngineLoad(running=2, waiting=0, kv_usage=0.75))
    first = router.cost_model(MODEL)
    assert isinstance(first, MeridianPolicy)
    assert (first.replicas["a"].kv_usage, first.replicas["b"].kv_usage) == (0.75, 0.0)
    # New parameters build a new policy: it starts from the usage already probed,
    # not from an empty replica until the next probe.
    params = {"kv_capacity_tokens": 8192}
    router.apply([_spec("a"), _spec("b")], {MODEL: ModelSpec(MODEL, "meridian", params)})
    rebuilt = router.cost_model(MODEL)
    assert isinstance(rebuilt, MeridianPolicy) and rebuilt is not first
    assert rebuilt.replicas["a"].kv_usage == 0.75
