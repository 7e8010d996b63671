"""KV events to cache-map keys: engine hashes as keys (vllm mode), keys rebuilt from
token ids and parents (token_ids mode), orphans, removals, clears, snapshots."""

from __future__ import annotations

from core.block_identity import BlockIdentityMode, BlockScheme
from core.blocks import block_hashes
from core.cache_map import CacheMap
from core.event_keys import (
    Applied,
    EngineHashKeys,
    RebuiltKeys,
    apply_events,
    keys_for,
)
from core.kv_events import CLEARED, REMOVED, STORED, CacheEvent

TOKENS = list(range(1000, 1128))  # four 32-token blocks
SEED = "meridian"


def cache_map() -> CacheMap:
    return CacheMap(max_blocks_per_replica=100, speculative_ttl_s=1.0, max_speculative=10)


def stored(
    hashes: list[int], first_block: int, parent: int | None, lora: str | None = None
) -> CacheEvent:
    """A BlockStored of TOKENS' blocks ``first_block..``, as vLLM would send it."""
    tokens = TOKENS[first_block * 32 : (first_block + len(hashes)) * 32]
    return CacheEvent(
        STORED,
        tuple(hashes),
        parent_block_hash=parent,
        token_ids=tuple(tokens),
        block_size=32,
        lora_name=lora,
        medium="GPU",
    )


def request_keys(tokens: list[int] = TOKENS, adapter: str = "") -> list[int]:
    return BlockScheme(block_size=32, meridian_seed=SEED).keys(tokens, adapter)


def test_engine_hashes_are_the_keys_in_vllm_mode() -> None:
    cm = cache_map()
    events = [
        CacheEvent(STORED, (1, 2, 3)),
        CacheEvent(REMOVED, (2,)),
        CacheEvent(REMOVED, (3,)),
        CacheEvent(STORED, (3,)),  # re-stored after its removal: held again
    ]
    assert apply_events(cm, "r1", events, EngineHashKeys()) == Applied(4, 0)
    assert cm.blocks_of("r1") == [1, 3]
    apply_events(cm, "r2", [CacheEvent(STORED, (1,))], EngineHashKeys())
    apply_events(cm, "r1", [CacheEvent(CLEARED), CacheEvent(STORED, (9,))], EngineHashKeys())
    assert cm.blocks_of("r1") == [9] and cm.holders(1) == {"r2"}


def test_token_ids_mode_rebuilds_the_requests_keys_across_parent_chains() -> None:
    cm, keys = cache_map(), RebuiltKeys(SEED)
    # The engine's hashes are opaque numbers; the chain continues through parents.
    events = [stored([501, 502], 0, None), stored([503], 2, 502), stored([504], 3, 503)]
    assert apply_events(cm, "r1", events, keys) == Applied(3, 0)
    assert sorted(cm.blocks_of("r1")) == sorted(request_keys())
    assert cm.longest_prefix(request_keys(), {"r1"}) == (4, {"r1"})


def test_removal_maps_engine_hashes_back_and_clear_forgets_them() -> None:
    cm, keys = cache_map(), RebuiltKeys(SEED)
    apply_events(cm, "r1", [stored([501, 502, 503], 0, None)], keys)
    apply_events(cm, "r1", [CacheEvent(REMOVED, (503, 999))], keys)  # 999: never stored
    assert sorted(cm.blocks_of("r1")) == sorted(request_keys()[:2]) and len(keys) == 2
    apply_events(cm, "r1", [CacheEvent(CLEARED)], keys)
    assert cm.blocks_of("r1") == [] and len(keys) == 0
    # After the clear, a child of a forgotten block is an orphan.
    assert apply_events(cm, "r1", [stored([504], 3, 503)], keys) == Applied(1, 1)
    assert keys.orphans == 1 and cm.blocks_of("r1") == []


def test_a_store_without_token_ids_cannot_be_keyed() -> None:
    cm, keys = cache_map(), RebuiltKeys(SEED)
    assert apply_events(cm, "r1", [CacheEvent(STORED, (1, 2))], keys) == Applied(1, 1)


def test_the_lora_name_is_part_of_the_rebuilt_keys() -> None:
    cm, keys = cache_map(), RebuiltKeys(SEED)
    apply_events(cm, "r1", [stored([501, 502], 0, None, lora="sql")], keys)
    assert cm.blocks_of("r1") == request_keys(TOKENS[:64], "sql")
    assert not set(cm.blocks_of("r1")) & set(request_keys())


def test_other_storage_tiers_are_skipped() -> None:
    cm, keys = cache_map(), RebuiltKeys(SEED)
    cpu = CacheEvent(STORED, (501,), token_ids=tuple(TOKENS[:32]), block_size=32, medium="CPU")
    assert apply_events(cm, "r1", [cpu], keys) == Applied(0, 0)
    assert cm.blocks_of("r1") == []


def test_the_map_is_bounded_oldest_first() -> None:
    keys = RebuiltKeys(SEED, max_blocks=2)
    keys.stored(stored([501, 502], 0, None))
    keys.stored(stored([503], 2, 502))  # 501, the oldest, is forgotten
    assert len(keys) == 2
    assert keys.removed([501, 502]) == [request_keys()[1]]


def test_a_snapshot_keeps_what_is_held_and_keys_stores_in_any_order() -> None:
    keys = RebuiltKeys(SEED)
    keys.stored(stored([501, 502], 0, None))
    # The snapshot: 501 still held, 502 evicted, 503/504 cached meanwhile (listed child first).
    held = keys.resync([501, 503, 504], [stored([504], 3, 503), stored([502, 503], 1, 501)])
    wanted = request_keys()
    assert sorted(held) == sorted([wanted[0], wanted[2], wanted[3]])
    assert keys.removed([502]) == []  # not held: not mapped either


def test_keys_follow_the_scheme() -> None:
    vllm = BlockScheme(BlockIdentityMode.VLLM)
    token_ids = BlockScheme(meridian_seed=SEED)
    assert isinstance(keys_for(vllm), EngineHashKeys) and keys_for(vllm).serves(vllm)
    rebuilt = keys_for(token_ids)
    assert isinstance(rebuilt, RebuiltKeys) and rebuilt.serves(token_ids)
    assert not rebuilt.serves(vllm) and not rebuilt.serves(BlockScheme(meridian_seed="other"))
    assert block_hashes(TOKENS, block_size=32, seed=SEED) == request_keys()
