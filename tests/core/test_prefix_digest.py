"""A region's prefix digest: sampled from its radix tree, matched by binary search,
truncated by recency, and carried as base64 words in the heartbeat."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.prefix_digest import MAX_WIRE_HASHES, PrefixDigest, digest_of
from core.radix_tree import RadixTree
from tests.support.descriptors import prefix


def _digest(
    tree: RadixTree, tenants: set[str], stride: int = 4, cap: int = 1 << 20
) -> PrefixDigest:
    return digest_of(tree, tenants, block_tokens=16, min_stride=stride, max_hashes=cap)


def test_a_prompt_extending_a_held_path_is_credited_to_the_stride_below_its_end() -> None:
    tree = RadixTree(10_000)
    system = prefix(1, 130)
    tree.insert(system, "r0")
    digest = _digest(tree, {"r0"})
    # The held path itself: its last block is a node end, so all of it.
    assert digest.held_blocks(system) == 130
    # Two new blocks after it: the deepest stride position held is block 128.
    assert digest.held_blocks(prefix(2, 2, system)) == 128
    # A prompt of its first 50 blocks: a stride position, not a node end.
    assert digest.held_blocks(system[:50]) == 48
    assert digest.held_blocks(prefix(3, 10)) == 0
    assert digest.held_blocks(()) == 0


def test_only_the_wanted_tenants_are_in_it() -> None:
    tree = RadixTree(10_000)
    tree.insert(prefix(1, 20), "local")
    tree.insert(prefix(2, 20), "peer")
    digest = _digest(tree, {"local"})
    assert digest.held_blocks(prefix(1, 20)) == 20
    assert digest.held_blocks(prefix(2, 20)) == 0


def test_a_branch_point_is_held_exactly() -> None:
    tree = RadixTree(10_000)
    shared = prefix(1, 7)  # not a multiple of the stride
    tree.insert(prefix(2, 9, shared), "r0")
    tree.insert(prefix(3, 9, shared), "r0")
    digest = _digest(tree, {"r0"})
    # The split left a node ending at block 7: a prompt of exactly the shared part.
    assert digest.held_blocks(shared) == 7
    assert digest.held_blocks(prefix(4, 3, shared)) == 4


def test_the_stride_doubles_until_the_held_blocks_fit() -> None:
    tree = RadixTree(100_000)
    for tag in range(10):
        tree.insert(prefix(tag, 100), "r0")  # 1,000 blocks held
    digest = _digest(tree, {"r0"}, stride=4, cap=100)
    assert digest.stride == 16
    assert len(digest.hashes) <= 100


def test_a_full_digest_keeps_the_most_recent_paths_shallow_blocks_first() -> None:
    tree = RadixTree(100_000)
    short = [prefix(tag, 3) for tag in range(10)]  # 30 blocks: stride 4 fits 8 hashes
    for path in short:
        tree.insert(path, "r0")
    # Each path has no stride position, only its end: ten ends for eight places.
    digest = _digest(tree, {"r0"}, stride=4, cap=8)
    assert digest.stride == 4
    assert [digest.held_blocks(p) for p in short] == [0, 0] + [3] * 8
    # A long new path: the stride doubles to fit it, the old short paths give way.
    tree.insert(prefix(20, 64), "r0")
    small = _digest(tree, {"r0"}, stride=4, cap=3)
    assert small.stride == 32
    assert small.held_blocks(prefix(20, 64)) == 64
    assert small.held_blocks(prefix(21, 1, prefix(20, 40))) == 32
    assert sum(small.held_blocks(p) for p in short) == 3  # the newest short path only


def test_a_digest_carries_the_version_of_the_tree_it_was_built_from() -> None:
    tree = RadixTree(10_000)
    tree.insert(prefix(1, 8), "r0")
    first = _digest(tree, {"r0"})
    tree.insert(prefix(1, 8), "r0")  # the same path again: the same hashes, a later tree
    again = _digest(tree, {"r0"})
    assert first.hashes == again.hashes and first != again
    assert again.version == tree.version > first.version


def test_encode_and_decode_round_trip() -> None:
    tree = RadixTree(10_000)
    tree.insert(prefix(1, 40), "r0")
    digest = _digest(tree, {"r0"})
    wire = digest.encode()
    assert PrefixDigest.decode(wire) == digest
    assert PrefixDigest.decode(PrefixDigest(4, 16, frozenset()).encode()).hashes == frozenset()
    # Hashes use all 64 bits.
    top = PrefixDigest(1, 16, frozenset({2**64 - 1, 0}), version=7)
    assert PrefixDigest.decode(top.encode()) == top


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"stride": 0, "block_tokens": 16, "version": 0, "blocks": ""},
        {"stride": True, "block_tokens": 16, "version": 0, "blocks": ""},
        {"stride": 4, "block_tokens": "16", "version": 0, "blocks": ""},
        {"stride": 4, "block_tokens": 16, "version": 0, "blocks": 7},
        {"stride": 4, "block_tokens": 16, "version": True, "blocks": ""},
        {"stride": 4, "block_tokens": 16, "blocks": ""},  # no version
        {"stride": 4, "block_tokens": 16, "version": -1, "blocks": ""},
        {"stride": 4, "block_tokens": 16, "version": 0, "blocks": "not base64!"},
        {
            "stride": 4,
            "block_tokens": 16,
            "version": 0,
            "blocks": base64.b64encode(b"123").decode(),
        },
    ],
)
def test_decode_refuses_what_is_not_a_digest(raw: object) -> None:
    with pytest.raises(ValueError):
        PrefixDigest.decode(raw)


def test_decode_refuses_a_digest_past_the_wire_bound_before_decoding_it() -> None:
    words = b"\x01" * 8 * (MAX_WIRE_HASHES + 1)
    raw = {
        "stride": 4,
        "block_tokens": 16,
        "version": 1,
        "blocks": base64.b64encode(words).decode(),
    }
    with pytest.raises(ValueError, match="at most"):
        PrefixDigest.decode(raw)
    at_bound = base64.b64encode(b"\x01" * 8 * MAX_WIRE_HASHES).decode()
    assert len(PrefixDigest.decode({**raw, "blocks": at_bound}).hashes) == 1


def test_digest_of_refuses_a_zero_stride_or_cap() -> None:
    with pytest.raises(ValueError):
        _digest(RadixTree(10), {"r0"}, stride=0)
    with pytest.raises(ValueError):
        _digest(RadixTree(10), {"r0"}, cap=0)


_paths = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(paths=_paths, probe=st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 30)))
def test_held_blocks_is_the_true_depth_to_stride_granularity(
    paths: list[tuple[int, int, int]], probe: tuple[int, int, int]
) -> None:
    """Against the tree's own walk: never more than is held, less by under a stride
    (all of it where the prompt ends at a node end)."""
    tree = RadixTree(100_000)
    for tag, shared, own in paths:
        tree.insert(prefix(100 + tag, own, prefix(tag % 2, shared)), "r0")
    tag, shared, own = probe
    prompt = prefix(200 + tag, own, prefix(tag % 2, shared))
    for stride in (1, 4, 8):
        digest = _digest(tree, {"r0"}, stride=stride)
        held = digest.held_blocks(prompt)
        depth = tree.match_depths(prompt, {"r0"}).get("r0", 0)
        assert held in {depth - depth % stride, depth}
        assert held != depth or depth % stride == 0 or depth == len(prompt)
