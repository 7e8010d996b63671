"""Publish an engine's KV cache events over ZMQ, in vLLM's wire format.

vLLM's ``ZmqEventPublisher`` sends each batch of events as three frames on a
PUB socket: the topic, an 8-byte big-endian sequence number, and a msgpack
payload ``[timestamp, [event, ...], data_parallel_rank]`` in which each event
is a map in vLLM 0.32's encoding (``sim.engine.events``).  One batch is sent per
engine step.  A consumer
detects lost batches by a gap in the sequence numbers; PUB drops when nobody
reads, so an absent consumer never slows the engine.

``describe`` is what the replica's ``GET /kv_events`` answers (discovery: where to
subscribe), and ``cache_snapshot`` what ``GET /kv_cache/blocks`` answers (the
authoritative state for anti-entropy, 002 §4.4): every cached block hash and the
sequence number of the next message, so a consumer knows which of the messages
it still holds are already reflected in the snapshot, and every cached block as
a one-block ``BlockStored`` (``stored``), so a consumer that keys blocks by
their token ids can key blocks whose events it missed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import zmq

from sim.engine.events import BlockStored, KVEvent, KVEventBuffer


class KVEventPublisher:
    """A bound ZMQ PUB socket that sends one message per batch of events."""

    def __init__(self, endpoint: str, *, topic: str = "", data_parallel_rank: int = 0) -> None:
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.sequence = 0
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.bind(endpoint)

    def publish(self, events: Sequence[KVEvent], timestamp: float | None = None) -> None:
        if not events:
            return
        payload = msgpack.packb(
            [
                time.time() if timestamp is None else timestamp,
                [event.as_wire() for event in events],
                self.data_parallel_rank,
            ],
            use_bin_type=True,
        )
        frames = [self.topic, self.sequence.to_bytes(8, "big"), payload]
        self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        self.sequence += 1

    def describe(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "topic": self.topic.decode()}

    def close(self) -> None:
        self._socket.close(linger=0)


def cache_snapshot(
    stores: Mapping[int, BlockStored], events: KVEventBuffer, publisher: KVEventPublisher | None
) -> dict[str, Any]:
    """The replica's cached blocks and the sequence they are consistent with.

    Events already buffered for the next message are published first: after that,
    every message below ``sequence`` is reflected in ``blocks`` and every later one
    describes a change made after the snapshot (the driver mutates the cache and
    buffers its events on the same event loop this runs on)."""
    if publisher is not None:
        publisher.publish(events.drain())
    return {
        "blocks": list(stores),
        "sequence": publisher.sequence if publisher is not None else None,
        "stored": [store.as_wire() for store in stores.values()],
    }
