"""A randomized workload against a small cache: the engine's bookkeeping never drifts."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from sim.engine import Engine
from tests.support.engine import fresh_prompt, request


def check_invariants(engine: Engine) -> None:
    pool = engine.pool
    held = Counter(block for r in engine.running for block in r.blocks)
    assert all(pool.ref_counts[b] == held.get(b, 0) for b in range(pool.num_blocks))
    assert set(pool.free_queue) == {b for b in range(pool.num_blocks) if pool.ref_counts[b] == 0}
    assert all(pool.block_hash[block] == h for h, block in pool.cached.items())
    assert engine.num_running <= engine.config.max_num_seqs
    assert all(not r.blocks for r in engine.waiting)


def test_random_traffic_with_aborts_keeps_the_books_straight(
    make_engine: Callable[..., Engine],
) -> None:
    rng = random.Random(7)
    engine = make_engine(num_blocks=40, max_num_seqs=6, max_num_batched_tokens=96)
    shared = [fresh_prompt(rng.choice([16, 40, 70])) for _ in range(4)]
    finished: Counter[str] = Counter()
    submitted = 0
    for _ in range(3000):
        if submitted < 150 and rng.random() < 0.3:
            prompt = rng.choice(shared) + fresh_prompt(rng.randint(1, 60))
            engine.add_request(request(f"r{submitted}", prompt, rng.randint(1, 80)))
            submitted += 1
        if engine.requests and rng.random() < 0.05:
            victim = rng.choice(list(engine.requests))
            finished[victim] += 1 if engine.abort(victim) else 0
        step = engine.step()
        assert step.num_prefill_tokens + step.num_decode_tokens <= 96
        finished.update(o.request_id for o in step.outputs if o.finish_reason)
        check_invariants(engine)
    while engine.has_work():
        finished.update(o.request_id for o in engine.step().outputs if o.finish_reason)
        check_invariants(engine)

    assert submitted == 150 and len(finished) == 150 and set(finished.values()) == {1}
    assert engine.pool.num_free == engine.pool.num_blocks
    assert engine.stats.preemptions > 0 and engine.stats.prefix_cache_hits > 0
    assert sum(engine.stats.finished.values()) == 150
