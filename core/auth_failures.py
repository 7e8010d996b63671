"""Per-source hold-down after failed API-key attempts.

A balancer's port is public, so a client guessing keys must not get unlimited
tries.  Each source (the connecting address; never a header the client writes) may
fail ``max_failures`` times within ``window_s`` seconds; after that every request
from it is answered 429 with ``Retry-After`` until the window that began with its
first failure ends, right key or not.  The table holds at most ``max_sources``
entries: expired ones go first, then the oldest, so a flood of addresses costs
bounded memory (and at worst forgets a guesser early).

Pure: the caller passes the time (``time.monotonic()`` in the balancer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Window:
    started: float
    failures: int


@dataclass
class AuthFailureLimiter:
    max_failures: int
    window_s: float
    max_sources: int = 65536
    _windows: dict[str, _Window] = field(default_factory=dict)

    def retry_after(self, source: str, now: float) -> int | None:
        """Whole seconds ``source`` must wait, or None while it may try."""
        window = self._windows.get(source)
        if window is None or now - window.started >= self.window_s:
            return None
        if window.failures < self.max_failures:
            return None
        return max(1, math.ceil(window.started + self.window_s - now))

    def record_failure(self, source: str, now: float) -> None:
        window = self._windows.get(source)
        if window is None or now - window.started >= self.window_s:
            self._windows.pop(source, None)
            self._make_room(now)
            self._windows[source] = _Window(now, 1)
        else:
            window.failures += 1

    def __len__(self) -> int:
        return len(self._windows)

    def _make_room(self, now: float) -> None:
        if len(self._windows) < self.max_sources:
            return
        expired = [s for s, w in self._windows.items() if now - w.started >= self.window_s]
        for source in expired:
            del self._windows[source]
        while len(self._windows) >= self.max_sources:
            del self._windows[next(iter(self._windows))]  # the oldest window
