"""Decode vLLM KV-cache event messages and apply them to a ``CacheMap`` (pure).

The push path of "Stateful Cache-Aware Routing" (002 §3): engines publish the life
of every cached block, and the router's cache map follows.  vLLM's
``ZmqEventPublisher`` sends one message per engine step as three ZMQ frames:

* the topic (bytes, often empty);
* an 8-byte big-endian sequence number, +1 per message, so a lost message shows
  as a gap (PUB drops silently when a subscriber falls behind its high-water mark);
* a msgpack payload ``[timestamp, [event, ...], data_parallel_rank]``.

Events come in two encodings, and both are accepted:

* tagged arrays (msgspec ``array_like``, what vLLM sends):
  ``["BlockStored", block_hashes, parent_hash, token_ids, block_size, lora_id, ...]``,
  ``["BlockRemoved", block_hashes, ...]``, ``["AllBlocksCleared"]``;
* maps with a ``type`` key: ``{"type": "BlockStored", "block_hashes": [...], ...}``.

Trailing fields newer vLLM versions add (``medium``, ...) are ignored.  A block
hash is an int; newer vLLM may send bytes, read as a big-endian unsigned int.

``SequenceTracker`` detects gaps per publisher; ``apply_events`` applies a batch
in order through the cache map's reverse index (002 §4.2).  Nothing here touches
a socket: the glue (``routing.kv_events``) owns ZMQ and the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from routing.core.cache_map import CacheMap

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"
KV_EVENTS_KEY = "kv_events"  # policy_params key: {"replica-name": "tcp://host:port"}


class KVEventDecodeError(ValueError):
    """A message or event that is not in vLLM's KV-event format."""


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One event, reduced to what the cache map needs."""

    kind: str  # STORED, REMOVED or CLEARED
    block_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded message: its sequence number and its events, in order."""

    sequence: int
    timestamp: float
    events: tuple[CacheEvent, ...]
    data_parallel_rank: int = 0


def _block_hash(value: Any) -> int:
    if isinstance(value, bool):
        raise KVEventDecodeError(f"block hash must be an int or bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big")
    raise KVEventDecodeError(f"block hash must be an int or bytes, got {type(value).__name__}")


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise KVEventDecodeError("block_hashes must be a list")
    return tuple(_block_hash(h) for h in value)


def decode_event(raw: Any) -> CacheEvent | None:
    """One event in either encoding; None for an event kind the map does not use."""
    if isinstance(raw, Mapping):
        kind, hashes = raw.get("type"), raw.get("block_hashes")
    elif isinstance(raw, list | tuple) and raw:
        kind, hashes = raw[0], raw[1] if len(raw) > 1 else None
    else:
        raise KVEventDecodeError(f"an event must be a tagged array or a map, got {raw!r}")
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind == CLEARED:
        return CacheEvent(CLEARED)
    if kind in (STORED, REMOVED):
        return CacheEvent(kind, _hashes(hashes))
    if isinstance(kind, str):
        return None  # a future event kind: skipping it keeps the consumer running
    raise KVEventDecodeError(f"an event needs a string tag, got {kind!r}")


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """``[topic, sequence, payload]`` (vLLM's three frames) into an ``EventBatch``."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    _topic, seq, payload = frames
    if len(seq) != 8:
        raise KVEventDecodeError(f"the sequence frame must be 8 bytes, got {len(seq)}")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise KVEventDecodeError(f"payload is not msgpack: {exc}") from None
    if not isinstance(body, list | tuple) or len(body) < 2 or not isinstance(body[1], list):
        raise KVEventDecodeError("payload must be [timestamp, [events], dp_rank]")
    events = tuple(e for e in (decode_event(raw) for raw in body[1]) if e is not None)
    rank = body[2] if len(body) > 2 and isinstance(body[2], int) else 0
    timestamp = float(body[0]) if isinstance(body[0], int | float) else 0.0
    return EventBatch(int.from_bytes(seq, "big"), timestamp, events, rank)


class SequenceTracker:
    """Per-publisher sequence numbers: is a message new, and was anything lost before it?

    ``observe`` answers (fresh, gap).  A message at or below the last one seen (or
    below a snapshot's sequence, ``resync_at``) is stale: its effects are already
    known.  The first message after start-up is never a gap: there is nothing to
    compare it with, and the first anti-entropy sync covers what came before.
    """

    def __init__(self) -> None:
        self._next: int | None = None

    @property
    def next_expected(self) -> int | None:
        return self._next

    def observe(self, sequence: int) -> tuple[bool, bool]:
        expected = self._next
        if expected is not None and sequence < expected:
            return False, False
        self._next = sequence + 1
        return True, expected is not None and sequence > expected

    def resync_at(self, sequence: int) -> None:
        """A snapshot reflects every message below ``sequence``: expect that one next."""
        if self._next is None or sequence > self._next:
            self._next = sequence


def apply_events(cache_map: CacheMap, replica: str, events: Iterable[CacheEvent]) -> int:
    """Apply ``events`` in order for ``replica``; consecutive removals go as one batch
    (002 §3.3's batched eviction, O(batch) through the reverse index).  Returns the
    number of events applied."""
    removed: list[int] = []
    count = 0
    for event in events:
        count += 1
        if event.kind == REMOVED:
            removed.extend(event.block_hashes)
            continue
        if removed:
            cache_map.apply_removed(replica, removed)
            removed = []
        if event.kind == STORED:
            cache_map.apply_stored(replica, event.block_hashes)
        else:
            cache_map.clear(replica)
    if removed:
        cache_map.apply_removed(replica, removed)
    return count


def split_kv_event_params(params: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Take ``kv_events`` (replica name → ZMQ endpoint) out of ``policy_params``.

    For engines that cannot be asked where they publish (real vLLM has no
    discovery endpoint, unlike the emulated replica's ``GET /kv_events``)."""
    rest = {k: v for k, v in params.items() if k != KV_EVENTS_KEY}
    raw = params.get(KV_EVENTS_KEY) or {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise ValueError(f"{KV_EVENTS_KEY} must map replica names to endpoints, got {raw!r}")
    return dict(raw), rest
