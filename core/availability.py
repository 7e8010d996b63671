"""When may the balancer push one more request to a replica?  (SkyLB §3.3)

Requests wait in the balancer (``core.pending_queue``) and are pushed only
to *available* replicas.  Three rules, chosen per service with the
``"pushing"`` key of ``ServiceConfig.policy_params``:

``sp-p`` (default): selective pushing on *pending* requests.  A replica is
    available while its latest ``/metrics`` probe showed no waiting request and
    the requests pushed since that probe have not used up a small budget
    (``"push_budget"``, default 1).  Pushes since the probe count because the
    probe cannot have seen them: a burst must not pile onto one replica between
    probes (DESIGN.md, request path step 4).  Three refinements keep the count
    honest:

    * a probe resets the count to the requests this balancer has outstanding
      on the replica that the probe does *not* show (outstanding minus running
      and waiting): pushed, still on the wire, not yet in the engine;
    * a finished request frees a batch slot, so it takes one off the count;
    * a probe older than ``probe_stale_s`` (or none yet) says nothing about
      pending requests: the rule falls back to SP-O's cap until one arrives.

    With N processes behind one balancer address (``core.shared_state``)
    the other processes' pushes since their own probes count against the same
    budget, and SP-O's cap counts their outstanding requests too, so a burst
    cannot pile onto one replica through several processes.

``sp-o``: selective pushing on *outstanding* requests: fewer than a fixed cap
    (``MERIDIAN_REPLICA_MAX_OUTSTANDING``).  Simple, but the right cap depends on
    the requests' memory footprint, which is why SkyLB prefers SP-P.

``blind``: no selection and so no queue: any healthy replica takes the request
    at once (kept to compare against, SkyLB Figure 9's "BP").

``tokens``: SP-P's rule expressed in tokens, for a policy that prices work
    (``core.policy.CostModel``, the ``meridian`` policy's default): a
    replica is available while the prefill work this balancer has queued on it
    is under the policy's admission limit (``CostModel.admits``).  No push
    budget: the replica holding a prefix stays available while its queued work
    is small.  SP-O's cap is a backstop only where the engine says it is full:
    past the cap a replica stays available while a fresh probe shows no request
    waiting in the engine (its batch has room), and without a fresh probe the cap
    holds.  A cap applied regardless held a holder back whenever it had 32
    requests out while its 64-sequence batch had room; the request waited out the
    cost model's wait limit and then went to that holder anyway (ToT on L4s, 60
    virtual s: 1,035 of 4,649 requests waited 0.25 s or more; over 120 virtual s,
    seeds 1-3, TTFT p90 0.43 s with the cap regardless, 0.27-0.29 s with this
    rule).  A policy that prices nothing falls back to SP-O's cap.

Everything here is plain data and functions of ``now``; the router owns one
``ProbeMark`` per replica and calls these on every decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.types import TargetState

PUSHING_KEY = "pushing"
PUSH_BUDGET_KEY = "push_budget"


class PushingMode(StrEnum):
    SP_P = "sp-p"
    SP_O = "sp-o"
    BLIND = "blind"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class PushingConfig:
    """A service's selective-pushing choice (from its ``policy_params``)."""

    mode: PushingMode = PushingMode.SP_P
    push_budget: int = 1

    def __post_init__(self) -> None:
        if self.push_budget < 1:
            raise ValueError(f"{PUSH_BUDGET_KEY} must be at least 1, not {self.push_budget}")


def split_pushing_params(
    params: Mapping[str, Any], default_mode: PushingMode = PushingMode.SP_P
) -> tuple[PushingConfig, dict[str, Any]]:
    """Take the pushing keys out of ``policy_params``; the rest belongs to the policy.

    ``default_mode`` applies when ``pushing`` is absent (the policy's own default,
    ``core.registry.default_pushing``).  ``ValueError`` with a clear
    message for an unknown mode or a bad budget.
    """
    rest = dict(params)
    raw_mode = rest.pop(PUSHING_KEY, default_mode.value)
    raw_budget = rest.pop(PUSH_BUDGET_KEY, 1)
    try:
        mode = PushingMode(str(raw_mode).lower())
    except ValueError:
        choices = ", ".join(m.value for m in PushingMode)
        raise ValueError(f"{PUSHING_KEY}={raw_mode!r} is not one of: {choices}") from None
    if isinstance(raw_budget, bool) or not isinstance(raw_budget, int):
        raise ValueError(f"{PUSH_BUDGET_KEY} must be an integer, not {raw_budget!r}")
    return PushingConfig(mode, raw_budget), rest


@dataclass(frozen=True, slots=True)
class AvailabilityLimits:
    """Balancer-wide bounds: the SP-O cap and how old a probe may be for SP-P."""

    max_outstanding: int
    probe_stale_s: float


@dataclass(slots=True)
class ProbeMark:
    """What the latest probe of one replica tells SP-P, and what happened since."""

    probed_at: float | None = None
    waiting: int = 0
    # Pushes the latest probe cannot account for (see the module docstring).
    unconfirmed: int = 0

    def on_probe(self, now: float, *, running: int, waiting: int, outstanding: int) -> None:
        self.probed_at = now
        self.waiting = waiting
        self.unconfirmed = max(0, outstanding - running - waiting)

    def on_push(self) -> None:
        self.unconfirmed += 1

    def on_finish(self) -> None:
        self.unconfirmed = max(0, self.unconfirmed - 1)

    def fresh(self, now: float, stale_s: float) -> bool:
        return self.probed_at is not None and now - self.probed_at <= stale_s


def is_available(
    target: TargetState,
    mark: ProbeMark,
    pushing: PushingConfig,
    limits: AvailabilityLimits,
    now: float,
    admits: Callable[[TargetState], bool] | None = None,
) -> bool:
    """May ``target`` take one more request right now under ``pushing``?

    ``admits``: the policy's token admission limit, used by ``tokens`` pushing."""
    if not target.healthy:
        return False
    if pushing.mode is PushingMode.BLIND:
        return True
    if pushing.mode is PushingMode.TOKENS and admits is not None:
        if not admits(target):
            return False
        if target.global_outstanding < limits.max_outstanding:
            return True
        # Past the cap: the engine's batch still has room if it queues nothing.
        return mark.fresh(now, limits.probe_stale_s) and mark.waiting == 0
    if pushing.mode is PushingMode.SP_P and mark.fresh(now, limits.probe_stale_s):
        # Sibling processes' pushes count too: a burst must not pile on through N of them.
        unconfirmed = mark.unconfirmed + target.peer_unconfirmed
        return mark.waiting == 0 and unconfirmed < pushing.push_budget
    return target.global_outstanding < limits.max_outstanding


def probe_would_help(
    target: TargetState,
    mark: ProbeMark,
    pushing: PushingConfig,
    limits: AvailabilityLimits,
    now: float,
) -> bool:
    """True when only the probe's age keeps a healthy SP-P replica unavailable.

    The glue probes such replicas again early while requests wait, so SP-P
    ramps a replica up at probe speed rather than one push per probe period.
    """
    return (
        target.healthy
        and pushing.mode is PushingMode.SP_P
        and not is_available(target, mark, pushing, limits, now)
    )
