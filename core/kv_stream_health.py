"""Is a replica's KV-event stream telling the truth?  Gap steps and stream health (pure).

**Gaps.**  A skipped sequence number means lost messages (a PUB socket drops past
its high-water mark).  ``gap_plan`` lists what to try, cheapest and most exact
first:

1. *replay*: vLLM's publisher keeps its last ``buffer_steps`` messages and
   resends them from a requested sequence on its replay endpoint (a ROUTER
   socket).  It heals the gap only if its buffer still held the first lost
   message (``replay_heals``);
2. *snapshot*: the anti-entropy sync, ``GET /kv_cache/blocks`` (the emulated
   replica serves it; vLLM does not);
3. *clear*: forget everything believed of the replica.  A map that is empty is
   honest; one with holes sends requests to blocks that are gone.

**Health.**  Two setup mistakes make a stream silent without an error anywhere:

* ``connect_endpoint``: the replica advertises an endpoint vLLM *connects* with
  (``tcp://127.0.0.1:5557`` instead of ``tcp://*:5557``), so it publishes to a
  socket nobody reads (``core.kv_sources.is_bind_endpoint``);
* ``silent``: the replica is serving prefix-cache queries that miss (so it is
  computing, and caching, new blocks), yet no event arrived for ``probes``
  probe intervals.  Misses, not queries: vLLM publishes nothing for a prompt
  that is cached in full, so a stream of repeated prompts is quiet and honest.
  The rule needs ``min_missed_tokens`` of misses in the window, which keeps a
  trickle of short prompts (whose partial last block is never stored) from
  raising it.

Nothing here reads a clock or a socket: the glue feeds probe samples and event
counts and acts on what comes back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum


class GapStep(StrEnum):
    REPLAY = "replay"
    SNAPSHOT = "snapshot"
    CLEAR = "clear"


def gap_plan(*, replay: bool, snapshot: bool) -> tuple[GapStep, ...]:
    """What to try, in order, after a sequence gap; the last step always succeeds."""
    steps = [GapStep.REPLAY] if replay else []
    if snapshot:
        steps.append(GapStep.SNAPSHOT)
    return (*steps, GapStep.CLEAR)


def replay_heals(start: int, replayed: list[int]) -> bool:
    """A replay from ``start`` heals the gap only if it begins exactly there: a later
    first message means the publisher's buffer had already dropped the lost ones."""
    return bool(replayed) and replayed[0] == start


class StreamState(StrEnum):
    OK = "ok"
    NO_STREAM = "no_stream"  # nothing to subscribe to: events off, or not discovered yet
    CONNECT_ENDPOINT = "connect_endpoint"
    SILENT = "silent"


STATE_ADVICE: dict[StreamState, str] = {
    StreamState.OK: "",
    StreamState.NO_STREAM: (
        "No KV-event endpoint is known for this replica, so routing cannot see its "
        "cache. Start vLLM with --kv-events-config "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:PORT"}\', or name the endpoint in the service\'s '
        "policy_params kv_events."
    ),
    StreamState.CONNECT_ENDPOINT: (
        "The replica's KV-event endpoint makes vLLM connect instead of bind, so its "
        "events go nowhere. Write the endpoint as tcp://*:PORT (with the *) in "
        "--kv-events-config."
    ),
    StreamState.SILENT: (
        "The replica is caching new prompt blocks but no KV event has arrived, so "
        "routing's view of its cache is going stale. Check that the endpoint is "
        "tcp://*:PORT, that the port is reachable from the balancer, and that "
        "enable_kv_cache_events is true."
    ),
}


@dataclass(frozen=True, slots=True)
class SilenceConfig:
    probes: int = 10  # probe intervals without an event before "silent"
    min_missed_tokens: int = 64  # missed prefix-cache tokens in that window

    def __post_init__(self) -> None:
        if self.probes < 1 or self.min_missed_tokens < 1:
            raise ValueError("probes and min_missed_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """Cumulative counters at one probe: prefix-cache tokens queried and hit, events seen."""

    queries: float
    hits: float
    events: int


class SilenceDetector:
    """One stream's recent probe samples, and whether they show a silent stream."""

    def __init__(self, config: SilenceConfig | None = None) -> None:
        self.config = config or SilenceConfig()
        # probes + 1 samples span ``probes`` intervals.
        self._samples: deque[ProbeSample] = deque(maxlen=self.config.probes + 1)
        self.silent = False

    def observe(self, sample: ProbeSample) -> bool:
        """Add a probe's sample; True when the stream is silent now."""
        last = self._samples[-1] if self._samples else None
        if last is not None and (sample.queries < last.queries or sample.events < last.events):
            self._samples.clear()  # the engine restarted or the stream was re-made
        elif last is not None and sample.events > last.events:
            self._samples.clear()  # an event arrived: whatever came before is moot
        self._samples.append(sample)
        self.silent = self._is_silent()
        return self.silent

    def _is_silent(self) -> bool:
        if len(self._samples) <= self.config.probes:
            return False
        first, last = self._samples[0], self._samples[-1]
        missed = (last.queries - first.queries) - (last.hits - first.hits)
        return last.events == first.events and missed >= self.config.min_missed_tokens


def stream_state(*, endpoint_known: bool, bind_endpoint: bool, silent: bool) -> StreamState:
    """One word for the stream, the most specific cause first."""
    if not endpoint_known:
        return StreamState.NO_STREAM
    if not bind_endpoint:
        return StreamState.CONNECT_ENDPOINT
    return StreamState.SILENT if silent else StreamState.OK
