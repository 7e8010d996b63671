"""Which blocks each replica's engine removed, and whether since a request was routed."""

from __future__ import annotations

import pytest

from core.eviction_log import EvictionLog


def test_a_removal_after_the_mark_is_seen_and_one_before_it_is_not() -> None:
    log = EvictionLog()
    log.record("a", [1, 2])
    mark = log.mark("a")
    assert mark == 2 and not log.removed_since("a", [1, 2, 3], mark)
    log.record("a", [3])
    assert log.removed_since("a", [1, 2, 3], mark)
    assert not log.removed_since("a", [1, 2], mark)  # only 3 went after the mark


def test_replicas_are_counted_apart() -> None:
    log = EvictionLog()
    mark_a, mark_b = log.mark("a"), log.mark("b")
    log.record("b", [7])
    assert not log.removed_since("a", [7], mark_a)
    assert log.removed_since("b", [7], mark_b)


def test_a_block_removed_again_is_dated_by_its_latest_removal() -> None:
    log = EvictionLog()
    log.record("a", [5])
    mark = log.mark("a")
    log.record("a", [6, 5])  # stored again and evicted again after the request was routed
    assert log.removed_since("a", [5], mark)


def test_more_removals_than_the_log_holds_count_as_eviction() -> None:
    log = EvictionLog(capacity=4)
    mark = log.mark("a")
    log.record("a", [10, 11, 12, 13])
    assert log.removed_since("a", [10], mark)
    assert not log.removed_since("a", [99], mark)  # four removals: all still known
    log.record("a", [14])
    # Five since the mark, four remembered: block 10 is forgotten, and so much churn
    # is eviction enough for any request that waited through it.
    assert log.removed_since("a", [99], mark)


def test_replicas_that_left_are_forgotten() -> None:
    log = EvictionLog()
    log.record("a", [1])
    log.record("b", [1])
    log.retain(["b"])
    assert log.mark("a") == 0 and log.mark("b") == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EvictionLog(capacity=0)
