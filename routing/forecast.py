"""Build the balancer's load forecast (``core.load_forecast``) from settings.

The predictor is chosen by name (``MERIDIAN_LENGTH_PREDICTOR``): ``none``,
``session-mean`` or ``learned``; the learned one may start from a state saved by
``manage.py bench predictor --save PATH`` (``MERIDIAN_LENGTH_PREDICTOR_STATE``),
else it starts as the session-mean baseline and learns from every completion.
``oracle`` is the simulator's alone: a live balancer cannot know the truth.
"""

from __future__ import annotations

from pathlib import Path

from core.load_anticipator import AnticipatorConfig
from core.load_forecast import ForecastConfig, LoadForecast
from core.predictors import LIVE_PREDICTORS, build_predictor


def build_forecast(
    predictor: str, *, state_path: str, horizon: int, seconds_per_iteration: float
) -> LoadForecast:
    """ValueError for a predictor a live balancer cannot run or an unreadable state."""
    if predictor not in LIVE_PREDICTORS:
        choices = ", ".join(LIVE_PREDICTORS)
        raise ValueError(f"MERIDIAN_LENGTH_PREDICTOR={predictor!r}: expected one of {choices}")
    state = None
    if state_path:
        try:
            state = Path(state_path).read_bytes()
        except OSError as exc:
            where = f"MERIDIAN_LENGTH_PREDICTOR_STATE={state_path}"
            raise ValueError(f"{where}: {exc.strerror}") from None
    config = ForecastConfig(
        AnticipatorConfig(horizon=horizon), seconds_per_iteration=seconds_per_iteration
    )
    return LoadForecast(build_predictor(predictor, state), config)
