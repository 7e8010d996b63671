"""KV cache events in vLLM's shape, and the bounded buffer the engine fills.

vLLM (``vllm/distributed/kv_events.py``) reports the life of every cached block
so that a router can keep an index of which replica holds which prefix:

* ``BlockStored``: full blocks just entered the prefix cache, with their chained
  hashes, the hash of the block before the first one (``None`` at the start of
  a sequence), their token ids, the block size and the LoRA id;
* ``BlockRemoved``: cached blocks were evicted (reused for other tokens);
* ``AllBlocksCleared``: the whole prefix cache was reset.

On the wire each event is a msgspec ``array_like`` tagged struct, i.e. a list
whose first item is the tag; ``as_wire`` returns exactly that list.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None

    def as_wire(self) -> list[Any]:
        return [
            "BlockStored",
            self.block_hashes,
            self.parent_block_hash,
            self.token_ids,
            self.block_size,
            self.lora_id,
        ]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]

    def as_wire(self) -> list[Any]:
        return ["BlockRemoved", self.block_hashes]


@dataclass(frozen=True)
class AllBlocksCleared:
    def as_wire(self) -> list[Any]:
        return ["AllBlocksCleared"]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBuffer:
    """Events waiting for a publisher, bounded so an absent consumer costs no memory.

    When full the oldest events are dropped and counted: a consumer that missed
    events must resynchronise from a full cache snapshot anyway (vLLM's ZMQ
    publisher has the same lossy PUB semantics).
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._events: deque[KVEvent] = deque(maxlen=capacity)
        self.dropped = 0

    def append(self, event: KVEvent) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)

    def drain(self) -> list[KVEvent]:
        """Every buffered event, oldest first; the buffer is empty afterwards."""
        events = list(self._events)
        self._events.clear()
        return events

    def __len__(self) -> int:
        return len(self._events)
