"""The pure KV-event decoder, sequence tracker and batch application (no sockets)."""

from __future__ import annotations

import msgpack
import pytest

from routing.core.cache_map import CacheMap
from routing.core.kv_events import (
    CLEARED,
    REMOVED,
    STORED,
    CacheEvent,
    KVEventDecodeError,
    SequenceTracker,
    apply_events,
    decode_event,
    decode_message,
    split_kv_event_params,
)


def frames(seq: int, events: list[object], topic: bytes = b"") -> list[bytes]:
    payload = msgpack.packb([1700000000.5, events, 0], use_bin_type=True)
    return [topic, seq.to_bytes(8, "big"), payload]


def cache_map() -> CacheMap:
    return CacheMap(max_blocks_per_replica=100, speculative_ttl_s=1.0, max_speculative=10)


def test_tagged_arrays_and_maps_decode_to_the_same_events() -> None:
    tagged = [["BlockStored", [1, 2], None, [0] * 32, 16, None], ["BlockRemoved", [1]]]
    tagged.append(["AllBlocksCleared"])
    mapped = [
        {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]
    a, b = decode_message(frames(7, tagged)), decode_message(frames(7, mapped))
    assert (
        a.events
        == b.events
        == (
            CacheEvent(STORED, (1, 2)),
            CacheEvent(REMOVED, (1,)),
            CacheEvent(CLEARED),
        )
    )
    assert a.sequence == 7 and a.timestamp == 1700000000.5


def test_bytes_hashes_unknown_kinds_and_malformed_messages() -> None:
    assert decode_event(["BlockRemoved", [b"\x01\x00"]]) == CacheEvent(REMOVED, (256,))
    assert decode_event({"type": "SomethingNew"}) is None
    for bad in ([b"", b"\x00" * 8], [b"", b"\x00" * 4, b"\x90"], [b"", b"\x00" * 8, b"\xc1"]):
        with pytest.raises(KVEventDecodeError):
            decode_message(bad)
    with pytest.raises(KVEventDecodeError):
        decode_event(["BlockStored", "not a list"])
    with pytest.raises(KVEventDecodeError):
        decode_event(42)


def test_sequence_tracker_finds_gaps_and_skips_what_a_snapshot_covered() -> None:
    tracker = SequenceTracker()
    assert tracker.observe(5) == (True, False)  # the first message is never a gap
    assert tracker.observe(6) == (True, False)
    assert tracker.observe(9) == (True, True)  # 7 and 8 were lost
    assert tracker.observe(8) == (False, False)  # late and stale
    tracker.resync_at(20)
    assert tracker.observe(19) == (False, False)
    assert tracker.observe(20) == (True, False)
    tracker.resync_at(3)  # an older snapshot never moves the tracker back
    assert tracker.next_expected == 21


def test_apply_events_in_order_through_the_reverse_index() -> None:
    cm = cache_map()
    events = [
        CacheEvent(STORED, (1, 2, 3)),
        CacheEvent(REMOVED, (2,)),
        CacheEvent(REMOVED, (3,)),
        CacheEvent(STORED, (3,)),  # re-stored after its removal: held again
    ]
    assert apply_events(cm, "r1", events) == 4
    assert cm.blocks_of("r1") == [1, 3]
    apply_events(cm, "r2", [CacheEvent(STORED, (1,))])
    apply_events(cm, "r1", [CacheEvent(CLEARED), CacheEvent(STORED, (9,))])
    assert cm.blocks_of("r1") == [9] and cm.holders(1) == {"r2"}


def test_kv_events_key_leaves_the_policy_params() -> None:
    endpoints, rest = split_kv_event_params(
        {"kv_events": {"r1": "tcp://10.0.0.1:5557"}, "speculative_ttl_s": 5}
    )
    assert endpoints == {"r1": "tcp://10.0.0.1:5557"} and rest == {"speculative_ttl_s": 5}
    assert split_kv_event_params({}) == ({}, {})
    with pytest.raises(ValueError, match="kv_events"):
        split_kv_event_params({"kv_events": ["tcp://x:1"]})
