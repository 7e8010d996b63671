"""The regional balancer: an OpenAI-compatible streaming proxy (SkyLB's two layers).

Its decisions live below it, in the top-level package ``core``: pure Python shared with the
simulator and the benchmarks (policies, request descriptors, leases, the metrics registry
and parsers, the SSE relay, SP-P/SP-O/blind availability, the regional FCFS queue, the local
and remote layers, Algorithm 1's placement, and ``dispatch.py``: the sans-IO dispatch core
that decides placement, queue hand-off, retries and deadlines for both the balancer and the
simulator).  This package is the glue around it that runs inside the ASGI server (uvicorn
for balancers by default, or daphne):

* ``views/completions.py``: ``POST /v1/chat/completions`` and ``/v1/completions``;
* ``views/ops.py``: ``/v1/models``, ``/health``, ``/metrics``;
* ``views/internal.py``: ``/internal/availability`` (peers, token), ``/internal/state``,
  ``/internal/cache_sync`` (anti-entropy now, token) and ``/internal/faults`` (drill
  faults: partition, dropped KV events; token);
* ``api_plain.py``: the inference routes on plain ASGI (no Django objects);
* ``api_asgi.py``: the rest of ``/v1/`` (Django without middleware hops);
  ``body_limit.py``: 413 before Django spools a body; ``lifespan.py``: start the
  runtime with the server; ``asgi_types.py``: the ASGI callables' types they share;
* ``dispatch.py``: carries the dispatch core's decisions out (requests to
  replicas and peers, relay, accounting); ``queue_pump.py``: the core's queue on
  the event loop (coalesced drains, the deadline timer, waiting futures);
* ``transport.py``: how an attempt reaches its target, with the partition
  drill's fault and the demo's RTT as wrappers around it;
* ``upstream.py``: one upstream call, first-byte commit, chunk-by-chunk relay;
  ``upstream_pool.py``: the lean keep-alive HTTP/1.1 client it relays through;
* ``runtime.py``: the per-process runtime and its background loops;
* ``topology.py`` (database snapshot), ``prober.py`` (replica ``/metrics``),
  ``peers.py`` (HTTP availability polls, Redis heartbeats),
  ``kv_events.py`` (the KV-event consumer: ZMQ SUB per owned replica, ~100 ms
  batches into the cache map, gap → resync, anti-entropy from the replica's
  ``/kv_cache/blocks``; decoding is ``core/kv_events.py``), ``telemetry.py``
  (metric families), ``errors.py`` (OpenAI-style error responses).
"""
