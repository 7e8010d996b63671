"""PreServe's proactive instance scaler (§4.3.2): how many replicas, window by window.

Two tiers, each correcting the other's blind spot:

* **At each window's start** N comes from the workload forecast of the *next* window
  and the profiled per-instance capacity (``InstanceCapacity.instances``: PreServe
  Algorithm 2).  A larger N launches the difference at once, a window ahead of the
  load, which covers the cold start.  A smaller N scales down, and that is the
  window's one scale-down (below).
* **Within the window**, from each ready replica's load-look-ahead map
  (``core.load_anticipator``): a replica is *potentially overloaded* when its
  anticipated KV usage exceeds ``overload_usage`` (95 %) of its KV capacity in more
  than ``overload_share`` (10 %) of the next L iterations, and each one asks for one
  more replica ("one potentially overloaded instance, one additional instance").  The
  target becomes ``ready + overloaded``, never less than it was: an overloaded replica
  whose helper is still cold-starting does not ask twice.
* **Scale-down is conservative**: only when every ready replica's peak anticipated
  usage stays below ``underload_usage`` (PreServe's T_u, 30 %) throughout the next L
  iterations, and at most once per window (thrashing).  It keeps
  ``ceil(sum of peak usages / T_u)`` replicas: the fleet's peak, packed no fuller
  than T_u.  The replicas to remove are isolated from routing first and drained by
  the reconcile step (drain before scale-down); this module only says how many.

``reactive`` is the request-rate autoscaler's N for the same beat: the scaler never
goes below it (proactive + reactive, the comparison ``simulate_scaling`` makes).  The
state is plain data; ``now`` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workers.scaling.workload_forecast import InstanceCapacity


@dataclass(frozen=True)
class InstanceScalerConfig:
    window_s: float = 600.0
    kv_capacity_tokens: int = 65_536  # per replica: the engine's KV cache, in tokens
    overload_usage: float = 0.95
    overload_share: float = 0.10
    underload_usage: float = 0.30
    min_replicas: int = 1
    max_replicas: int = 16

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.kv_capacity_tokens < 1:
            raise ValueError("window_s and kv_capacity_tokens must be positive")
        for name in ("overload_usage", "overload_share", "underload_usage"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in (0, 1]")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 0 <= min_replicas <= max_replicas")


@dataclass(frozen=True)
class InstanceScalerState:
    n_target: int
    window: int | None = None  # the window whose start was handled
    scaled_down_in: int | None = None  # the window of the last scale-down

    def to_dict(self) -> dict[str, object]:
        return {
            "n_target": self.n_target,
            "window": self.window,
            "scaled_down_in": self.scaled_down_in,
        }

    @classmethod
    def from_dict(cls, data: object, default_target: int) -> InstanceScalerState:
        if not isinstance(data, Mapping) or not isinstance(data.get("n_target"), int):
            return cls(n_target=default_target)
        window, down = data.get("window"), data.get("scaled_down_in")
        return cls(
            n_target=data["n_target"],
            window=window if isinstance(window, int) else None,
            scaled_down_in=down if isinstance(down, int) else None,
        )


@dataclass(frozen=True)
class ScalerSignals:
    """What one beat knows: the forecast N for the next window (None: no forecast yet),
    the reactive N, and each ready replica's look-ahead map (KV tokens per iteration)."""

    forecast_n: int | None
    reactive_n: int
    lookaheads: Sequence[Sequence[int]]
    # Ready replicas whose map is not known (no recent report): counted as ready, and
    # while there is one the fleet's load is not known, so no under-load scale-down.
    unmapped: int = 0


def forecast_instances(
    forecast: Mapping[str, object], now_window: int, capacity: InstanceCapacity
) -> int | None:
    """N for the windows ahead from a stored forecast (``workers.forecasting``'s entry:
    ``next_window`` and the prompt and decode token forecasts of it and the one after):
    the largest N over the forecast windows not yet past, so the next window's replicas
    launch a window early (their cold start).  None when the entry is malformed or
    every window it forecasts is past (the forecast beat has not run for a while)."""
    first, tokens = forecast.get("next_window"), forecast.get("forecast")
    if not isinstance(first, int) or not isinstance(tokens, Mapping):
        return None
    prompt, decode = tokens.get("prompt"), tokens.get("decode")
    if not isinstance(prompt, list) or not isinstance(decode, list):
        return None
    needs = [
        capacity.instances(max(0.0, float(p)), max(0.0, float(d)))
        for index, (p, d) in enumerate(zip(prompt, decode, strict=False), start=first)
        if index >= now_window and isinstance(p, int | float) and isinstance(d, int | float)
    ]
    return max(needs) if needs else None


