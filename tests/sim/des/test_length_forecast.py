"""The simulator's balancers run the production load forecast: predictions on the
descriptor, the replicas' look-ahead maps, completions counted against them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.des.config import SimConfig, SimConfigError
from sim.des.world import World
from tests.sim.des.conftest import SHORT_CHAT


def _tallies(world: World) -> list[tuple[int, int]]:
    """(completed, absolute error tokens) per replica map, over every balancer."""
    return [
        (f.tally.completed, f.tally.absolute_error_tokens)
        for lb in world.balancers.values()
        for f in lb.core.forecast.snapshot()
    ]


def test_the_oracle_predicts_every_engine_length_exactly(
    make_config: Callable[..., SimConfig],
) -> None:
    world = World(make_config(length_predictor="oracle"))
    run = world.run()
    served = sum(1 for r in run.records if r.ok)
    tallies = _tallies(world)
    assert sum(completed for completed, _ in tallies) == served > 0
    assert all(error == 0 for _, error in tallies)
    # Every request left its replica's map when it completed.
    assert all(len(lb.core.forecast.anticipator(f.replica)) == 0
               for lb in world.balancers.values() for f in lb.core.forecast.snapshot())  # fmt: skip


def test_no_predictor_assumes_max_tokens_and_is_counted_wrong_where_it_is(
    make_config: Callable[..., SimConfig],
) -> None:
    # max_tokens far above the engine's median answer (180 tokens): most stop earlier.
    workload = SHORT_CHAT.replace(
        "max_tokens_min=8,max_tokens_max=24", "max_tokens_min=600,max_tokens_max=800"
    )
    world = World(make_config(length_predictor="none", workload=workload, max_requests=10))
    world.run()
    tallies = _tallies(world)
    assert sum(completed for completed, _ in tallies) > 0
    # The engine stops before max_tokens on some requests: "none" overestimates them.
    assert sum(error for _, error in tallies) > 0


def test_the_learned_predictor_runs_in_the_simulator(
    make_config: Callable[..., SimConfig],
) -> None:
    world = World(make_config(length_predictor="learned"))
    world.run()
    predictors = {lb.core.forecast.predictor.name for lb in world.balancers.values()}
    assert predictors == {"learned"}
    assert sum(completed for completed, _ in _tallies(world)) > 0


def test_an_unknown_predictor_is_refused(make_config: Callable[..., SimConfig]) -> None:
    with pytest.raises(SimConfigError, match="--length-predictor"):
        make_config(length_predictor="psychic")
