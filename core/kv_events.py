"""Decode vLLM KV-cache event messages into plain events (pure).

The push path of "Stateful Cache-Aware Routing" (002 §3): engines publish the life
of every cached block, and the router's cache map follows.  vLLM's
``ZmqEventPublisher`` sends one message per engine step as three ZMQ frames:

* the topic (bytes, often empty);
* an 8-byte big-endian sequence number, +1 per message, so a lost message shows
  as a gap (PUB drops silently when a subscriber falls behind its high-water mark);
* a msgpack payload ``[timestamp, [event, ...], data_parallel_rank]``.

Events come in two encodings, and both are accepted:

* maps with a ``type`` key (msgspec's tagged structs, what vLLM 0.32 sends):
  ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ...,
  "token_ids": [...], "block_size": 32, "lora_id": None, "medium": "GPU",
  "lora_name": None, ...}``, ``{"type": "BlockRemoved", "block_hashes": [...],
  "medium": "GPU"}``, ``{"type": "AllBlocksCleared"}``;
* tagged arrays (msgspec ``array_like``, older releases), the same fields in
  vLLM's declaration order: ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, ...]``,
  ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``.

Fields newer vLLM versions add (``extra_keys``, ``group_idx``, ...) are ignored.
A block hash is an int, vLLM's 64-bit form; a bytes hash (a full digest, sent when
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) is reduced to the same int, its low 64
bits.  What the hashes mean to the cache map is the block scheme's business
(``core.event_keys``).

``SequenceTracker`` detects gaps per publisher; ``core.event_keys``
applies a batch to the cache map.  Nothing here touches
a socket: the glue (``routing.kv_events``) owns ZMQ and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from core.block_identity import external_hash

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"
KV_EVENTS_KEY = "kv_events"  # policy_params key: {"replica-name": "tcp://host:port"}


class KVEventDecodeError(ValueError):
    """A message or event that is not in vLLM's KV-event format."""


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One event, reduced to what the cache map and the block schemes need."""

    kind: str  # STORED, REMOVED or CLEARED
    block_hashes: tuple[int, ...] = ()
    # BlockStored only: the block before the first one (None: a sequence's start),
    # the stored blocks' tokens, and what keyed them in the engine.
    parent_block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None  # "GPU" for the prefix cache that serves hits


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
        return external_hash(bytes(value))
    raise KVEventDecodeError(f"block hash must be an int or bytes, got {type(value).__name__}")


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise KVEventDecodeError("block_hashes must be a list")
    return tuple(_block_hash(h) for h in value)


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise KVEventDecodeError("token_ids must be a list of ints")
    return tuple(value)


def _optional(value: Any, kind: type[Any], name: str) -> Any:
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise KVEventDecodeError(f"{name} must be {kind.__name__} or null, got {value!r}")


# Field names of the tagged-array encoding, by position after the tag (vLLM's order).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
)
_REMOVED_FIELDS = ("block_hashes", "medium")


def _fields(raw: Any) -> tuple[Any, dict[str, Any]]:
    """The tag and the named fields of an event in either encoding."""
    if isinstance(raw, Mapping):
        return raw.get("type"), dict(raw)
    if not isinstance(raw, list | tuple) or not raw:
        raise KVEventDecodeError(f"an event must be a tagged array or a map, got {raw!r}")
    kind = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
    names = _STORED_FIELDS if kind == STORED else _REMOVED_FIELDS
    return kind, dict(zip(names, raw[1:], strict=False))


def decode_event(raw: Any) -> CacheEvent | None:
    """One event in either encoding; None for an event kind the map does not use."""
    kind, fields = _fields(raw)
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind == CLEARED:
        return CacheEvent(CLEARED)
    medium = _optional(fields.get("medium"), str, "medium")
    if kind == REMOVED:
        return CacheEvent(REMOVED, _hashes(fields.get("block_hashes")), medium=medium)
    if kind == STORED:
        parent = fields.get("parent_block_hash")
        return CacheEvent(
            STORED,
            _hashes(fields.get("block_hashes")),
            parent_block_hash=None if parent is None else _block_hash(parent),
            token_ids=_token_ids(fields.get("token_ids")),
            block_size=_optional(fields.get("block_size"), int, "block_size"),
            lora_id=_optional(fields.get("lora_id"), int, "lora_id"),
            lora_name=_optional(fields.get("lora_name"), str, "lora_name"),
            medium=medium,
        )
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
