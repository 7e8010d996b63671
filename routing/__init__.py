"""The regional balancer: an OpenAI-compatible streaming proxy (SkyLB's two layers).

``routing/core/`` is pure Python shared with the simulator and the benchmarks
(policies, request descriptors, leases, the metrics registry and parsers, the
SSE relay, peer ranking).  Beside it, the glue that runs inside daphne:

* ``views/completions.py``: ``POST /v1/chat/completions`` and ``/v1/completions``;
* ``views/ops.py``: ``/v1/models``, ``/health``, ``/metrics``, ``/internal/state``;
* ``dispatch.py``: local replica, else nearest available peer; retries; accounting;
* ``upstream.py``: one upstream call, first-byte commit, chunk-by-chunk relay;
* ``runtime.py``: the per-process runtime and its background loops;
* ``topology.py`` (database snapshot), ``prober.py`` (replica ``/metrics``),
  ``peers.py`` (Redis heartbeats), ``telemetry.py`` (metric families),
  ``errors.py`` (OpenAI-style error responses).
"""
