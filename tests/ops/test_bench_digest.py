"""The prefix digest's bench table: its trees are filled as it says, and each row is of
a digest that fits the heartbeat's budget and matches the held path it times."""

from __future__ import annotations

from core.prefix_digest import digest_of
from ops.bench.digest import SHAPES, TENANTS, digest_table, filled_tree


def test_a_filled_tree_holds_a_conversation_path_within_each_replicas_bound() -> None:
    tree, path = filled_tree(512, seed=3, turns=400)
    assert all(tree.size(t) <= 512 for t in TENANTS)
    assert sum(tree.size(t) for t in TENANTS) > 3 * 512  # filled up to the bounds
    digest = digest_of(tree, set(TENANTS), block_tokens=16, min_stride=4, max_hashes=4096)
    # The last conversation turn was just inserted: the digest holds all of it.
    assert digest.held_blocks(path) == len(path)


def test_every_shape_gets_a_row_of_a_digest_within_budget() -> None:
    headers, rows = digest_table(seed=1, runs=2, turns=300)
    assert [row[0] for row in rows] == [label for label, _ in SHAPES]
    hashes = headers.index("hashes")
    assert all(0 < int(row[hashes]) <= 4096 for row in rows)
