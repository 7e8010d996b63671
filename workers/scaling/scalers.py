"""Scaling policies by name: how many replicas (placement policies say where).

Each beat a ``ScalingPolicy`` turns the stored state and this beat's signals into
N_tar and the state to store; the placement policy (``registry``) then decides the
spot/on-demand mix and the zones for that N_tar.  So the instance scaler composes
with SpotHedge as PreServe's scaler decides how many and SpotHedge decides where.

- ``request-rate``: SkyServe's autoscaler (``autoscaler``), reactive, QPS only;
- ``preserve``: PreServe's instance scaler (``instance_scaler``) over the forecast and
  the load-look-ahead maps, never below the request-rate autoscaler's N (proactive +
  reactive); that floor rises with the autoscaler's up-delay and falls at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from workers.scaling.autoscaler import AutoscalerConfig, AutoscalerState, RequestRateAutoscaler
from workers.scaling.instance_scaler import (
    InstanceScaler,
    InstanceScalerConfig,
    InstanceScalerState,
    ScalerSignals,
)


@dataclass(frozen=True)
class ScalingSignals:
    """One beat's inputs: QPS over the autoscaler's window, the forecast N for the next
    window (None: no forecast), the ready replicas' look-ahead maps (KV tokens)."""

    qps: float
    forecast_n: int | None = None
    lookaheads: Sequence[Sequence[int]] = field(default_factory=tuple)
    unmapped: int = 0  # ready replicas whose look-ahead map is not known


@dataclass(frozen=True)
class ScalingOutcome:
    """One beat's N_tar, the state to store, and why (``reason``: plain data for the
    ``scaling.decision`` Event; ``describe``: the same in one line)."""

    n_target: int
    state: dict[str, object]
    reason: dict[str, object]
    describe: str


class ScalingPolicy(ABC):
    name: ClassVar[str]

    def __init__(self, autoscaler: AutoscalerConfig, scaler: InstanceScalerConfig) -> None:
        self.autoscaler = RequestRateAutoscaler(autoscaler)

    def step(
        self, stored: Mapping[str, object], fallback: int, now: float, signals: ScalingSignals
    ) -> tuple[int, dict[str, object]]:
        """N_tar and the state to store; ``fallback``: N_tar when nothing is stored."""
        outcome = self.decide(stored, fallback, now, signals)
        return outcome.n_target, outcome.state

    @abstractmethod
    def decide(
        self, stored: Mapping[str, object], fallback: int, now: float, signals: ScalingSignals
    ) -> ScalingOutcome:
        """``step`` with the reason for its N."""

    def reactive(
        self, stored: Mapping[str, object], fallback: int, now: float, qps: float
    ) -> AutoscalerState:
        previous = AutoscalerState.from_dict(stored.get("autoscaler"), fallback)
        return self.autoscaler.step(previous, now, qps)


class RequestRatePolicy(ScalingPolicy):
    name = "request-rate"

    def decide(
        self, stored: Mapping[str, object], fallback: int, now: float, signals: ScalingSignals
    ) -> ScalingOutcome:
        scaled = self.reactive(stored, fallback, now, signals.qps)
        return ScalingOutcome(
            scaled.n_target,
            {"autoscaler": scaled.to_dict()},
            {"qps": round(signals.qps, 4)},
            f"request rate {signals.qps:.2f}/s -> N={scaled.n_target}",
        )


class PreServePolicy(ScalingPolicy):
    name = "preserve"

    def __init__(self, autoscaler: AutoscalerConfig, scaler: InstanceScalerConfig) -> None:
        # The forecast and the once-per-window scale-down own the way down: the reactive
        # floor keeps its up-delay (a burst shorter than a cold start launches nothing)
        # but follows the load down at once, or its hysteresis would hold every
        # replica the forecast lets go.
        super().__init__(replace(autoscaler, downscale_delay_s=0.0), scaler)
        self.scaler = InstanceScaler(scaler)

    def decide(
        self, stored: Mapping[str, object], fallback: int, now: float, signals: ScalingSignals
    ) -> ScalingOutcome:
        scaled = self.reactive(stored, fallback, now, signals.qps)
        previous = InstanceScalerState.from_dict(stored.get("instance_scaler"), fallback)
        inputs = ScalerSignals(
            signals.forecast_n, scaled.n_target, signals.lookaheads, signals.unmapped
        )
        state, why = self.scaler.decide(previous, now, inputs)
        return ScalingOutcome(
            state.n_target,
            {"autoscaler": scaled.to_dict(), "instance_scaler": state.to_dict()},
            {"qps": round(signals.qps, 4), **why.to_dict()},
            f"{why.describe()} -> N={state.n_target}",
        )


SCALERS: dict[str, type[ScalingPolicy]] = {
    cls.name: cls for cls in (RequestRatePolicy, PreServePolicy)
}


def build_scaler(
    name: str, autoscaler: AutoscalerConfig, scaler: InstanceScalerConfig | None = None
) -> ScalingPolicy:
    try:
        cls = SCALERS[name]
    except KeyError:
        raise ValueError(
            f"unknown scaling policy {name!r}; choose from {sorted(SCALERS)}"
        ) from None
    return cls(autoscaler, scaler or InstanceScalerConfig())
