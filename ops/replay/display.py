"""The replay's progress line and final summary, as text.

On a terminal the status line is redrawn in place with ``\\r`` about once a
second; into a pipe or a log file (the demo runs replay as a child process) it
becomes a plain line every ``plain_every_s`` seconds instead, so logs stay
readable.
"""

from __future__ import annotations

from collections.abc import Callable

from ops.replay.stats import ReplaySnapshot


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _errors(snap: ReplaySnapshot) -> str:
    if not snap.failed:
        return "errors 0"
    kinds = ", ".join(f"{kind}: {count}" for kind, count in snap.errors.items())
    return f"errors {snap.failed} ({kinds})"


def format_status(snap: ReplaySnapshot) -> str:
    """One line: elapsed, counts, rates, TTFT percentiles and cache share."""
    return (
        f"{snap.elapsed:6.1f}s  sent {snap.sent}  ok {snap.ok}  {_errors(snap)}  "
        f"in flight {snap.in_flight}  {snap.requests_per_s:.1f} req/s  "
        f"{snap.tokens_per_s:.0f} tok/s  TTFT p50 {_ms(snap.ttft_p50)} p90 {_ms(snap.ttft_p90)}  "
        f"cached {snap.cached_share:.0%}"
    )


def format_summary(snap: ReplaySnapshot) -> str:
    """A two-column table of the whole run, then each error kind with its message."""
    rows = [
        ("duration", f"{snap.elapsed:.1f} s"),
        ("requests sent", str(snap.sent)),
        ("succeeded", str(snap.ok)),
        ("failed", str(snap.failed)),
        ("cancelled at stop", str(snap.cancelled)),
        ("throughput", f"{snap.requests_per_s:.2f} req/s"),
        ("output tokens/s", f"{snap.tokens_per_s:.1f}"),
        ("prompt tokens", str(snap.prompt_tokens)),
        ("cached prompt tokens", f"{snap.cached_tokens} ({snap.cached_share:.1%})"),
        ("completion tokens", str(snap.completion_tokens)),
        (
            "TTFT p50 / p90 / p99",
            " / ".join(map(_ms, (snap.ttft_p50, snap.ttft_p90, snap.ttft_p99))),
        ),
        ("latency p50 / p90", f"{_ms(snap.latency_p50)} / {_ms(snap.latency_p90)}"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = ["Replay summary", "-" * (width + 20)]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    for kind, count in snap.errors.items():
        lines.append(f"error {kind} x{count}: {snap.error_messages.get(kind, '')}")
    return "\n".join(lines)


class StatusLine:
    """Writes the status line through ``write``: in place on a TTY, periodic otherwise."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        tty: bool,
        flush: Callable[[], None] = lambda: None,
        plain_every_s: float = 10.0,
    ) -> None:
        self.write = write
        self.tty = tty
        self.flush = flush
        self.plain_every_s = plain_every_s
        self._last_plain: float | None = None
        self._width = 0

    def update(self, snap: ReplaySnapshot) -> None:
        line = format_status(snap)
        if self.tty:
            # Pad over the previous, possibly longer, line before returning the cursor.
            self.write("\r" + line.ljust(self._width))
            self._width = len(line)
        elif self._last_plain is None or snap.elapsed - self._last_plain >= self.plain_every_s:
            self.write(line + "\n")
            self._last_plain = snap.elapsed
        self.flush()

    def close(self) -> None:
        """End the in-place line so what follows starts on a fresh line."""
        if self.tty and self._width:
            self.write("\n")
            self.flush()
