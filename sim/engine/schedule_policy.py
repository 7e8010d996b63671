"""The order in which an engine admits its waiting requests.

vLLM schedules its waiting queue first come, first served (``fcfs``, its
default and this emulation's).  SGLang's default, ``--schedule-policy lpm``,
is *longest prefix match*: before each batch it looks every waiting request's
prompt up in its radix cache and admits the one with the most cached tokens
first.  The SkyLB paper's replicas ran SGLang, so ``lpm`` lets the simulator
run the thrashing regime on the engines the paper had.  Why it matters there:
with small caches most turns wait for KV room, and while they wait the blocks
of their history age in the LRU.  First come, first served admits the oldest
turn, whose history is the likeliest to be gone; longest prefix first admits
the turns whose history is still cached and recomputes less (docs/results.md,
*Small caches*).

What this module follows of SGLang's ``SchedulePolicy.calc_priority`` (read,
not copied):

* the sort is by cached prefix tokens, longest first, and stable, so equal
  matches keep their arrival order;
* past ``LPM_MAX_WAITING`` waiting requests it falls back to arrival order
  (SGLang turns the per-request lookups off there to save CPU);
* *in-batch prefix caching*: a request that finds at most
  ``IN_BATCH_CHECK_TOKENS`` cached but shares at least
  ``IN_BATCH_DEPRIORITIZE_TOKENS`` leading tokens with an earlier such waiting
  request goes to the back, so one of them computes the shared prefix and the
  rest find it cached rather than all computing it side by side.

A request preempted by recompute is ranked with the rest (SGLang puts a
retracted request back in its waiting queue; vLLM puts it at the front).

Blocks, not tokens: the emulated cache holds whole blocks, so a match is a
number of blocks times the block size, and "shares the first 32 tokens" is
"has the same hash for the block holding token 32" (block hashes chain, so
equal hashes there mean equal leading tokens; with blocks over 32 tokens, the
whole first block must match).

vLLM's other order, ``--scheduling-policy priority`` (``priority``), serves the
waiting request with the lowest ``(priority, arrival time)`` first, each request's
``priority`` given by its client (0 by default), and when a running request needs a
block that is not free it preempts the running request with the highest
``(priority, arrival time)`` rather than the newest (vLLM V1's
``Scheduler.schedule``, read, not copied); an engine on ``fcfs`` takes a
``priority`` and ignores it, as vLLM 0.32 does.  A balancer that knows where a
prompt is cached can mark the cold copies into a full cache
(``core.policies.meridian``): the engine then admits a turn whose history it still
holds before the cold prompts that arrived earlier, much as ``lpm`` does, and
preempts a cold one first.

Pure: the engine passes what its cache says of each request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")

LPM_MAX_WAITING = 128
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


class SchedulePolicy(StrEnum):
    FCFS = "fcfs"  # vLLM
    LPM = "lpm"  # SGLang's default
    PRIORITY = "priority"  # vLLM's --scheduling-policy priority


def shared_prefix_block(block_size: int) -> int:
    """Index of the block whose hash identifies a request's first
    ``IN_BATCH_DEPRIORITIZE_TOKENS`` tokens (and the rest of that block)."""
    return max(1, math.ceil(IN_BATCH_DEPRIORITIZE_TOKENS / block_size)) - 1


def priority_key(priority: int, arrival_time: float) -> tuple[int, float]:
    """vLLM's order under ``priority``: lower priority values first, then earlier
    arrivals; the running request with the largest key is the one preempted."""
    return priority, arrival_time


def longest_prefix_first(
    waiting: Sequence[T],
    cached_tokens: Callable[[T], int],
    leading_key: Callable[[T], int | None],
) -> list[T]:
    """``waiting`` (in arrival order) in the order SGLang's ``lpm`` admits it.

    ``cached_tokens``: what the cache holds of the request's prompt now.
    ``leading_key``: an identity of its first ``IN_BATCH_DEPRIORITIZE_TOKENS``
    tokens (``shared_prefix_block``'s block hash), None when its prompt is shorter.
    """
    if len(waiting) > LPM_MAX_WAITING:
        return list(waiting)
    seen: set[int] = set()
    ranked: list[tuple[float, int, T]] = []
    for position, request in enumerate(waiting):
        cached = cached_tokens(request)
        rank = float(-cached)
        if cached <= IN_BATCH_CHECK_TOKENS and (key := leading_key(request)) is not None:
            if key in seen:
                rank = math.inf  # an earlier waiting request computes that prefix first
            else:
                seen.add(key)
        ranked.append((rank, position, request))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [request for _, _, request in ranked]
