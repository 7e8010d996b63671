"""Mooncake traces: hash ids become exact, shared 512-token text blocks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from core.blocks import block_hashes
from core.tokenizer import WordTokenizer
from sim.workloads import ApiKind, TraceFormatError
from sim.workloads.mooncake import MOONCAKE_BLOCK_TOKENS, MooncakeTrace, block_text

TraceFile = Callable[[str, str], Path]


def jsonl(*records: dict[str, object]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_a_block_is_exactly_512_tokens_and_the_same_id_gives_the_same_text(
    tokenizer: WordTokenizer,
) -> None:
    assert tokenizer.count(block_text(42)) == MOONCAKE_BLOCK_TOKENS == 512
    assert block_text(42) == block_text(42)
    assert block_text(42) != block_text(43)
    # Blocks concatenate without fusing tokens at the seam.
    assert tokenizer.encode(block_text(1) + block_text(2)) == (
        tokenizer.encode(block_text(1)) + tokenizer.encode(block_text(2))
    )


def test_prompts_are_trimmed_to_input_length_and_follow_the_trace(
    trace_file: TraceFile, tokenizer: WordTokenizer
) -> None:
    path = trace_file(
        "trace.jsonl",
        jsonl(
            {"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]},
            {"timestamp": 1500, "input_length": 700, "output_length": 0, "hash_ids": [0, 9]},
            {"timestamp": 2500, "input_length": 600, "output_length": 3, "hash_ids": [5]},
        ),
    )
    programs = list(MooncakeTrace(path).programs())
    steps = [p.steps[0] for p in programs]
    assert [tokenizer.count(s.prompt) for s in steps] == [1100, 700, 600]
    assert [p.start for p in programs] == [0.0, 1.5, 2.5]
    assert [s.max_tokens for s in steps] == [6, 1, 3]  # 0 asks for the minimum of one
    assert all(s.kind is ApiKind.COMPLETION and s.ignore_eos for s in steps)


def test_shared_hash_ids_give_a_shared_token_prefix(
    trace_file: TraceFile, tokenizer: WordTokenizer
) -> None:
    path = trace_file(
        "trace.jsonl",
        jsonl(
            {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [3, 4]},
            {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [3, 8]},
        ),
    )
    first, second = (tokenizer.encode(p.steps[0].prompt) for p in MooncakeTrace(path).programs())
    assert first[:512] == second[:512]
    assert first[512:] != second[512:]
    # ...which the replica sees as shared KV blocks: the first 32 blocks of 16 tokens.
    shared = [a == b for a, b in zip(block_hashes(first), block_hashes(second), strict=True)]
    assert shared == [True] * 32 + [False] * 32


def test_a_turn_that_grows_an_earlier_prompt_continues_its_conversation(
    trace_file: TraceFile,
) -> None:
    path = trace_file(
        "trace.jsonl",
        jsonl(
            {"timestamp": 0, "input_length": 1100, "output_length": 9, "hash_ids": [1, 2, 3]},
            # The next turn: both full blocks of the first, then its reply and a question.
            {"timestamp": 5, "input_length": 1800, "output_length": 9, "hash_ids": [1, 2, 7, 8]},
            # The same document asked again, not longer: anyone's, a session of its own.
            {"timestamp": 6, "input_length": 1100, "output_length": 9, "hash_ids": [1, 2, 4]},
            # A third turn of the first conversation, continuing the second request.
            {"timestamp": 9, "input_length": 2100, "output_length": 9, "hash_ids": [1, 2, 7, 8, 5]},
            {"timestamp": 9, "input_length": 600, "output_length": 9, "hash_ids": [6, 2]},
        ),
    )
    keys = [p.session_key for p in MooncakeTrace(path).programs()]
    assert keys == ["mooncake-0", "mooncake-0", "mooncake-1", "mooncake-0", "mooncake-2"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (
            '{"timestamp": 0, "input_length": "9", "output_length": 1, "hash_ids": []}',
            "input_length",
        ),
        ('{"timestamp": -1, "input_length": 9, "output_length": 1, "hash_ids": []}', "timestamp"),
        ('{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": "x"}', "hash_ids"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_malformed_lines_name_the_file_and_line(
    trace_file: TraceFile, line: str, message: str
) -> None:
    good = jsonl({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]})
    path = trace_file("bad.jsonl", good + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=message) as caught:
        list(MooncakeTrace(path).programs())
    assert str(caught.value).startswith(f"{path}:3: ")
