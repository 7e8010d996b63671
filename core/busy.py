"""Busy or down: what a probe that timed out says about a replica (pure, no clock).

A replica's status page answers from the process that also serves its streams, and
under load it answers late: vLLM's ``/metrics`` took 1.5-4.7 s under decode on two
cores (docs/engines.md), and Kubernetes' default 1 s probe timeout has marked
saturated vLLM pods unready for the same reason.  Failing such a replica sends its
whole load to the others at its peak, and the control plane may replace it.

What tells busy from down is the replica's own traffic: a replica whose answers to
real requests brought bytes within the *busy grace* of a timed-out probe is busy,
and the probe is late, not failed.  A replica that has gone quiet as well (a hung
engine), or that was never asked anything, gets no such excuse.  A refusal, a reset
or an error status is a failure whatever the traffic says: those are not slowness.

The balancer's prober applies this to its ``/metrics`` probes
(``LocalRouter.excuse_late_probe``), and passes what is left of each replica's grace
to the control plane through Redis (``core.peers.serving_key``), whose readiness
probe excuses its own timeouts the same way (``workers.probes``).
"""

from __future__ import annotations


def grace_left(silent_for_s: float | None, grace_s: float) -> float:
    """Seconds for which a replica last heard from ``silent_for_s`` ago (None: never)
    still counts as busy rather than down; 0 once the grace is spent."""
    if silent_for_s is None:
        return 0.0
    return max(0.0, grace_s - silent_for_s)
