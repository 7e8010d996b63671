"""Whole runs: deterministic for a seed, every request accounted for, every policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from core.policies.meridian_terms import MeridianConfig
from core.registry import policy_names
from sim.des.config import DEFAULT_TTFT_SLO_S, SimConfig, SimConfigError
from sim.des.metrics import summarize
from sim.des.world import SimRun, World, engine_defaults, simulate
from sim.engine import Engine, EngineConfig
from sim.engine.request import EngineRequest
from sim.engine.schedule_policy import SchedulePolicy


def fingerprint(run: SimRun) -> list[tuple[object, ...]]:
    return [
        (r.request_id, r.sent_at, r.first_at, r.done_at, r.journey.replica, r.cached_tokens)
        for r in run.records
    ]


def test_the_same_seed_gives_the_same_run_event_for_event(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config()
    first, second = simulate(config), simulate(config)
    assert fingerprint(first) == fingerprint(second)
    assert first.stats.events == second.stats.events
    other = simulate(dataclasses.replace(config, seed=config.seed + 1))
    assert fingerprint(other) != fingerprint(first)


def test_a_request_budget_is_sent_exactly_and_every_request_finishes(
    make_config: Callable[..., SimConfig],
) -> None:
    run = simulate(make_config(max_requests=25))
    summary = summarize(run)
    assert summary.issued == 25
    assert summary.ok == 25
    assert summary.failed == summary.unfinished == 0
    assert all(r.first_at is not None and r.first_at <= (r.done_at or 0) for r in run.records)
    assert all(r.completion_tokens > 0 for r in run.records)
    # Every token a client received was sampled in one engine step and counted once
    # in the fleet's token waits.
    assert run.waits.tokens == sum(r.completion_tokens for r in run.records)
    # Each replica's running batch, sampled at the instants the outstanding counts are.
    assert [at for at, _ in run.batches] == [at for at, _ in run.samples]
    assert all(len(batch) == len(run.replica_names) for _, batch in run.batches)
    assert run.replica_regions == tuple(name.rsplit("-", 1)[0] for name in run.replica_names)
    assert any(sum(batch) for _, batch in run.batches)


def test_a_duration_stops_sending_at_its_end(make_config: Callable[..., SimConfig]) -> None:
    config = make_config(max_requests=None, duration_s=3.0)
    run = simulate(config)
    assert run.records
    assert max(r.sent_at for r in run.records) < config.warmup_s + 3.0
    assert summarize(run).unfinished == 0


def test_a_ramp_starts_each_region_s_clients_evenly_over_it(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(clients={"us-east": 4, "eu-west": 2}, ramp_s=2.0, max_requests=60)
    run = simulate(config)

    def sends_at(region: str, offset: float) -> int:
        at = config.warmup_s + offset
        return sum(1 for r in run.records if r.region == region and abs(r.sent_at - at) < 1e-9)

    # Each client's first request at its share of the ramp: one at each step.
    assert [sends_at("us-east", t) for t in (0.0, 0.5, 1.0, 1.5)] == [1, 1, 1, 1]
    assert [sends_at("eu-west", t) for t in (0.0, 1.0)] == [1, 1]
    at_once = simulate(dataclasses.replace(config, ramp_s=0.0))
    assert sum(1 for r in at_once.records if r.sent_at == config.warmup_s) == 6
    assert summarize(run).ok == summarize(at_once).ok == 60
    with pytest.raises(SimConfigError, match="ramp"):
        make_config(ramp_s=-1.0)
    with pytest.raises(SimConfigError, match="ramp"):
        make_config(clients={}, rate={"us-east": 1.0}, ramp_s=5.0)


def test_later_turns_hit_the_prefix_cache(make_config: Callable[..., SimConfig]) -> None:
    summary = summarize(simulate(make_config(policy="skylb", max_requests=40)))
    assert summary.hit_rate > 0.3


def test_each_answer_records_when_an_engine_took_it(
    make_config: Callable[..., SimConfig],
) -> None:
    run = simulate(make_config(policy="skylb", max_requests=40))
    served = [r for r in run.records if r.ok]
    assert served
    for record in served:
        started = record.journey.engine_started_at
        assert started is not None and record.first_at is not None
        assert record.sent_at <= started <= record.first_at
        # Not the first token's time: that reaches the client one way after the step.
        assert started < record.first_at
    summary = summarize(run)
    assert 0.0 < summary.bound_at_start <= summary.bound_infinite
    assert summary.hit_of_bound_at_start == summary.hit_rate / summary.bound_at_start


@pytest.mark.parametrize("policy", policy_names())
def test_every_registry_policy_serves_a_small_workload(
    policy: str, make_config: Callable[..., SimConfig]
) -> None:
    summary = summarize(simulate(make_config(policy=policy, max_requests=12)))
    assert (summary.ok, summary.failed, summary.unfinished) == (12, 0, 0)


def test_queue_timeouts_are_counted_as_503s_not_lost(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(
        replicas={"us-east": 1},
        duration_s=1.0,
        clients={"us-east": 12},
        max_requests=40,
        pushing="sp-p",
        timing={"queue_max_wait_s": 0.05},
    )
    summary = summarize(simulate(config))
    assert summary.failed > 0
    assert set(summary.errors) == {"503"}
    assert summary.ok + summary.failed + summary.unfinished == summary.issued == 40


def test_a_full_queue_refuses_with_429(make_config: Callable[..., SimConfig]) -> None:
    config = make_config(
        replicas={"us-east": 1},
        duration_s=1.0,
        clients={"us-east": 12},
        max_requests=40,
        pushing="sp-p",
        timing={"queue_max_len": 1},
    )
    summary = summarize(simulate(config))
    assert summary.errors.get("429", 0) > 0
    assert summary.ok + summary.failed + summary.unfinished == summary.issued


def test_under_overload_the_cost_model_drops_nothing_least_load_serves(
    make_config: Callable[..., SimConfig],
) -> None:
    # Long shared prompts on two replicas: queued prefill passes the admission
    # limit, so the cost model holds requests in the regional queue, whose
    # deadline is short.  Least load pushes blindly and times nothing out; SP-P,
    # holding requests back with no patience limit, does.
    overload = {
        "workload": (
            "conversations:system_tokens=2048,users=8,turns_min=1,turns_max=2,"
            "user_tokens_min=200,user_tokens_max=400,max_tokens_min=16,max_tokens_max=32"
        ),
        "replicas": {"us-east": 2},
        "clients": {"us-east": 24},
        "max_requests": 60,
        "timing": {"queue_max_wait_s": 1.5},
    }
    least_load = summarize(simulate(make_config(policy="least_load", **overload)))
    held_back = summarize(simulate(make_config(policy="skylb", pushing="sp-p", **overload)))
    meridian = summarize(simulate(make_config(policy="meridian", **overload)))
    assert held_back.errors.get("503", 0) > 0  # the overload is real
    assert (meridian.queue_wait["p90"] or 0.0) > 0  # and the cost model did queue
    assert meridian.ok >= least_load.ok == 60
    assert meridian.failed == meridian.unfinished == 0


def test_engines_that_schedule_by_priority_receive_the_cost_models_priorities(
    make_config: Callable[..., SimConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated balancer hands each placement's priority to the engine request: on
    a cost model that sees every cache as full, a cold prompt goes as 1 and a turn its
    replica caches as 0; engines on vLLM's default order get none (all 0)."""
    received: list[int] = []
    add_request = Engine.add_request

    def recording(engine: Engine, request: EngineRequest) -> None:
        received.append(request.priority)
        add_request(engine, request)

    monkeypatch.setattr(Engine, "add_request", recording)
    params = {"kv_capacity_tokens": 16, "affinity_tokens": 0}
    priority = dataclasses.replace(EngineConfig(), schedule_policy=SchedulePolicy.PRIORITY)
    simulate(make_config(policy="meridian", engine=priority, policy_params=params))
    assert received.count(1) > 0 and received.count(0) > 0
    assert set(received) == {0, 1} and len(received) >= 30
    received.clear()
    simulate(make_config(policy="meridian", policy_params=params))
    assert received and set(received) == {0}


