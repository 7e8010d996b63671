"""KV cache events in vLLM's shape, and the bounded buffer the engine fills.

vLLM (``vllm/distributed/kv_events.py``) reports the life of every cached block
so that a router can keep an index of which replica holds which prefix:

* ``BlockStored``: full blocks just entered the prefix cache, with their hashes
  (the int form: each digest's low 64 bits), the hash of the block before the
  first one (``None`` at the start of a sequence), their token ids, the block
  size, the LoRA id and name, the storage medium, and per block the extra keys
  that went into its hash (untagged: the LoRA name);
* ``BlockRemoved``: cached blocks were evicted (reused for other tokens);
* ``AllBlocksCleared``: the whole prefix cache was reset.

On the wire vLLM 0.32 encodes each event as msgspec encodes a tagged struct: a
map whose first key is ``type``, then the fields in declaration order, with the
optional trailing fields left out when they hold their default.  ``as_wire``
returns exactly that map (the KV cache group is always 0 here: one group).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"  # vLLM's label for the prefix cache that serves hits


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None

    def as_wire(self) -> dict[str, Any]:
        extra = None if self.lora_name is None else [self.lora_name]
        return {
            "type": "BlockStored",
            "block_hashes": self.block_hashes,
            "parent_block_hash": self.parent_block_hash,
            "token_ids": self.token_ids,
            "block_size": self.block_size,
            "lora_id": self.lora_id,
            "medium": MEDIUM_GPU,
            "lora_name": self.lora_name,
            "extra_keys": [extra] * len(self.block_hashes),
            "group_idx": 0,
        }


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]

    def as_wire(self) -> dict[str, Any]:
        return {
            "type": "BlockRemoved",
            "block_hashes": self.block_hashes,
            "medium": MEDIUM_GPU,
            "group_idx": 0,
        }


@dataclass(frozen=True)
class AllBlocksCleared:
    def as_wire(self) -> dict[str, Any]:
        return {"type": "AllBlocksCleared"}


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
