"""Per-key limits: validation, the admission decision, headers, refusals, the local ledger."""

from __future__ import annotations

import pytest

from core.key_limits import (
    DEFAULT_COMPLETION_ESTIMATE,
    INSUFFICIENT_QUOTA,
    MAX_LIMIT,
    RATE_LIMIT_EXCEEDED,
    Counts,
    KeyLimits,
    LocalLedger,
    Verdict,
    admission_from_reply,
    decide,
    duration,
    model_not_allowed,
    parse_limit,
    parse_models,
    rate_limit_headers,
    refusal,
    reservation,
)


@pytest.mark.parametrize(
    ("text", "expected"), [(None, None), ("", None), (" none ", None), ("5", 5), ("1_000", 1000)]
)
def test_parse_limit_reads_what_an_operator_types(text: str | None, expected: int | None) -> None:
    assert parse_limit("--rpm", text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "--rpm must be between 1 and"),
        ("-3", "--rpm must be between 1 and"),
        ("ten", "--rpm must be a whole number or 'none'; got 'ten'"),
        ("1.5", "--rpm must be a whole number"),
        (str(MAX_LIMIT + 1), "--rpm must be between 1 and"),
    ],
)
def test_parse_limit_refuses_bad_values_naming_the_option(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_limit("--rpm", text)


def test_key_limits_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="max_concurrent must be between 1"):
        KeyLimits(max_concurrent=0)
    with pytest.raises(ValueError, match="tokens_per_minute must be a whole number"):
        KeyLimits(tokens_per_minute=True)
    with pytest.raises(ValueError, match="budget_period must be one of hour, day, week, month"):
        KeyLimits(budget_period="fortnight")
    with pytest.raises(ValueError, match="allowed model names"):
        KeyLimits(allowed_models=frozenset({" padded "}))


def test_parse_models_splits_and_trims() -> None:
    assert parse_models(" a, b ,,a ") == frozenset({"a", "b"})
    assert parse_models(["x", " y "]) == frozenset({"x", "y"})
    assert parse_models("") == frozenset()
    with pytest.raises(ValueError, match="must be strings"):
        parse_models([3])  # type: ignore[list-item]


def test_allow_list_admits_listed_models_and_their_adapters() -> None:
    everything = KeyLimits()
    listed = KeyLimits(allowed_models=frozenset({"base"}))
    assert everything.allows("anything", "anything")
    assert listed.allows("base", "base")
    assert listed.allows("base-lora", "base")  # an adapter of a listed model
    assert not listed.allows("other", "other")
    error = model_not_allowed("other")
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")


def test_reservation_is_prompt_plus_the_completion_cap_or_an_estimate() -> None:
    assert reservation(100, 50) == 150
    assert reservation(100, None) == 100 + DEFAULT_COMPLETION_ESTIMATE
    assert reservation(100, 0) == 100


def test_counted_only_with_a_numeric_limit() -> None:
    assert not KeyLimits().counted
    assert not KeyLimits(allowed_models=frozenset({"m"})).counted
    assert KeyLimits(token_budget=10).counted


@pytest.mark.parametrize(
    ("limits", "counts", "reserve", "verdict"),
    [
        (KeyLimits(), Counts(10**6, 10**9, 10**4, 10**9), 10, Verdict.ADMITTED),
        (KeyLimits(max_concurrent=2), Counts(concurrent=1), 0, Verdict.ADMITTED),
        (KeyLimits(max_concurrent=2), Counts(concurrent=2), 0, Verdict.CONCURRENCY),
        (KeyLimits(requests_per_minute=3), Counts(requests=2), 0, Verdict.ADMITTED),
        (KeyLimits(requests_per_minute=3), Counts(requests=3), 0, Verdict.REQUESTS),
        (KeyLimits(tokens_per_minute=100), Counts(tokens=60), 40, Verdict.ADMITTED),
        (KeyLimits(tokens_per_minute=100), Counts(tokens=60), 41, Verdict.TOKENS),
        (KeyLimits(token_budget=100), Counts(budget=99), 2, Verdict.BUDGET),
        # Concurrency is checked first, so a key at every limit says concurrency.
        (
            KeyLimits(max_concurrent=1, requests_per_minute=1, token_budget=1),
            Counts(1, 1, 1, 1),
            5,
            Verdict.CONCURRENCY,
        ),
    ],
)
def test_decide(limits: KeyLimits, counts: Counts, reserve: int, verdict: Verdict) -> None:
    assert decide(limits, counts, reserve) is verdict


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (17, "17ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (360_000, "6m0s"),
        (3_723_400, "1h2m3.4s"),
    ],
)
def test_duration_is_written_as_openai_does(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_headers_and_reset_from_the_script_reply() -> None:
    limits = KeyLimits(requests_per_minute=10, tokens_per_minute=1000)
    # verdict, requests, tokens, concurrent, budget, now_ms (12.5 s into a minute)
    admission = admission_from_reply(limits, 200, [0, 4, 300, 0, 0, 60_000 * 5 + 12_500])
    assert admission.admitted
    assert admission.window_reset_ms == 47_500
    assert rate_limit_headers(admission) == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "6",
        "x-ratelimit-reset-requests": "47.5s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "700",
        "x-ratelimit-reset-tokens": "47.5s",
    }
    with pytest.raises(ValueError, match="not 6"):
        admission_from_reply(limits, 0, [0, 1])


