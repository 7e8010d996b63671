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
from core.policies.meridian import MeridianPolicy
from core.topology import ModelSpec
from core.types import RequestDescriptor
from routing.cache_view import Expectation
from routing.kv_events import ReplicaStream
from tests.routing.test_kv_consumer import ENGINE_KEYS, NoSocket, Snapshots, batch, runtime
from tests.support.upstreams import MODEL

pytestmark = pytest.mark.anyio

PROMPT = (11, 12, 13, 14)  # four blocks


async def cached_then_routed(
    build_runtime: Any, params: dict[str, Any] | None = None
) -> tuple[Any, Expectation]:
    """A runtime whose replica ``a`` has confirmed the prompt's blocks, and the
    expectation routing the prompt there took: every block cached.  ``params``: a
    ``meridian`` service's instead of the ``cache_map`` one."""
    if params is None:
        rt = await runtime(build_runtime, Snapshots())
    else:
        rt = await build_runtime(Snapshots(), model=ModelSpec(MODEL, "meridian", params))
        rt.kv.streams["a"] = ReplicaStream("a", "tcp://127.0.0.1:1", socket=NoSocket())
    rt.kv.accept(rt.kv.streams["a"], batch(0, CacheEvent(STORED, PROMPT)))
    rt.kv.flush()
    expected = rt.cache_view.expect("a", request_for(rt))
    assert expected is not None and expected.tokens == len(PROMPT) * block_size(rt)
    return rt, expected


def block_size(rt: Any) -> int:
    return int(rt.cache_view.block_size(MODEL))


def request_for(rt: Any, blocks: tuple[int, ...] = PROMPT) -> RequestDescriptor:
    return RequestDescriptor("r1", MODEL, len(blocks) * block_size(rt) + 1, block_hashes=blocks)


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


# -- a policy whose holdings are its own: the meridian tree fed by the engines' events --

FOLLOWED_TREE = {**ENGINE_KEYS, "tree_from_kv_events": True}


async def test_a_tree_fed_by_events_is_checked_against_the_confirmed_blocks(
    build_runtime: Any,
) -> None:
    """The tree learns paths when it routes them; the check reads the blocks the
    engine's own events confirmed, kept beside the tree for it."""
    rt, expected = await cached_then_routed(build_runtime, FOLLOWED_TREE)
    policy = rt.router.policy(MODEL)
    assert isinstance(policy, MeridianPolicy)
    assert rt.kv.view_map(MODEL) is not None and rt.kv.cache_map_policy(MODEL) is None
    rt.cache_view.observe("a", MODEL, expected, expected.tokens)
    assert judged(rt) == [Comparison.AGREED]


async def test_a_tree_fed_by_events_tells_an_eviction_from_a_wrong_view(
    build_runtime: Any,
) -> None:
    rt, expected = await cached_then_routed(build_runtime, FOLLOWED_TREE)
    rt.kv.accept(rt.kv.streams["a"], batch(1, CacheEvent(REMOVED, PROMPT)))
    rt.cache_view.observe("a", MODEL, expected, reported=0)
    # Blocks the engine never confirmed: nothing expected, the engine found them.
    unseen = rt.cache_view.expect("a", request_for(rt, (21, 22)))
    assert unseen is not None and unseen.tokens == 0
    rt.cache_view.observe("a", MODEL, unseen, reported=2 * block_size(rt))
    assert judged(rt) == [Comparison.EVICTED, Comparison.MISSED]


async def test_a_tree_of_its_own_takes_no_events_and_is_not_checked(
    build_runtime: Any,
) -> None:
    rt = await build_runtime(Snapshots(), model=ModelSpec(MODEL, "meridian", ENGINE_KEYS))
    assert rt.kv.view_map(MODEL) is None
    assert rt.cache_view.expect("a", request_for(rt)) is None
