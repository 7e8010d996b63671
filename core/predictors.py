"""Response-length predictors by name, for the balancer's settings and the simulator.

``learned`` is imported only when it is asked for: its library (river, numpy,
scipy) takes about a second to load, which a process that never predicts should
not pay.  ``oracle`` knows the true length, which only the simulator has.
"""

from __future__ import annotations

from core.length_predictor import (
    LengthPredictor,
    NoPredictor,
    OraclePredictor,
    SessionMeanPredictor,
)

LIVE_PREDICTORS = ("none", "session-mean", "learned")
SIM_PREDICTORS = (*LIVE_PREDICTORS, "oracle")


def build_predictor(name: str, state: bytes | None = None) -> LengthPredictor:
    """The named predictor (``state``: a saved learned model); ValueError otherwise."""
    if name == "none":
        return NoPredictor()
    if name == "session-mean":
        return SessionMeanPredictor()
    if name == "oracle":
        return OraclePredictor()
    if name != "learned":
        raise ValueError(f"length predictor {name!r}: expected one of {', '.join(SIM_PREDICTORS)}")
    from core.learned_length import LearnedPredictor

    return LearnedPredictor() if state is None else LearnedPredictor.from_state(state)
