"""The KV-event consumer's bookkeeping, in process: batches, gaps, anti-entropy, keys.

A real ``BalancerRuntime`` serving a ``cache_map`` model; messages are handed to
``KVEventConsumer.accept`` as the socket reader would, and the replicas'
``GET /kv_cache/blocks`` is answered by their loopback servers.  The bookkeeping
tests run in ``vllm`` block identity, where the events' hashes are the keys; the
``token_ids`` tests check that keys are rebuilt and orphans resync.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from core.block_identity import parse_block_identity
from core.kv_events import REMOVED, STORED, CacheEvent, EventBatch
from core.policies.cache_map import CacheMapPolicy
from core.policies.meridian import MeridianPolicy
from core.topology import ModelSpec
from routing.kv_events import ReplicaStream
from sim.kv_events import KVEventPublisher
from tests.support.loopback import Received, Reply
from tests.support.processes import free_port
from tests.support.upstreams import MODEL, Upstreams

pytestmark = pytest.mark.anyio


ENGINE_KEYS = {"block_identity": {"mode": "vllm"}}
TOKENS = list(range(500, 564))  # two 32-token blocks


class Snapshots(Upstreams):
    """Replicas whose ``/kv_cache/blocks`` answers what the test set."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[str, tuple[list[int], int]] = {}
        self.stored: dict[str, list[dict[str, Any]]] = {}
        self.fetched: list[str] = []

    async def answer(self, request: Received) -> Reply:
        if request.path != "/kv_cache/blocks":
            return await super().answer(request)
        self.fetched.append(request.server)
        blocks, sequence = self.blocks.get(request.server, ([], 0))
        body = {"blocks": blocks, "sequence": sequence, "stored": self.stored.get(request.server)}
        return Reply(200, [json.dumps(body).encode()])


async def runtime(
    build_runtime: Any, snapshots: Snapshots, params: dict[str, Any] = ENGINE_KEYS
) -> Any:
    rt = await build_runtime(snapshots, model=ModelSpec(MODEL, "cache_map", params))
    rt.kv.streams["a"] = ReplicaStream("a", "tcp://127.0.0.1:1", socket=NoSocket())
    return rt


class NoSocket:
    def close(self, linger: int = 0) -> None:
        pass


def batch(seq: int, *events: CacheEvent) -> EventBatch:
    return EventBatch(seq, 0.0, events)


def cache_map(rt: Any) -> Any:
    policy = rt.kv.cache_map_policy(MODEL)
    assert isinstance(policy, CacheMapPolicy)
    return policy.cache_map


async def test_events_wait_for_the_batch_then_apply_in_order(build_runtime: Any) -> None:
    rt = await runtime(build_runtime, Snapshots())
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1, 2, 3))))
    rt.kv.accept(stream, batch(1, CacheEvent(REMOVED, (2,))))
    assert cache_map(rt).blocks_of("a") == []  # not before the batch interval's flush
    rt.kv.flush()
    assert cache_map(rt).blocks_of("a") == [1, 3]
    assert rt.kv.view()["replicas"]["a"]["next_sequence"] == 2


async def test_a_gap_without_replay_resyncs_that_replica_at_once(build_runtime: Any) -> None:
    snapshots = Snapshots()
    rt = await runtime(build_runtime, snapshots)
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1,))))
    snapshots.blocks["a"] = ([1, 7, 8], 5)  # what the replica holds after messages 0..4
    rt.kv.accept(stream, batch(3, CacheEvent(STORED, (7,))))  # 1 and 2 were lost
    await asyncio.wait_for(rt.kv._heals["a"], timeout=5)
    assert snapshots.fetched == ["a"] and stream.gaps == 1
    # Message 3 was queued before the snapshot (sequence 5) covered it: dropped, not replayed.
    assert stream.pending == []
    assert sorted(cache_map(rt).blocks_of("a")) == [1, 7, 8]
    rt.kv.accept(stream, batch(4, CacheEvent(REMOVED, (7,))))  # stale: in the snapshot
    rt.kv.accept(stream, batch(5, CacheEvent(REMOVED, (8,))))
    rt.kv.flush()
    assert sorted(cache_map(rt).blocks_of("a")) == [1, 7]


async def test_a_lost_message_shows_as_a_gap_on_the_next_one(build_runtime: Any) -> None:
    """``lose_next`` (the ``lose_kv_events`` fault) loses messages before the sequence
    check, as a PUB socket past its high-water mark does: the next message is a gap."""
    snapshots = Snapshots()
    rt = await runtime(build_runtime, snapshots)
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1,))))
    rt.kv.lose_next = 1
    rt.kv.accept(stream, batch(1, CacheEvent(STORED, (2,))))  # never seen
    snapshots.blocks["a"] = ([1, 2, 3], 3)
    rt.kv.accept(stream, batch(2, CacheEvent(STORED, (3,))))
    await asyncio.wait_for(rt.kv._heals["a"], timeout=5)
    assert rt.kv.lose_next == 0 and stream.gaps == 1 and stream.received == 2
    assert sorted(cache_map(rt).blocks_of("a")) == [1, 2, 3]  # healed by the snapshot


