"""The walk's index: three orders of one set of replicas, kept sorted as keys move."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core.cost_floors import CostFloors

keys = st.sampled_from([0.0, 0.5, 1.0, 2.5, 9.0])
ops = st.lists(
    st.tuples(st.sampled_from("abcdef"), keys, keys, keys)
    | st.frozensets(st.sampled_from("abcdef")),
    max_size=40,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(ops)
def test_each_order_is_the_sorted_latest_keys_of_the_replicas_kept(steps: list[object]) -> None:
    floors = CostFloors()
    latest: dict[str, tuple[float, float, float]] = {}
    for step in steps:
        if isinstance(step, frozenset):
            floors.retain(step)
            latest = {k: v for k, v in latest.items() if k in step}
        else:
            assert isinstance(step, tuple)
            target_id, floor, base, slope = step
            floors.file(target_id, floor, base, slope)
            latest[target_id] = (floor, base, slope)
    orders = (floors.by_floor, floors.by_base, floors.by_slope)
    for column, order in enumerate(orders):
        assert order == sorted((v[column], k) for k, v in latest.items())
    assert set(floors.ids()) == set(latest) and all(k in floors for k in latest)
