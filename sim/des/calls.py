"""A request on its way through simulated balancers: the simulator's ``ProxyCall``.

Each hop (client → balancer, balancer → peer balancer, balancer → replica) gets
its own ``SimCall`` whose callbacks the next hop invokes; a hop adds its one-way
latency on the way in and on the way back, so a forward pays the inter-region
RTT once each way (first token and completion both arrive one RTT later), as
``routing.transport.DemoLatency`` charges it in demo mode and as the network
does in production.  ``Journey`` is shared by every hop of one client request
and collects what the report needs (queue waits, where it was served).  What
the dispatch core keeps per request (targets tried, attempts) is its
``Ticket``, whose handle a ``SimCall`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.types import RequestDescriptor

STATUS_OK = 200
STATUS_BAD_REQUEST = 400


@dataclass(slots=True)
class Journey:
    """What happened to one client request across all its hops."""

    queue_wait: float = 0.0
    forwarded: bool = False
    replica: str = ""
    served_region: str = ""
    # When the engine that answered first scheduled it: where its prefix was looked
    # up, for the oracle bound at the engines' own start times (sim.des.oracle).
    engine_started_at: float | None = None


@dataclass(frozen=True, slots=True)
class CallResult:
    """How a request ended, as the OpenAI response's status and ``usage`` say."""

    ok: bool
    status: int
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tokens: tuple[int, ...] = ()


def refused(status: int, error: str) -> CallResult:
    return CallResult(ok=False, status=status, error=error)


@dataclass(slots=True)
class SimCall:
    """One hop's view of a request: what to send and whom to answer."""

    descriptor: RequestDescriptor
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    journey: Journey
    on_first: Callable[[], None]
    on_done: Callable[[CallResult], None]
