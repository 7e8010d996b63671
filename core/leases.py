"""In-flight accounting: one lease per dispatched request, released exactly once.

SkyServe's load balancer, LiteLLM's router and Higress's least-request plugin
all shipped in-flight counters that drifted (negative, or stuck high until a
restart) because some exit path, an upstream error, a client disconnect, a
cancellation before streaming started, forgot to decrement or decremented twice.
Here the counter is never touched directly: ``InflightLedger.acquire`` returns a
``Lease`` that increments the target's ``outstanding`` and the ledger total, and
``Lease.release`` undoes both the first time it is called and does nothing
after.  The proxy calls ``release`` from every ``finally`` it has; calling it
again from a second path is harmless by construction.

The ledger is keyed by target id, not by ``TargetState`` object: a topology
refresh may replace a replica's state object while requests to it are still
running, and the next snapshot reads the true count back with ``outstanding``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.types import TargetState

ReleaseHook = Callable[["Lease", bool], None]


@dataclass(eq=False, slots=True)
class Lease:
    """The right to one outstanding slot on ``target`` until released."""

    ledger: InflightLedger
    target: TargetState
    request_id: str
    on_release: ReleaseHook | None = None
    released: bool = field(default=False, init=False)
    ok: bool | None = field(default=None, init=False)

    def release(self, ok: bool) -> bool:
        """Give the slot back; True the first time, False (and no effect) after."""
        if self.released:
            return False
        self.released = True
        self.ok = ok
        self.ledger._return(self)
        if self.on_release is not None:
            self.on_release(self, ok)
        return True


class InflightLedger:
    """Outstanding requests per target and in total for one balancer."""

    def __init__(self) -> None:
        self._by_target: dict[str, int] = {}
        self._total = 0
        self._acquired = 0

    @property
    def total(self) -> int:
        return self._total

    @property
    def acquired(self) -> int:
        """Leases ever acquired (the probe schedule's sign of traffic)."""
        return self._acquired

    def outstanding(self, target_id: str) -> int:
        return self._by_target.get(target_id, 0)

    def by_target(self) -> dict[str, int]:
        return dict(self._by_target)

    def acquire(
        self, target: TargetState, request_id: str, on_release: ReleaseHook | None = None
    ) -> Lease:
        count = self._by_target.get(target.target_id, 0) + 1
        self._by_target[target.target_id] = count
        self._total += 1
        self._acquired += 1
        target.outstanding = count
        return Lease(self, target, request_id, on_release)

    def _return(self, lease: Lease) -> None:
        target_id = lease.target.target_id
        count = self._by_target.get(target_id, 0) - 1
        if count < 0:  # cannot happen with single release; refuse to go negative regardless
            raise AssertionError(f"in-flight count for {target_id} would go negative")
        if count:
            self._by_target[target_id] = count
        else:
            # Bounded state: targets with nothing outstanding take no room.
            self._by_target.pop(target_id, None)
        self._total -= 1
        lease.target.outstanding = count
