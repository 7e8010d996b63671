"""Progress bars for long commands (``simulate``, ``replay``), drawn with tqdm.

A bar is drawn only on a terminal and never when the user asked for none
(``--no-progress``): into a pipe or a log file a redrawn bar is noise, so
those get the commands' plain lines instead.  A bar counts toward a budget:
virtual or wall seconds of a ``--duration``, else requests of a request cap,
else it just counts.
"""

from __future__ import annotations

from typing import Any, TextIO

from tqdm import tqdm


def raw_stream(wrapper: Any) -> TextIO:
    """The stream under a management command's ``self.stderr``: Django's wrapper ends
    every write with a newline, which would turn tqdm's in-place redraws into lines."""
    stream: TextIO = getattr(wrapper, "_out", wrapper)
    return stream


def bars_wanted(stream: TextIO, *, disabled: bool) -> bool:
    isatty = getattr(stream, "isatty", None)
    return not disabled and callable(isatty) and bool(isatty())


class BudgetBar:
    """A bar over ``duration_s`` seconds when given, else over ``max_requests``."""

    def __init__(
        self,
        label: str,
        stream: TextIO,
        *,
        duration_s: float | None,
        max_requests: int | None,
        seconds_unit: str = "s",
    ) -> None:
        self.by_time = duration_s is not None
        total = duration_s if self.by_time else max_requests
        unit = seconds_unit if self.by_time else "req"
        self.total = None if total is None else float(total)
        self.bar = tqdm(
            total=self.total, desc=label, unit=unit, file=stream, leave=False, dynamic_ncols=True
        )

    def advance(self, seconds: float, sent: int, note: str = "") -> None:
        """Move to ``seconds`` (or ``sent`` requests), capped at the total."""
        value = float(seconds if self.by_time else sent)
        if self.total is not None:
            value = min(value, self.total)
        if value > self.bar.n:
            self.bar.update(value - self.bar.n)
        if note:
            self.bar.set_postfix_str(note, refresh=False)

    def close(self) -> None:
        self.bar.close()
