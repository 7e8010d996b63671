"""PreServe's load-look-ahead map (§4.3.1): the map, early finish, the 0.2·D virtual
extension, and turning seconds into iterations."""

from __future__ import annotations

import pytest

from core.load_anticipator import AnticipatorConfig, IterationClock, LoadAnticipator


def _map(horizon: int = 10) -> LoadAnticipator:
    return LoadAnticipator(AnticipatorConfig(horizon=horizon))


def test_a_request_holds_its_prompt_plus_one_token_per_iteration_until_its_prediction() -> None:
    ahead = _map()
    ahead.admit("r", prompt_tokens=100, cached_tokens=0, predicted_output=4)
    assert ahead.lookahead() == [100, 101, 102, 103, 0, 0, 0, 0, 0, 0]
    assert ahead.kv_tokens() == 100
    assert ahead.peak() == 103


def test_requests_add_up_and_cached_prompt_tokens_are_not_counted_twice() -> None:
    ahead = _map(5)
    ahead.admit("a", 100, 0, 3)
    ahead.admit("b", 50, 20, 10)
    assert ahead.lookahead() == [130, 132, 134, 33, 34]
    assert ahead.mean() == pytest.approx((130 + 132 + 134 + 33 + 34) / 5)


def test_advancing_moves_every_request_along_its_ramp() -> None:
    ahead = _map(4)
    ahead.admit("r", 100, 0, 6)
    ahead.advance(3)
    assert ahead.kv_tokens() == 103
    assert ahead.lookahead() == [103, 104, 105, 0]


def test_early_finish_takes_the_remaining_iterations_out() -> None:
    ahead = _map(6)
    ahead.admit("short", 10, 0, 100)
    ahead.admit("other", 20, 0, 100)
    ahead.advance(2)
    outcome = ahead.finish("short", actual_output_tokens=2)
    assert outcome is not None
    assert (outcome.predicted, outcome.actual, outcome.error) == (100, 2, -98)
    assert ahead.lookahead() == [22, 23, 24, 25, 26, 27]
    assert ahead.finish("short") is None  # once only


def test_a_request_past_its_prediction_gets_a_virtual_extension_of_a_fifth() -> None:
    ahead = _map(20)
    ahead.admit("r", 100, 0, 10)
    ahead.advance(10)  # still running at its predicted end
    # Extended by 0.2 * 10 = 2 iterations beyond where it is now.
    assert ahead.lookahead()[:3] == [110, 111, 0]
    ahead.advance(3)  # outlived the first extension too: another 2
    assert ahead.lookahead()[:2] == [113, 0]
    outcome = ahead.finish("r", 14)
    assert outcome is not None
    assert (outcome.extensions, outcome.error) == (2, 4)


def test_progress_sets_a_known_count_and_never_goes_back() -> None:
    ahead = _map(4)
    ahead.admit("r", 10, 0, 8)
    ahead.progress("r", 5)
    ahead.progress("r", 3)
    assert ahead.lookahead() == [15, 16, 17, 0]


def test_peak_with_adds_a_request_virtually() -> None:
    ahead = _map(5)
    ahead.admit("a", 100, 0, 2)
    before = ahead.lookahead()
    assert ahead.peak_with(50, 0, 5) == max(100 + 50, 101 + 51, 52, 53, 54)
    assert ahead.peak_with(500, 450, 1) == 150
    assert ahead.lookahead() == before  # nothing was admitted


def test_the_map_is_bounded_and_drops_requests_nobody_finished() -> None:
    ahead = LoadAnticipator(AnticipatorConfig(horizon=4, max_running=2, stale_after=50))
    for name in ("a", "b", "c"):
        ahead.admit(name, 10, 0, 5)
    assert len(ahead) == 2 and "a" not in ahead
    ahead.advance(50)
    assert len(ahead) == 0


def test_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="horizon"):
        AnticipatorConfig(horizon=0)
    with pytest.raises(ValueError, match="extension"):
        AnticipatorConfig(extension=0)


def test_clock_turns_seconds_into_whole_iterations_keeping_the_remainder() -> None:
    clock = IterationClock(0.125)
    assert clock.elapsed(5.0) == 0  # the first call starts it
    assert clock.elapsed(5.3125) == 2  # 2.5 iterations: half of one carried
    assert clock.elapsed(5.375) == 1  # the carried half and half another
    assert clock.elapsed(5.25) == 0  # time never runs back


def test_clock_learns_the_replicas_pace() -> None:
    clock = IterationClock(0.1, weight=0.5)
    clock.learn(seconds=2.0, iterations=100)  # 0.02 s per iteration observed
    assert clock.seconds_per_iteration == pytest.approx(0.06)
    clock.learn(seconds=1.0, iterations=0)  # a one-token answer says nothing
    assert clock.seconds_per_iteration == pytest.approx(0.06)
