"""This process's balancer runtime, as the views reach it.

Every process loads the same URLconf: balancers, the console (which answers the
``/v1`` routes with 503 ``not_a_balancer``) and each ``manage.py`` command, for its
system checks.  Only a balancer builds a runtime, so the views reach it through these
two functions and ``routing.runtime`` (the dispatcher, httpx, Redis, ZeroMQ) is
imported only in a process whose ``MERIDIAN_BALANCER`` names one.  There it is
already loaded at start-up (``routing.lifespan``), so the import below costs a
dictionary lookup per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from core import errors

if TYPE_CHECKING:
    from routing.runtime import BalancerRuntime


async def get_runtime() -> BalancerRuntime:
    """``routing.runtime.get_runtime``: this process's runtime, started on first use.

    Raises ``ApiError`` (503) in a process that plays no balancer, or while the
    topology cannot be loaded.
    """
    if not settings.MERIDIAN_BALANCER:
        raise errors.not_a_balancer()
    from routing import runtime

    return await runtime.get_runtime()


def current_runtime() -> BalancerRuntime | None:
    """The runtime if this process is a balancer and has started one (no side effects)."""
    if not settings.MERIDIAN_BALANCER:
        return None
    from routing import runtime

    return runtime.current_runtime()
