"""Each request of a run as one flat row: what ``simulate --records`` writes.

A summary says how a policy did; the rows say which requests made it so (which
ones missed the SLO, where each was served, how long it queued, how much of its
prompt was cached), for a reader's own breakdown by region, prompt length or
time.  Times are virtual seconds from the run's start; a latency is None where
the request never got that far.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sim.des.clients import RequestRecord
from sim.des.metrics import in_slo
from sim.des.world import SimRun


def request_rows(label: str, run: SimRun, ttft_slo_s: float) -> Iterator[dict[str, Any]]:
    """One row per request ``run`` issued, in the order clients sent them."""
    start = min((r.sent_at for r in run.records), default=0.0)
    for record in sorted(run.records, key=lambda r: (r.sent_at, r.request_id)):
        yield _row(label, record, start, ttft_slo_s)


def _row(label: str, record: RequestRecord, start: float, ttft_slo_s: float) -> dict[str, Any]:
    journey = record.journey
    started = journey.engine_started_at
    return {
        "run": label,
        "request_id": record.request_id,
        "client_region": record.region,
        "program": record.program,
        "step": record.step,
        "sent_s": _rounded(record.sent_at - start),
        "status": record.status if record.done_at is not None else None,
        "ok": record.ok,
        "met_slo": in_slo(record, ttft_slo_s),
        "ttft_s": _rounded(record.ttft),
        "e2e_s": _rounded(record.e2e),
        "queue_wait_s": _rounded(journey.queue_wait),
        "engine_started_s": _rounded(None if started is None else started - start),
        "forwarded": journey.forwarded,
        "served_region": journey.served_region or None,
        "replica": journey.replica or None,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
    }


def _rounded(seconds: float | None) -> float | None:
    # Microseconds: finer than any step the engine model takes, and short lines.
    return None if seconds is None else round(seconds, 6)
