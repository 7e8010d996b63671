"""The regional balancer: an OpenAI-compatible streaming proxy (SkyLB's two layers).

``routing/core/`` is pure Python shared with the simulator and the benchmarks
(policies, request descriptors, leases, the metrics registry and parsers, the
SSE relay, SP-P/SP-O/blind availability, the regional FCFS queue, the local
and remote layers and Algorithm 1's placement).  Beside it, the glue that runs
inside daphne:

* ``views/completions.py``: ``POST /v1/chat/completions`` and ``/v1/completions``;
* ``views/ops.py``: ``/v1/models``, ``/health``, ``/metrics``;
* ``views/internal.py``: ``/internal/availability`` (peers, token) and ``/internal/state``;
* ``dispatch.py``: the two-layer placement behind the queue (``QueuePump``); retries;
  accounting;
* ``upstream.py``: one upstream call, first-byte commit, chunk-by-chunk relay;
* ``runtime.py``: the per-process runtime and its background loops;
* ``topology.py`` (database snapshot), ``prober.py`` (replica ``/metrics``),
  ``peers.py`` (HTTP availability polls, Redis heartbeats), ``telemetry.py``
  (metric families), ``errors.py`` (OpenAI-style error responses).
"""
