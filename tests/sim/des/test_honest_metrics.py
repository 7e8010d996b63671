"""Goodput, SLO attainment, rejections and oracle bounds in a run's summary."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sim.des.calls import Journey
from sim.des.clients import RequestRecord
from sim.des.config import SimConfig
from sim.des.metrics import summarize
from sim.des.report import format_table
from sim.des.world import SimRun, simulate
from sim.engine import EngineConfig


def served(i: int, ttft: float) -> RequestRecord:
    return RequestRecord(
        f"r{i}", "us-east", float(i), 100, float(i) + ttft, float(i) + ttft + 1, True, 200,
        journey=Journey(),
    )  # fmt: skip


def dropped(i: int, status: int) -> RequestRecord:
    return RequestRecord(f"r{i}", "us-east", float(i), 100, None, float(i) + 30, False, status)


def test_a_policy_that_drops_cannot_look_better(make_config: Callable[..., SimConfig]) -> None:
    config = make_config()
    # "serves all": ten answers at 1.5 s.  "drops half": five fast answers, five 503s.
    serves_all = SimRun(config, [served(i, 1.5) for i in range(10)], end_s=20.0)
    drops_half = SimRun(
        config,
        [served(i, 0.1) for i in range(5)] + [dropped(i, 503) for i in range(5, 10)],
        end_s=20.0,
    )
    a, b = summarize(serves_all, "serves all"), summarize(drops_half, "drops half")
    assert b.ttft["p90"] is not None and a.ttft["p90"] is not None
    assert b.ttft["p90"] < a.ttft["p90"]  # the percentiles flatter the dropper...
    assert (a.slo_attainment, b.slo_attainment) == (1.0, 0.5)  # ...attainment does not
    assert a.goodput_rps > b.goodput_rps
    assert (b.dropped, b.rejected) == (5, 0)
    table = format_table([b, a]).splitlines()
    assert table[1].split()[0] == "serves" and table[2].split()[0] == "drops"


def test_a_request_over_the_slo_or_rejected_is_a_miss(
    make_config: Callable[..., SimConfig],
) -> None:
    records = [served(0, 0.5), served(1, 3.0), dropped(2, 400), dropped(3, 400)]
    records.append(RequestRecord("r4", "us-east", 4.0, 100))  # never finished
    summary = summarize(SimRun(make_config(), records, end_s=10.0), ttft_slo_s=1.0)
    assert summary.slo_attainment == 1 / 5
    assert summary.goodput_rps == 1 / 10
    assert (summary.rejected, summary.dropped, summary.unfinished) == (2, 1, 1)
    lenient = summarize(SimRun(make_config(), records, end_s=10.0), ttft_slo_s=5.0)
    assert lenient.slo_attainment == 2 / 5


def test_rates_are_over_the_window_clients_sent_in(make_config: Callable[..., SimConfig]) -> None:
    # Clients send from the 1 s warm-up for 10 s; one straggler sent last answers at 40 s.
    config = make_config(max_requests=None, duration_s=10.0, warmup_s=1.0)
    records = [served(i, 0.5) for i in range(1, 10)]
    records.append(RequestRecord("late", "us-east", 10.5, 100, 11.0, 40.0, True, 200))
    summary = summarize(SimRun(config, records, end_s=40.0))
    assert (summary.window_s, summary.served_in_window, summary.ok) == (10.0, 9, 10)
    assert summary.throughput_rps == 9 / 10.0
    assert summary.goodput_rps == 9 / 10.0
    # The whole run, drain included, is kept beside it: the straggler set its length.
    assert summary.throughput_makespan_rps == 10 / 39.0
    # Every answer still counts in the latencies and the SLO attainment.
    assert summary.slo_attainment == 1.0


def test_a_run_bounded_by_count_is_measured_to_its_last_answer(
    make_config: Callable[..., SimConfig],
) -> None:
    summary = summarize(SimRun(make_config(), [served(i, 0.5) for i in range(10)], end_s=20.0))
    assert (summary.window_s, summary.served_in_window) == (20.0, 10)
    assert summary.throughput_rps == summary.throughput_makespan_rps == 10 / 20.0


def test_context_rejections_are_counted_in_a_simulated_run(
    make_config: Callable[..., SimConfig],
) -> None:
    # A 160-token context refuses most of these conversations' requests with 400.
    engine = EngineConfig.for_profile("l4-llama3.1-8b", max_model_len=160)
    summary = summarize(simulate(make_config(engine=engine, max_requests=20)))
    assert summary.rejected > 0
    assert summary.errors.get("400") == summary.rejected
    assert summary.ok + summary.rejected + summary.dropped == summary.issued
    assert summary.slo_attainment <= summary.ok / summary.issued


def test_the_bounds_hold_over_a_simulated_run(make_config: Callable[..., SimConfig]) -> None:
    for policy in ("round_robin", "consistent_hash"):
        summary = summarize(simulate(make_config(policy=policy, max_requests=40)))
        assert summary.hit_rate > 0
        assert summary.hit_rate <= summary.bound_infinite
        assert summary.bound_hit_rate <= summary.bound_infinite
        assert summary.hit_of_bound is not None and summary.hit_of_bound > 0


def test_rejected_requests_never_fill_the_bounds_cache(
    make_config: Callable[..., SimConfig],
) -> None:
    # Most prompts are over a 160-token context: rejected, never computed, never cached.
    engine = EngineConfig.for_profile("l4-llama3.1-8b", max_model_len=160, kv_blocks=24)
    summary = summarize(simulate(make_config(engine=engine, max_requests=40)))
    assert summary.rejected > 0
    assert summary.hit_rate <= summary.bound_infinite
    assert summary.bound_hit_rate <= summary.bound_infinite


def test_a_small_fleet_cache_lowers_the_pooled_bound(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(policy="consistent_hash", max_requests=40)
    roomy = summarize(simulate(config))
    tiny_engine = dataclasses.replace(config.engine, num_blocks=24)
    tiny = summarize(simulate(dataclasses.replace(config, engine=tiny_engine)))
    assert roomy.bound_hit_rate == roomy.bound_infinite  # everything fits
    assert tiny.bound_hit_rate < tiny.bound_infinite


def test_the_reachable_bound_follows_the_deployment(make_config: Callable[..., SimConfig]) -> None:
    # One prompt of four blocks, sent from us-east and then from eu-west.
    size = make_config().engine.block_size
    records = [
        dataclasses.replace(served(i, 0.2), region=region, prompt_keys=(1, 2, 3, 4),
                            prompt_tokens=4 * size + 1)
        for i, region in enumerate(("us-east", "eu-west"))
    ]  # fmt: skip
    regional = summarize(SimRun(make_config(policy="meridian"), records, end_s=5.0))
    single = summarize(SimRun(make_config(policy="least_load"), records, end_s=5.0))
    assert regional.bound_hit_rate == single.bound_hit_rate > 0  # the pooled fleet hits
    assert regional.bound_reachable == 0.0  # eu-west's balancer never saw us-east's copy
    assert regional.hit_of_reachable is None
    assert single.bound_reachable == single.bound_hit_rate  # one balancer owns it all
