"""The waiting queue's order: vLLM's first come first served and priority, SGLang's
longest prefix match."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.engine import Engine
from sim.engine.request import RequestStatus
from sim.engine.schedule_policy import (
    LPM_MAX_WAITING,
    SchedulePolicy,
    longest_prefix_first,
    shared_prefix_block,
)
from tests.support.engine import fresh_prompt, request, run_to_completion

# (name, cached tokens, leading key) stand-ins for waiting requests.
Waiting = tuple[str, int, int | None]


def order(waiting: list[Waiting]) -> list[str]:
    ranked = longest_prefix_first(waiting, lambda w: w[1], lambda w: w[2])
    return [name for name, _, _ in ranked]


def test_the_longest_cached_prefix_goes_first_and_equal_ones_keep_their_arrival_order() -> None:
    waiting = [("a", 64, 1), ("b", 512, 2), ("c", 64, 3), ("d", 1024, 4), ("e", 512, 5)]
    assert order(waiting) == ["d", "b", "e", "a", "c"]


def test_a_request_sharing_an_uncached_prefix_with_an_earlier_one_waits_behind_the_rest() -> None:
    # b and d open with what a opens with, and none of it is cached: a computes it,
    # and b and d go last so they find it cached (SGLang's in-batch prefix caching).
    waiting = [("a", 0, 7), ("b", 16, 7), ("c", 0, 8), ("d", 0, 7), ("e", 48, 7)]
    # e finds more than the check threshold cached, so it is ranked by its match.
    assert order(waiting) == ["e", "a", "c", "b", "d"]


def test_a_prompt_too_short_to_share_a_prefix_is_never_held_back() -> None:
    assert order([("a", 0, None), ("b", 0, None)]) == ["a", "b"]


def test_past_the_waiting_limit_the_queue_keeps_its_arrival_order() -> None:
    waiting = [(str(i), i, i) for i in range(LPM_MAX_WAITING + 1)]
    assert order(waiting) == [str(i) for i in range(LPM_MAX_WAITING + 1)]
    assert order(waiting[:LPM_MAX_WAITING])[0] == str(LPM_MAX_WAITING - 1)


def test_the_shared_prefix_block_covers_the_first_32_tokens() -> None:
    assert [shared_prefix_block(size) for size in (1, 16, 32, 64)] == [31, 1, 0, 0]


def _waiting_behind_one_slot(engine: Engine, cold_priority: int = 0) -> list[str]:
    """A cached conversation, then a cold request and the conversation's next turn
    waiting for the engine's one batch slot: which of the two it takes first."""
    history = fresh_prompt(64)
    engine.add_request(request("turn-1", history, 4, ignore_eos=True))
    run_to_completion(engine)
    engine.add_request(request("busy", fresh_prompt(16), 8, ignore_eos=True))
    engine.step()  # holds the slot
    cold = request("cold", fresh_prompt(64), 4, ignore_eos=True, priority=cold_priority)
    engine.add_request(cold)
    engine.add_request(request("turn-2", history + fresh_prompt(16), 4, ignore_eos=True))
    firsts: list[str] = []
    for result in run_to_completion(engine):
        firsts += result.first_scheduled
    return firsts


def test_fcfs_admits_in_arrival_order(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_seqs=1)
    assert engine.config.schedule_policy is SchedulePolicy.FCFS  # vLLM's, the default
    assert _waiting_behind_one_slot(engine) == ["cold", "turn-2"]


def test_lpm_admits_the_turn_whose_history_is_cached_first(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(max_num_seqs=1, schedule_policy=SchedulePolicy.LPM)
    assert _waiting_behind_one_slot(engine) == ["turn-2", "cold"]
    # turn-2 found its whole history cached: 64 of its 80 prompt tokens.
    assert engine.stats.prefix_cache_hits == 64


def test_priority_admits_the_lowest_priority_value_first(
    make_engine: Callable[..., Engine],
) -> None:
    """vLLM's ``--scheduling-policy priority``: lower values first, then arrival order;
    a balancer that marks the cold prompt 1 gets the cached turn served first."""
    engine = make_engine(max_num_seqs=1, schedule_policy=SchedulePolicy.PRIORITY)
    assert _waiting_behind_one_slot(engine) == ["cold", "turn-2"]  # equal: arrival order
    engine = make_engine(max_num_seqs=1, schedule_policy=SchedulePolicy.PRIORITY)
    assert _waiting_behind_one_slot(engine, cold_priority=1) == ["turn-2", "cold"]
    assert engine.stats.prefix_cache_hits == 64


def test_a_first_come_first_served_engine_takes_a_priority_and_ignores_it(
    make_engine: Callable[..., Engine],
) -> None:
    """As vLLM 0.32 does (``tests/engines``): no refusal, and arrival order stands."""
    engine = make_engine(max_num_seqs=1)
    assert _waiting_behind_one_slot(engine, cold_priority=1) == ["cold", "turn-2"]


def _two_running(engine: Engine, first: int, second: int, priorities: tuple[int, int]) -> None:
    """``low`` running, then ``high`` admitted beside it, with the given priorities, on
    four blocks of 16 tokens: each holds two, so the next block either needs is not
    free.  ``first`` and ``second`` are their prompt lengths."""
    low, high = priorities
    engine.add_request(request("low", fresh_prompt(first), 20, ignore_eos=True, priority=low))
    engine.step()
    engine.add_request(request("high", fresh_prompt(second), 20, ignore_eos=True, priority=high))
    engine.step()
    assert [r.request_id for r in engine.running] == ["low", "high"]


@pytest.mark.parametrize(
    ("policy", "priorities", "preempted", "left"),
    [
        (SchedulePolicy.FCFS, (0, 0), "high", "low"),  # the newest
        (SchedulePolicy.PRIORITY, (1, 0), "low", "high"),  # the highest (priority, arrival)
    ],
)
def test_priority_preempts_the_lowest_priority_running_request_not_the_newest(
    make_engine: Callable[..., Engine],
    policy: SchedulePolicy,
    priorities: tuple[int, int],
    preempted: str,
    left: str,
) -> None:
    """``low`` needs a third block first, and one of the two must give its blocks up."""
    engine = make_engine(num_blocks=4, schedule_policy=policy)
    _two_running(engine, 31, 31, priorities)
    assert engine.step().num_preempted == 1
    assert engine.requests[preempted].status is RequestStatus.PREEMPTED
    assert [r.request_id for r in engine.running] == [left]


def test_a_victim_scheduled_earlier_in_the_step_leaves_the_batch(
    make_engine: Callable[..., Engine],
) -> None:
    """``high`` needs a third block after ``low`` was scheduled in the same step: ``low``
    is preempted and taken out of the batch (no token sampled on freed blocks), and
    its token goes back to the step's budget, as vLLM's scheduler does."""
    engine = make_engine(num_blocks=4, schedule_policy=SchedulePolicy.PRIORITY)
    _two_running(engine, 20, 31, (1, 0))
    assert engine.step().num_preempted == 0  # high's 32nd token still fits its two blocks
    low = engine.requests["low"]
    tokens_before = low.num_tokens
    result = engine.step()
    assert result.num_preempted == 1 and low.status is RequestStatus.PREEMPTED
    assert [output.request_id for output in result.outputs] == ["high"]
    assert low.num_tokens == tokens_before and low.num_computed_tokens == 0 and not low.blocks
    assert [r.request_id for r in engine.running] == ["high"]
    run_to_completion(engine)  # both finish; the preempted one recomputes
    assert low.status is RequestStatus.FINISHED
