"""Block hashing: the batched ``block_hashes`` equals chaining ``block_hash`` block by block.

The values are the contract with the emulated replicas and their KV events, so the
fast path must never change them.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.blocks import block_hash, block_hashes, root_hash


def chained(tokens: list[int], block_size: int, extra: str, seed: str) -> list[int]:
    out, parent = [], root_hash(seed)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start : start + block_size], extra)
        out.append(parent)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=80),
    st.sampled_from([1, 4, 16]),
    st.sampled_from(["", "lora-a"]),
    st.sampled_from(["meridian", "other"]),
)
def test_batched_hashes_equal_the_block_by_block_chain(
    tokens: list[int], block_size: int, extra: str, seed: str
) -> None:
    assert block_hashes(tokens, block_size=block_size, extra=extra, seed=seed) == chained(
        tokens, block_size, extra, seed
    )


def test_a_known_value_is_unchanged() -> None:
    # Pinned so that a change to the definition is noticed, not silently shipped.
    assert block_hashes(list(range(16))) == [block_hash(root_hash(), list(range(16)))]
    assert block_hashes(list(range(32)))[1] == block_hash(
        block_hash(root_hash(), list(range(16))), list(range(16, 32))
    )


def test_a_chain_continued_from_a_known_parent_equals_the_whole_chain() -> None:
    tokens = list(range(64))
    whole = block_hashes(tokens)
    assert block_hashes(tokens[32:], parent=whole[1]) == whole[2:]
