"""The engine's scheduler: batching limits, chunked prefill, preemption, aborts, counters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.engine import Engine
from tests.support.engine import fresh_prompt, request, run_to_completion


def tokens_by_request(engine: Engine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for result in run_to_completion(engine):
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_max_num_seqs_caps_the_running_batch(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_seqs=2)
    for name in "abc":
        engine.add_request(request(name, fresh_prompt(20), 10, ignore_eos=True))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    while engine.has_work():
        engine.step()
        assert engine.num_running <= 2
    assert engine.stats.finished["length"] == 3


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(max_num_batched_tokens=256)
    engine.add_request(request("long", fresh_prompt(600), 3, ignore_eos=True))
    steps = [engine.step() for _ in range(3)]
    assert [s.num_prefill_tokens for s in steps] == [256, 256, 88]
    assert [len(s.outputs) for s in steps] == [0, 0, 1]  # first token after the last chunk
    ttft = engine.stats.ttft.sum
    assert abs(ttft - sum(s.duration_s for s in steps)) < 1e-9


def test_decode_shares_the_budget_with_a_new_prefill(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_batched_tokens=64)
    engine.add_request(request("old", fresh_prompt(10), 50, ignore_eos=True))
    engine.step()
    engine.add_request(request("new", fresh_prompt(200), 5, ignore_eos=True))
    step = engine.step()
    # Continuous batching: one decode token for "old", the other 63 for "new"'s prefill.
    assert (step.num_decode_tokens, step.num_prefill_tokens) == (1, 63)


def test_preemption_by_recompute_and_the_victim_still_completes(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(num_blocks=10)
    engine.add_request(request("a", fresh_prompt(48), 60, ignore_eos=True))
    prompt_b = fresh_prompt(48)
    engine.add_request(request("b", prompt_b, 60, ignore_eos=True))

    tokens: dict[str, list[int]] = {}
    saw_preemption = False
    while engine.has_work():
        result = engine.step()
        if result.num_preempted and not saw_preemption:
            saw_preemption = True
            # The newest running request is the victim and goes to the front of the queue.
            assert engine.waiting[0].request_id == "b"
            assert engine.waiting[0].num_computed_tokens == 0
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)

    assert saw_preemption and engine.stats.preemptions >= 1
    assert len(tokens["a"]) == len(tokens["b"]) == 60
    assert engine.stats.finished["length"] == 2
    # Recompute keeps what was generated: b's text is what it would have been alone.
    alone = make_engine()
    alone.add_request(request("b", prompt_b, 60, ignore_eos=True))
    assert tokens_by_request(alone)["b"] == tokens["b"]


def test_a_step_names_the_requests_it_schedules_for_the_first_time(
    make_engine: Callable[..., Engine],
) -> None:
    # Two fit in the batch, the third waits; a preempted request resumes, not starts.
    engine = make_engine(max_num_seqs=2, num_blocks=10)
    for name in "abc":
        engine.add_request(request(name, fresh_prompt(48), 60, ignore_eos=True))
    firsts: list[str] = []
    preempted = 0
    while engine.has_work():
        result = engine.step()
        firsts += result.first_scheduled
        preempted += result.num_preempted
    assert preempted >= 1  # some request was scheduled again after losing its blocks
    assert sorted(firsts) == ["a", "b", "c"]  # each named once, on its prefix lookup


def test_abort_during_prefill_frees_blocks_and_counts_an_abort(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(max_num_batched_tokens=128)
    engine.add_request(request("gone", fresh_prompt(1000), 10))
    engine.add_request(request("queued", fresh_prompt(10), 10))
    engine.step()
    assert engine.kv_usage > 0
    assert engine.abort("gone") is not None
    assert engine.abort("queued") is not None
    assert (engine.num_running, engine.num_waiting, engine.kv_usage) == (0, 0, 0.0)
    assert engine.stats.finished["abort"] == 2
    assert engine.abort("gone") is None


def test_counters_follow_the_engine_state(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(num_blocks=100, max_num_seqs=1)
    engine.add_request(request("a", fresh_prompt(64), 4, ignore_eos=True))
    engine.add_request(request("b", fresh_prompt(32), 4, ignore_eos=True))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    assert engine.kv_usage == pytest.approx(4 / 100)
    run_to_completion(engine)
    stats = engine.stats
    assert (stats.prompt_tokens, stats.generation_tokens) == (96, 8)
    assert stats.ttft.count == stats.e2e.count == 2
    assert stats.prefix_cache_queries == 96 and stats.prefix_cache_hits == 0


def test_output_lengths_are_deterministic_and_capped(make_engine: Callable[..., Engine]) -> None:
    prompts = [fresh_prompt(30) for _ in range(200)]

    def lengths(engine: Engine, max_tokens: int, **kw: object) -> list[int]:
        for i, prompt in enumerate(prompts):
            engine.add_request(request(str(i), prompt, max_tokens, **kw))
        tokens = tokens_by_request(engine)
        return [len(tokens[str(i)]) for i in range(len(prompts))]

    first = lengths(make_engine(max_num_seqs=256), 400)
    assert first == lengths(make_engine(max_num_seqs=256), 400)
    assert max(first) <= 400 and min(first) >= 1
    assert 100 <= sorted(first)[len(first) // 2] <= 300  # median of the log-normal model
    assert lengths(make_engine(max_num_seqs=256), 7, ignore_eos=True) == [7] * 200
    engine = make_engine(max_num_seqs=256)
    lengths(engine, 150)
    assert engine.stats.finished["stop"] > 0 and engine.stats.finished["length"] > 0


def test_max_loras_skips_a_third_adapter_without_blocking_others(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(max_loras=1)
    engine.add_request(request("sql", fresh_prompt(20), 5, ignore_eos=True, lora_name="sql"))
    engine.add_request(request("chat", fresh_prompt(20), 5, ignore_eos=True, lora_name="chat"))
    engine.add_request(request("base", fresh_prompt(20), 5, ignore_eos=True))
    engine.step()
    assert {r.request_id for r in engine.running} == {"sql", "base"}
    assert [r.request_id for r in engine.waiting] == ["chat"]
    assert engine.lora_adapters() == ({"sql"}, {"chat"})
    assert set(tokens_by_request(engine)) == {"sql", "chat", "base"}
