"""Ask a vLLM publisher's replay endpoint for the KV-event messages a consumer missed.

vLLM's ``ZmqEventPublisher`` keeps its last ``buffer_steps`` messages and serves
them on a ROUTER socket (``replay_endpoint`` in ``--kv-events-config``).  The
request is one 8-byte big-endian start sequence behind an empty delimiter frame
(what a REQ socket would add; a DEALER sends it itself, because the answer is
many messages and REQ takes only one).  Every buffered message from that
sequence on comes back as ``[b"", topic, seq, payload]``, then the end marker
``[b"", b"", seq = -1 (signed 8 bytes), b""]``.

The publisher answers between its own sends (it polls every 100 ms), so the whole
exchange gets ``timeout_s`` per reply; silence means "no replay", and the caller
falls back to the next gap step.
"""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from core.kv_events import EventBatch, KVEventDecodeError, decode_message

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ReplayUnavailableError(Exception):
    """The replay endpoint did not answer in time, or answered nonsense."""


async def replay_from(
    context: zmq.asyncio.Context, endpoint: str, start: int, *, timeout_s: float
) -> list[EventBatch]:
    """Every message the publisher still buffers from sequence ``start`` on, in order."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(endpoint)
        await socket.send_multipart([b"", start.to_bytes(8, "big")])
        return await _read_until_end(socket, timeout_s)
    except TimeoutError:
        raise ReplayUnavailableError(f"no answer from {endpoint}") from None
    finally:
        socket.close(linger=0)


async def _read_until_end(socket: zmq.asyncio.Socket, timeout_s: float) -> list[EventBatch]:
    batches: list[EventBatch] = []
    while True:
        frames = await asyncio.wait_for(socket.recv_multipart(), timeout_s)
        if len(frames) != 4 or frames[0] != b"":
            raise ReplayUnavailableError(f"replay reply of {len(frames)} frames")
        _, topic, seq, payload = frames
        if seq == END_SEQ:
            return batches
        try:
            batches.append(decode_message([topic, seq, payload]))
        except KVEventDecodeError as exc:
            raise ReplayUnavailableError(f"replayed message unreadable: {exc}") from None
