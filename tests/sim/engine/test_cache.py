"""The engine's prefix cache: hits, LRU eviction, KV events, blocking on a full cache."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from core.block_identity import BlockIdentityMode, BlockScheme, HashAlgo, VllmHashSpec
from sim.engine import AllBlocksCleared, BlockRemoved, BlockStored, Engine
from tests.support.engine import fresh_prompt, request, run_to_completion


def block_hashes(tokens: list[int], extra: str = "") -> list[int]:
    """vLLM's block hashes of ``tokens`` (default seed and algorithm, 16-token blocks)."""
    return BlockScheme(BlockIdentityMode.VLLM, block_size=16).keys(tokens, extra)


def serve_one(engine: Engine, request_id: str, prompt: list[int], max_tokens: int = 1) -> int:
    """Run one request alone to completion; return its cached-token count."""
    engine.add_request(request(request_id, prompt, max_tokens, ignore_eos=True))
    outputs = [out for result in run_to_completion(engine) for out in result.outputs]
    assert outputs[-1].finish_reason == "length"
    return outputs[-1].cached_tokens


def test_repeated_prefix_is_served_from_cache(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    shared = fresh_prompt(100)
    assert serve_one(engine, "first", shared) == 0
    # A second request sharing the first 100 tokens reuses their 6 full blocks.
    assert serve_one(engine, "second", [*shared, *fresh_prompt(20)]) == 96
    assert engine.stats.prefix_cache_queries == 100 + 120
    assert engine.stats.prefix_cache_hits == 96


def test_a_prefix_scheduled_in_the_same_step_is_found_cached(
    make_engine: Callable[..., Engine],
) -> None:
    # vLLM caches a request's blocks as it schedules them (``allocate_slots``), before
    # the step runs: a request scheduled after it in the same step finds them.
    engine = make_engine()
    shared = fresh_prompt(100)
    engine.add_request(request("first", [*shared, *fresh_prompt(20)], 1, ignore_eos=True))
    engine.add_request(request("second", [*shared, *fresh_prompt(20)], 1, ignore_eos=True))
    step = engine.step()
    assert step.num_prefill_tokens == 120 + 120 - 96  # one step for both: the second prefills 24
    cached = {out.request_id: out.cached_tokens for out in step.outputs}
    assert cached == {"first": 0, "second": 96}
    assert engine.stats.prefix_cache_hits == 96


def test_a_prompt_in_chunks_is_cached_chunk_by_chunk_as_scheduled(
    make_engine: Callable[..., Engine],
) -> None:
    # A prompt longer than a step's budget is cached a chunk at a time, as each chunk
    # is scheduled: a request sharing it that arrives mid-prefill and is scheduled in
    # the step of the last chunk finds that chunk too.
    engine = make_engine(max_num_batched_tokens=64)
    shared = fresh_prompt(96)
    engine.add_request(request("long", shared, 1, ignore_eos=True))
    engine.step()  # 64 of its 96 tokens: 4 blocks
    engine.add_request(request("late", [*shared, *fresh_prompt(4)], 1, ignore_eos=True))
    step = engine.step()  # the last 32 tokens (blocks 5 and 6), then the late request
    cached = {out.request_id: out.cached_tokens for out in step.outputs}
    assert cached == {"long": 0, "late": 96}


def test_fully_cached_prompt_still_recomputes_its_last_block(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    prompt = fresh_prompt(64)
    serve_one(engine, "first", prompt)
    # vLLM caps the hit at num_tokens - 1: the model must run on at least one token.
    assert serve_one(engine, "again", prompt) == 48


def test_least_recently_used_blocks_are_evicted_first(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(num_blocks=10)
    prompt_a, prompt_b = fresh_prompt(40), fresh_prompt(40)
    serve_one(engine, "a", prompt_a)
    serve_one(engine, "b", prompt_b)
    assert serve_one(engine, "a-again", prompt_a) == 32  # A is now more recent than B
    engine.events.drain()

    serve_one(engine, "big", fresh_prompt(128))  # needs 8 of the 10 blocks

    removed = [
        h for e in engine.events.drain() if isinstance(e, BlockRemoved) for h in e.block_hashes
    ]
    # Only B's blocks go, tail first: a request frees its blocks in reverse order.
    assert removed == block_hashes(prompt_b)[::-1]
    assert serve_one(engine, "a-third", prompt_a) == 32
    assert serve_one(engine, "b-again", prompt_b) == 0


def test_block_stored_events_chain_prompt_and_generated_blocks(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    prompt = fresh_prompt(40)
    engine.add_request(request("r", prompt, 30, ignore_eos=True))
    run_to_completion(engine)

    stored = [e for e in engine.events.drain() if isinstance(e, BlockStored)]
    prompt_hashes = block_hashes(prompt)
    assert stored[0].block_hashes == prompt_hashes
    assert stored[0].parent_block_hash is None
    assert stored[0].token_ids == prompt[:32]
    assert stored[0].block_size == 16
    # 40 prompt + 30 generated tokens = 4 full blocks; the later ones chain on the prompt's.
    later = [h for e in stored[1:] for h in e.block_hashes]
    assert len(later) == 2
    assert stored[1].parent_block_hash == prompt_hashes[-1]


def test_reset_prefix_cache_clears_everything(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    prompt = fresh_prompt(48)
    serve_one(engine, "r", prompt)
    assert engine.reset_prefix_cache()
    assert isinstance(engine.events.drain()[-1], AllBlocksCleared)
    assert serve_one(engine, "r2", prompt) == 0


def test_requests_wait_while_the_cache_is_full_and_run_once_blocks_free(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(num_blocks=8)
    engine.add_request(request("big", fresh_prompt(80), 20, ignore_eos=True))  # 5..7 blocks
    engine.add_request(request("next", fresh_prompt(60), 5, ignore_eos=True))  # needs 4
    first = engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    assert engine.kv_usage == pytest.approx(5 / 8)

    finished: list[str] = []
    while engine.has_work():
        result = engine.step()
        finished += [o.request_id for o in result.outputs if o.finish_reason]
        if "big" not in finished:
            assert engine.num_waiting == 1, "the second request ran before blocks were freed"
    assert finished == ["big", "next"]
    assert engine.stats.prefix_cache_queries == 80 + 60  # a waiting request is queried once
    assert first.outputs[0].request_id == "big"
    assert engine.kv_usage == 0.0


def test_lora_requests_hash_apart_from_the_base_model(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    prompt = fresh_prompt(48)
    serve_one(engine, "base", prompt)
    engine.events.drain()
    engine.add_request(request("lora", prompt, 1, ignore_eos=True, lora_name="sql", lora_id=3))
    outputs = [o for result in run_to_completion(engine) for o in result.outputs]
    assert outputs[-1].cached_tokens == 0  # another adapter's KV is not reusable
    stored = [e for e in engine.events.drain() if isinstance(e, BlockStored)]
    assert stored[0].lora_id == 3
    assert stored[0].block_hashes == block_hashes(prompt, extra="sql")


def test_the_block_size_and_hash_algorithm_are_the_engines_settings(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(block_size=32, hash_algo=HashAlgo.SHA256_CBOR, hash_seed="42")
    prompt = fresh_prompt(70)
    serve_one(engine, "r", prompt)
    stored = [e for e in engine.events.drain() if isinstance(e, BlockStored)]
    scheme = BlockScheme(
        BlockIdentityMode.VLLM, block_size=32, vllm=VllmHashSpec(HashAlgo.SHA256_CBOR, "42")
    )
    assert stored[0].block_hashes == scheme.keys(prompt)
    assert stored[0].block_size == 32 and len(stored[0].token_ids) == 64
    # Every cached block is re-described by a one-block store, chained to its parent.
    first, second = scheme.keys(prompt)
    assert engine.pool.stores[second] == BlockStored([second], first, prompt[32:64], 32)
