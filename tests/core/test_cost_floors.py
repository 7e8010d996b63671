"""The walk's index: three orders of one set of replicas, kept sorted as keys move."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.cost_floors import CostFloors

ids = st.sampled_from("abcdef")
keys = st.sampled_from([0.0, 0.5, 1.0, 2.5, 9.0])
steps = st.lists(
    st.tuples(st.just("floor"), ids, keys)
    | st.tuples(st.just("overflow"), ids, keys, keys)
    | st.tuples(st.just("retain"), st.frozensets(ids)),
    max_size=40,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps)
def test_each_order_is_the_sorted_latest_keys_and_changes_leave_the_rest_stale(
    script: list[tuple[object, ...]],
) -> None:
    floors = CostFloors()
    floor: dict[str, float] = {}
    overflow: dict[str, tuple[float, float]] = {}
    stale: set[str] = set()
    for kind, *args in script:
        if kind == "floor":
            target_id, key = args
            assert isinstance(target_id, str) and isinstance(key, float)
            floors.file_floor(target_id, key)
            floor[target_id] = key
            stale.add(target_id)
        elif kind == "overflow":
            target_id, base, slope = args
            assert isinstance(target_id, str)
            assert isinstance(base, float) and isinstance(slope, float)
            floors.file_overflow(target_id, base, slope)
            overflow[target_id] = (base, slope)
            stale.discard(target_id)
        else:
            (keep,) = args
            assert isinstance(keep, frozenset)
            floors.retain(keep)
            floor = {k: v for k, v in floor.items() if k in keep}
            overflow = {k: v for k, v in overflow.items() if k in keep}
            stale &= keep
    assert floors.by_floor == sorted((v, k) for k, v in floor.items())
    assert floors.by_base == sorted((v[0], k) for k, v in overflow.items())
    assert floors.by_slope == sorted((v[1], k) for k, v in overflow.items())
    assert floors.stale == stale
    assert set(floors.ids()) == set(floor) and all(k in floors for k in floor)
