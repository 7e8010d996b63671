"""Start a balancer's runtime when its server starts, not on its first request.

Until the runtime runs, a balancer sends no heartbeats and answers no peer polls, so
a restarted balancer would look dead to its peers and the controller until some
client happened to call it.  uvicorn (and hypercorn) speak the ASGI lifespan
protocol; daphne does not, so under daphne the start is scheduled on its Twisted
reactor, whose loop is the asyncio loop the application runs on.  A start that
fails (database not migrated yet, say) is logged; the runtime retries on the next
request or refresh.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

from django.conf import settings

from core.errors import ApiError
from routing.asgi_types import Receive, Scope, Send
from routing.runtime import current_runtime, get_runtime

logger = logging.getLogger(__name__)


# Retry delays while the runtime cannot start (e.g. the database is not migrated yet).
FIRST_RETRY_S, MAX_RETRY_S = 0.5, 10.0


async def start_runtime() -> None:
    """Start this process's balancer runtime, retrying with backoff until it runs."""
    if not settings.MERIDIAN_BALANCER:
        return
    delay = FIRST_RETRY_S
    while True:
        try:
            await get_runtime()
        except ApiError as error:
            logger.warning(
                "balancer runtime not started, retrying in %.1fs: %s", delay, error.message
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)
        else:
            # Django, the URLconf and the runtime's own structures are built: move them
            # out of the collector's reach so full collections only walk what requests
            # and the routing structures allocate from here on.
            gc.freeze()
            young_gc_threshold(settings.MERIDIAN_BALANCER_GC_GEN0)
            return


def young_gc_threshold(allocations: int) -> None:
    """Collect the young generation every ``allocations`` allocations, the older ones
    at the interpreter's ratios as before."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(allocations, gen1, gen2)


class LifespanApp:
    """The ``lifespan`` scope: start the runtime at startup, close it at shutdown."""

    def __init__(self) -> None:
        self._start: asyncio.Future[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # In the background: a balancer whose database is not ready yet still
                # starts serving (with 503s) and keeps trying.
                self._start = asyncio.ensure_future(start_runtime())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._start is not None:
                    self._start.cancel()
                runtime = current_runtime()
                if runtime is not None:
                    await runtime.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def start_when_daphne_runs() -> None:
    """Under daphne, schedule ``start_runtime`` for when its reactor starts."""
    if not settings.MERIDIAN_BALANCER or "daphne.server" not in sys.modules:
        return
    from twisted.internet import reactor

    reactor.callWhenRunning(lambda: asyncio.ensure_future(start_runtime()))
