"""The balancer's own sub-second replica probe (an asyncio task, not Celery).

Each round (``MERIDIAN_PROBE_INTERVAL_S``, a few hundred ms) GETs every owned
replica's ``/metrics`` concurrently through the relay's keep-alive pool
(``routing.upstream_pool``: under load httpx's own cost was about half of a
probe's, docs/performance.md), parses it with
``core.engine_metrics`` and feeds the router: running/waiting/KV usage
for the policies and for SP-P availability (SkyLB §3.3, Algorithm 1 lines
3-8), health for candidate filtering, and the engine's block size (from
``vllm:cache_config_info``) for the model's block scheme.  Every recorded probe wakes the
regional queue through the router's ``on_change``.

``MERIDIAN_PROBE_FAILURE_THRESHOLD`` consecutive failures make a replica
unhealthy, as does a dispatch error; either opens its circuit breaker
(``core.breaker``): probes during the hold-down
(``MERIDIAN_BREAKER_HOLD_DOWN_S``) do not count, and after it
``MERIDIAN_BREAKER_READMIT_PROBES`` good probes in a row make it healthy again,
so one good probe does not readmit a flapping replica.

A probe that times out is not always a failure (``core.busy``): a replica whose
relayed responses brought bytes within ``MERIDIAN_PROBE_BUSY_GRACE_S`` is busy, not
down.  Its probe is counted in ``meridian_probe_late_total`` and the replica keeps its
health and its last load numbers until they go stale.  A refused or reset
connection, an error status or a malformed page counts as a failure at once, and so
does a timeout once the replica's streams have gone quiet too (a hung engine).
``serving`` passes each replica's remaining grace on to the control plane.

Celery's slower probes feed the console and the database; this one feeds routing (DESIGN.md,
"The sub-second probe that selective pushing needs runs inside each balancer").

``probe_soon`` probes named replicas at once, outside the round, when requests
wait for them: under SP-P a replica that took its push budget is unavailable
until a probe says its batch admitted the pushed requests, so waiting for the
next round would cap each replica at one push per interval.  At most one probe
per replica is in flight, which bounds the extra load on a replica to one
``/metrics`` request per probe round trip (and ``MERIDIAN_PROBE_MIN_GAP_S``,
applied by the caller).

Every ``MODELS_REFRESH_S`` a round also reads each replica's ``/v1/models``:
vLLM lists its LoRA adapters there with the base model as ``parent``, which
feeds the ``AdapterDirectory`` (``core.lora``), so adapters need no
configuration.  A replica whose ``/v1/models`` fails keeps what it listed last.  Those
reads take the same pool: through httpx, each opened a new connection once the replica
had closed the last one (its 5 s keep-alive), which an idle balancer's profile showed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable

from core.block_identity import ModelBlockSchemes
from core.busy import grace_left
from core.engine_metrics import EngineLoad, MetricsFormatError, parse_engine_load
from core.lora import AdapterDirectory, adapters_in_models
from core.router import LocalRouter
from core.types import TargetState
from routing.telemetry import BalancerMetrics
from routing.upstream import join_url
from routing.upstream_pool import UpstreamError, UpstreamPool, UpstreamTimeout

logger = logging.getLogger(__name__)
# How often each replica's /v1/models is read for its LoRA adapters: adapters are
# loaded at start-up or by an operator, so seconds of delay are fine.
MODELS_REFRESH_S = 5.0


class ReplicaProber:
    def __init__(
        self,
        pool: UpstreamPool,
        router: LocalRouter,
        metrics: BalancerMetrics,
        *,
        timeout_s: float,
        failure_threshold: int,
        busy_grace_s: float = 0.0,
        schemes: ModelBlockSchemes | None = None,
        adapters: AdapterDirectory | None = None,
        models_refresh_s: float = MODELS_REFRESH_S,
    ) -> None:
        self.pool = pool
        self.schemes = schemes or ModelBlockSchemes()
        self.router = router
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.failure_threshold = failure_threshold
        self.busy_grace_s = busy_grace_s
        self.adapters = adapters
        self.models_refresh_s = models_refresh_s
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        # Also told of every successful probe (the KV-event stream's health check).
        self.on_load: Callable[[str, EngineLoad], None] | None = None
        self._models_read_at: dict[str, float] = {}

    async def probe_all(self) -> None:
        targets = self.router.targets()
        if targets:
            await asyncio.gather(*(self.probe(t) for t in targets), self._read_models(targets))

    async def _read_models(self, targets: list[TargetState]) -> None:
        """Each due replica's LoRA adapters, from its ``/v1/models``."""
        if self.adapters is None:
            return
        self.adapters.keep_only([t.target_id for t in targets])
        now = asyncio.get_running_loop().time()
        due = [
            t
            for t in targets
            if now - self._models_read_at.get(t.target_id, -self.models_refresh_s)
            >= self.models_refresh_s
        ]
        for target in due:
            self._models_read_at[target.target_id] = now
        await asyncio.gather(*(self._read_models_of(t) for t in due))

    async def _read_models_of(self, target: TargetState) -> None:
        assert self.adapters is not None
        try:
            # Through the probe's own pool, as /metrics (the module docstring says why).
            status, body = await self.pool.get(join_url(target.url, "/v1/models"), self.timeout_s)
            if not 200 <= status < 300:
                raise UpstreamError(f"/v1/models answered {status}")
            listed = adapters_in_models(json.loads(body))
        except (UpstreamError, ValueError) as exc:
            logger.debug("reading %s's /v1/models failed: %s", target.target_id, exc)
            return
        self.adapters.record(target.target_id, listed)

    def probe_soon(self, names: Iterable[str]) -> None:
        """Start a probe of each named replica that has none in flight (no await)."""
        for name in names:
            target = self.router.target(name)
            if target is None or name in self._in_flight:
                continue
            task = asyncio.get_running_loop().create_task(self.probe(target))
            self._in_flight[name] = task
            task.add_done_callback(functools.partial(self._probed, name))

    def _probed(self, name: str, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            # probe() handles expected failures; anything else is a bug: say so.
            logger.error("probe of %s failed", name, exc_info=task.exception())

    async def probe(self, target: TargetState) -> None:
        try:
            status, body = await self.pool.get(join_url(target.url, "/metrics"), self.timeout_s)
            if not 200 <= status < 300:
                raise UpstreamError(f"/metrics answered {status}")
            load = parse_engine_load(body.decode("utf-8", "replace"))
        except UpstreamTimeout as exc:
            if not self._excused(target):
                self._failed(target, exc)
            return
        except (UpstreamError, MetricsFormatError) as exc:
            self._failed(target, exc)
            return
        was_healthy = target.healthy
        self.schemes.observe_engine(target.model, load.block_size, load.hash_algo)
        self.router.record_probe(target.target_id, load)
        if self.on_load is not None:
            self.on_load(target.target_id, load)
        if not was_healthy:
            logger.info("replica %s healthy again", target.target_id)

    def serving(self) -> dict[str, float]:
        """Each replica still within its busy grace, and the seconds of it left: what
        the heartbeat tells the control plane's readiness probe (``core.busy``)."""
        now = asyncio.get_running_loop().time()
        left = {
            t.target_id: grace_left(self._silent_for(t, now), self.busy_grace_s)
            for t in self.router.targets()
        }
        return {name: seconds for name, seconds in left.items() if seconds > 0}

    def _silent_for(self, target: TargetState, now: float) -> float | None:
        """Seconds since a relayed response from ``target`` last brought bytes."""
        heard_at = self.pool.heard_from(target.url)
        return None if heard_at is None else now - heard_at

    def _excused(self, target: TargetState) -> bool:
        """A timed-out probe of a replica that still streams to this balancer's
        requests: late, not failed (``LocalRouter.excuse_late_probe``)."""
        silent_for = self._silent_for(target, asyncio.get_running_loop().time())
        if not self.router.excuse_late_probe(target.target_id, silent_for, self.busy_grace_s):
            return False
        self.metrics.probe_late.inc(target.target_id)
        if target.late_probes == 1:
            logger.info(
                "replica %s: probe late (busy: it answered requests %.1f s ago)",
                target.target_id,
                silent_for,
            )
        return True

    def _failed(self, target: TargetState, exc: Exception) -> None:
        self.metrics.probe_failures.inc(target.target_id)
        if self.router.record_probe_failure(target.target_id, self.failure_threshold):
            logger.warning("replica %s unhealthy after probe failures: %s", target.target_id, exc)

    async def close(self) -> None:
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
