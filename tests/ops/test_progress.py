"""Progress bars: drawn on a terminal only, counting toward the command's budget."""

from __future__ import annotations

import io

from ops.progress import BudgetBar, bars_wanted


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal_and_never_when_refused() -> None:
    assert bars_wanted(Terminal(), disabled=False)
    assert not bars_wanted(Terminal(), disabled=True)
    assert not bars_wanted(io.StringIO(), disabled=False)  # a pipe or a log file


def test_a_duration_bar_counts_seconds_and_stops_at_its_total() -> None:
    stream = Terminal()
    bar = BudgetBar("run", stream, duration_s=10, max_requests=500, seconds_unit="virtual s")
    bar.advance(4.0, 100)
    assert bar.bar.n == 4.0
    bar.advance(3.0, 120)  # never backwards
    bar.advance(25.0, 900, "draining")  # the drain after the budget stays at 100 %
    assert bar.bar.n == 10.0
    bar.close()
    assert "run:" in stream.getvalue() and "virtual s" in stream.getvalue()


def test_a_request_bar_counts_requests_and_an_open_one_just_counts() -> None:
    bar = BudgetBar("replay", Terminal(), duration_s=None, max_requests=50)
    bar.advance(100.0, 20)
    assert (bar.bar.n, bar.bar.total) == (20.0, 50.0)
    bar.close()
    endless = BudgetBar("replay", Terminal(), duration_s=None, max_requests=None)
    endless.advance(5.0, 7)
    assert endless.bar.n == 7.0 and endless.bar.total is None
    endless.close()
