"""What a drill's traffic is and how its requests are counted.

``TrafficConfig`` is what a drill command asks for (``--traffic R`` and friends),
``RequestRecord`` what each request came to, and ``split_at`` counts them on either
side of the reaction point.  Plain data: sending is ``ops.drills.stream``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    number: int
    sent_at: float  # time.monotonic()
    ended_at: float
    ok: bool
    attempts: int
    base_url: str
    balancer: str | None = None
    replica: str | None = None
    error: str | None = None

    @property
    def outcome(self) -> str:
        if not self.ok:
            return "failed"
        return "retried" if self.attempts > 1 else "succeeded"


@dataclass(frozen=True)
class TrafficConfig:
    api_key: str
    model: str
    rate: float
    max_requests: int = 200
    # Enough that requests to a dead balancer (each held ~1.5 s by the SDK's retries)
    # do not queue the next arrivals behind them at drill rates.
    workers: int = 32
    max_retries: int = 2
    timeout_s: float = 30.0
    max_tokens: int = 8


def split_at(records: list[RequestRecord], point: float | None) -> dict[str, dict[str, int]]:
    """Counts by outcome for requests sent before and after ``point`` (monotonic);
    with no reaction point every request is "before"."""
    counts = {phase: {"succeeded": 0, "retried": 0, "failed": 0} for phase in ("before", "after")}
    for record in records:
        phase = "after" if point is not None and record.sent_at >= point else "before"
        counts[phase][record.outcome] += 1
    return counts
