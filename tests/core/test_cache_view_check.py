"""The hit-rate mismatch detector: expected cached tokens against the engine's report."""

from __future__ import annotations

import pytest

from core.cache_map import CacheMap
from core.cache_view_check import (
    EVICTING_ADVICE,
    MISMATCH_ADVICE,
    Comparison,
    MismatchConfig,
    MismatchDetector,
    ViewState,
    expected_cached_tokens,
    replica_warnings,
)

BLOCK = 16


def cache_map() -> CacheMap:
    return CacheMap(max_blocks_per_replica=100, speculative_ttl_s=10.0, max_speculative=100)


def test_expectation_leaves_the_last_token_to_compute() -> None:
    assert expected_cached_tokens(3, BLOCK, 100) == 48
    assert expected_cached_tokens(4, BLOCK, 64) == 48  # all 64 cached: vLLM reports 48
    assert expected_cached_tokens(0, BLOCK, 64) == 0


def detector(**overrides: float) -> MismatchDetector:
    config = {"window": 10, "min_requests": 4, "threshold": 0.5, "tolerance_blocks": 1}
    return MismatchDetector(MismatchConfig(**{**config, **overrides}))  # type: ignore[arg-type]


def test_a_sustained_gap_raises_mismatch() -> None:
    d = detector()
    states = [d.observe("a", expected=64, reported=0, block_size=BLOCK)[1] for _ in range(4)]
    assert states == [ViewState.WARMING] * 3 + [ViewState.MISMATCH]
    check = d.check("a")
    assert check is not None and check.ratio == 1.0
    assert (check.expected_tokens, check.reported_tokens, check.checked) == (256, 0, 4)


def test_differences_within_one_block_are_agreement() -> None:
    d = detector()
    for reported in (64, 48, 80, 64):
        d.observe("a", expected=64, reported=reported, block_size=BLOCK)
    check = d.check("a")
    assert check is not None and check.state is ViewState.OK and check.ratio == 0.0


def test_an_occasional_miss_does_not_fire_and_recovery_clears_it() -> None:
    d = detector()
    for i in range(10):
        d.observe("a", expected=64, reported=0 if i % 4 == 0 else 64, block_size=BLOCK)
    assert d.check("a").state is ViewState.OK  # type: ignore[union-attr]
    for _ in range(10):
        d.observe("a", expected=0, reported=96, block_size=BLOCK)
    assert d.check("a").state is ViewState.MISMATCH  # type: ignore[union-attr]
    transitions = [d.observe("a", expected=32, reported=32, block_size=BLOCK) for _ in range(10)]
    assert (ViewState.MISMATCH, ViewState.OK) in transitions


def test_replicas_that_left_are_forgotten() -> None:
    d = detector()
    d.observe("a", expected=0, reported=0, block_size=BLOCK)
    d.observe("b", expected=0, reported=0, block_size=BLOCK)
    d.retain(["b"])
    assert [name for name, _ in d.items()] == ["b"]


@pytest.mark.parametrize(
    "config", [{"window": 3, "min_requests": 4}, {"threshold": 1.0}, {"tolerance_blocks": -1}]
)
def test_bad_configs_are_refused(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MismatchConfig(**config)  # type: ignore[arg-type]


def test_a_prefix_the_engine_evicted_after_routing_is_not_held_against_the_view() -> None:
    d = detector()
    states = [
        d.observe("a", expected=64, reported=16, block_size=BLOCK, evicted_since=True)[1]
        for _ in range(4)
    ]
    assert states == [ViewState.WARMING] * 3 + [ViewState.EVICTING]
    check = d.check("a")
    assert check is not None and check.ratio == 0.0 and check.evicted_ratio == 1.0
    assert list(check.window) == [Comparison.EVICTED] * 4


def test_eviction_explains_only_finding_less() -> None:
    d = detector()
    # Found more than expected: the view lacked blocks the engine had, evictions or not.
    d.observe("a", expected=0, reported=64, block_size=BLOCK, evicted_since=True)
    # Found less with nothing of it removed since routing: the view held blocks the
    # engine did not have when the request was routed.
    d.observe("a", expected=64, reported=0, block_size=BLOCK, evicted_since=False)
    # Within a block: agreement, whatever was removed.
    d.observe("a", expected=64, reported=48, block_size=BLOCK, evicted_since=True)
    check = d.check("a")
    assert check is not None
    assert list(check.window) == [Comparison.MISSED, Comparison.MISSED, Comparison.AGREED]


def test_a_wrong_view_comes_before_a_thrashing_cache() -> None:
    d = detector(threshold=0.3)
    for evicted in (True, True, False, False, True, False):
        d.observe("a", expected=64, reported=0, block_size=BLOCK, evicted_since=evicted)
    check = d.check("a")
    assert check is not None and check.ratio == check.evicted_ratio == 0.5
    assert check.state is ViewState.MISMATCH
    for _ in range(10):
        d.observe("a", expected=64, reported=0, block_size=BLOCK, evicted_since=True)
    assert d.check("a").state is ViewState.EVICTING  # type: ignore[union-attr]


def test_each_state_warns_with_its_own_advice() -> None:
    evicting = {"state": "evicting", "advice": EVICTING_ADVICE}
    mismatch = {"state": "mismatch", "advice": MISMATCH_ADVICE}
    assert replica_warnings(None, evicting) == [
        {"kind": "cache_evicting", "message": EVICTING_ADVICE}
    ]
    assert replica_warnings(None, mismatch) == [
        {"kind": "cache_view_mismatch", "message": MISMATCH_ADVICE}
    ]
    assert replica_warnings(None, {"state": "ok", "advice": ""}) == []
    assert "--scheduling-policy priority" in EVICTING_ADVICE
