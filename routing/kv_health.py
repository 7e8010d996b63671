"""Each tracked replica's KV-event stream state, told to a human once per change.

The decisions are ``core.kv_stream_health``'s; this keeps one
``SilenceDetector`` per subscribed replica, turns discovery results and probe
samples into a ``StreamState``, and logs a change of state once (a warning with
what to fix, or the recovery), never once per probe.  ``/metrics``,
``/internal/state`` and the console read ``states``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from core.kv_stream_health import (
    STATE_ADVICE,
    ProbeSample,
    SilenceConfig,
    SilenceDetector,
    StreamState,
    stream_state,
)

logger = logging.getLogger(__name__)


class KVStreamHealth:
    def __init__(self, silence: SilenceConfig | None = None) -> None:
        self.silence = silence or SilenceConfig()
        self.states: dict[str, StreamState] = {}
        self._detectors: dict[str, SilenceDetector] = {}

    def unsubscribed(self, replica: str, *, advertised_connect: bool) -> None:
        """Discovery found nothing to subscribe to (or an endpoint vLLM connects with)."""
        self._detectors.pop(replica, None)
        state = stream_state(endpoint_known=advertised_connect, bind_endpoint=False, silent=False)
        self._set(replica, state)

    def subscribed(self, replica: str) -> None:
        self._detectors[replica] = SilenceDetector(self.silence)
        self._set(replica, StreamState.OK)

    def observe_probe(self, replica: str, sample: ProbeSample) -> None:
        detector = self._detectors.get(replica)
        if detector is None:
            return
        silent = detector.observe(sample)
        self._set(replica, stream_state(endpoint_known=True, bind_endpoint=True, silent=silent))

    def retain(self, replicas: Iterable[str]) -> None:
        keep = set(replicas)
        for name in [n for n in self.states if n not in keep]:
            self.states.pop(name)
            self._detectors.pop(name, None)

    def _set(self, replica: str, state: StreamState) -> None:
        before = self.states.get(replica)
        self.states[replica] = state
        if before == state:
            return
        if state is StreamState.OK:
            if before is not None:
                logger.info("KV events of %s: stream healthy again (was %s)", replica, before)
            return
        logger.warning("KV events of %s: %s. %s", replica, state, STATE_ADVICE[state])
