"""The balancer's load forecast: prediction on arrival, the replica's map on a send,
training and error tallies on completion, through the dispatch core."""

from __future__ import annotations

import dataclasses

from core.length_predictor import NoPredictor, RequestFeatures, SessionMeanPredictor
from core.load_anticipator import AnticipatorConfig
from core.load_forecast import ForecastConfig, LoadForecast
from core.types import RequestDescriptor


def _request(rid: str, session: str = "s", prompt: int = 100) -> RequestDescriptor:
    return RequestDescriptor(rid, "m", prompt, block_hashes=(77, 78), session_key=session)


def _forecast() -> LoadForecast:
    config = ForecastConfig(AnticipatorConfig(horizon=8), seconds_per_iteration=1.0)
    return LoadForecast(SessionMeanPredictor(default=4), config)


def test_prediction_uses_the_session_and_the_first_block_as_system_prompt() -> None:
    forecast = _forecast()
    first = forecast.predict(_request("a"))
    assert first.predicted_output_tokens == 4
    forecast.complete("r1", first, output_tokens=10, now=0.0)
    features = forecast.features(_request("b"))
    assert features.earlier_outputs == (10,)
    assert features.system_key == 77
    assert forecast.predict(_request("b")).predicted_output_tokens == 10
    # A retry keeps the prediction it already has.
    again = forecast.predict(dataclasses.replace(first, predicted_output_tokens=3))
    assert again.predicted_output_tokens == 3


def test_without_a_predictor_the_descriptor_keeps_no_prediction_but_the_map_has_one() -> None:
    config = ForecastConfig(AnticipatorConfig(horizon=8), seconds_per_iteration=1.0)
    forecast = LoadForecast(NoPredictor(default=6), config)
    request = forecast.predict(_request("a"))
    assert request.predicted_output_tokens is None  # the cost model keeps its own mean
    forecast.admit("r1", request, now=0.0)
    # Its 100 prompt tokens grow by one per iteration for the 6 it is expected to run.
    assert forecast.anticipator("r1").lookahead()[:7] == [100, 101, 102, 103, 104, 105, 0]


def test_admit_tick_and_complete_drive_the_replicas_map_and_tally() -> None:
    forecast = _forecast()
    request = forecast.predict(_request("a", prompt=50))
    forecast.admit("r1", request, now=10.0)
    assert forecast.anticipator("r1").lookahead()[:5] == [50, 51, 52, 53, 0]
    forecast.tick(12.0)  # two iterations at one second each
    assert forecast.anticipator("r1").kv_tokens() == 52
    outcome = forecast.complete("r1", request, output_tokens=7, now=13.0, decode_seconds=3.0)
    assert outcome is not None and outcome.error == 3
    (snapshot,) = forecast.snapshot()
    assert snapshot.running == 0
    assert (snapshot.tally.completed, snapshot.tally.overran) == (1, 1)
    assert snapshot.tally.absolute_error_tokens == 3
    assert snapshot.seconds_per_iteration < 1.0  # learned from 3 s for 6 iterations


def test_abandon_leaves_the_map_without_training() -> None:
    forecast = _forecast()
    request = forecast.predict(_request("a"))
    forecast.admit("r1", request, now=0.0)
    forecast.abandon("r1", "a")
    forecast.forget("a")
    (snapshot,) = forecast.snapshot()
    assert snapshot.running == 0 and snapshot.tally.completed == 0
    assert forecast.history.earlier("s") == ()


def test_retain_drops_replicas_that_left() -> None:
    forecast = _forecast()
    forecast.admit("gone", forecast.predict(_request("a")), now=0.0)
    forecast.admit("kept", forecast.predict(_request("b")), now=0.0)
    forecast.retain(["kept"])
    assert [s.replica for s in forecast.snapshot()] == ["kept"]


def test_features_given_by_the_glue_keep_their_cues() -> None:
    forecast = _forecast()
    given = RequestFeatures(prompt_tokens=0, endpoint="completions", cues=(1, 2))
    request = RequestDescriptor("a", "m", 30, max_tokens=9, features=given)
    features = forecast.features(request)
    assert (features.prompt_tokens, features.max_tokens, features.cues) == (30, 9, (1, 2))
    assert features.endpoint == "completions"


def test_a_prediction_and_the_features_carry_every_other_field() -> None:
    # Both are built field by field (for speed): a field added to either dataclass
    # must be added there too, which this test notices.
    features = RequestFeatures(
        5,
        max_tokens=6,
        endpoint="embeddings",
        system_key=7,
        earlier_outputs=(8,),
        cues=(9, 10),
        oracle_output=11,
    )
    request = RequestDescriptor(
        "r",
        "m",
        100,
        block_hashes=(77,),
        session_key="s",
        max_tokens=12,
        lora="l",
        forwarded=True,
        first_turn=True,
        features=features,
    )
    assert {f.name for f in dataclasses.fields(RequestDescriptor)} == {
        "request_id",
        "model",
        "prompt_tokens",
        "block_hashes",
        "session_key",
        "max_tokens",
        "lora",
        "forwarded",
        "first_turn",
        "features",
        "predicted_output_tokens",
    }
    assert {f.name for f in dataclasses.fields(RequestFeatures)} == {
        "prompt_tokens",
        "max_tokens",
        "endpoint",
        "system_key",
        "earlier_outputs",
        "cues",
        "oracle_output",
    }
    predicted = _forecast().predict(request)
    assert predicted == dataclasses.replace(request, predicted_output_tokens=4)
    assert _forecast().features(request) == dataclasses.replace(
        features, prompt_tokens=100, max_tokens=12, earlier_outputs=()
    )
