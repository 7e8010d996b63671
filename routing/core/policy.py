"""The one interface every routing policy implements.

A policy picks a target for a request among candidates the balancer already
filtered to healthy, routable ones, and hears about completions so stateful
policies (prefix tries, cache maps) can learn.  Policies hold no globals: each
balancer builds its own instance from the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from routing.core.types import RequestDescriptor, TargetState


class Policy(Protocol):
    name: str

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        """The target for ``request``, or None when no candidate should take it."""
        ...

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        """Called once per routed request when it finishes, fails or is cancelled."""
        ...
