"""A replica's KV usage over its next L decode iterations (PreServe §4.3.1).

PreServe keeps, per instance, a *load-look-ahead map*: for each of the next L
iterations, the KV tokens the running requests will hold.  A request with P
prompt tokens and D predicted output tokens holds P + i tokens at its i-th
decode iteration, for i in [0, D).  Two corrections keep the map honest when the
prediction is wrong:

* **early finish** (actual < D): the request's remaining iterations are taken
  out of the map at once (``finish``);
* **overrun** (still running after D): a *virtual extension* of ``0.2 * D``
  iterations is added, again each time the request outlives it, until it ends
  (``AnticipatorConfig.extension``).

Rather than shifting a stored array each iteration, the map is rebuilt on
demand from the running requests (``lookahead``: one pass over the requests
and one over the horizon, with difference arrays for each request's ramp), and
cached until something changes.  The two corrections are then exact by
construction: a finished request is gone, an overrunning one carries its
extended budget.

Iterations come from the driver: ``progress`` sets a request's decoded count
when it is known (the simulator knows it), ``advance`` moves every running
request on by whole iterations, and ``IterationClock`` turns the balancer's
elapsed seconds into those iterations at the replica's learned seconds per
iteration.  A request is counted from its admission, before its prefill ends
(PreServe updates the map after prefill): the balancer does not see prefill
end, and the prompt's KV is allocated when the prefill starts anyway.

``cached_tokens`` is the part of the prompt whose KV the replica holds already
for other running requests (shared blocks are held once); pass 0 when unknown,
which counts the whole prompt, as the paper does.

``peak_with`` answers the router's question (§4.3.3): the peak over the
horizon if a new request were added, without adding it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AnticipatorConfig:
    """``horizon``: L, iterations looked ahead (PreServe: 100).  ``extension``: the
    virtual extension granted to a request that outlives its prediction, as a
    fraction of the prediction (PreServe: 0.2).  ``max_running``: bound on the
    requests tracked; the oldest admitted is forgotten beyond it (a driver that
    lost a completion must not grow the map forever).  ``stale_after``: a request
    that has decoded this many iterations is dropped as lost: longer than any
    model's context, so only a completion the driver never reported gets there."""

    horizon: int = 100
    extension: float = 0.2
    max_running: int = 4096
    stale_after: int = 1 << 17

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ValueError("horizon must be at least 1")
        if self.extension <= 0:
            raise ValueError("extension must be positive")
        if self.max_running < 1:
            raise ValueError("max_running must be at least 1")


