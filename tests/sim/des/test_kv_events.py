"""The simulator feeds the engines' KV events to a cache_map balancer (and to a meridian one
whose tree follows them), as production does."""

from __future__ import annotations

from collections.abc import Callable

from core.policies.cache_map import CacheMapPolicy
from core.policies.meridian import MeridianPolicy
from sim.des.config import MODEL, SimConfig
from sim.des.metrics import summarize
from sim.des.world import SimRun, World
from sim.engine.engine import EngineConfig


def run_world(config: SimConfig) -> tuple[World, SimRun]:
    world = World(config)
    run = world.run()
    world.loop.run(until=world.loop.now + 5.0)  # the last events reach the map
    return world, run


def test_the_cache_map_mirrors_what_the_engines_cache(
    make_config: Callable[..., SimConfig],
) -> None:
    world, _ = run_world(make_config(policy="cache_map", max_requests=40))
    for lb in world.balancers.values():
        policy = lb.router.policy(MODEL)
        assert isinstance(policy, CacheMapPolicy)
        assert lb.kv_events_applied > 0
        for name, replica in world.replicas.items():
            if name not in {t.target_id for t in lb.router.targets()}:
                continue
            confirmed = [
                key
                for key in policy.cache_map.blocks_of(name)
                if not policy.cache_map.is_speculative(name, key)
            ]
            # Every block the engine holds in its prefix cache is confirmed in the map.
            assert len(confirmed) == len(replica.engine.pool.cached) > 0


def test_cache_map_routing_keeps_its_hits_with_events(
    make_config: Callable[..., SimConfig],
) -> None:
    _, run = run_world(make_config(policy="cache_map", max_requests=60))
    summary = summarize(run)
    assert summary.ok == summary.issued
    assert summary.hit_rate > 0.5
    assert summary.hit_of_bound is not None and summary.hit_of_bound > 0.8


def test_other_policies_do_not_subscribe(make_config: Callable[..., SimConfig]) -> None:
    world, _ = run_world(make_config(policy="least_load", max_requests=10))
    assert all(lb.kv_events_applied == 0 for lb in world.balancers.values())


def test_a_meridian_tree_that_follows_the_engines_holds_no_more_than_they_cache(
    make_config: Callable[..., SimConfig],
) -> None:
    # 24-block caches under 8 conversations: the engines evict, and say so.
    config = make_config(
        policy="meridian",
        policy_params={"tree_from_kv_events": True},
        engine=EngineConfig(num_blocks=24),
        max_requests=80,
    )
    world, run = run_world(config)
    assert summarize(run).ok == 80
    for lb in world.balancers.values():
        policy = lb.router.policy(MODEL)
        assert isinstance(policy, MeridianPolicy)
        owned = {t.target_id for t in lb.router.targets()}
        assert lb.kv_events_applied > 0 and policy.following == owned
        for name in owned:
            # The bound is twice the cache; the engines' evictions keep it to the cache.
            assert policy.tree.size(name) <= world.replicas[name].engine.config.num_blocks
