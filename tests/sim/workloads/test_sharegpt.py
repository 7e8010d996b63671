"""ShareGPT conversations: recorded turns become sequential chat steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.workloads import Program, TraceFormatError
from sim.workloads.sharegpt import ShareGptConversations

TraceFile = Callable[[str, str], Path]

RECORDS = [
    {
        "id": "abc_0",
        "conversations": [
            {"from": "human", "value": "What is a KV cache?"},
            {"from": "gpt", "value": "It stores keys and values."},
            {"from": "human", "value": "Why reuse it?"},
            {"from": "gpt", "value": "To skip prefill work."},
        ],
    },
    # Opens with an assistant message (a later segment): history, not a request.
    {
        "id": "def_1",
        "conversations": [
            {"from": "gpt", "value": "Continuing."},
            {"from": "human", "value": "Go on"},
            {"from": "gpt", "value": "Done"},
        ],
    },
    {"id": "nothing", "conversations": [{"from": "human", "value": "unanswered"}]},
]


def check(programs: list[Program]) -> None:
    assert len(programs) == 2  # the unanswered record yields no program
    talk = programs[0]
    assert talk.session_key == "sharegpt-abc_0"
    assert [len(step.messages) for step in talk.steps] == [1, 3]
    # The second turn carries the recorded reply, so its prompt is the real conversation.
    assert talk.steps[1].messages[1].content == "It stores keys and values."
    assert talk.steps[1].messages[1].role == "assistant"
    assert talk.steps[1].after == (0,)
    # max_tokens is the recorded reply's length: "It stores keys and values." is 6 tokens.
    assert [step.max_tokens for step in talk.steps] == [6, 5]
    assert all(step.ignore_eos for step in talk.steps)
    assert [m.role for m in programs[1].steps[0].messages] == ["assistant", "user"]


def test_jsonl(trace_file: TraceFile) -> None:
    path = trace_file("talks.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS))
    check(list(ShareGptConversations(path).programs()))


def test_json_array(trace_file: TraceFile) -> None:
    path = trace_file("talks.json", json.dumps(RECORDS, indent=2))
    check(list(ShareGptConversations(path).programs()))


def test_unknown_speaker_names_the_line(trace_file: TraceFile) -> None:
    bad = {"conversations": [{"from": "robot", "value": "beep"}]}
    path = trace_file("bad.jsonl", json.dumps(RECORDS[0]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceFormatError, match=f"{path}:2: unknown speaker 'robot'"):
        list(ShareGptConversations(path).programs())


def test_bad_record_in_an_array_names_its_line(trace_file: TraceFile) -> None:
    text = json.dumps(RECORDS[:1], indent=1)[:-1] + ',\n{"conversations": 5}\n]'
    path = trace_file("bad.json", text)
    line = text.count("\n", 0, text.index('{"conversations": 5}')) + 1
    with pytest.raises(TraceFormatError, match=f"{path}:{line}: 'conversations' must be a list"):
        list(ShareGptConversations(path).programs())


def test_truncated_array_is_reported(trace_file: TraceFile) -> None:
    path = trace_file("cut.json", json.dumps(RECORDS)[:50])
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        list(ShareGptConversations(path).programs())