@dataclass(slots=True)
class _Running:
    footprint: int  # prompt tokens not already held for another request
    predicted: int  # D, whole iterations
    budget: int  # D plus the virtual extensions granted so far
    generated: int = 0
    extensions: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished request's prediction against what it did (``actual``: None when
    the request failed or was cancelled, so its length says nothing)."""

    predicted: int
    actual: int | None
    extensions: int

    @property
    def error(self) -> int | None:
        """Actual minus predicted: positive when it ran past the prediction."""
        return None if self.actual is None else self.actual - self.predicted


class LoadAnticipator:
    """The look-ahead map of one replica."""

    def __init__(self, config: AnticipatorConfig | None = None) -> None:
        self.config = config or AnticipatorConfig()
        self._running: dict[str, _Running] = {}
        self._cached: tuple[int, list[int]] | None = None  # (horizon, map)

    # -- events ------------------------------------------------------------------------

    def admit(
        self, request_id: str, prompt_tokens: int, cached_tokens: int, predicted_output: float
    ) -> None:
        """A request starts on this replica, expected to generate ``predicted_output``."""
        predicted = max(1, math.ceil(predicted_output))
        footprint = max(0, prompt_tokens - max(0, cached_tokens))
        self._running.pop(request_id, None)
        self._running[request_id] = _Running(footprint, predicted, predicted)
        while len(self._running) > self.config.max_running:
            del self._running[next(iter(self._running))]
        self._cached = None

    def progress(self, request_id: str, generated_tokens: int) -> None:
        """The request has decoded ``generated_tokens`` so far (a known count)."""
        running = self._running.get(request_id)
        if running is None or generated_tokens <= running.generated:
            return
        running.generated = generated_tokens
        self._extend(running)
        self._cached = None

    def advance(self, iterations: int) -> None:
        """``iterations`` decode iterations passed: each running request decoded one
        token per iteration."""
        if iterations <= 0 or not self._running:
            return
        for running in self._running.values():
            running.generated += iterations
            self._extend(running)
        stale = [rid for rid, r in self._running.items() if r.generated >= self.config.stale_after]
        for request_id in stale:
            del self._running[request_id]
        self._cached = None

    def finish(self, request_id: str, actual_output_tokens: int | None = None) -> Outcome | None:
        """The request ended; what is left of it leaves the map (early finish)."""
        running = self._running.pop(request_id, None)
        if running is None:
            return None
        self._cached = None
        return Outcome(running.predicted, actual_output_tokens, running.extensions)

    # -- the map -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._running

    def kv_tokens(self) -> int:
        """KV tokens the running requests hold now."""
        return sum(r.footprint + r.generated for r in self._running.values())

    def lookahead(self, horizon: int | None = None) -> list[int]:
        """KV tokens held at each of the next ``horizon`` iterations (default L)."""
        length = horizon or self.config.horizon
        if self._cached is None or self._cached[0] != length:
            self._cached = (length, self._build(length))
        return list(self._cached[1])

    def peak(self, horizon: int | None = None) -> int:
        return max(self.lookahead(horizon), default=0)

    def mean(self, horizon: int | None = None) -> float:
        ahead = self.lookahead(horizon)
        return sum(ahead) / len(ahead) if ahead else 0.0

    def peak_with(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        predicted_output: float,
        horizon: int | None = None,
    ) -> int:
        """The peak over the horizon if this request were admitted now (§4.3.3's
        "virtually adds request r"); the map itself does not change."""
        ahead = self.lookahead(horizon)
        footprint = max(0, prompt_tokens - max(0, cached_tokens))
        span = min(len(ahead), max(1, math.ceil(predicted_output)))
        with_it = max((ahead[i] + footprint + i for i in range(span)), default=0)
        return max(with_it, max(ahead[span:], default=0))

    # -- internals -------------------------------------------------------------------------

    def _extend(self, running: _Running) -> None:
        """Grant virtual extensions until the budget lies ahead of the request again."""
        if running.generated < running.budget:
            return
        step = max(1, math.ceil(self.config.extension * running.predicted))
        missing = running.generated - running.budget + 1
        grants = math.ceil(missing / step)
        running.budget += grants * step
        running.extensions += grants

    def _build(self, length: int) -> list[int]:
        # Each request adds the ramp (footprint + generated + i) on [0, remaining):
        # a constant and a slope of 1, both switched off at ``remaining``.
        constant = [0] * (length + 1)
        slope = [0] * (length + 1)
        for running in self._running.values():
            until = min(length, running.budget - running.generated)
            if until <= 0:
                continue
            base = running.footprint + running.generated
            constant[0] += base
            constant[until] -= base
            slope[0] += 1
            slope[until] -= 1
        ahead, level, rising = [], 0, 0
        for i in range(length):
            level += constant[i]
            rising += slope[i]
            ahead.append(level + rising * i)
        return ahead


class IterationClock:
    """Turns a replica's elapsed seconds into whole decode iterations.

    ``seconds_per_iteration`` starts at the engine profile's inter-token latency
    and follows what completed requests show (``learn``: an exponentially
    weighted mean).  The fraction of an iteration left over is carried to the
    next ``elapsed`` so that frequent ticks do not round time away.
    """

    def __init__(self, seconds_per_iteration: float, *, weight: float = 0.2) -> None:
        if seconds_per_iteration <= 0:
            raise ValueError("seconds_per_iteration must be positive")
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.seconds_per_iteration = seconds_per_iteration
        self.weight = weight
        self._last: float | None = None
        self._carry = 0.0

    def elapsed(self, now: float) -> int:
        """Whole iterations since the previous call (0 on the first)."""
        if self._last is None or now <= self._last:
            self._last = now if self._last is None else self._last
            return 0
        iterations = (now - self._last) / self.seconds_per_iteration + self._carry
        self._last = now
        whole = math.floor(iterations)
        self._carry = iterations - whole
        return whole

    def learn(self, seconds: float, iterations: int) -> None:
        """A request decoded ``iterations`` tokens in ``seconds`` (after its first)."""
        if iterations < 1 or seconds <= 0:
            return
        observed = seconds / iterations
        self.seconds_per_iteration += self.weight * (observed - self.seconds_per_iteration)
