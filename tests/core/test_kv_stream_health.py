"""What to do on a sequence gap, and when a stream is called silent."""

from __future__ import annotations

from core.kv_stream_health import (
    GapStep,
    ProbeSample,
    SilenceConfig,
    SilenceDetector,
    StreamState,
    gap_plan,
    replay_heals,
    stream_state,
)


def test_gap_plan_tries_replay_then_snapshot_and_ends_by_clearing() -> None:
    assert gap_plan(replay=True, snapshot=True) == (
        GapStep.REPLAY,
        GapStep.SNAPSHOT,
        GapStep.CLEAR,
    )
    assert gap_plan(replay=False, snapshot=True) == (GapStep.SNAPSHOT, GapStep.CLEAR)
    assert gap_plan(replay=True, snapshot=False) == (GapStep.REPLAY, GapStep.CLEAR)
    assert gap_plan(replay=False, snapshot=False) == (GapStep.CLEAR,)


def test_a_replay_heals_only_if_the_buffer_still_held_the_first_lost_message() -> None:
    assert replay_heals(7, [7, 8, 9])
    assert not replay_heals(7, [9, 10])  # 7 and 8 already left the buffer
    assert not replay_heals(7, [])


def feed(detector: SilenceDetector, samples: list[tuple[float, float, int]]) -> list[bool]:
    return [detector.observe(ProbeSample(q, h, e)) for q, h, e in samples]


def test_misses_without_events_for_the_whole_window_make_a_stream_silent() -> None:
    detector = SilenceDetector(SilenceConfig(probes=3, min_missed_tokens=32))
    states = feed(detector, [(0, 0, 5), (40, 0, 5), (80, 0, 5), (120, 0, 5)])
    assert states == [False, False, False, True]


def test_one_event_makes_it_ok_again() -> None:
    detector = SilenceDetector(SilenceConfig(probes=2, min_missed_tokens=32))
    assert feed(detector, [(0, 0, 0), (50, 0, 0), (100, 0, 0)])[-1]
    assert not detector.observe(ProbeSample(150, 0, 1))


def test_fully_cached_prompts_publish_nothing_and_are_not_silence() -> None:
    detector = SilenceDetector(SilenceConfig(probes=2, min_missed_tokens=32))
    # Every queried token hit: vLLM stores no block and publishes no event.
    assert feed(detector, [(0, 0, 3), (200, 200, 3), (400, 400, 3), (600, 600, 3)]) == [False] * 4


def test_a_trickle_of_short_misses_stays_under_the_minimum() -> None:
    detector = SilenceDetector(SilenceConfig(probes=2, min_missed_tokens=64))
    assert feed(detector, [(0, 0, 0), (10, 0, 0), (20, 0, 0)]) == [False] * 3


def test_a_restarted_engine_starts_a_fresh_window() -> None:
    detector = SilenceDetector(SilenceConfig(probes=2, min_missed_tokens=32))
    assert feed(detector, [(500, 0, 0), (600, 0, 0), (700, 0, 0)])[-1]
    assert feed(detector, [(10, 0, 0), (60, 0, 0)]) == [False, False]


def test_stream_state_names_the_most_specific_cause() -> None:
    def state(known: bool, bind: bool, silent: bool) -> StreamState:
        return stream_state(endpoint_known=known, bind_endpoint=bind, silent=silent)

    assert state(False, False, True) is StreamState.NO_STREAM
    assert state(True, False, True) is StreamState.CONNECT_ENDPOINT
    assert state(True, True, True) is StreamState.SILENT
    assert state(True, True, False) is StreamState.OK
