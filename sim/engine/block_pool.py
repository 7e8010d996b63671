"""The KV block pool with prefix caching, as in vLLM V1's ``BlockPool``.

The GPU's KV cache is ``num_blocks`` blocks of ``block_size`` tokens.  Each
block has a reference count (how many running requests use it) and, once it
holds a *full* block of computed tokens, the chained hash of those tokens
(vLLM's, ``sim.engine.request``).  A hash -> block map is the prefix cache; for
each cached hash the pool also keeps the store that described it (parent, tokens,
LoRA), so a snapshot can re-describe every cached block as a ``BlockStored``.

Freed blocks are not wiped: a block whose reference count drops to zero goes
to the tail of a free queue but keeps its hash, so a later request with the
same prefix can take it back (a cache hit).  Allocation pops from the head, so
the least recently freed block is reused first (LRU eviction); only then is its
hash dropped, which is when a ``BlockRemoved`` event is emitted.  Requests free
their blocks in reverse order, so the tail of a prompt, the part least likely
to be shared, is evicted before its head (vLLM does the same).

Two requests that compute the same block concurrently produce two blocks with
one hash; the second stays uncached (a duplicate) and is reused as soon as it
is freed, which keeps the map one-to-one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sim.engine.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBuffer


class BlockPool:
    """Blocks, reference counts, the prefix-cache map and the LRU free queue."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        events: KVEventBuffer,
        *,
        enable_caching: bool = True,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.events = events
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self.stores: dict[int, BlockStored] = {}  # cached hash -> its one-block store
        # Insertion order is the eviction order: head = least recently freed.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks no request references, cached or not (vLLM counts both as free)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests: vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - self.num_free / self.num_blocks

    def lookup_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks holding the longest run of leading ``hashes`` that is cached."""
        if not self.enable_caching:
            return []
        hits: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block = self.cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (taking them uses free space)."""
        return sum(1 for block in blocks if self.ref_counts[block] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the queue."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` blocks from the head of the free queue, or None if too few are free."""
        if count > len(self.free_queue):
            return None
        blocks: list[int] = []
        evicted: list[int] = []
        for _ in range(count):
            block, _none = self.free_queue.popitem(last=False)
            old_hash = self.block_hash[block]
            if old_hash is not None:
                self.block_hash[block] = None
                del self.cached[old_hash]
                del self.stores[old_hash]
                evicted.append(old_hash)
            self.ref_counts[block] = 1
            blocks.append(block)
        if evicted:
            self.events.append(BlockRemoved(block_hashes=evicted))
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference per block; unreferenced blocks join the queue's tail."""
        for block in reversed(blocks):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None

    def cache_full_blocks(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        end: int,
        token_ids: Sequence[int],
        parent: int | None,
        lora_id: int | None = None,
        lora_name: str = "",
    ) -> None:
        """Register blocks ``start..end`` of a request under their hashes.

        ``parent`` is the hash of block ``start - 1`` (None for the first block).
        Each contiguous run of newly cached blocks becomes one ``BlockStored``
        event so a consumer can chain it onto what it already knows.
        """
        if not self.enable_caching:
            return
        size, lora = self.block_size, lora_name or None
        run: list[int] = []
        run_parent = parent
        run_start = start
        for index in range(start, end):
            block, block_hash = blocks[index], hashes[index]
            block_parent = hashes[index - 1] if index else None
            if block_hash in self.cached:
                self._emit_stored(run, run_parent, run_start, token_ids, lora_id, lora)
                run, run_parent, run_start = [], block_hash, index + 1
                continue
            self.cached[block_hash] = block
            self.block_hash[block] = block_hash
            tokens = list(token_ids[index * size : (index + 1) * size])
            self.stores[block_hash] = BlockStored(
                [block_hash], block_parent, tokens, size, lora_id, lora
            )
            run.append(block_hash)
        self._emit_stored(run, run_parent, run_start, token_ids, lora_id, lora)

    def _emit_stored(
        self,
        run: list[int],
        parent: int | None,
        first: int,
        token_ids: Sequence[int],
        lora_id: int | None,
        lora_name: str | None,
    ) -> None:
        if not run:
            return
        size = self.block_size
        tokens = list(token_ids[first * size : (first + len(run)) * size])
        self.events.append(BlockStored(run, parent, tokens, size, lora_id, lora_name))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use, as in vLLM."""
        if self.num_free != self.num_blocks:
            return False
        self.cached.clear()
        self.stores.clear()
        self.block_hash = [None] * self.num_blocks
        self.events.append(AllBlocksCleared())
        return True
