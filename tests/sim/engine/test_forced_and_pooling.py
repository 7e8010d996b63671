"""Requests that do not sample: structured output (forced tokens) and pooling (embeddings)."""

from __future__ import annotations

from collections.abc import Callable

from sim.engine import Engine, RequestOutput
from tests.support.engine import fresh_prompt, request, run_to_completion


def outputs(engine: Engine) -> dict[str, list[RequestOutput]]:
    found: dict[str, list[RequestOutput]] = {}
    for result in run_to_completion(engine):
        for out in result.outputs:
            found.setdefault(out.request_id, []).append(out)
    return found


def test_forced_tokens_are_emitted_in_order_then_the_request_stops(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    forced = [7, 8, 9, 10]
    engine.add_request(request("json", fresh_prompt(40), 50, output_token_ids=forced))
    engine.add_request(request("cut", fresh_prompt(40), 3, output_token_ids=forced))
    found = outputs(engine)
    assert [t for out in found["json"] for t in out.new_token_ids] == forced
    assert found["json"][-1].finish_reason is not None
    assert found["json"][-1].finish_reason.value == "stop"
    # max_tokens cuts a structured answer short, and says so, as vLLM does.
    assert [t for out in found["cut"] for t in out.new_token_ids] == forced[:3]
    assert found["cut"][-1].finish_reason is not None
    assert found["cut"][-1].finish_reason.value == "length"


def test_a_pooling_request_ends_with_its_prefill_and_counts_cached_prompt_tokens(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    prompt = fresh_prompt(64)
    engine.add_request(request("first", prompt, 1, pooling=True))
    first = outputs(engine)["first"]
    engine.add_request(request("again", prompt, 1, pooling=True))
    again = outputs(engine)["again"]
    for found in (first, again):
        assert len(found) == 1 and found[0].new_token_ids == []
        assert found[0].finish_reason is not None and found[0].finish_reason.value == "stop"
    assert (first[0].completion_tokens, first[0].cached_tokens) == (0, 0)
    assert again[0].cached_tokens == 48  # the last block is recomputed, as in vLLM
    assert engine.stats.generation_tokens == 0 and not engine.has_work()