async def test_a_fault_naming_a_replica_spares_the_other_streams(build_runtime: Any) -> None:
    # Two services' replicas of one engine hear the same publisher: a fault for one
    # must not be spent on whichever stream reads the message first.
    rt = await runtime(build_runtime, Snapshots())
    a = rt.kv.streams["a"]
    rt.kv.streams["b"] = b = ReplicaStream("b", "tcp://127.0.0.1:2", socket=NoSocket())
    rt.kv.fault_replica, rt.kv.lose_next, rt.kv.drop_next = "a", 1, 1
    rt.kv.accept(b, batch(0, CacheEvent(STORED, (7,))))
    assert (rt.kv.lose_next, rt.kv.drop_next, b.received, len(b.pending)) == (1, 1, 1, 1)
    rt.kv.accept(a, batch(0, CacheEvent(STORED, (1,))))  # lost: never seen
    rt.kv.accept(a, batch(1, CacheEvent(STORED, (2,))))  # dropped, after the gap it shows
    assert (rt.kv.lose_next, rt.kv.drop_next, a.gaps, a.pending) == (0, 0, 0, [])


async def test_a_silently_lost_event_is_healed_by_the_next_sync(build_runtime: Any) -> None:
    snapshots = Snapshots()
    rt = await runtime(build_runtime, snapshots)
    stream = rt.kv.streams["a"]
    rt.kv.drop_next = 1
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (4, 5))))  # thrown away, no gap
    rt.kv.flush()
    assert cache_map(rt).holders(4) == set() and stream.gaps == 0
    snapshots.blocks["a"] = ([4, 5], 1)
    snapshots.blocks["b"] = ([9], 0)
    results = await rt.kv.sync_all()
    assert {n: r.blocks for n, r in results.items()} == {"a": 2, "b": 1}
    assert cache_map(rt).holders(4) == {"a"} and cache_map(rt).holders(9) == {"b"}


def stored(hashes: list[int], first: int, parent: int | None) -> CacheEvent:
    tokens = tuple(TOKENS[first * 32 : (first + len(hashes)) * 32])
    return CacheEvent(STORED, tuple(hashes), parent, tokens, block_size=32)


def request_keys(rt: Any) -> list[int]:
    rt.block_schemes.observe_engine(MODEL, 32)  # what the prober reads from the engine
    return rt.block_schemes.scheme(MODEL).keys(TOKENS)


async def test_token_ids_mode_keys_events_as_requests_are_keyed(build_runtime: Any) -> None:
    rt = await runtime(build_runtime, Snapshots(), params={})
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, stored([77], 0, None), stored([78], 1, 77)))
    rt.kv.flush()
    assert cache_map(rt).longest_prefix(request_keys(rt), {"a", "b"}) == (2, {"a"})
    rt.kv.accept(stream, batch(1, CacheEvent(REMOVED, (78,))))
    rt.kv.flush()
    assert cache_map(rt).blocks_of("a") == request_keys(rt)[:1]
    assert rt.kv.view()["orphans"] == 0


async def test_an_orphan_is_counted_and_resyncs_from_the_snapshots_stores(
    build_runtime: Any,
) -> None:
    snapshots = Snapshots()
    rt = await runtime(build_runtime, snapshots, params={})
    stream = rt.kv.streams["a"]
    # The store of block 0 was missed (no gap: say, before the subscription).
    snapshots.blocks["a"] = ([77, 78], 2)
    snapshots.stored["a"] = [
        {"type": "BlockStored", "block_hashes": [77, 78], "parent_block_hash": None,
         "token_ids": TOKENS, "block_size": 32, "lora_id": None, "medium": "GPU"},
    ]  # fmt: skip
    rt.kv.accept(stream, batch(0, stored([78], 1, 77)))
    rt.kv.flush()
    assert rt.kv.orphans == {"a": 1}
    assert rt.kv.view()["replicas"]["a"]["orphans"] == 1
    await asyncio.wait_for(rt.kv._resyncs["a"], timeout=5)
    assert snapshots.fetched == ["a"]
    assert sorted(cache_map(rt).blocks_of("a")) == sorted(request_keys(rt))


