"""One emulated replica in virtual time: the very ``Engine`` behind ``sim.serve``.

``sim.replica.EngineDriver`` calls ``Engine.step()``, sleeps the modeled
duration (times ``time_scale``) and then hands out the step's tokens; here the
sleep is a scheduled event, so the same engine object batches, caches prefixes,
evicts and preempts exactly as it does behind HTTP.  A request submitted while a
step runs joins the engine's waiting queue and is scheduled in the next step,
as with the driver.  After each step the engine's KV events go to whoever
subscribed (balancers whose policy keeps a cache map), in vLLM's wire shape
through the balancer's own decoder.  The replica's answers follow vLLM's usage semantics
(``prompt_tokens``, ``completion_tokens``, ``cached_tokens``) because they are
the engine's own ``RequestOutput`` fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.engine_metrics import EngineLoad
from core.kv_events import CacheEvent, decode_event
from sim.des.loop import EventLoop
from sim.engine import Engine, EngineRequest, RequestOutput, StepResult

KVSubscriber = Callable[[tuple[CacheEvent, ...]], None]


@dataclass(slots=True)
class Generation:
    """One request inside the replica and whom to tell about its tokens."""

    on_first: Callable[[], None]
    on_done: Callable[[RequestOutput, list[int]], None]
    tokens: list[int] = field(default_factory=list)
    # When the engine first scheduled it, in virtual seconds: its prefix lookup.
    scheduled_at: float | None = None


class SimReplica:
    def __init__(
        self, name: str, region: str, engine: Engine, loop: EventLoop, *, time_scale: float
    ) -> None:
        self.name = name
        self.region = region
        self.engine = engine
        self.loop = loop
        self.time_scale = time_scale
        self.steps = 0
        self._stepping = False
        self._live: dict[str, Generation] = {}
        self._kv_subscribers: list[KVSubscriber] = []

    def subscribe_kv_events(self, subscriber: KVSubscriber) -> None:
        """Hear this replica's KV events after every step, as a ZMQ subscriber would."""
        self._kv_subscribers.append(subscriber)

    @property
    def outstanding(self) -> int:
        """Requests the engine holds (running + waiting), for the variance metric."""
        return len(self._live)

    def load(self) -> EngineLoad:
        """What its ``/metrics`` page would say right now (vLLM's three gauges)."""
        stats = self.engine.stats
        return EngineLoad(
            running=self.engine.num_running,
            waiting=self.engine.num_waiting,
            kv_usage=self.engine.kv_usage,
            prefix_queries=float(stats.prefix_cache_queries),
            prefix_hits=float(stats.prefix_cache_hits),
        )

    def submit(self, request: EngineRequest, generation: Generation) -> None:
        """Queue ``request``; ValueError when the engine refuses it (the API's 400)."""
        if not self.engine.has_work():
            # As the driver: idle time passes on the modeled clock too.
            self.engine.advance_clock(self.loop.now / self.time_scale)
        self.engine.add_request(request)
        self._live[request.request_id] = generation
        if not self._stepping:
            self._stepping = True
            self.loop.call_soon(self._step)

    def _step(self) -> None:
        result = self.engine.step()
        self.steps += 1
        for request_id in result.first_scheduled:
            # The step's batch was formed now, before its modeled duration passes.
            self._live[request_id].scheduled_at = self.loop.now
        # Tokens exist only once the forward pass is over: deliver after the step.
        self.loop.call_later(result.duration_s * self.time_scale, self._deliver, result)

    def _publish_kv_events(self) -> None:
        """vLLM publishes one message per step: its events on the wire, decoded by the
        balancer's own decoder (``core.kv_events.decode_event``)."""
        raw = self.engine.events.drain()
        if not raw or not self._kv_subscribers:
            return
        decoded = (decode_event(event.as_wire()) for event in raw)
        events = tuple(event for event in decoded if event is not None)
        for subscriber in self._kv_subscribers:
            subscriber(events)

    def _deliver(self, result: StepResult) -> None:
        self._publish_kv_events()
        for output in result.outputs:
            generation = self._live.get(output.request_id)
            if generation is None:
                continue
            if not generation.tokens:
                generation.on_first()
            generation.tokens.extend(output.new_token_ids)
            if output.finish_reason is not None:
                del self._live[output.request_id]
                generation.on_done(output, generation.tokens)
        if self.engine.has_work():
            self._step()
        else:
            self._stepping = False
