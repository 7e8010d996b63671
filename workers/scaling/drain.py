"""Drain before scale-down: when may a replica that leaves the fleet be terminated?

A replica chosen for removal (by any scaling policy's reconcile step) or warned of a
spot preemption is *drained*: its row goes ``draining`` at once, so no balancer routes
a new request to it after its next topology refresh, and it keeps serving what it
already holds.  Each scaling beat then asks :func:`judge` about it, with the number of
requests the replica itself reports in flight (running + waiting on its ``/metrics``;
``None`` when that is unknown):

1. **settling** (``elapsed < settle_s``): a balancer may still push to it until its
   topology refresh, so a zero count proves nothing yet: wait;
2. **drained** (in flight = 0 after settling): terminate; nothing is cut;
3. **deadline** (``elapsed >= deadline_s`` with requests still in flight, or a replica
   that does not answer): terminate anyway.  The requests still running are cut (their
   clients see the stream end without ``[DONE]``); the glue records how many in a
   warning Event.  The deadline bounds what a stuck stream can cost, and a preemption
   warning's lead time bounds it from the other side: the cloud will not wait;
4. otherwise: wait.

An unknown count (a metrics probe that timed out or failed) counts as busy: silence is
not evidence that nothing runs, so only the deadline ends such a drain.  (The glue reads
a refused connection as 0: no process listens, so nothing runs there.)

Pure: plain data in, a verdict out; ``now`` is an argument.  The live glue
(``workers.draining``) keeps each drain in the service's ``scaling_state``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

SCALE_DOWN = "scale-down"
PREEMPTION_WARNING = "preemption-warning"
REASONS = (SCALE_DOWN, PREEMPTION_WARNING)


@dataclass(frozen=True)
class DrainConfig:
    """``settle_s``: at least one balancer topology refresh; ``deadline_s``: the most a
    drain may take before what still runs is cut."""

    settle_s: float
    deadline_s: float

    def __post_init__(self) -> None:
        if self.settle_s < 0:
            raise ValueError(f"drain settle_s must be >= 0, not {self.settle_s}")
        if self.deadline_s < self.settle_s:
            raise ValueError(
                f"drain deadline_s ({self.deadline_s}) must be >= settle_s ({self.settle_s})"
            )


@dataclass(frozen=True)
class Drain:
    """One replica being drained: since when, and why."""

    handle: str
    started_at: float
    reason: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"drain reason {self.reason!r} is not one of {REASONS}")

    def to_dict(self) -> dict[str, object]:
        return {"started_at": self.started_at, "reason": self.reason}


class Verdict(StrEnum):
    WAIT = "wait"
    DRAINED = "drained"  # nothing in flight: terminate, nothing is cut
    DEADLINE = "deadline"  # past the deadline: terminate, cutting what still runs


def judge(drain: Drain, now: float, in_flight: int | None, config: DrainConfig) -> Verdict:
    """What to do with ``drain`` at ``now``, the replica reporting ``in_flight``."""
    if in_flight is not None and in_flight < 0:
        raise ValueError(f"{drain.handle}: in-flight count {in_flight} is negative")
    elapsed = now - drain.started_at
    if elapsed < config.settle_s:
        return Verdict.WAIT
    if in_flight == 0:
        return Verdict.DRAINED
    if elapsed >= config.deadline_s:
        return Verdict.DEADLINE
    return Verdict.WAIT


def drains_from_state(value: object) -> dict[str, Drain]:
    """The drains kept in ``scaling_state["draining"]``; malformed entries are dropped
    (the state is ours, but an operator may have edited it)."""
    if not isinstance(value, Mapping):
        return {}
    drains = {}
    for handle, entry in value.items():
        if not isinstance(handle, str) or not isinstance(entry, Mapping):
            continue
        started, reason = entry.get("started_at"), entry.get("reason")
        if isinstance(started, int | float) and reason in REASONS:
            drains[handle] = Drain(handle, float(started), str(reason))
    return drains


def drains_to_state(drains: Mapping[str, Drain]) -> dict[str, object]:
    return {handle: drains[handle].to_dict() for handle in sorted(drains)}
