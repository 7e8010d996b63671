"""The push-based cache map: reverse index, batched removal, destructive sync, speculation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache_map import CacheMap

blocks = st.lists(st.integers(0, 30), max_size=12)
replica = st.sampled_from(["a", "b", "c"])
event = st.one_of(
    st.tuples(st.just("stored"), replica, blocks),
    st.tuples(st.just("removed"), replica, blocks),
    st.tuples(st.just("clear"), replica, st.just([])),
    st.tuples(st.just("sync"), replica, blocks),
    st.tuples(st.just("speculate"), replica, blocks),
    st.tuples(st.just("tick"), replica, st.just([])),
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_map(clock: FakeClock, **bounds: int) -> CacheMap:
    return CacheMap(
        max_blocks_per_replica=bounds.get("per_replica", 1000),
        speculative_ttl_s=5.0,
        max_speculative=bounds.get("speculative", 1000),
        clock=clock,
    )


def test_stored_removed_and_cleared_events_update_holders() -> None:
    m = make_map(FakeClock())
    m.apply_stored("a", [1, 2, 3])
    m.apply_stored("b", [1])
    assert m.holders(1) == {"a", "b"} and m.holders(3) == {"a"}
    m.apply_removed("a", [1, 3, 99])  # one batch; unknown hashes are ignored
    assert m.holders(1) == {"b"} and m.holders(3) == set()
    m.apply_removed("zz", [1])
    m.clear("b")
    assert m.holders(1) == set() and m.replicas() == ["a"]
    assert len(m) == 1


def test_sync_is_a_destructive_per_replica_replace() -> None:
    m = make_map(FakeClock())
    m.apply_stored("a", [1, 2, 3])
    m.apply_stored("b", [2])
    m.sync("a", [3, 4])
    assert m.blocks_of("a") == [3, 4]
    assert m.holders(1) == set() and m.holders(2) == {"b"} and m.holders(4) == {"a"}


def test_speculation_is_confirmed_by_a_stored_event_or_expires() -> None:
    clock = FakeClock()
    m = make_map(clock)
    m.speculate("a", [1, 2])
    assert m.holders(1) == {"a"} and m.is_speculative("a", 1)
    m.apply_stored("a", [1])
    assert not m.is_speculative("a", 1) and m.speculative_count == 1
    clock.now = 5.0
    assert m.holders(2) == set()  # expired, never confirmed
    assert m.holders(1) == {"a"}  # confirmed entries never expire
    m.speculate("a", [1])  # already confirmed: stays confirmed
    assert not m.is_speculative("a", 1)


def test_failed_requests_withdraw_only_speculative_entries() -> None:
    m = make_map(FakeClock())
    m.apply_stored("a", [1])
    m.speculate("a", [1, 2])
    m.forget_speculative("a", [1, 2])
    assert m.holders(1) == {"a"} and m.holders(2) == set()


def test_bounds_drop_the_oldest_entries() -> None:
    clock = FakeClock()
    m = make_map(clock, per_replica=3, speculative=2)
    m.apply_stored("a", [1, 2, 3, 4])
    assert m.blocks_of("a") == [2, 3, 4]
    m.apply_stored("a", [2])  # re-stored: now the newest
    m.apply_stored("a", [5])
    assert m.blocks_of("a") == [4, 2, 5]
    m.speculate("b", [10, 11, 12])
    assert m.speculative_count == 2 and m.holders(10) == set()


def test_only_the_confirmed_leading_run_counts() -> None:
    cmap = make_map(FakeClock())
    cmap.apply_stored("a", [1, 2, 3])
    cmap.speculate("a", [4])
    assert cmap.confirmed_prefix("a", [1, 2, 3, 4, 5]) == 3  # 4 is only a guess
    assert cmap.confirmed_prefix("a", [1, 9, 3]) == 1  # a chain stops at a miss
    assert cmap.confirmed_prefix("b", [1, 2, 3]) == 0


def test_longest_prefix_only_counts_available_replicas() -> None:
    m = make_map(FakeClock())
    m.apply_stored("a", [1, 2, 3])
    m.apply_stored("b", [1, 2])
    assert m.longest_prefix([1, 2, 3, 4], {"a", "b"}) == (3, {"a"})
    assert m.longest_prefix([1, 2, 3, 4], {"b", "c"}) == (2, {"b"})
    assert m.longest_prefix([9], {"a"}) == (0, set())


@settings(max_examples=100, deadline=None)
@given(st.lists(event, max_size=40))
def test_reverse_index_always_mirrors_the_forward_map(
    ops: list[tuple[str, str, list[int]]],
) -> None:
    clock = FakeClock()
    m = make_map(clock, per_replica=8, speculative=10)
    for op, who, hashes in ops:
        if op == "tick":
            clock.now += 2.0
        elif op == "clear":
            m.clear(who)
        else:
            getattr(m, {"stored": "apply_stored", "removed": "apply_removed"}.get(op, op))(
                who, hashes
            )
        forward = {(h, r) for h, states in m._holders.items() for r in states}
        reverse = {(h, r) for r, index in m._by_replica.items() for h in index}
        assert forward == reverse
        assert all(len(index) <= 8 for index in m._by_replica.values())
        assert m.speculative_count <= 10
        if op == "sync":
            # The snapshot replaced everything; beyond the bound its newest blocks stay.
            newest = list(dict.fromkeys(reversed(hashes)))[:8]
            assert set(m.blocks_of(who)) == set(newest)


def test_what_the_engine_removed_goes_to_the_eviction_log() -> None:
    m = make_map(FakeClock())
    m.apply_stored("a", [1, 2, 3, 4])
    m.speculate("a", [8])
    mark = m.evictions.mark("a")
    m.apply_removed("a", [1])
    assert m.evictions.removed_since("a", [1], mark)
    mark = m.evictions.mark("a")
    # A snapshot without 2 says the engine removed it; 3 and 4 are still held.
    m.sync("a", [3, 4, 5])
    assert m.evictions.removed_since("a", [2], mark)
    assert not m.evictions.removed_since("a", [3, 4], mark)
    mark = m.evictions.mark("a")
    m.speculate("a", [9])
    m.clear("a")  # AllBlocksCleared: every block it reported, not the guesses
    assert m.evictions.removed_since("a", [3], mark)
    assert not m.evictions.removed_since("a", [9], mark)
    mark_b = m.evictions.mark("b")
    m.apply_stored("b", [1])
    m.retain(["a"])  # a replica that left removed nothing
    assert not m.evictions.removed_since("b", [1], mark_b)
