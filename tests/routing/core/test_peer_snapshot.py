"""SkyLB's regional snapshot as a cost model reads it: tokens a peer probably holds."""

from __future__ import annotations

from routing.core.peer_snapshot import PeerSnapshot
from tests.support.descriptors import prefix


def test_a_forwarded_prefix_is_held_by_that_peer_only() -> None:
    snapshot = PeerSnapshot(max_blocks_per_peer=100, block_tokens=16)
    doc = prefix(1, 10)
    snapshot.record((*doc, *prefix(2, 2)), "eu")
    asked = (*doc, *prefix(3, 2))
    assert snapshot.cached_tokens(asked, 16 * 12, {"eu", "ap"}) == {"eu": 160}
    assert snapshot.cached_tokens(prefix(4, 3), 48, {"eu"}) == {}
    snapshot.forget("eu")
    assert snapshot.cached_tokens(asked, 16 * 12, {"eu"}) == {}


def test_each_peer_forgets_its_least_recent_forwards_past_its_bound() -> None:
    snapshot = PeerSnapshot(max_blocks_per_peer=20, block_tokens=16)
    old, new = prefix(1, 15), prefix(2, 15)
    snapshot.record(old, "eu")
    # 30 blocks: over the bound, the older prompt is cut from its tail until the peer
    # is back under 90 % of it (18 blocks): 3 of its blocks remain.
    snapshot.record(new, "eu")
    assert snapshot.cached_tokens(old, 240, {"eu"}) == {"eu": 48}
    assert snapshot.cached_tokens(new, 240, {"eu"}) == {"eu": 240}