async def test_a_changed_block_identity_starts_the_replicas_keys_afresh(
    build_runtime: Any,
) -> None:
    rt = await runtime(build_runtime, Snapshots())
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1, 2))))
    rt.kv.flush()
    assert cache_map(rt).blocks_of("a") == [1, 2]
    rt.block_schemes.configure(MODEL, parse_block_identity({"mode": "token_ids"}))
    rt.kv.accept(stream, batch(1, stored([77], 0, None)))
    rt.kv.flush()
    # Engine hashes 1 and 2 are no keys of the new scheme: only the re-keyed block stays.
    assert cache_map(rt).blocks_of("a") == request_keys(rt)[:1]


class _Wire:
    """An event as the emulator's publisher sends it (``KVEvent.as_wire``)."""

    def __init__(self, kind: str, hashes: tuple[int, ...]) -> None:
        self.kind, self.hashes = kind, hashes

    def as_wire(self) -> list[object]:
        return [self.kind, list(self.hashes)]


async def test_a_gap_is_healed_by_the_publishers_replay_first(build_runtime: Any) -> None:
    snapshots = Snapshots()
    rt = await runtime(build_runtime, snapshots)
    pub_port, replay_port = free_port(), free_port()
    publisher = KVEventPublisher(f"tcp://*:{pub_port}", replay_endpoint=f"tcp://*:{replay_port}")
    publisher.start_replay()
    try:
        for hashes in ((1,), (2,), (3,), (4,)):  # messages 0..3, as the replica sent them
            publisher.publish([_Wire(STORED, hashes)])  # type: ignore[list-item]
        stream = rt.kv.streams["a"]
        stream.replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
        rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1,))))
        rt.kv.accept(stream, batch(3, CacheEvent(STORED, (4,))))  # 1 and 2 were lost
        await asyncio.wait_for(rt.kv._heals["a"], timeout=10)
    finally:
        await publisher.close()
    assert stream.healed_by == {"replay": 1} and snapshots.fetched == []
    assert cache_map(rt).blocks_of("a") == [1, 2, 3, 4]  # in the engine's order


async def test_with_neither_replay_nor_snapshot_the_replicas_view_is_cleared(
    build_runtime: Any,
) -> None:
    class NoSnapshots(Snapshots):
        async def answer(self, request: Received) -> Reply:
            if request.path == "/kv_cache/blocks":
                return Reply(404, [b'{"detail": "Not Found"}'])
            return await super().answer(request)

    rt = await runtime(build_runtime, NoSnapshots())
    stream = rt.kv.streams["a"]
    rt.kv.accept(stream, batch(0, CacheEvent(STORED, (1, 2))))
    rt.kv.accept(stream, batch(2, CacheEvent(STORED, (9,))))  # message 1 was lost
    await asyncio.wait_for(rt.kv._heals["a"], timeout=10)
    assert stream.healed_by == {"clear": 1}
    assert cache_map(rt).blocks_of("a") == []  # nothing it believed may be true any more
    # The next gap skips the snapshot the replica does not serve, and what was queued
    # after the loss survives the clear.
    rt.kv.accept(stream, batch(3, CacheEvent(STORED, (7,))))
    rt.kv.accept(stream, batch(5, CacheEvent(STORED, (10,))))
    await asyncio.wait_for(rt.kv._heals["a"], timeout=10)
    assert stream.healed_by == {"clear": 2}
    assert cache_map(rt).blocks_of("a") == [10]


async def test_a_meridian_tree_that_follows_the_engines_forgets_what_they_evict(
    build_runtime: Any,
) -> None:
    params = {**ENGINE_KEYS, "tree_from_kv_events": True}
    rt = await build_runtime(Snapshots(), model=ModelSpec(MODEL, "meridian", params))
    policy = rt.router.policy(MODEL)
    assert isinstance(policy, MeridianPolicy) and rt.router.kv_sink(MODEL) is policy.kv_sink
    assert "a" in rt.kv.tracked()  # its replicas are subscribed like a cache_map's
    rt.kv.streams["a"] = stream = ReplicaStream("a", "tcp://127.0.0.1:1", socket=NoSocket())
    policy.tree.insert((1, 2, 3), "a")
    rt.kv.accept(stream, batch(0, CacheEvent(REMOVED, (2,))))
    assert policy.tree.match((1, 2, 3), {"a"}) == (3, {"a"})  # not before the flush
    rt.kv.flush()
    assert policy.tree.match((1, 2, 3), {"a"}) == (1, {"a"})
    # Snapshots name blocks, not paths: the periodic sync leaves the tree alone.
    assert await rt.kv.sync_all() == {}


async def test_a_meridian_tree_of_its_own_takes_no_events(build_runtime: Any) -> None:
    rt = await build_runtime(Snapshots(), model=ModelSpec(MODEL, "meridian", ENGINE_KEYS))
    assert rt.router.kv_sink(MODEL) is None and rt.kv.tracked() == {}
