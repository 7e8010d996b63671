"""Error bodies look exactly like OpenAI's, with the status and headers clients rely on."""

from __future__ import annotations

import json

import pytest

from core import errors


def test_body_has_exactly_openais_four_fields() -> None:
    error = errors.missing_parameter("messages")
    assert error.status == 400
    assert error.body() == {
        "error": {
            "message": "Missing required parameter: 'messages'.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "missing_required_parameter",
        }
    }


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (errors.invalid_api_key(provided=True), 401, "invalid_api_key"),
        (errors.model_not_found("gpt-9"), 404, "model_not_found"),
        (errors.request_too_large(10, 5), 413, "request_too_large"),
        (errors.at_capacity("m", 2), 429, "capacity_exceeded"),
        (errors.no_healthy_replica("m", 2), 503, "no_healthy_replica"),
        (errors.not_a_balancer(), 503, "not_a_balancer"),
        (errors.upstream_failed("m", 3, "reset"), 502, "upstream_error"),
    ],
)
def test_status_and_code_pairs(error: errors.ApiError, status: int, code: str) -> None:
    assert (error.status, error.body()["error"]["code"]) == (status, code)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_busy_and_unavailable_answers_carry_retry_after() -> None:
    assert errors.at_capacity("m", 3).headers == {"Retry-After": "3"}
    assert errors.no_healthy_replica("m", 1).headers == {"Retry-After": "1"}


def test_invalid_type_names_the_json_type_received() -> None:
    error = errors.invalid_type("max_tokens", "an integer", "12")
    assert error.body()["error"]["message"] == (
        "Invalid type for 'max_tokens': expected an integer, but got a string instead."
    )
    assert error.param == "max_tokens"


def test_unknown_model_message_quotes_the_model() -> None:
    assert "`gpt-9`" in errors.model_not_found("gpt-9").message


def test_an_unknown_path_gets_openais_invalid_url_wording() -> None:
    error = errors.unknown_url("POST", "/v1/nothing")
    assert (error.status, error.code, error.message) == (
        404,
        "unknown_url",
        "Invalid URL (POST /v1/nothing)",
    )


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (404, b'{"detail": "Not Found"}', "do not serve /v1/embeddings (they answered: Not Found)"),
        (404, b"<html><body>Not Found</body></html>", "<html><body>Not Found</body></html>"),
        (400, b"", "The replica answered 400: no body"),
        (422, b'[{"loc": ["body"]}]', '[{"loc": ["body"]}]'),
    ],
)
def test_a_replicas_non_openai_error_gets_the_openai_envelope(
    status: int, body: bytes, words: str
) -> None:
    shaped = errors.upstream_error_body(status, body, path="/v1/embeddings", model="m")
    assert shaped is not None
    error = json.loads(shaped)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_an_openai_shaped_replica_error_is_left_as_it_is() -> None:
    vllm = b'{"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}'
    assert errors.upstream_error_body(400, vllm, path="/v1/completions", model="m") is None
