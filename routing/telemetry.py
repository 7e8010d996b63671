"""The metric families one balancer exposes at ``/metrics``.

Request outcomes are counted when a request *finishes* (the stream ended, failed
or the client left), labelled by model, HTTP status and route:

* ``local``: served by a replica this balancer owns;
* ``forwarded_out``: this balancer forwarded it to a peer;
* ``forwarded_in``: a peer forwarded it here (served locally, never re-forwarded).

A client that disconnects mid-stream is counted with status ``499`` (nginx's
"client closed request"), so aborted streams are visible next to successes.

The regional queue (SkyLB §3.3) is visible per model: its length, the age of its
oldest entry, and how long each request waited with how it left the queue
(``placed``, ``timeout`` → 503, ``cancelled``: the client went away), plus the
pushes refused because it was full (429).  Nothing leaves the queue uncounted.

The balancer's own view of each replica's cache is checked too: the state of its
KV-event stream (``meridian_kv_event_stream_state``, 1 on the current state:
``ok``, ``no_stream``, ``connect_endpoint``, ``silent``), and the hit-rate
mismatch detector's expected and reported cached tokens, mismatch and evicted shares and
state (``warming``, ``ok``, ``mismatch``, ``evicting``); see docs/runbook.md for what each
means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.cache_view_check import ReplicaCheck, ViewState
from core.kv_stream_health import StreamState
from core.load_forecast import ReplicaForecast
from core.metrics import MetricsRegistry
from core.remote import RemoteRouter
from core.router import LocalRouter

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

CLIENT_CLOSED = 499
QUEUE_PLACED = "placed"
QUEUE_TIMEOUT = "timeout"
QUEUE_CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """One model's queue at render time."""

    model: str
    length: int
    oldest_wait_s: float


def event_loop_name(loop: object) -> str:
    """The event loop's library: ``uvloop`` under uvicorn where it is installed (the
    balancers' loop, ``docs/performance.md``), ``asyncio`` under daphne or without it."""
    return type(loop).__module__.partition(".")[0]