def test_a_key_without_per_minute_limits_sends_no_headers() -> None:
    admission = admission_from_reply(KeyLimits(max_concurrent=3), 0, [0, 1, 0, 1, 0, 0])
    assert rate_limit_headers(admission) == {}


def test_refusals_are_openai_shaped_429s_with_headers() -> None:
    limits = KeyLimits(requests_per_minute=2, token_budget=1000, budget_period="hour")
    rpm = refusal(admission_from_reply(limits, 10, [2, 2, 30, 0, 30, 59_000]))
    assert rpm.status == 429
    assert rpm.body()["error"]["type"] == rpm.code == RATE_LIMIT_EXCEEDED
    assert rpm.headers["Retry-After"] == "1"
    assert rpm.headers["x-ratelimit-remaining-requests"] == "0"
    assert "requests per minute: limit 2" in rpm.message
    budget = refusal(admission_from_reply(limits, 10, [4, 1, 10, 0, 995, 1_800_000]))
    assert budget.code == budget.type == INSUFFICIENT_QUOTA
    assert budget.headers["Retry-After"] == "1800"  # the hour's second half
    assert "1000 tokens per hour" in budget.message
    conc = refusal(admission_from_reply(KeyLimits(max_concurrent=1), 0, [1, 0, 0, 1, 0, 0]))
    assert "concurrent" in conc.message and conc.headers["Retry-After"] == "1"
    too_big = refusal(admission_from_reply(KeyLimits(tokens_per_minute=5), 9, [3, 0, 0, 0, 0, 0]))
    assert "alone exceeds the limit" in too_big.message
    with pytest.raises(ValueError, match="no refusal"):
        refusal(admission_from_reply(limits, 0, [0, 1, 0, 0, 0, 0]))


def test_local_ledger_holds_the_limits_in_one_process() -> None:
    ledger = LocalLedger()
    limits = KeyLimits(requests_per_minute=3, max_concurrent=2, tokens_per_minute=1000)
    first = ledger.admit("k", limits, 100, "a", now_ms=1_000)
    second = ledger.admit("k", limits, 100, "b", now_ms=1_001)
    assert first.admitted and second.admitted
    assert ledger.admit("k", limits, 100, "c", now_ms=1_002).verdict is Verdict.CONCURRENCY
    ledger.finish("k", "a", reserved=100, actual=40)  # settles 100 -> 40
    ledger.finish("k", "a", reserved=100, actual=40)  # a second finish changes nothing
    third = ledger.admit("k", limits, 100, "c", now_ms=1_003)
    assert third.admitted and third.counts.tokens == 240
    ledger.finish("k", "b", 100, None)
    ledger.finish("k", "c", 100, None)
    assert ledger.admit("k", limits, 1, "d", now_ms=1_004).verdict is Verdict.REQUESTS
    # A new minute starts the per-minute counts again.
    assert ledger.admit("k", limits, 1, "e", now_ms=61_000).admitted


def test_local_ledger_stays_bounded() -> None:
    ledger = LocalLedger(max_keys=2)
    limits = KeyLimits(requests_per_minute=1)
    for key in "abc":
        ledger.admit(key, limits, 0, "m", now_ms=0)
    # "a" was forgotten (the oldest), so it may send again; "c" may not.
    assert ledger.admit("a", limits, 0, "m2", now_ms=1).admitted
    assert not ledger.admit("c", limits, 0, "m2", now_ms=1).admitted
