"""Run one drill end to end and record it as a ``DrillRun``.

The sequence: optional traffic starts (and runs ``warmup_s`` so "before" has healthy
requests in it), the fault is injected, the balancers' state is polled every
``poll_s`` until the plan's reaction check passes or ``bound_s`` (the configured
detection periods plus slack) runs out, traffic goes on for ``after_s`` past the
reaction (and the fault is held at least ``hold_s``), then the fault is restored if
the plan can, traffic stops and every request is counted on its side of the
reaction point by when it was *sent*.  Outcome (``ops.drills.judging.judge``):
passed when routing reacted within the bound and no request sent after the
reaction failed; a reaction seen after the bound, even by a check started before
it, fails the drill.  A plan with a ``converge`` check
(partition, Redis outage) also has to see the system whole again within
``converge_bound_s`` after the fault is cleared, else the outcome is
``not-converged``.

Long waits go through ``stop.wait`` so SIGTERM (the command sets ``stop``) ends a
drill at once, still restoring the fault and recording the run as aborted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from fleet.models import DrillRun
from ops.drills.judging import judge
from ops.drills.traffic import RequestRecord, TrafficConfig, split_at

if TYPE_CHECKING:
    # Types only: the checks' HTTP polling and the SDK stay out of the console's
    # drill catalog and the URLconf, which import this module.
    from ops.drills.reactions import ReactionCheck
    from ops.drills.stream import TrafficStream


@dataclass
class DrillPlan:
    kind: str
    target: str
    bound_s: float
    inject: Callable[[], str]  # breaks the thing; returns what it did
    check: ReactionCheck
    restore: Callable[[], str] | None = None
    hold_s: float = 0.0
    converge: ReactionCheck | None = None  # after restore: is the system whole again?
    converge_bound_s: float = 0.0


@dataclass(frozen=True)
class DrillOptions:
    traffic: TrafficConfig | None = None
    resolve_url: Callable[[], str | None] = lambda: None  # where the region's clients go now
    warmup_s: float = 1.0
    after_s: float = 3.0
    poll_s: float = 0.2


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    entries: list[dict[str, Any]] = field(default_factory=list)
    echo: Callable[[str], None] | None = None

    def add(self, text: str, at: float | None = None) -> None:
        t = round((at if at is not None else time.monotonic()) - self.t0, 3)
        self.entries.append({"t": t, "event": text})
        if self.echo is not None:
            self.echo(f"+{t:7.2f}s  {text}")


class _Drill:
    def __init__(self, plan: DrillPlan, options: DrillOptions, stop: threading.Event) -> None:
        self.plan, self.options, self.stop = plan, options, stop
        self.stream: TrafficStream | None = None
        self.injected_at: float | None = None
        self.reacted_at: float | None = None
        self.converged: bool | None = None

    @property
    def reaction_s(self) -> float | None:
        if self.injected_at is None or self.reacted_at is None:
            return None
        return round(self.reacted_at - self.injected_at, 3)

    def follow_clients(self, timeline: Timeline) -> None:
        """Point the traffic at the balancer that serves the region now."""
        url = self.options.resolve_url()
        if self.stream is not None and url and url != self.stream.base_url:
            self.stream.base_url = url
            timeline.add(f"clients now sent to {url}")

    def watch(self, timeline: Timeline, injected_at: float) -> None:
        """Poll the check until it sees the reaction or the bound has passed.  The
        deadline is read *after* each check: a check started in time that answers
        late (a slow poll on a busy machine) is recorded with the time it answered,
        and ``judge`` fails a reaction past its bound."""
        last = None
        while not self.stop.is_set():
            reaction = last = self.plan.check()
            answered = time.monotonic()
            self.follow_clients(timeline)
            if reaction.reacted:
                # Clients were re-pointed just above, so every request sent from here
                # on goes where routing now serves the region.
                self.reacted_at = answered
                took = answered - injected_at
                late = " (past the bound)" if took > self.plan.bound_s else ""
                timeline.add(f"routing reacted after {took:.2f}s{late}: {reaction.detail}")
                return
            if answered - injected_at > self.plan.bound_s:
                break
            self.stop.wait(self.options.poll_s)
        # What the check saw last: the measurement that fell short.
        seen = f": last check saw {last.detail}" if last is not None else ""
        timeline.add(f"routing did not react within {self.plan.bound_s:.1f}s{seen}")

    def converge(self, timeline: Timeline) -> None:
        check = self.plan.converge
        if check is None:
            return
        started = time.monotonic()
        last = None
        while not self.stop.is_set() and time.monotonic() - started <= self.plan.converge_bound_s:
            result = last = check()
            if result.reacted:
                self.converged = True
                took = time.monotonic() - started
                timeline.add(f"state converged {took:.2f}s after the fault ended: {result.detail}")
                return
            self.stop.wait(self.options.poll_s)
        self.converged = False
        # What the check saw last: what had not converged.
        seen = f": last check saw {last.detail}" if last is not None else ""
        timeline.add(f"state did not converge within {self.plan.converge_bound_s:.1f}s{seen}")

    def linger(self, timeline: Timeline, injected_at: float) -> None:
        after = (self.reacted_at or time.monotonic()) + (self.options.after_s if self.stream else 0)
        until = max(after, injected_at + self.plan.hold_s)
        while not self.stop.is_set() and time.monotonic() < until:
            self.follow_clients(timeline)
            self.stop.wait(min(self.options.poll_s, max(0.0, until - time.monotonic())))


def run_drill(
    plan: DrillPlan,
    options: DrillOptions,
    *,
    stop: threading.Event | None = None,
    echo: Callable[[str], None] | None = None,
) -> DrillRun:
    stop = stop or threading.Event()
    run = DrillRun.objects.create(kind=plan.kind, target=plan.target, bound_s=plan.bound_s)
    timeline = Timeline(echo=echo)
    drill = _Drill(plan, options, stop)
    records: list[RequestRecord] = []
    completed = restored = False
    try:
        drill.stream = _start_traffic(options, timeline)
        if drill.stream is not None:
            stop.wait(options.warmup_s)
        injected_at = time.monotonic()
        what = plan.inject()
        drill.injected_at = injected_at
        timeline.add(f"fault injected: {what}", at=injected_at)
        drill.watch(timeline, injected_at)
        drill.linger(timeline, injected_at)
        if plan.restore is not None:
            restored = True
            timeline.add(f"fault cleared: {plan.restore()}")
        drill.converge(timeline)
        completed = True
    finally:
        # Also on an error (the fault could not be set, the database went away): the
        # fault is cleared, traffic stopped, and the run recorded as aborted.
        if plan.restore is not None and drill.injected_at is not None and not restored:
            timeline.add(f"fault cleared: {plan.restore()}")
        if drill.stream is not None:
            records = drill.stream.stop()
            timeline.add(f"traffic stopped after {len(records)} requests")
        if not completed:
            _finish(run, timeline, records, drill, aborted=True)
    return _finish(run, timeline, records, drill, aborted=stop.is_set())


def _start_traffic(options: DrillOptions, timeline: Timeline) -> TrafficStream | None:
    if options.traffic is None:
        return None
    url = options.resolve_url()
    if url is None:
        timeline.add("no live balancer serves the region: drill runs without traffic")
        return None
    # The openai SDK loads here, when a drill sends traffic, and nowhere earlier: this
    # module is imported by every drill command and the console's drill catalog, and
    # through the URLconf by every manage.py command's checks (~1 s of CPU each).
    from ops.drills.stream import TrafficStream

    stream = TrafficStream(options.traffic, url)
    stream.start()
    timeline.add(f"traffic started: {options.traffic.rate:g} req/s to {url}")
    return stream


def _milestones(timeline: Timeline, records: list[RequestRecord]) -> None:
    """Request-level facts worth a line: failures, and which balancer answered."""
    failed = [r for r in records if not r.ok]
    if failed:
        timeline.add(f"first failed request sent ({failed[0].error})", at=failed[0].sent_at)
        timeline.add("last failed request sent", at=failed[-1].sent_at)
    serving = None
    for record in records:
        if record.ok and record.balancer != serving:
            serving = record.balancer
            timeline.add(f"requests served by {serving}", at=record.sent_at)


def _finish(
    run: DrillRun,
    timeline: Timeline,
    records: list[RequestRecord],
    drill: _Drill,
    *,
    aborted: bool,
) -> DrillRun:
    _milestones(timeline, records)
    counts = split_at(records, drill.reacted_at)
    for phase, outcomes in counts.items():
        for outcome, n in outcomes.items():
            setattr(run, f"{outcome}_{phase}", n)
    run.reaction_s = drill.reaction_s
    run.timeline = sorted(timeline.entries, key=lambda e: e["t"])
    run.ended_at = timezone.now()
    run.outcome = _outcome(run, aborted, drill.converged)
    run.save()
    return run


def _outcome(run: DrillRun, aborted: bool, converged: bool | None = None) -> str:
    verdict = judge(
        reaction_s=run.reaction_s,
        bound_s=run.bound_s,
        failed_after=run.failed_after,
        converged=converged,
        aborted=aborted,
    )
    return verdict.outcome
