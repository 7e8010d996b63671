"""Publish an engine's KV cache events over ZMQ, as vLLM's ``ZmqEventPublisher`` does.

vLLM sends each batch of events as three frames on a PUB socket: the topic, an
8-byte big-endian sequence number, and a msgpack payload ``[timestamp, [event,
...], data_parallel_rank]`` in which each event is a map in vLLM 0.32's encoding
(``sim.engine.events``).  One batch is sent per engine step.  A consumer detects
lost batches by a gap in the sequence numbers; PUB drops when nobody reads, so an
absent consumer never slows the engine.

Like vLLM, the publisher *binds* an endpoint written with ``*`` (``tcp://*:5557``)
and *connects* to any other (``tcp://127.0.0.1:5557``): the setup trap in which
events go to a socket nobody reads is reproduced, not hidden.

With a replay endpoint (a ROUTER socket, always bound) it keeps the last
``buffer_steps`` messages; a client sends ``[b"", start_seq (8 bytes)]`` from a
DEALER and receives every buffered ``[b"", topic, seq, payload]`` from
``start_seq`` on, then the end marker ``[b"", b"", seq=-1 (signed), b""]``
(vLLM's ``_service_replay`` framing).

``sources`` is what ``GET /kv_event_sources`` answers (vLLM 0.32's shape: the
publisher's config per data-parallel rank), and ``cache_snapshot`` what
``GET /kv_cache/blocks`` answers (the authoritative state for anti-entropy,
002 §4.4, an emulator extension): every cached block hash and the sequence
number of the next message, so a consumer knows which of the messages it still
holds are already reflected in the snapshot, and every cached block as a
one-block ``BlockStored`` (``stored``), so a consumer that keys blocks by their
token ids can key blocks whose events it missed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from core.kv_sources import is_bind_endpoint
from sim.engine.events import BlockStored, KVEvent, KVEventBuffer

END_SEQ = (-1).to_bytes(8, "big", signed=True)
HWM = 100_000
BUFFER_STEPS = 10_000


class KVEventPublisher:
    """A PUB socket that sends one message per batch, and an optional replay socket."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        buffer_steps: int = BUFFER_STEPS,
        topic: str = "",
        data_parallel_rank: int = 0,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.buffer_steps = buffer_steps
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.sequence = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, HWM)
        if is_bind_endpoint(endpoint):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)  # vLLM's behaviour, trap included
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None

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
        self._buffer.append((self.sequence, payload))
        self.sequence += 1

    # -- replay ----------------------------------------------------------------------------

    def start_replay(self) -> None:
        """Bind the replay socket and answer requests on the running loop."""
        if self.replay_endpoint is None or self._replay is not None:
            return
        socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.replay_endpoint)
        self._replay = socket
        self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay(socket))

    async def _serve_replay(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs and ignores a malformed request too
            client, _, start = frames
            for reply in self.replay_frames(int.from_bytes(start, "big")):
                await socket.send_multipart([client, *reply])

    def replay_frames(self, start: int) -> list[list[bytes]]:
        """The replies to a replay request from ``start``, end marker last."""
        replies = [
            [b"", self.topic, seq.to_bytes(8, "big"), payload]
            for seq, payload in self._buffer
            if seq >= start
        ]
        return [*replies, [b"", b"", END_SEQ, b""]]

    # -- discovery and shutdown -------------------------------------------------------------

    def sources(self) -> dict[str, dict[str, Any]]:
        """vLLM 0.32's ``GET /kv_event_sources``: the publisher's config per DP rank."""
        return {
            str(self.data_parallel_rank): {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.endpoint,
                "replay_endpoint": self.replay_endpoint,
                "buffer_steps": self.buffer_steps,
                "hwm": HWM,
                "max_queue_size": HWM,
                "topic": self.topic.decode(),
            }
        }

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            await asyncio.gather(self._replay_task, return_exceptions=True)
        if self._replay is not None:
            self._replay.close(linger=0)
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