class BalancerMetrics:
    def __init__(self, balancer: str, event_loop: str = "") -> None:
        self.registry = MetricsRegistry()
        r = self.registry
        self.info = r.gauge(
            "meridian_balancer_info",
            "This balancer (always 1), and the event loop it runs on.",
            ["balancer", "event_loop"],
        )
        self.info.set(1, balancer, event_loop)
        self.requests = r.counter(
            "meridian_requests_total",
            "Finished requests by model, HTTP status and route.",
            ["model", "status", "route"],
        )
        self.internal_errors = r.counter(
            "meridian_internal_errors_total",
            "API requests that raised an unexpected exception (answered 500, JSON body).",
        )
        self.unknown_paths = r.counter(
            "meridian_unknown_path_requests_total",
            "Requests to a /v1 path no route serves (answered 404), by method.",
            ["method"],
        )
        self.ttft = r.histogram(
            "meridian_ttft_seconds",
            "Time from request arrival to the first upstream byte.",
            ["model", "route"],
            TTFT_BUCKETS,
        )
        self.latency = r.histogram(
            "meridian_request_duration_seconds",
            "Time from request arrival to the end of the response.",
            ["model", "route"],
            LATENCY_BUCKETS,
        )
        self.inflight = r.gauge("meridian_inflight_requests", "Requests dispatched, not finished.")
        # Per API key (label: the key's prefix, one per issued key: bounded by the database).
        self.key_requests = r.counter(
            "meridian_key_requests_total",
            "Requests this balancer admitted for an API key (forwards counted where they entered).",
            ["key"],
        )
        self.key_tokens = r.counter(
            "meridian_key_tokens_total",
            "Tokens of an API key's finished requests, by kind (prompt, cached, completion).",
            ["key", "kind"],
        )
        self.key_limited = r.counter(
            "meridian_key_limited_total",
            "Requests refused by an API key's limits, by which limit (or model).",
            ["key", "limit"],
        )
        self.key_limits_degraded = r.counter(
            "meridian_key_limits_degraded_total",
            "Key-limit store calls that failed (Redis): limits held per process meanwhile.",
        )
        self.key_limits_shared = r.gauge(
            "meridian_key_limits_shared",
            "1 while key limits are held in Redis across processes, 0 while held locally.",
        )
        self.queue = r.gauge(
            "meridian_queue_length",
            "Requests waiting in this balancer for an available target, per model.",
            ["model"],
        )
        self.queue_oldest = r.gauge(
            "meridian_queue_oldest_wait_seconds",
            "How long the oldest queued request of a model has waited.",
            ["model"],
        )
        self.queue_wait = r.histogram(
            "meridian_queue_wait_seconds",
            "Time requests spent in the queue, by how they left it.",
            ["model", "outcome"],
            QUEUE_WAIT_BUCKETS,
        )
        self.queue_rejected = r.counter(
            "meridian_queue_rejected_total",
            "Requests refused with 429 because the model's queue was full.",
            ["model"],
        )
        self.peer_available = r.gauge(
            "meridian_peer_available",
            "1 when the peer may take a forwarded request for the model now.",
            ["peer", "model"],
        )
        self.peer_outstanding = r.gauge(
            "meridian_peer_forwarded_outstanding",
            "Requests forwarded to the peer and not finished.",
            ["peer"],
        )
        self.availability_errors = r.counter(
            "meridian_availability_poll_errors_total",
            "Failed polls of a peer's /internal/availability.",
            ["peer"],
        )
        self.outstanding = r.gauge(
            "meridian_replica_outstanding", "Requests outstanding per replica.", ["replica"]
        )
        self.sibling_outstanding = r.gauge(
            "meridian_replica_sibling_outstanding",
            "Requests outstanding per replica from the other processes of this balancer "
            "(as of the last shared-state exchange; docs/scale-out.md).",
            ["replica"],
        )
        self.healthy = r.gauge(
            "meridian_replica_healthy", "1 when this balancer routes to the replica.", ["replica"]
        )
        self.cached_ratio = r.gauge(
            "meridian_replica_cached_token_ratio",
            "Cached prompt tokens / prompt tokens in the replica's responses.",
            ["replica"],
        )
        self.prompt_tokens = r.counter(
            "meridian_prompt_tokens_total", "Prompt tokens served.", ["replica"]
        )
        self.cached_tokens = r.counter(
            "meridian_cached_prompt_tokens_total", "Prompt tokens served from cache.", ["replica"]
        )
        self.completion_tokens = r.counter(
            "meridian_completion_tokens_total", "Completion tokens served.", ["replica"]
        )
        self.upstream_errors = r.counter(
            "meridian_upstream_errors_total",
            "Failed upstream attempts by target (replica or peer) and reason.",
            ["target", "reason"],
        )
        self.retries = r.counter(
            "meridian_retries_total", "Attempts after the first, by model.", ["model"]
        )
        self.probe_failures = r.counter(
            "meridian_probe_failures_total", "Failed /metrics probes per replica.", ["replica"]
        )
        self.probe_late = r.counter(
            "meridian_probe_late_total",
            "Timed-out /metrics probes of a replica still answering requests (busy, not "
            "counted as failures).",
            ["replica"],
        )
        self.topology_reads = r.counter(
            "meridian_topology_reads_total",
            "Topology refreshes by how they read the database: 'checked' (the topology "
            "token had not moved: one row) or 'full' (every table).",
            ["read"],
        )
        self.heartbeat_errors = r.counter(
            "meridian_heartbeat_errors_total", "Failed heartbeat publish/read rounds (Redis)."
        )
        self.live_publish_errors = r.counter(
            "meridian_live_publish_errors_total",
            "Live-feed records not appended to the region's Redis stream (console).",
        )
        self.kv_stream_state = r.gauge(
            "meridian_kv_event_stream_state",
            "1 on the state of the replica's KV-event stream (ok, no_stream, "
            "connect_endpoint, silent).",
            ["replica", "state"],
        )
        self.cache_expected = r.counter(
            "meridian_cache_view_expected_tokens_total",
            "Cached prompt tokens the cache map expected on the replica (checked requests).",
            ["replica"],
        )
        self.cache_reported = r.counter(
            "meridian_cache_view_reported_tokens_total",
            "Cached prompt tokens the replica reported for the same requests.",
            ["replica"],
        )
        self.cache_mismatch_ratio = r.gauge(
            "meridian_cache_view_mismatch_ratio",
            "Share of the replica's recent checked requests off by more than one block, "
            "not counting those whose prefix its engine evicted after they were routed.",
            ["replica"],
        )
        self.cache_evicted_ratio = r.gauge(
            "meridian_cache_view_evicted_ratio",
            "Share of the replica's recent checked requests that found less cached because "
            "its engine evicted the expected blocks after they were routed.",
            ["replica"],
        )
        self.cache_view_state = r.gauge(
            "meridian_cache_view_state",
            "1 on the mismatch detector's state for the replica (warming, ok, mismatch, evicting).",
            ["replica", "state"],
        )
        self.anticipated_kv = r.gauge(
            "meridian_anticipated_kv_tokens",
            "KV tokens the replica's running requests hold now, and at the peak and on "
            "average over the next L decode iterations (PreServe's look-ahead map).",
            ["replica", "stat"],
        )
        self.anticipated_running = r.gauge(
            "meridian_anticipated_running_requests",
            "Requests in the replica's look-ahead map.",
            ["replica"],
        )
        self.seconds_per_iteration = r.gauge(
            "meridian_replica_seconds_per_iteration",
            "Decode iteration time the look-ahead map assumes for the replica (learned).",
            ["replica"],
        )
        self.predictions = r.counter(
            "meridian_length_predictions_total",
            "Completed requests whose output length was predicted, per replica.",
            ["replica"],
        )
        self.predicted_tokens = r.counter(
            "meridian_length_predicted_tokens_total",
            "Output tokens predicted for those requests (compare with completion tokens).",
            ["replica"],
        )
        self.prediction_error = r.counter(
            "meridian_length_prediction_error_tokens_total",
            "Absolute error of those predictions, in tokens (over predictions: the MAE).",
            ["replica"],
        )
        self.prediction_overruns = r.counter(
            "meridian_length_prediction_overruns_total",
            "Requests that generated more than predicted (given a virtual extension).",
            ["replica"],
        )

    def count_prediction(self, replica: str, predicted: int, actual: int) -> None:
        """A completed request's predicted output against the engine's count."""
        self.predictions.inc(replica)
        self.predicted_tokens.inc(replica, amount=predicted)
        self.prediction_error.inc(replica, amount=abs(actual - predicted))
        if actual > predicted:
            self.prediction_overruns.inc(replica)

    def set_forecast(self, forecast: Sequence[ReplicaForecast]) -> None:
        """The anticipated-load gauges, read now."""
        self.anticipated_kv.replace(
            row
            for f in forecast
            for row in (
                ((f.replica, "now"), float(f.kv_tokens)),
                ((f.replica, "peak"), float(f.peak_kv_tokens)),
                ((f.replica, "mean"), f.mean_kv_tokens),
            )
        )
        self.anticipated_running.replace(((f.replica,), f.running) for f in forecast)
        self.seconds_per_iteration.replace(
            ((f.replica,), f.seconds_per_iteration) for f in forecast
        )

    def set_cache_health(
        self,
        streams: Mapping[str, StreamState],
        checks: Sequence[tuple[str, ReplicaCheck]],
    ) -> None:
        """The stream-state and mismatch gauges, read now (one series per state)."""
        self.kv_stream_state.replace(
            ((name, str(s)), int(s is now)) for name, now in streams.items() for s in StreamState
        )
        self.cache_mismatch_ratio.replace(((name,), c.ratio) for name, c in checks)
        self.cache_evicted_ratio.replace(((name,), c.evicted_ratio) for name, c in checks)
        self.cache_view_state.replace(
            ((name, str(s)), int(s is c.state)) for name, c in checks for s in ViewState
        )

    def render(self, router: LocalRouter, remote: RemoteRouter, queues: list[QueueSnapshot]) -> str:
        """Prometheus text, with the per-replica, peer and queue gauges read now."""
        targets = router.targets()
        self.inflight.set(router.ledger.total + remote.ledger.total)
        self.queue.replace(((q.model,), q.length) for q in queues)
        self.queue_oldest.replace(((q.model,), q.oldest_wait_s) for q in queues)
        links = remote.links()
        models = [q.model for q in queues]
        now = remote.clock()
        self.peer_available.replace(
            ((link.spec.name, m), int(remote.is_available(link, m, now)))
            for link in links
            for m in models
        )
        self.peer_outstanding.replace(((link.spec.name,), link.state.outstanding) for link in links)
        self.outstanding.replace(((t.target_id,), t.outstanding) for t in targets)
        self.sibling_outstanding.replace(((t.target_id,), t.peer_outstanding) for t in targets)
        self.healthy.replace(((t.target_id,), int(t.healthy)) for t in targets)
        self.cached_ratio.replace(
            ((t.target_id,), router.usage(t.target_id).cached_ratio) for t in targets
        )
        return self.registry.render()
