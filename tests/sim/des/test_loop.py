"""The event loop: time order, FIFO among equal times, bounded runs."""

from __future__ import annotations

from sim.des.loop import EventLoop


def test_callbacks_run_in_time_order_and_fifo_at_equal_times() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.call_at(2.0, seen.append, "late")
    loop.call_at(1.0, seen.append, "first at 1")
    loop.call_at(1.0, seen.append, "second at 1")
    loop.call_soon(seen.append, "now")
    loop.run()
    assert seen == ["now", "first at 1", "second at 1", "late"]
    assert loop.now == 2.0
    assert loop.events_run == 4


def test_run_until_stops_before_later_events_and_resumes() -> None:
    loop = EventLoop()
    seen: list[float] = []

    def tick() -> None:
        seen.append(loop.now)
        loop.call_later(1.0, tick)

    loop.call_soon(tick)
    loop.run(until=2.5)
    assert seen == [0.0, 1.0, 2.0]
    assert loop.now == 2.5
    loop.run(until=4.0)
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_callback_scheduled_in_the_past_runs_now_not_earlier() -> None:
    loop = EventLoop()
    seen: list[float] = []
    loop.call_at(5.0, lambda: loop.call_at(1.0, lambda: seen.append(loop.now)))
    loop.run()
    assert seen == [5.0]


def test_stop_ends_the_run_after_the_current_callback() -> None:
    loop = EventLoop()
    seen: list[int] = []
    loop.call_soon(lambda: (seen.append(1), loop.stop()))
    loop.call_soon(seen.append, 2)
    loop.run()
    assert seen == [1]
    assert loop.pending() == 1
