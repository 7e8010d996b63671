"""How a drill judges itself and says so: pure verdicts, one report shape for every drill.

No Django, no clock, no I/O: the runner measures, this module decides and renders,
so the verdict can be tested against its own numbers.

* ``judge``: a reaction counts only when it came within the bound.  A check that
  was started in time but answered after the bound (a slow poll on a busy
  machine) is a late reaction, and a late reaction fails the drill, always.
* ``traffic_share``: how an operator sees a slowed replica being avoided, from the
  balancer's own counters: the replica's share of the requests dispatched since
  the fault, against the share it had before (or, with too little traffic before,
  its fair share among its model's replicas).
* ``DrillReport`` and ``render``: what every drill prints, the same way for all
  kinds: what was measured, the reaction against its bound, the verdict and why,
  the timeline and the request counts on each side of the reaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The outcomes, spelled as ``fleet.models.DrillRun.Outcome`` stores them.
PASSED = "passed"
FAILED_AFTER_REACTION = "failed-after-reaction"
NO_REACTION = "no-reaction"
NOT_CONVERGED = "not-converged"
ABORTED = "aborted"

# What each kind's reaction check measures (the report's first line says it).
MEASURES: Mapping[str, str] = {
    "preempt": "seconds from the fault until no balancer lists the replicas as healthy",
    "kill-balancer": "seconds from SIGKILL until a live balancer routes every replica it owned",
    "slow-replica": (
        "seconds from the slowdown until the replica's share of the requests its "
        "balancers dispatched fell below half the share it had before"
    ),
    "partition": "seconds from the cut until each region reports the other not alive",
    "redis-outage": "seconds from the pause until every live balancer reports Redis unreachable",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    why: str


def judge(
    *,
    reaction_s: float | None,
    bound_s: float,
    failed_after: int,
    converged: bool | None = None,
    aborted: bool = False,
) -> Verdict:
    """The drill's outcome from what it measured; ``reaction_s`` is when the check
    that saw the reaction *answered*, so a slow check cannot pass a late reaction."""
    if aborted:
        return Verdict(ABORTED, "the drill was stopped before it finished")
    if reaction_s is None:
        return Verdict(NO_REACTION, f"routing did not react within {bound_s:.2f}s")
    if reaction_s > bound_s:
        return Verdict(
            NO_REACTION, f"routing reacted after {reaction_s:.2f}s, past its {bound_s:.2f}s bound"
        )
    if converged is False:
        return Verdict(NOT_CONVERGED, "state did not converge after the fault cleared")
    if failed_after:
        return Verdict(
            FAILED_AFTER_REACTION, f"{failed_after} request(s) sent after the reaction failed"
        )
    return Verdict(PASSED, f"reacted in {reaction_s:.2f}s within {bound_s:.2f}s, none failed after")


@dataclass(frozen=True, slots=True)
class Share:
    """The slowed replica's part of what was dispatched since the fault, against
    what it usually gets: its share before the fault when enough was dispatched
    before to tell (``usual``), else its fair share among the model's replicas."""

    dispatched: int  # to every replica of the model, since the fault
    to_replica: int
    replicas: int
    usual: float | None = None

    @property
    def share(self) -> float:
        return self.to_replica / self.dispatched if self.dispatched else 0.0

    @property
    def fair(self) -> float:
        return 1.0 / self.replicas if self.replicas else 0.0

    @property
    def reference(self) -> float:
        return self.usual if self.usual is not None else self.fair

    def moved_away(self, *, min_dispatched: int, fraction: float = 0.5) -> bool:
        """Enough requests were dispatched since the fault to tell, and the replica
        got less than ``fraction`` of the share it usually gets."""
        if self.replicas < 2 or self.dispatched < min_dispatched:
            return False
        return self.share < self.reference * fraction

    def describe(self, name: str) -> str:
        usual = (
            f"{self.usual:.0%} before it"
            if self.usual is not None
            else f"fair share {self.fair:.0%} of {self.replicas}"
        )
        return (
            f"{name} got {self.to_replica} of {self.dispatched} requests dispatched since "
            f"the fault ({self.share:.0%}; {usual})"
        )


def traffic_share(
    before: Mapping[str, int], now: Mapping[str, int], name: str, *, min_before: int = 1
) -> Share | None:
    """``before`` (at the fault) and ``now``: requests dispatched per replica of one
    model so far (finished plus outstanding, the balancer's own counters).  None
    when ``name`` is not among them; a replica missing from ``before`` started from
    zero.  The share before the fault counts when at least ``min_before`` requests
    were dispatched before it."""
    if name not in now:
        return None
    delta = {r: max(0, n - before.get(r, 0)) for r, n in now.items()}
    total_before = sum(before.get(r, 0) for r in now)
    usual = before.get(name, 0) / total_before if total_before >= min_before else None
    return Share(sum(delta.values()), delta[name], len(now), usual)


@dataclass(frozen=True, slots=True)
class PhaseCounts:
    succeeded: int = 0
    retried: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class DrillReport:
    kind: str
    number: int | None
    target: str
    bound_s: float
    reaction_s: float | None
    outcome: str
    timeline: Sequence[tuple[float, str]]
    before: PhaseCounts
    after: PhaseCounts

    @property
    def measures(self) -> str:
        return MEASURES.get(self.kind, "seconds from the fault until routing reacted")

    @property
    def verdict(self) -> Verdict:
        """The reasons behind the recorded outcome (recomputed from the same numbers)."""
        return judge(
            reaction_s=self.reaction_s,
            bound_s=self.bound_s,
            failed_after=self.after.failed,
            converged=False if self.outcome == NOT_CONVERGED else None,
            aborted=self.outcome == ABORTED,
        )


def render(report: DrillReport) -> str:
    reaction = f"{report.reaction_s:.2f}s" if report.reaction_s is not None else "none"
    number = f" #{report.number}" if report.number is not None else ""
    b, a = report.before, report.after
    lines = [
        f"drill {report.kind}{number}: {report.target}",
        f"measured: {report.measures}",
        f"reaction: {reaction} (bound {report.bound_s:.2f}s)",
        "timeline:",
        *(f"  +{t:7.2f}s  {event}" for t, event in report.timeline),
        "requests (by when sent)   succeeded  retried  failed",
        f"  before the reaction     {b.succeeded:9d}  {b.retried:7d}  {b.failed:6d}",
        f"  after the reaction      {a.succeeded:9d}  {a.retried:7d}  {a.failed:6d}",
        f"outcome: {report.outcome} ({report.verdict.why})",
    ]
    return "\n".join(lines)
