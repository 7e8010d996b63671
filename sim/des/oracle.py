"""Oracle bounds on a run's KV hit rate: what placement alone could have reached (pure).

Both bounds replay the run's own served requests, as block keys, through one
imagined cache and count prefix hits the way the engine does (the longest run of
a prompt's leading blocks that is cached, at most ``(prompt_tokens - 1) //
block_size`` blocks: the last token is always recomputed for its logits):

* ``infinite``: one replica with an infinite cache.  A prompt hits every leading
  block any earlier request held; only routing-independent misses (first
  sight of a prefix) remain.  The ceiling of any fleet, any placement.
* ``pooled``: the fleet's real KV capacity (replicas x blocks each) as one LRU
  cache, as if placement were free: every request lands where its prefix is and
  no block is held twice.  It keeps the engines' eviction order (blocks are
  touched when a request arrives and again, tail first, when it finishes, as
  vLLM frees them), and it is generous where the engines are not: blocks of
  running requests are never pinned, and a request's blocks count as cached
  the moment it is sent.  LRU is not Belady-optimal, so a policy could in
  principle beat this bound by a little; in practice it is the ceiling, and
  ``hit / bound`` is how close a policy came to perfect placement.
* ``pooled_at_start``: the same pooled LRU, each request looking its prefix up
  when an engine first scheduled it, as the engine does, instead of when it was
  sent.  Under load a request waits (in a queue, at a replica) while others run,
  and the blocks its previous turn left may be evicted in the meantime: no
  placement keeps every waiting conversation's blocks when they outgrow the
  fleet's memory.  It holds the run's own waits fixed, so it is not a bound over
  every schedule (``pooled`` is); ``pooled - pooled_at_start`` is what waiting
  cost the cache, and ``hit / pooled_at_start`` is how close placement came
  given the waits the run had.
* ``reachable``: the same LRU, one per balancer: the replicas a balancer owns
  pooled as its cache, fed only the requests its clients send it.  What the
  deployment's balancers can reach without forwarding: with one balancer owning
  every replica it equals ``pooled``; with a balancer per region it leaves out
  reuse between regions (a prefix first sent in one region and again in
  another), which only a forward, or one balancer for the world, can collect.

Only served requests take part: a rejected or dropped request was never
computed, so its blocks must not fill (or, in the LRU, flush) the imagined
cache, and it reports no cached tokens to compare with.  Each request is
inserted at its send time (its prompt's blocks) and at its
completion (the blocks its reply completed), so a follow-up turn that quotes the
reply hits them, as it does on the engine.  Events at one instant apply
completions first.  Cost: O(total prompt blocks), one dict operation each.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

FILL, LOOKUP = 0, 1  # at one instant a completion's blocks are in before the next lookup


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One request as the oracle sees it."""

    sent_at: float
    done_at: float | None
    prompt_keys: tuple[int, ...]  # the prompt's full blocks, chained
    reply_keys: tuple[int, ...]  # blocks completed by the reply, continuing the chain
    max_hit_blocks: int  # the engine's cap: (prompt_tokens - 1) // block_size
    started_at: float | None = None  # when an engine first scheduled it (None: unknown)

    @property
    def looked_up_at(self) -> float:
        """When the engine looked its prefix up (its send time when unknown)."""
        return self.sent_at if self.started_at is None else self.started_at


@dataclass(frozen=True, slots=True)
class Bounds:
    """Hit rates (cached prompt tokens over the served requests' prompt tokens)."""

    infinite: float
    pooled: float
    reachable: float
    pooled_at_start: float


@dataclass(frozen=True, slots=True)
class BalancerPool:
    """One balancer's share for the ``reachable`` bound: its clients' requests and the
    KV capacity of the replicas it owns."""

    uses: Sequence[CacheUse]
    capacity_blocks: int


def max_hit_blocks(prompt_tokens: int, block_size: int) -> int:
    return max(prompt_tokens - 1, 0) // block_size


def _timeline(uses: Sequence[CacheUse], at_start: bool) -> list[tuple[float, int, int]]:
    """(time, kind, index) in the order the oracle applies them: each lookup when the
    request was sent, or with ``at_start`` when an engine first scheduled it."""
    events = [
        (use.looked_up_at if at_start else use.sent_at, LOOKUP, i) for i, use in enumerate(uses)
    ]
    events += [(use.done_at, FILL, i) for i, use in enumerate(uses) if use.done_at is not None]
    events.sort()
    return events


def leading_hits(held: Container[int], keys: Sequence[int], limit: int) -> int:
    """How many of the first ``limit`` keys are held, counting until the first miss
    (an engine reuses only a cached run of leading blocks)."""
    hits = 0
    for key in keys[:limit]:
        if key not in held:
            break
        hits += 1
    return hits


class _InfiniteCache:
    def __init__(self) -> None:
        self.held: set[int] = set()

    def lookup(self, keys: Sequence[int], limit: int) -> int:
        return leading_hits(self.held, keys, limit)

    def touch(self, keys: Iterable[int]) -> None:
        self.held.update(keys)


class _LruCache:
    """Most recent at the end; ``touch`` takes keys tail first so heads stay longest."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[int, None] = OrderedDict()

    def lookup(self, keys: Sequence[int], limit: int) -> int:
        return leading_hits(self.held, keys, limit)

    def touch(self, keys: Iterable[int]) -> None:
        held = self.held
        for key in reversed(list(keys)):
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity:
            held.popitem(last=False)


def prefix_hit_blocks(
    uses: Sequence[CacheUse], capacity_blocks: int | None, *, at_start: bool = False
) -> int:
    """Blocks the requests would hit in one cache of ``capacity_blocks`` (None:
    infinite), replayed in send order (``at_start``: in the engines' start order)."""
    cache = _InfiniteCache() if capacity_blocks is None else _LruCache(capacity_blocks)
    hits = 0
    for _, kind, index in _timeline(uses, at_start):
        use = uses[index]
        if kind == FILL:
            cache.touch((*use.prompt_keys, *use.reply_keys))
            continue
        hits += cache.lookup(use.prompt_keys, use.max_hit_blocks)
        cache.touch(use.prompt_keys)
    return hits


def hit_rate_bounds(
    uses: Sequence[CacheUse],
    prompt_tokens: int,
    *,
    block_size: int,
    capacity_blocks: int,
    balancers: Sequence[BalancerPool] = (),
) -> Bounds:
    """The bounds as hit rates over ``prompt_tokens`` (the requests' prompts).

    ``balancers`` splits ``uses`` by the balancer that owns each; none given means
    one balancer owning the whole fleet (``reachable`` is then ``pooled``)."""
    if prompt_tokens <= 0:
        return Bounds(0.0, 0.0, 0.0, 0.0)
    pooled_blocks = prefix_hit_blocks(uses, capacity_blocks)
    reachable_blocks = (
        sum(prefix_hit_blocks(pool.uses, pool.capacity_blocks) for pool in balancers)
        if balancers
        else pooled_blocks
    )
    return Bounds(
        prefix_hit_blocks(uses, None) * block_size / prompt_tokens,
        pooled_blocks * block_size / prompt_tokens,
        reachable_blocks * block_size / prompt_tokens,
        prefix_hit_blocks(uses, capacity_blocks, at_start=True) * block_size / prompt_tokens,
    )


def share_of_bound(hit_rate: float, bound: float) -> float | None:
    """``hit / bound``; None when the bound is 0 (nothing was reusable)."""
    return hit_rate / bound if bound > 0 else None
