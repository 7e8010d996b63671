"""The hit-rate mismatch detector's glue (``routing.cache_view``) in process: an
expectation taken when a request is routed, judged against what the engine reported,
with the engine's removals that arrive around the answer.

A real ``BalancerRuntime`` serving a ``cache_map`` model in ``vllm`` block identity
(the events' hashes are the keys); messages are handed to ``KVEventConsumer.accept``
as the socket reader would, and the event batch runs as its loop would
(``apply_kv_events``).
"""

from __future__ import annotations

from typing import Any

import pytest

from core.cache_view_check import Comparison
from core.kv_events import REMOVED, STORED, CacheEvent
from core.types import RequestDescriptor
from routing.cache_view import Expectation
from tests.routing.test_kv_consumer import Snapshots, batch, runtime
from tests.support.upstreams import MODEL

pytestmark = pytest.mark.anyio

PROMPT = (11, 12, 13, 14)  # four blocks


async def cached_then_routed(build_runtime: Any) -> tuple[Any, Expectation]:
    """A runtime whose replica ``a`` has confirmed the prompt's blocks, and the
    expectation routing the prompt there took: every block cached."""
    rt = await runtime(build_runtime, Snapshots())
    rt.kv.accept(rt.kv.streams["a"], batch(0, CacheEvent(STORED, PROMPT)))
    rt.kv.flush()
    size = rt.cache_view.block_size(MODEL)
    request = RequestDescriptor("r1", MODEL, len(PROMPT) * size + 1, block_hashes=PROMPT)
    expected = rt.cache_view.expect("a", request)
    assert expected is not None and expected.tokens == len(PROMPT) * size
    return rt, expected


def judged(rt: Any) -> list[Comparison]:
    check = rt.cache_view.detector.check("a")
    return list(check.window) if check is not None else []


async def test_an_answer_that_agrees_is_judged_at_once(build_runtime: Any) -> None:
    rt, expected = await cached_then_routed(build_runtime)
    rt.cache_view.observe("a", MODEL, expected, expected.tokens)
    assert judged(rt) == [Comparison.AGREED]


async def test_a_removal_received_but_not_yet_applied_explains_the_shortfall(
    build_runtime: Any,
) -> None:
    """The engine evicted the prefix and then served the request: its removal came
    before the answer, but waits in the consumer's queue for the next batch."""
    rt, expected = await cached_then_routed(build_runtime)
    rt.kv.accept(rt.kv.streams["a"], batch(1, CacheEvent(REMOVED, PROMPT)))
    rt.cache_view.observe("a", MODEL, expected, reported=0)
    assert judged(rt) == [Comparison.EVICTED]


async def test_a_shortfall_waits_a_whole_batch_interval_for_its_removal(
    build_runtime: Any,
) -> None:
    """The removal is read after the answer (the consumer reads its socket on the same
    loop): the shortfall is judged only after the batch that follows the next one."""
    rt, expected = await cached_then_routed(build_runtime)
    rt.cache_view.observe("a", MODEL, expected, reported=0)
    assert judged(rt) == []
    rt.kv.accept(rt.kv.streams["a"], batch(1, CacheEvent(REMOVED, PROMPT)))
    await rt.apply_kv_events()
    assert judged(rt) == []  # held through one whole interval
    await rt.apply_kv_events()
    assert judged(rt) == [Comparison.EVICTED]


async def test_a_shortfall_no_removal_explains_is_a_miss(build_runtime: Any) -> None:
    rt, expected = await cached_then_routed(build_runtime)
    rt.cache_view.observe("a", MODEL, expected, reported=0)
    await rt.apply_kv_events()
    await rt.apply_kv_events()
    assert judged(rt) == [Comparison.MISSED]
    assert rt.cache_view.detector.check("a").expected_tokens == expected.tokens


async def test_a_held_report_of_a_replica_gone_is_dropped(build_runtime: Any) -> None:
    rt, expected = await cached_then_routed(build_runtime)
    rt.cache_view.observe("a", MODEL, expected, reported=0)
    rt.cache_view.retain([])
    await rt.apply_kv_events()
    await rt.apply_kv_events()
    assert rt.cache_view.detector.check("a") is None
