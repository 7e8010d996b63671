"""When the balancer's probe loop runs a probe round (pure, no clock).

While requests come in, a round runs every ``base_s`` (``MERIDIAN_PROBE_INTERVAL_S``):
SP-P availability and the load-aware policies need sub-second load numbers.  An idle
balancer does not: each round is a ``/metrics`` request and parse per replica, which was
most of an idle balancer's CPU.  So after a round that saw no traffic the gap to the next
one doubles, up to ``idle_max_s`` (``MERIDIAN_PROBE_IDLE_INTERVAL_S``).

The loop still wakes every ``base_s`` and calls ``tick``, which costs no I/O: the first
tick that sees traffic runs a round at once and goes back to ``base_s``.  Requests that
arrive after a quiet spell therefore find load numbers at most ``base_s`` older than
under steady traffic, and a probe older than ``MERIDIAN_PROBE_STALE_S`` makes SP-P fall
back to SP-O's cap meanwhile, as it always does.

"Traffic" is any request acquired since the last tick (a cumulative count, so a request
that started and finished between two ticks counts), any request still in flight, or any
request waiting in a queue; the glue also counts any unhealthy replica, since readmitting
it waits on good probes.  A replica that dies while the balancer is idle is seen by the
next round, at most ``idle_max_s`` later, or by the first request sent to it, which
fails over.
"""

from __future__ import annotations


class ProbeSchedule:
    """Whether a probe round is due at each tick of ``base_s``."""

    def __init__(self, base_s: float, idle_max_s: float) -> None:
        if base_s <= 0:
            raise ValueError(f"the probe interval must be positive, got {base_s}")
        if idle_max_s < base_s:
            raise ValueError(
                f"the idle probe interval ({idle_max_s}) must be at least the probe "
                f"interval ({base_s})"
            )
        self.base_s = base_s
        self.idle_max_s = idle_max_s
        self.gap_s = base_s  # between the last round and the next one
        self._waited_s = 0.0
        self._acquired: int | None = None

    def tick(self, acquired: int, busy: bool) -> bool:
        """Called every ``base_s``: run a probe round now?

        ``acquired``: requests acquired so far (cumulative); ``busy``: any in flight or
        queued now."""
        active = busy or acquired != self._acquired
        self._acquired = acquired
        if active:
            self.gap_s, self._waited_s = self.base_s, 0.0
            return True
        self._waited_s += self.base_s
        # A small tolerance: sums of base_s land just under a multiple of it.
        if self._waited_s + 1e-9 < self.gap_s:
            return False
        self._waited_s = 0.0
        self.gap_s = min(self.idle_max_s, self.gap_s * 2)
        return True
