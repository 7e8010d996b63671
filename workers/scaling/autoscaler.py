"""SkyServe's request-rate autoscaler (§4): N_can = ⌈R / Q_tar⌉ over a QPS window.

N_tar follows N_can only after N_can has stayed above N_tar for ``upscale_delay_s``
(or below it for ``downscale_delay_s``), so a burst shorter than a cold start does not
launch replicas that would be ready after it ended, and a lull does not throw away
warm ones.  N_tar is clamped to [min_replicas, max_replicas].  The state is plain
data so the controller can persist it between beats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AutoscalerConfig:
    target_qps_per_replica: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 16
    upscale_delay_s: float = 300.0
    downscale_delay_s: float = 1200.0


@dataclass(frozen=True)
class AutoscalerState:
    n_target: int
    above_since: float | None = None
    below_since: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "n_target": self.n_target,
            "above_since": self.above_since,
            "below_since": self.below_since,
        }

    @classmethod
    def from_dict(cls, data: object, default_target: int) -> AutoscalerState:
        if not isinstance(data, dict) or not isinstance(data.get("n_target"), int):
            return cls(n_target=default_target)
        above, below = data.get("above_since"), data.get("below_since")
        return cls(
            n_target=data["n_target"],
            above_since=float(above) if isinstance(above, (int, float)) else None,
            below_since=float(below) if isinstance(below, (int, float)) else None,
        )


class RequestRateAutoscaler:
    def __init__(self, config: AutoscalerConfig) -> None:
        if config.target_qps_per_replica <= 0:
            raise ValueError("target_qps_per_replica must be positive")
        self.config = config

    def candidate(self, qps: float) -> int:
        """N_can, clamped to the bounds."""
        c = self.config
        wanted = math.ceil(max(0.0, qps) / c.target_qps_per_replica - 1e-9)
        return max(c.min_replicas, min(c.max_replicas, wanted))

    def step(self, state: AutoscalerState, now: float, qps: float) -> AutoscalerState:
        n_can = self.candidate(qps)
        c = self.config
        current = max(c.min_replicas, min(c.max_replicas, state.n_target))
        if n_can > current:
            since = state.above_since if state.above_since is not None else now
            if now - since >= c.upscale_delay_s:
                return AutoscalerState(n_target=n_can)
            return AutoscalerState(n_target=current, above_since=since)
        if n_can < current:
            since = state.below_since if state.below_since is not None else now
            if now - since >= c.downscale_delay_s:
                return AutoscalerState(n_target=n_can)
            return AutoscalerState(n_target=current, below_since=since)
        return replace(state, n_target=current, above_since=None, below_since=None)
