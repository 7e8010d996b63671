"""Oracle bounds on the hit rate, on hand-computed request streams."""

from __future__ import annotations

from sim.des.oracle import (
    BalancerPool,
    CacheUse,
    hit_rate_bounds,
    max_hit_blocks,
    prefix_hit_blocks,
    share_of_bound,
)


def use(
    at: float,
    keys: tuple[int, ...],
    *,
    done: float | None = None,
    reply: tuple[int, ...] = (),
    cap: int | None = None,
    started: float | None = None,
) -> CacheUse:
    limit = len(keys) if cap is None else cap
    return CacheUse(at, done, keys, reply, limit, started)


def test_the_engines_cap_recomputes_the_last_token() -> None:
    assert max_hit_blocks(32, 16) == 1  # two full blocks, the second is recomputed
    assert max_hit_blocks(33, 16) == 2
    assert max_hit_blocks(0, 16) == 0


def test_an_infinite_cache_hits_every_leading_block_seen_before() -> None:
    uses = [
        use(0.0, (1, 2, 3)),  # first sight: 0
        use(1.0, (1, 2, 4)),  # 1, 2 then 4 is new: 2
        use(2.0, (1, 2, 4, 5)),  # 1, 2, 4: 3
        use(3.0, (9, 2)),  # a different first block: 0 (a prefix, not a set)
    ]
    assert prefix_hit_blocks(uses, None) == 5


def test_hits_stop_at_the_engines_cap() -> None:
    uses = [
        use(0.0, (1, 2, 3)),
        use(1.0, (1, 2, 3), cap=2),  # 3 would hit, the engine recomputes it: 2
    ]
    assert prefix_hit_blocks(uses, None) == 2


def test_a_reply_is_cached_at_completion_for_the_next_turn() -> None:
    uses = [
        use(0.0, (1, 2), done=5.0, reply=(3,)),
        use(4.0, (1, 2, 3)),  # before the reply exists: 1, 2
        use(6.0, (1, 2, 3, 4)),  # after: 1, 2, 3
    ]
    assert prefix_hit_blocks(uses, None) == 5


def test_pooled_lru_evicts_the_least_recent_and_tails_before_heads() -> None:
    uses = [
        use(0.0, (1, 2)),
        use(1.0, (3, 4)),  # capacity 3: 1 2 | 3 4 -> the tail 2 of the older prompt goes
        use(2.0, (1, 2)),  # 1 is still there, 2 is not: 1 hit
    ]
    assert prefix_hit_blocks(uses, 3) == 1
    assert prefix_hit_blocks(uses, 4) == 2  # everything fits: both blocks hit
    assert prefix_hit_blocks(uses, None) == 2


def test_a_hit_refreshes_its_blocks() -> None:
    uses = [
        use(0.0, (1,)),
        use(1.0, (2,)),
        use(2.0, (1,)),  # hit, and 1 becomes the most recent
        use(3.0, (3,)),  # capacity 2: evicts 2, not 1
        use(4.0, (1,)),  # hit
    ]
    assert prefix_hit_blocks(uses, 2) == 2


def test_bounds_as_rates_and_the_share_of_the_bound() -> None:
    uses = [use(0.0, (1, 2)), use(1.0, (3, 4)), use(2.0, (1, 2))]
    bounds = hit_rate_bounds(uses, 96, block_size=16, capacity_blocks=3)
    assert bounds.infinite == 2 * 16 / 96
    assert bounds.pooled == 1 * 16 / 96
    assert share_of_bound(bounds.pooled / 2, bounds.pooled) == 0.5
    assert share_of_bound(0.0, 0.0) is None
    assert hit_rate_bounds([], 0, block_size=16, capacity_blocks=3).pooled == 0.0


def test_the_reachable_bound_keeps_each_balancers_reuse_to_itself() -> None:
    east = [use(0.0, (1, 2)), use(2.0, (1, 2))]
    west = [use(1.0, (1, 2)), use(3.0, (5, 6))]
    everything = sorted([*east, *west], key=lambda u: u.sent_at)
    split = [BalancerPool(east, 4), BalancerPool(west, 4)]
    bounds = hit_rate_bounds(everything, 128, block_size=16, capacity_blocks=8, balancers=split)
    assert bounds.pooled == 4 * 16 / 128  # west's first (1, 2) hits east's copy
    assert bounds.reachable == 2 * 16 / 128  # only east's own repeat
    one = hit_rate_bounds(everything, 128, block_size=16, capacity_blocks=8)
    assert one.reachable == one.pooled  # one balancer owning the fleet


def test_at_start_a_waiting_turn_finds_what_others_evicted_while_it_waited() -> None:
    uses = [
        use(0.0, (1, 2), done=1.0, reply=(3,)),
        # The next turn is sent as the first ends, but an engine takes it at 5 s.
        use(1.0, (1, 2, 3, 4), started=5.0),
        # Meanwhile another request runs: capacity 4 keeps only the first turn's head.
        use(2.0, (10, 11, 12), done=3.0, started=2.0),
    ]
    assert prefix_hit_blocks(uses, 4) == 3  # looked up when sent: 1, 2, 3
    assert prefix_hit_blocks(uses, 4, at_start=True) == 1  # when scheduled: 1, then 2 is gone
    assert prefix_hit_blocks(uses, None, at_start=True) == 3  # nothing evicts infinity
    bounds = hit_rate_bounds(uses, 160, block_size=16, capacity_blocks=4)
    assert (bounds.pooled, bounds.pooled_at_start) == (3 * 16 / 160, 1 * 16 / 160)


def test_an_unknown_start_is_looked_up_when_sent() -> None:
    uses = [use(0.0, (1, 2), done=1.0), use(1.0, (1, 2, 3)), use(2.0, (5, 6, 7))]
    assert uses[1].looked_up_at == 1.0
    assert prefix_hit_blocks(uses, 4, at_start=True) == prefix_hit_blocks(uses, 4) == 2
