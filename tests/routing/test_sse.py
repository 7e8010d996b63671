"""The SSE relay: split events incrementally, learn usage, strip it when not asked."""

from __future__ import annotations

import json
import random

import pytest

from core.sse import SseRelay, Usage


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CONTENT = _event({"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None})
USAGE = _event(
    {
        "id": "c",
        "choices": [],
        "usage": {
            "prompt_tokens": 40,
            "completion_tokens": 3,
            "total_tokens": 43,
            "prompt_tokens_details": {"cached_tokens": 32},
        },
    }
)
DONE = b"data: [DONE]\n\n"
STREAM = CONTENT + CONTENT + USAGE + DONE


def _relay_in_pieces(relay: SseRelay, data: bytes, size: int) -> bytes:
    out = [relay.feed(data[i : i + size]) for i in range(0, len(data), size)]
    return b"".join(out) + relay.flush()


def test_usage_chunk_is_stripped_when_the_client_did_not_ask_and_usage_is_kept() -> None:
    relay = SseRelay(strip_usage=True)
    assert relay.feed(STREAM) == CONTENT + CONTENT + DONE
    assert relay.usage == Usage(prompt_tokens=40, completion_tokens=3, cached_tokens=32)


def test_usage_chunk_is_relayed_byte_for_byte_when_asked() -> None:
    relay = SseRelay(strip_usage=False)
    assert relay.feed(STREAM) + relay.flush() == STREAM
    assert relay.usage is not None and relay.usage.cached_tokens == 32


def test_events_split_across_chunks_at_any_byte_come_out_whole_and_in_order() -> None:
    for size in (1, 2, 3, 7, 50):
        relay = SseRelay(strip_usage=True)
        assert _relay_in_pieces(relay, STREAM, size) == CONTENT + CONTENT + DONE
        assert relay.usage is not None and relay.usage.prompt_tokens == 40


def test_complete_events_are_emitted_at_once_not_held_for_later() -> None:
    relay = SseRelay(strip_usage=True)
    half = len(CONTENT) // 2
    assert relay.feed(CONTENT + CONTENT[:half]) == CONTENT
    assert relay.feed(CONTENT[half:]) == CONTENT


def test_crlf_framing_is_understood() -> None:
    relay = SseRelay(strip_usage=True)
    crlf = STREAM.replace(b"\n", b"\r\n")
    out = relay.feed(crlf) + relay.flush()
    assert b'"choices": []' not in out
    assert out.count(b"data:") == 3


def test_content_mentioning_usage_is_not_mistaken_for_the_usage_chunk() -> None:
    text = _event({"choices": [{"index": 0, "delta": {"content": 'the "usage" of words'}}]})
    relay = SseRelay(strip_usage=True)
    assert relay.feed(text) == text
    assert relay.usage is None


def test_a_stream_that_never_ends_an_event_is_passed_through_when_the_buffer_is_full() -> None:
    relay = SseRelay(strip_usage=True, max_pending=64)
    assert relay.feed(b"x" * 100) == b"x" * 100


def test_usage_from_a_non_streaming_body_without_details() -> None:
    assert Usage.from_openai({"prompt_tokens": 5, "completion_tokens": 2}) == Usage(5, 2, 0)
    assert Usage.from_openai(None) is None


def test_event_per_chunk_streams_pass_content_through_and_still_strip_usage() -> None:
    # How replicas write: one whole event per chunk (the relay's fast path).
    relay = SseRelay(strip_usage=True)
    out = [relay.feed(event) for event in (CONTENT, CONTENT, USAGE, DONE)]
    assert out == [CONTENT, CONTENT, b"", DONE]
    assert relay.usage is not None and relay.usage.completion_tokens == 3


def test_openai_style_null_usage_on_content_chunks_is_relayed_untouched() -> None:
    relay = SseRelay(strip_usage=True)
    content = CONTENT.replace(b'"usage": null', b'"usage" : null')
    assert relay.feed(content + content) == content + content
    assert relay.feed(USAGE + DONE) == DONE
    assert relay.usage is not None and relay.usage.prompt_tokens == 40


def test_a_read_that_coalesced_hundreds_of_events_is_relayed_whole_minus_usage() -> None:
    relay = SseRelay(strip_usage=True)
    body = CONTENT * 500 + USAGE + DONE
    half = len(CONTENT) // 2
    assert relay.feed(body + CONTENT[:half]) == CONTENT * 500 + DONE
    assert relay.feed(CONTENT[half:]) == CONTENT
    assert relay.usage is not None and relay.usage.cached_tokens == 32


def test_responses_api_usage_is_read_from_its_own_names_and_events() -> None:
    usage = {"input_tokens": 40, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 32}}
    assert Usage.from_body({"object": "response", "usage": usage}) == Usage(40, 3, 32)
    completed = b"event: response.completed\n" + _event(
        {"type": "response.completed", "response": {"id": "r", "usage": usage}}
    )
    created = b"event: response.created\n" + _event(
        {"type": "response.created", "response": {"id": "r", "usage": None}}
    )
    relay = SseRelay(strip_usage=False)
    stream = created + completed
    assert relay.feed(stream) + relay.flush() == stream
    assert relay.usage == Usage(40, 3, 32)


def _events_by_definition(data: bytes) -> list[bytes]:
    """Events as the SSE framing defines them: each ends at the earliest boundary of
    any framing after its start (the splitter this module used to run, kept as the
    reference)."""
    events, start = [], 0
    while True:
        ends = [
            i + len(m) for m in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := data.find(m, start)) >= 0
        ]
        if not ends:
            return [*events, data[start:]]
        end = min(ends)
        events.append(data[start:end])
        start = end


@pytest.mark.parametrize("newlines", [[b"\n"], [b"\n", b"\r", b"\r\n"]], ids=["lf", "mixed"])
def test_only_usage_events_are_dropped_wherever_their_boundaries_fall(
    newlines: list[bytes],
) -> None:
    pieces = [*newlines, b"data: x", b'data: {"usage": {"prompt_tokens": 1}}', b":c"]
    usage_only = b'data: {"choices": [], "usage": {"prompt_tokens": 2}}'
    rng = random.Random(17)
    for _ in range(3000):
        data = b"".join(
            rng.choice([*pieces, *newlines, usage_only]) for _ in range(rng.randint(1, 14))
        )
        reference = SseRelay(strip_usage=True)
        events = _events_by_definition(data)
        # the complete events less the usage-only ones, then the stray tail as it is
        expected = b"".join(e for e in events[:-1] if reference._keep(e)) + events[-1]
        relay = SseRelay(strip_usage=True)
        assert relay._filter(data) == expected, data
        assert relay.usage == reference.usage
