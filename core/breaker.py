"""A circuit breaker per replica: when a replica that failed may take requests again.

Without one, the next good probe (every few hundred ms) readmitted a replica that
had just failed a request, so a flapping replica kept taking, and failing,
requests.  Envoy's outlier detection and Linkerd's failure accrual do what this
does:

* closed: the replica takes requests.  A failure (a request that broke before its
  first byte, or enough failed probes) *opens* it.
* open: no requests for a hold-down.  Each time it opens again before it was
  fully readmitted the hold-down doubles, up to a cap, so a replica that keeps
  flapping is kept out longer and longer.  Probes during the hold-down do not
  count.
* half-open: after the hold-down, probes are trials: ``readmit_after``
  consecutive good probes close it (and reset the hold-down); one failed probe
  opens it again.  So one good probe never readmits a replica that just failed.

Pure: every event carries ``now`` (the router's injected clock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """``hold_down_s``: the first hold-down; ``max_hold_down_s``: its cap as it doubles;
    ``readmit_after``: consecutive good probes after the hold-down that readmit."""

    hold_down_s: float = 1.0
    max_hold_down_s: float = 30.0
    readmit_after: int = 2

    def __post_init__(self) -> None:
        if self.hold_down_s < 0 or self.max_hold_down_s < self.hold_down_s:
            raise ValueError("need 0 <= hold_down_s <= max_hold_down_s")
        if self.readmit_after < 1:
            raise ValueError("readmit_after must be at least 1")


# The behaviour before breakers: the first good probe readmits at once.
NO_HOLD_DOWN = BreakerConfig(hold_down_s=0.0, max_hold_down_s=0.0, readmit_after=1)


class Breaker:
    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.state = BreakerState.CLOSED
        self.open_until = 0.0
        self.good_probes = 0
        # Times it opened since it was last closed: each one doubles the hold-down.
        self.trips = 0

    @property
    def closed(self) -> bool:
        return self.state is BreakerState.CLOSED

    def hold_down(self) -> float:
        """The hold-down the next opening gets."""
        c = self.config
        return min(c.max_hold_down_s, c.hold_down_s * 2.0**self.trips)

    def failed(self, now: float) -> None:
        """A request or the probes found the replica broken: open (again)."""
        if self.state is BreakerState.OPEN:
            # Still held down: the hold-down runs from the latest failure.
            self.open_until = max(self.open_until, now + self._current_hold_down())
            return
        self.open_until = now + self.hold_down()
        self.trips += 1
        self.state = BreakerState.OPEN
        self.good_probes = 0

    def _current_hold_down(self) -> float:
        """The hold-down the breaker got when it last opened."""
        c = self.config
        return min(c.max_hold_down_s, c.hold_down_s * 2.0 ** max(0, self.trips - 1))

    def probe_ok(self, now: float) -> bool:
        """A good probe; True when the replica may take requests (closed)."""
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False  # held down: a good probe now proves nothing
            self.state, self.good_probes = BreakerState.HALF_OPEN, 0
        if self.state is BreakerState.HALF_OPEN:
            self.good_probes += 1
            if self.good_probes < self.config.readmit_after:
                return False
            self.state, self.trips, self.good_probes = BreakerState.CLOSED, 0, 0
        return True

    def probe_failed(self, now: float) -> None:
        """A failed probe: a half-open replica failed its trial and opens again (a
        closed one opens only once the prober's failure threshold says so)."""
        if self.state is BreakerState.HALF_OPEN:
            self.failed(now)
