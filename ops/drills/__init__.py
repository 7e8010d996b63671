"""Failure drills and planned operator moves, as plain functions the management
commands orchestrate (and tests call directly).

* ``targets``: which replicas or balancer a drill acts on.
* ``replicas``: state changes with Events (preempted, draining ↔ ready).
* ``faults``: the emulated replica's ``POST /fault`` and killing a balancer's
  listening process (loopback only).
* ``traffic``: what a drill's traffic is (``TrafficConfig``) and how its requests
  are counted; ``stream`` sends it, a small bounded request stream through the
  official ``openai`` client with its retries on, recording each request's outcome
  (the one module that imports the SDK, loaded only when a drill sends traffic).
* ``reactions``: predicates over balancers' ``GET /internal/state`` that say when
  routing has reacted to a fault.
* ``partition``: the partition drill (``POST /internal/faults`` on both sides'
  balancers; reacted when each side sees the other not alive, converged when alive);
* ``redis_outage``: the Redis-outage drill (``CLIENT PAUSE … ALL``, bounded and
  self-healing; reacted when every balancer reports Redis down, converged when
  Redis, heartbeats and balancer states are back);
* ``served``: the model a drill's traffic asks for by default;
* ``runner``: one drill end to end (inject, watch, split the requests at the
  reaction point, check convergence where the plan asks, record a ``DrillRun``);
  ``kinds`` builds the replica and balancer drills' plans; ``report`` prints the
  timeline.
"""