def test_the_cost_model_starts_from_the_simulated_engines_profile() -> None:
    small_kv = EngineConfig.for_profile("l4-llama3.1-8b-small-kv")
    params = engine_defaults("meridian", small_kv)
    assert params["kv_capacity_tokens"] == 8192
    assert params["max_blocks_per_target"] == 512
    h100 = engine_defaults("meridian", EngineConfig.for_profile("h100-llama3.1-8b"))
    assert h100["prefill_s_per_token"] == pytest.approx(0.04e-3)
    # The admission limit follows the card's prefill rate: what it clears in the wait limit.
    assert "admission_tokens" not in params
    assert MeridianConfig(prefill_s_per_token=h100["prefill_s_per_token"]).admission_limit() == 6250
    # One more running sequence: its GEMM share plus attention reads of 1,024 tokens.
    assert params["seq_s"] == pytest.approx(0.3e-3 + 1024 * 0.44e-6)
    assert h100["seq_s"] == pytest.approx(0.05e-3 + 1024 * 0.04e-6)
    # The order the engines serve their queues in: vLLM's, unless they run SGLang's.
    assert params["engine_queue"] == "fcfs"
    lpm = dataclasses.replace(small_kv, schedule_policy=SchedulePolicy.LPM)
    assert engine_defaults("meridian", lpm)["engine_queue"] == "lpm"
    by_priority = dataclasses.replace(small_kv, schedule_policy=SchedulePolicy.PRIORITY)
    assert engine_defaults("meridian", by_priority)["engine_queue"] == "priority"
    # The sequences an engine runs at once: past them a request waits for a slot.
    assert params["max_num_seqs"] == 64 and h100["max_num_seqs"] == 1024
    # A policy without these knobs gets none; a profile with no GPU time says nothing.
    assert engine_defaults("sglang", small_kv) == {}
    assert engine_defaults("meridian", EngineConfig.for_profile("zero")) == {}
    # The service the balancers run: a value given on the command line wins.
    config = SimConfig(
        workload="conversations",
        policy="meridian",
        replicas={"us-east": 1},
        duration_s=1.0,
        engine=small_kv,
        policy_params={"kv_capacity_tokens": 1000},
    )
    spec = World(config).model_spec()
    assert spec.policy_params["kv_capacity_tokens"] == 1000
    assert spec.policy_params["max_blocks_per_target"] == 512


def test_the_cost_model_is_held_to_the_slo_the_run_is_scored_on() -> None:
    def params(policy: str, **changes: object) -> dict[str, object]:
        config = SimConfig(
            workload="conversations", policy=policy, replicas={"us-east": 1}, duration_s=1.0
        )
        return dict(World(dataclasses.replace(config, **changes)).model_spec().policy_params)

    assert params("meridian")["ttft_slo_s"] == DEFAULT_TTFT_SLO_S
    assert params("meridian", ttft_slo_s=0.5)["ttft_slo_s"] == 0.5
    # A value given on the command line wins; a policy without the knob gets none.
    given = params("meridian", ttft_slo_s=0.5, policy_params={"ttft_slo_s": 0.0})
    assert given["ttft_slo_s"] == 0.0
    assert "ttft_slo_s" not in params("sglang")
    with pytest.raises(SimConfigError, match="--ttft-slo"):
        SimConfig(
            workload="tot", policy="meridian", replicas={"a": 1}, duration_s=1.0, ttft_slo_s=0.0
        )
