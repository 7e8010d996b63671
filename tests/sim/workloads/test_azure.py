"""Azure LLM inference CSV: arrival offsets from wall-clock timestamps, exact lengths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from core.tokenizer import WordTokenizer
from sim.workloads import TraceFormatError
from sim.workloads.azure import AzureTrace

TraceFile = Callable[[str, str], Path]

SAMPLE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:47.0000001,20,0"  # the published file ends without a newline
)


def test_offsets_and_lengths(trace_file: TraceFile, tokenizer: WordTokenizer) -> None:
    programs = list(AzureTrace(trace_file("azure.csv", SAMPLE)).programs())
    assert [p.start for p in programs] == pytest.approx([0.0, 4.314579, 60.3194101])
    assert [tokenizer.count(p.steps[0].prompt) for p in programs] == [374, 396, 20]
    assert [p.steps[0].max_tokens for p in programs] == [44, 109, 1]
    assert all(p.steps[0].ignore_eos for p in programs)


def test_prompts_are_unique_from_the_first_token(
    trace_file: TraceFile, tokenizer: WordTokenizer
) -> None:
    programs = list(AzureTrace(trace_file("azure.csv", SAMPLE)).programs())
    first_tokens = {tokenizer.encode(p.steps[0].prompt)[0] for p in programs}
    assert len(first_tokens) == len(programs)


def test_same_seed_same_prompts(trace_file: TraceFile) -> None:
    path = trace_file("azure.csv", SAMPLE)
    assert list(AzureTrace(path, seed=1).programs()) == list(AzureTrace(path, seed=1).programs())
    assert list(AzureTrace(path, seed=1).programs()) != list(AzureTrace(path, seed=2).programs())


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("time,a,b\n", 1, "expected the header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3\n", 2, "3 columns"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", 2, "cannot read"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,0,4\n", 2, "out of range"),
    ],
)
def test_malformed_rows_name_the_file_and_line(
    trace_file: TraceFile, text: str, line: int, message: str
) -> None:
    path = trace_file("bad.csv", text)
    with pytest.raises(TraceFormatError, match=message) as caught:
        list(AzureTrace(path).programs())
    assert str(caught.value).startswith(f"{path}:{line}: ")
