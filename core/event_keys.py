"""Turn a replica's KV events into cache-map keys, under its model's block scheme (pure).

An event names blocks by the *engine's* hash.  What the cache map needs is the key
a request's blocks get (``core.block_identity``):

* ``vllm`` mode (``EngineHashKeys``): Meridian computes the engine's own hash, so
  an event's hashes are the keys as they are.
* ``token_ids`` mode (``RebuiltKeys``): each ``BlockStored`` is re-keyed with
  Meridian's chain from its ``token_ids``, continuing from the key of its
  ``parent_block_hash`` (None: the chain's root), and the replica's map engine
  hash → key remembers the result, so a later ``BlockRemoved`` (which carries
  hashes only) finds the keys to drop and a later store can chain onto them.
  A store whose parent is not in the map, or that carries no token ids, cannot
  be keyed: it is an *orphan*, counted, and the caller should resync the
  replica (the blocks exist on the engine; the map just cannot name them).

The map is bounded (LRU over stores and parent look-ups): an engine holds at most
its number of KV blocks, so the default bound covers any single replica; past it
the oldest mapping is forgotten, which costs at worst an orphan later.

``apply_events`` applies one message's events in order; consecutive removals go as
one batch through the cache map's reverse index (002 §3.3's batched eviction,
§4.2).  Events of another storage tier than the one that serves prefix hits
(vLLM's ``medium`` other than ``GPU``, e.g. a CPU offload tier) are skipped: a
block evicted to CPU is still a hit on the engine's GPU side only if it is there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.block_identity import BlockIdentityMode, BlockScheme
from core.blocks import block_hashes
from core.kv_events import CLEARED, REMOVED, STORED, CacheEvent

DEFAULT_MAX_MAPPED_BLOCKS = 1 << 20
PREFIX_CACHE_MEDIUMS = frozenset({None, "GPU"})


class CacheEventSink(Protocol):
    """What keeps a replica's holdings from its events: the ``cache_map`` policy's
    ``CacheMap``, or the ``meridian`` policy's radix tree (``TreeEvictions``)."""

    def apply_stored(self, replica: str, block_hashes: Sequence[int]) -> None: ...

    def apply_removed(self, replica: str, block_hashes: Sequence[int]) -> None: ...

    def clear(self, replica: str) -> None: ...


class EventKeys(Protocol):
    """One replica's translation from event hashes to cache-map keys."""

    orphans: int

    def serves(self, scheme: BlockScheme) -> bool:
        """Whether this translation is valid under ``scheme`` (else: build a new one)."""
        ...

    def stored(self, event: CacheEvent) -> tuple[int, ...] | None:
        """The keys of a store's blocks; None for an orphan."""
        ...

    def removed(self, engine_hashes: Iterable[int]) -> list[int]: ...

    def cleared(self) -> None: ...

    def resync(self, blocks: Sequence[int], stored: Sequence[CacheEvent]) -> list[int]:
        """The keys of a snapshot's ``blocks``; ``stored`` re-describes them as stores
        (parents first, where the engine can say), for modes that rebuild keys."""
        ...


class EngineHashKeys:
    """``vllm`` mode: the engine's hashes are the keys."""

    def __init__(self) -> None:
        self.orphans = 0

    def serves(self, scheme: BlockScheme) -> bool:
        return scheme.mode is BlockIdentityMode.VLLM

    def stored(self, event: CacheEvent) -> tuple[int, ...] | None:
        return event.block_hashes

    def removed(self, engine_hashes: Iterable[int]) -> list[int]:
        return list(engine_hashes)

    def cleared(self) -> None:
        """Engine hashes are used as they come: there is no mapping to forget."""

    def resync(self, blocks: Sequence[int], stored: Sequence[CacheEvent]) -> list[int]:
        return list(blocks)


