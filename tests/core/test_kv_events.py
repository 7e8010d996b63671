"""The pure KV-event decoder and sequence tracker (no sockets)."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from core.kv_events import (
    CLEARED,
    REMOVED,
    STORED,
    CacheEvent,
    KVEventDecodeError,
    SequenceTracker,
    decode_event,
    decode_message,
    split_kv_event_params,
)


def frames(seq: int, events: list[object], topic: bytes = b"") -> list[bytes]:
    payload = msgpack.packb([1700000000.5, events, 0], use_bin_type=True)
    return [topic, seq.to_bytes(8, "big"), payload]


# A BlockStored as vLLM 0.32 encodes it: msgspec's tagged struct as a map, fields in
# declaration order, defaults (None) of the trailing optional fields omitted.
VLLM_STORED = {
    "type": "BlockStored",
    "block_hashes": [13907755898995373680, 17701127471491950661],
    "parent_block_hash": None,
    "token_ids": list(range(64)),
    "block_size": 32,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "extra_keys": [None, None],
    "group_idx": 0,
}
STORED_EVENT = CacheEvent(
    STORED,
    (13907755898995373680, 17701127471491950661),
    token_ids=tuple(range(64)),
    block_size=32,
    medium="GPU",
)


def test_vllm_maps_decode_with_the_fields_block_identity_needs() -> None:
    batch = decode_message(
        frames(
            7,
            [
                VLLM_STORED,
                {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0},
                {"type": "AllBlocksCleared"},
            ],
        )
    )
    assert batch.events == (
        STORED_EVENT,
        CacheEvent(REMOVED, (1,), medium="GPU"),
        CacheEvent(CLEARED),
    )
    assert batch.sequence == 7 and batch.timestamp == 1700000000.5
    lora = {**VLLM_STORED, "parent_block_hash": 5, "lora_id": 3, "lora_name": "sql"}
    event = decode_event(lora)
    assert event is not None
    assert (event.parent_block_hash, event.lora_id, event.lora_name) == (5, 3, "sql")


def test_tagged_arrays_decode_like_maps_in_vllms_field_order() -> None:
    tagged = [
        ["BlockStored", VLLM_STORED["block_hashes"], None, list(range(64)), 32, None, "GPU"],
        ["BlockRemoved", [1]],
        ["AllBlocksCleared"],
    ]
    assert decode_message(frames(0, tagged)).events == (
        STORED_EVENT,
        CacheEvent(REMOVED, (1,)),
        CacheEvent(CLEARED),
    )
    short = decode_event(["BlockStored", [1, 2]])  # an engine that sends hashes only
    assert short == CacheEvent(STORED, (1, 2))


def test_bytes_hashes_are_read_as_vllms_64_bit_int_form() -> None:
    digest = hashlib.sha256(b"a block").digest()
    as_int = int.from_bytes(digest, "big") & ((1 << 64) - 1)  # maybe_convert_block_hash
    event = decode_event(
        {"type": "BlockStored", "block_hashes": [digest], "parent_block_hash": digest}
    )
    assert event is not None
    assert event.block_hashes == (as_int,) and event.parent_block_hash == as_int
    assert decode_event(["BlockRemoved", [b"\x01\x00"]]) == CacheEvent(REMOVED, (256,))


def test_unknown_kinds_are_skipped_and_malformed_messages_refused() -> None:
    assert decode_event({"type": "SomethingNew"}) is None
    for bad in ([b"", b"\x00" * 8], [b"", b"\x00" * 4, b"\x90"], [b"", b"\x00" * 8, b"\xc1"]):
        with pytest.raises(KVEventDecodeError):
            decode_message(bad)
    for event in (
        ["BlockStored", "not a list"],
        42,
        {**VLLM_STORED, "token_ids": ["a"]},
        {**VLLM_STORED, "block_size": "32"},
        {**VLLM_STORED, "lora_name": 7},
    ):
        with pytest.raises(KVEventDecodeError):
            decode_event(event)


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


def test_kv_events_key_leaves_the_policy_params() -> None:
    endpoints, rest = split_kv_event_params(
        {"kv_events": {"r1": "tcp://10.0.0.1:5557"}, "speculative_ttl_s": 5}
    )
    assert endpoints == {"r1": "tcp://10.0.0.1:5557"} and rest == {"speculative_ttl_s": 5}
    assert split_kv_event_params({}) == ({}, {})
    with pytest.raises(ValueError, match="kv_events"):
        split_kv_event_params({"kv_events": ["tcp://x:1"]})
