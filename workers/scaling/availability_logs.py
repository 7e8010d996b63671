"""Spot availability event logs (the 2020 ``training_on_a_dime`` format) as spot traces.

A second, independent source of preemptions beside SkyPilot's traces
(``workers.scaling.traces``).  The logger kept one spot instance per GPU type, GPU
count and zone, pinged it every few minutes, and replaced it when it was gone.  Its
``*.out`` files are lines of five kinds::

    [2020-03-15T10:07:33.000Z] Created instance i-0ad1 with 1 GPU(s) of type v100 in zone us-east-1b
    [2020-03-15T10:21:22.000Z] Instance i-0ad1 running in zone us-east-1b
    [2020-03-15T15:11:45.000Z] Instance i-0ad1 not running in zone us-east-1b
    [2020-03-15T15:11:46.000Z] Successfully deleted instance i-0ad1
    [2020-03-15T10:11:21.000Z] Instance with 8 GPU(s) of type k80 creation failed

Reading: an instance type (``<gpu>x<count>``, e.g. ``k80x1``) is obtainable in a zone
from the moment an instance of it was created there until the ping that found it not
running (its preemption, known to the ping period: about 10 minutes); then it is not,
until the next instance of it is created there.  Creation failures name no zone; they
are why a zone stays down, and are counted, not placed.  A ``running`` line for an
instance the log never created (a log that starts mid-run) names no type: skipped.

Each instance type becomes one binary, multi-zone ``SpotTrace`` sampled every
``gap_s`` from the first event: 1 while obtainable (unbounded capacity, as a 1-node
SkyPilot file reads), 0 otherwise.  Several files (a folder) are merged into one
timeline first, so the zones of every file become zones of one trace per type.

Pure: text in, traces out; ``workers.scaling.spot_sources`` reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from workers.scaling.traces import SpotTrace

EXPECTED_FORMAT = (
    "a spot availability event log (2020 training_on_a_dime format): lines"
    " '[ISO-8601 time] Created instance <id> with <n> GPU(s) of type <gpu> in zone <zone>',"
    " '[time] Instance <id> running in zone <zone>',"
    " '[time] Instance <id> not running in zone <zone>',"
    " '[time] Successfully deleted instance <id>' or"
    " '[time] Instance with <n> GPU(s) of type <gpu> creation failed'"
)

_TIME = r"^\[(?P<ts>[^\]]+)\] "
_PATTERNS = {
    "created": re.compile(
        _TIME + r"Created instance (?P<id>\S+) with (?P<n>\d+) GPU\(s\) of type (?P<gpu>\w+)"
        r" in zone (?P<zone>\S+)$"
    ),
    "not-running": re.compile(_TIME + r"Instance (?P<id>\S+) not running in zone (?P<zone>\S+)$"),
    "running": re.compile(_TIME + r"Instance (?P<id>\S+) running in zone (?P<zone>\S+)$"),
    "deleted": re.compile(_TIME + r"Successfully deleted instance (?P<id>\S+)$"),
    "creation-failed": re.compile(
        _TIME + r"Instance with (?P<n>\d+) GPU\(s\) of type (?P<gpu>\w+) creation failed$"
    ),
}


class LogFormatError(ValueError):
    """A line that is none of the event log's kinds; the message names the format."""


@dataclass(frozen=True)
class LogEvent:
    at: float  # seconds since the epoch
    kind: str  # a key of _PATTERNS
    instance: str = ""
    instance_type: str = ""  # <gpu>x<count>, where the line says
    zone: str = ""


def parse_log(text: str, source: str) -> list[LogEvent]:
    """Every event of one log; ``LogFormatError`` naming ``source``, the line and the
    expected format for anything else (blank lines are skipped)."""
    events = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line:
            events.append(_event(line, f"{source}:{number}"))
    if not events:
        raise LogFormatError(f"{source}: no events; expected {EXPECTED_FORMAT}")
    return events


def _event(line: str, where: str) -> LogEvent:
    for kind, pattern in _PATTERNS.items():
        match = pattern.match(line)
        if match is None:
            continue
        fields = match.groupdict()
        try:
            at = datetime.fromisoformat(fields["ts"].replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise LogFormatError(
                f"{where}: {fields['ts']!r} is not an ISO-8601 time; expected {EXPECTED_FORMAT}"
            ) from None
        gpu, count = fields.get("gpu"), fields.get("n")
        instance_type = f"{gpu.lower()}x{int(count)}" if gpu and count else ""
        return LogEvent(at, kind, fields.get("id") or "", instance_type, fields.get("zone") or "")
    raise LogFormatError(f"{where}: {line[:100]!r} is not {EXPECTED_FORMAT}")


@dataclass(frozen=True)
class LogSummary:
    """What a merged timeline held, for the command to say."""

    files: int
    events: int
    preemptions: int
    creation_failures: int
    zones: tuple[str, ...]
    instance_types: tuple[str, ...]


def traces_from_logs(
    name: str, logs: Sequence[Sequence[LogEvent]], gap_s: float = 60.0
) -> tuple[list[SpotTrace], LogSummary]:
    """One binary multi-zone trace per instance type from the merged ``logs``."""
    if gap_s <= 0:
        raise ValueError(f"gap_s must be positive, not {gap_s}")
    events = sorted((e for log in logs for e in log), key=lambda e: e.at)
    if not events:
        raise LogFormatError(f"{name}: no events; expected {EXPECTED_FORMAT}")
    origin, end = events[0].at, events[-1].at
    intervals = _intervals(events, end)
    steps = max(1, int((end - origin) // gap_s) + 1)
    by_type: dict[str, dict[str, list[int]]] = {}
    for (instance_type, zone), spans in sorted(intervals.items()):
        series = [0] * steps
        for start, stop in spans:
            first = max(0, int(-(-(start - origin) // gap_s)))  # first sample at or after start
            for i in range(first, steps):
                if origin + i * gap_s >= stop:
                    break
                series[i] = 1
        by_type.setdefault(instance_type, {})[zone] = series
    traces = [
        SpotTrace(name=f"{name}/{t}", gap_s=gap_s, zones=zones, binary=True)
        for t, zones in sorted(by_type.items())
    ]
    summary = LogSummary(
        files=len(logs),
        events=len(events),
        preemptions=sum(1 for e in events if e.kind == "not-running"),
        creation_failures=sum(1 for e in events if e.kind == "creation-failed"),
        zones=tuple(sorted({zone for _, zone in intervals})),
        instance_types=tuple(sorted(by_type)),
    )
    return traces, summary


def _intervals(
    events: Iterable[LogEvent], end: float
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(instance type, zone) -> the [start, stop) spans an instance of it was up."""
    kinds: dict[str, str] = {}  # instance id -> its type, from its creation line
    up: dict[str, tuple[str, str, float]] = {}  # instance id -> (type, zone, since)
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for event in events:
        if event.kind == "created":
            kinds[event.instance] = event.instance_type
            up.setdefault(event.instance, (event.instance_type, event.zone, event.at))
        elif event.kind == "not-running" and event.instance in up:
            instance_type, zone, since = up.pop(event.instance)
            spans.setdefault((instance_type, zone), []).append((since, event.at))
    for instance_type, zone, since in up.values():
        spans.setdefault((instance_type, zone), []).append((since, end + 1.0))
    return spans
