"""Failure drills and planned operator moves, as plain functions the management
commands orchestrate (and tests call directly).

* ``targets``: which replicas or balancer a drill acts on.
* ``replicas``: state changes with Events (preempted, draining ↔ ready).
* ``faults``: the emulated replica's ``POST /fault`` and killing a balancer's
  listening process (loopback only).
* ``traffic``: a small bounded request stream through the official ``openai``
  client with its retries on, recording each request's outcome.
* ``reactions``: predicates over balancers' ``GET /internal/state`` that say when
  routing has reacted to a fault.
* ``runner``: one drill end to end (inject, watch, split the requests at the
  reaction point, record a ``DrillRun``); ``kinds`` builds each drill's plan;
  ``report`` prints its timeline.
"""