class InstanceScaler:
    def __init__(self, config: InstanceScalerConfig) -> None:
        self.config = config

    def overloaded(self, lookahead: Sequence[int]) -> bool:
        c = self.config
        if not lookahead:
            return False
        limit = c.overload_usage * c.kv_capacity_tokens
        over = sum(1 for tokens in lookahead if tokens > limit)
        return over > c.overload_share * len(lookahead)

    def keep_after_scale_down(self, lookaheads: Sequence[Sequence[int]]) -> int | None:
        """Replicas to keep when every one stays under T_u; None when one does not."""
        c = self.config
        peaks = [max(ahead, default=0) / c.kv_capacity_tokens for ahead in lookaheads]
        if not peaks or max(peaks) >= c.underload_usage:
            return None
        return math.ceil(sum(peaks) / c.underload_usage - 1e-9)

    def step(
        self, state: InstanceScalerState, now: float, signals: ScalerSignals
    ) -> InstanceScalerState:
        return self.decide(state, now, signals)[0]

    def decide(
        self, state: InstanceScalerState, now: float, signals: ScalerSignals
    ) -> tuple[InstanceScalerState, ScalerReason]:
        """The next state, and which tier set its N (for the operator's Event)."""
        c = self.config
        window = math.floor(now / c.window_s)
        n, down_in, handled = state.n_target, state.scaled_down_in, state.window
        forecast_n: int | None = None
        if window != state.window and signals.forecast_n is not None:
            # A window's start, once, when its forecast is there (a late one still counts).
            if signals.forecast_n < n:
                down_in = window
            n, handled, forecast_n = signals.forecast_n, window, signals.forecast_n
        ready = len(signals.lookaheads) + signals.unmapped
        overloaded = sum(1 for ahead in signals.lookaheads if self.overloaded(ahead))
        kept: int | None = None
        if overloaded:
            n = max(n, ready + overloaded)
        elif down_in != window and not signals.unmapped:
            keep = self.keep_after_scale_down(signals.lookaheads)
            if keep is not None and keep < n:
                n, down_in, kept = keep, window, keep
        proactive = n
        n = max(n, signals.reactive_n)
        n = max(c.min_replicas, min(c.max_replicas, n))
        reason = ScalerReason(
            window=window,
            forecast_n=forecast_n,
            ready=ready,
            unmapped=signals.unmapped,
            overloaded=overloaded,
            scaled_down_to=kept,
            reactive_n=signals.reactive_n,
            reactive_floor=signals.reactive_n > proactive,
        )
        return InstanceScalerState(n_target=n, window=handled, scaled_down_in=down_in), reason


@dataclass(frozen=True)
class ScalerReason:
    """Why one step's N is what it is: the forecast N applied at this window's start
    (None: not this beat), the ready replicas and how many of them look overloaded
    (each adds one), the under-load scale-down's N (None: none this beat), and the
    reactive N with whether it was the floor that decided."""

    window: int
    forecast_n: int | None
    ready: int
    unmapped: int
    overloaded: int
    scaled_down_to: int | None
    reactive_n: int
    reactive_floor: bool

    def describe(self) -> str:
        parts = []
        if self.forecast_n is not None:
            parts.append(f"forecast N={self.forecast_n} for window {self.window}")
        if self.overloaded:
            parts.append(
                f"{self.overloaded} of {self.ready} ready replicas potentially overloaded"
                f" +{self.overloaded}"
            )
        if self.scaled_down_to is not None:
            parts.append(f"all under-loaded: scale down to {self.scaled_down_to}")
        if self.unmapped:
            parts.append(f"{self.unmapped} ready replicas without a look-ahead map")
        if self.reactive_floor:
            parts.append(f"request-rate floor N={self.reactive_n}")
        return "; ".join(parts) or "held"

    def to_dict(self) -> dict[str, object]:
        return {
            "window": self.window,
            "forecast_n": self.forecast_n,
            "ready": self.ready,
            "unmapped": self.unmapped,
            "overloaded": self.overloaded,
            "scaled_down_to": self.scaled_down_to,
            "reactive_n": self.reactive_n,
            "reactive_floor": self.reactive_floor,
        }