class RebuiltKeys:
    """``token_ids`` mode: Meridian's keys rebuilt from each store's tokens and parent."""

    def __init__(self, seed: str, *, max_blocks: int = DEFAULT_MAX_MAPPED_BLOCKS) -> None:
        self.seed = seed
        self.max_blocks = max_blocks
        self.orphans = 0
        self._keys: OrderedDict[int, int] = OrderedDict()  # engine hash -> key

    def __len__(self) -> int:
        return len(self._keys)

    def serves(self, scheme: BlockScheme) -> bool:
        return scheme.mode is BlockIdentityMode.TOKEN_IDS and scheme.meridian_seed == self.seed

    def stored(self, event: CacheEvent) -> tuple[int, ...] | None:
        keys = self._rebuild(event, self._keys)
        if keys is None:
            self.orphans += 1
            return None
        for engine_hash, key in zip(event.block_hashes, keys, strict=True):
            self._remember(engine_hash, key)
        return keys

    def _rebuild(self, event: CacheEvent, known: OrderedDict[int, int]) -> tuple[int, ...] | None:
        size = event.block_size
        if not size or len(event.token_ids) != size * len(event.block_hashes):
            return None  # no tokens to key by (an engine that does not send them)
        parent = None
        if event.parent_block_hash is not None:
            parent = known.get(event.parent_block_hash)
            if parent is None:
                return None
            known.move_to_end(event.parent_block_hash)
        keys = block_hashes(
            event.token_ids,
            block_size=size,
            extra=event.lora_name or "",
            seed=self.seed,
            parent=parent,
        )
        return tuple(keys)

    def _remember(self, engine_hash: int, key: int) -> None:
        self._keys[engine_hash] = key
        self._keys.move_to_end(engine_hash)
        while len(self._keys) > self.max_blocks:
            self._keys.popitem(last=False)

    def removed(self, engine_hashes: Iterable[int]) -> list[int]:
        popped = (self._keys.pop(h, None) for h in engine_hashes)
        return [key for key in popped if key is not None]

    def cleared(self) -> None:
        self._keys.clear()

    def resync(self, blocks: Sequence[int], stored: Sequence[CacheEvent]) -> list[int]:
        """Keep what the snapshot still holds; key what ``stored`` can newly explain.

        Stores are retried until none makes progress, so their order does not
        matter (an engine may list a child before a parent it re-cached later)."""
        held = set(blocks)
        known = OrderedDict((h, k) for h, k in self._keys.items() if h in held)
        pending = [e for e in stored if not set(e.block_hashes) <= known.keys()]
        progress = True
        while pending and progress:
            progress, waiting = False, []
            for event in pending:
                keys = self._rebuild(event, known)
                if keys is None:
                    waiting.append(event)
                    continue
                progress = True
                known.update(zip(event.block_hashes, keys, strict=True))
            pending = waiting
        self._keys = OrderedDict((h, k) for h, k in known.items() if h in held)
        return list(self._keys.values())


def keys_for(scheme: BlockScheme) -> EventKeys:
    if scheme.mode is BlockIdentityMode.VLLM:
        return EngineHashKeys()
    return RebuiltKeys(scheme.meridian_seed)


@dataclass(frozen=True, slots=True)
class Applied:
    events: int = 0
    orphans: int = 0


def apply_events(
    cache_map: CacheEventSink, replica: str, events: Iterable[CacheEvent], keys: EventKeys
) -> Applied:
    """Apply ``events`` in order for ``replica``, keyed by ``keys``."""
    removed: list[int] = []
    count = orphans = 0
    for event in events:
        if event.medium not in PREFIX_CACHE_MEDIUMS:
            continue
        count += 1
        if event.kind == REMOVED:
            removed.extend(keys.removed(event.block_hashes))
            continue
        if removed:
            cache_map.apply_removed(replica, removed)
            removed = []
        if event.kind == STORED:
            stored = keys.stored(event)
            if stored is None:
                orphans += 1
            else:
                cache_map.apply_stored(replica, stored)
        elif event.kind == CLEARED:
            keys.cleared()
            cache_map.clear(replica)
    if removed:
        cache_map.apply_removed(replica, removed)
    return Applied(count, orphans)
