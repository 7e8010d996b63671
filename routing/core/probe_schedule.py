"""How long the balancer's probe loop waits before its next round (pure, no clock).

While requests come in, the loop probes every ``base_s`` (``MERIDIAN_PROBE_INTERVAL_S``):
SP-P availability and the load-aware policies need sub-second load numbers.  An idle
balancer does not: each round is a ``/metrics`` request and parse per replica, which was
most of an idle balancer's CPU.  So each round that saw no traffic doubles the wait, up
to ``idle_max_s`` (``MERIDIAN_PROBE_IDLE_INTERVAL_S``); the first round that sees traffic
goes back to ``base_s``.

"Traffic" is any request acquired since the last round (a cumulative count, so a request
that started and finished between two rounds counts), any request still in flight, or any
request waiting in a queue; the glue also keeps the base interval while any replica is
unhealthy, since readmitting it waits on good probes.  A replica that dies while the
balancer is idle is seen by the next round, at most ``idle_max_s`` later, or by the
first request sent to it, which fails over.  A request that waits for a probe does not wait for the
schedule: the queue asks for early probes itself (``ReplicaProber.probe_soon``), and a
probe older than ``MERIDIAN_PROBE_STALE_S`` makes SP-P fall back to SP-O's cap.
"""

from __future__ import annotations


class ProbeSchedule:
    """The delay before each probe round, from what the balancer did since the last one."""

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
        self.delay_s = base_s
        self._acquired: int | None = None

    def next_delay(self, acquired: int, busy: bool) -> float:
        """The wait before the next round.

        ``acquired``: requests acquired so far (cumulative); ``busy``: any in flight or
        queued now."""
        active = busy or acquired != self._acquired
        self._acquired = acquired
        self.delay_s = self.base_s if active else min(self.idle_max_s, self.delay_s * 2)
        return self.delay_s
