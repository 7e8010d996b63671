"""Build the balancer's load forecast (``routing.core.load_forecast``) from settings.

The predictor is chosen by name (``MERIDIAN_LENGTH_PREDICTOR``): ``none``,
``session-mean`` or ``learned``; the learned one may start from a state saved by
``manage.py bench predictor --save PATH`` (``MERIDIAN_LENGTH_PREDICTOR_STATE``),
else it starts as the session-mean baseline and learns from every completion.
``oracle`` is the simulator's alone: a live balancer cannot know the truth.
The learned predictor's library is imported here, when a balancer builds it,
never by the URLconf.
"""

from __future__ import annotations

from pathlib import Path

from routing.core.length_predictor import LengthPredictor, NoPredictor, SessionMeanPredictor
from routing.core.load_anticipator import AnticipatorConfig
from routing.core.load_forecast import ForecastConfig, LoadForecast

PREDICTORS = ("none", "session-mean", "learned")


def build_predictor(name: str, state_path: str = "") -> LengthPredictor:
    """The named predictor; ValueError for an unknown name or an unreadable state."""
    if name == "none":
        return NoPredictor()
    if name == "session-mean":
        return SessionMeanPredictor()
    if name != "learned":
        raise ValueError(f"length predictor {name!r}: expected one of {', '.join(PREDICTORS)}")
    from routing.core.learned_length import LearnedPredictor

    if not state_path:
        return LearnedPredictor()
    try:
        blob = Path(state_path).read_bytes()
    except OSError as exc:
        raise ValueError(f"length predictor state {state_path}: {exc.strerror}") from None
    return LearnedPredictor.from_state(blob)


def build_forecast(
    predictor: str, *, state_path: str, horizon: int, seconds_per_iteration: float
) -> LoadForecast:
    config = ForecastConfig(
        AnticipatorConfig(horizon=horizon), seconds_per_iteration=seconds_per_iteration
    )
    return LoadForecast(build_predictor(predictor, state_path), config)
