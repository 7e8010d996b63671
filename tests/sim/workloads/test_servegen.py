"""ServeGen per-client rate traces, on tiny generated files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from core.tokenizer import WordTokenizer
from sim.workloads import ApiKind, TraceFormatError, WorkloadSpecError, parse_workload
from sim.workloads.servegen import ServeGenConfig, ServeGenTrace

# Three 600 s windows: 0.5 req/s (Gamma), silent, 0.2 req/s (Weibull).
CLIENT_1 = "0,0.5,2.0,Gamma,0.25,8.0\n600,0,0,,0,0\n1200,0.2,1.0,Weibull,1.5,3.0\n"
CLIENT_2 = "0,0.1,1.0,Gamma,1.0,10.0\n600,0.1,1.0,Gamma,1.0,10.0\n1200,0,0,,0,0\n"


@pytest.fixture
def trace_dir(trace_file: Callable[[str, str], Path]) -> Path:
    trace_file("chunk-1-trace.csv", CLIENT_1)
    return trace_file("chunk-2-trace.csv", CLIENT_2).parent


def test_arrivals_follow_each_windows_rate_and_merge_in_time_order(trace_dir: Path) -> None:
    programs = list(ServeGenTrace(trace_dir).programs())
    starts = [p.start for p in programs]
    assert starts == sorted(starts)
    one = [p.start for p in programs if p.session_key == "client-1"]
    # Expected 300, nothing in 600-1200, then about 120: a renewal process varies a bit.
    assert 200 < sum(1 for t in one if t < 600) < 400
    assert not any(600 <= t < 1200 for t in one)
    assert 70 < sum(1 for t in one if t >= 1200) < 170
    assert {p.session_key for p in programs} == {"client-1", "client-2"}


def test_programs_are_single_unique_completions_with_exact_lengths(trace_dir: Path) -> None:
    tokenizer = WordTokenizer()
    programs = list(ServeGenTrace(trace_dir, ServeGenConfig(max_input_tokens=300)).programs())[:20]
    prompts = set()
    for program in programs:
        (step,) = program.steps
        assert step.kind is ApiKind.COMPLETION and step.ignore_eos
        assert 1 <= len(tokenizer.encode(step.prompt)) <= 300
        assert 1 <= step.max_tokens <= 1024
        prompts.add(step.prompt.split()[0])
    assert len(prompts) == len(programs)  # a unique first token: no accidental sharing


def test_the_same_seed_gives_the_same_trace(trace_dir: Path) -> None:
    first = [(p.start, p.steps) for p in ServeGenTrace(trace_dir).programs()]
    again = [(p.start, p.steps) for p in ServeGenTrace(trace_dir).programs()]
    other = [
        (p.start, p.steps) for p in ServeGenTrace(trace_dir, ServeGenConfig(seed=1)).programs()
    ]
    assert first == again != other


def test_rate_scale_thins_the_load(trace_dir: Path) -> None:
    full = len(list(ServeGenTrace(trace_dir).programs()))
    tenth = len(list(ServeGenTrace(trace_dir, ServeGenConfig(rate_scale=0.1)).programs()))
    assert 0.05 * full < tenth < 0.2 * full


def test_a_shifted_trace_starts_later_in_the_day_and_wraps(trace_dir: Path) -> None:
    shifted = ServeGenTrace(trace_dir).shifted(600.0)
    one = [p.start for p in shifted.programs() if p.session_key == "client-1"]
    # Trace seconds 600-1800 come first (silent, then 0.2 req/s), then 0-600 wrapped.
    assert not any(t < 600 for t in one)
    assert any(600 <= t < 1200 for t in one)
    assert 200 < sum(1 for t in one if t >= 1200) < 400
    assert max(one) < 1800


def test_lengths_come_from_the_dataset_pdfs_when_present(
    trace_dir: Path, trace_file: Callable[[str, str], Path]
) -> None:
    pdfs = {"input_tokens": "{40: 0.5, 41: 0.5}", "output_tokens": "{7: 1.0}"}
    trace_file("chunk-1-dataset.json", json.dumps({"0": pdfs}))
    tokenizer = WordTokenizer()
    for program in ServeGenTrace(trace_dir / "chunk-1-trace.csv").programs():
        (step,) = program.steps
        assert len(tokenizer.encode(step.prompt)) in (40, 41)
        assert step.max_tokens == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,0.5,2.0,Gamma,0.25\n", "expected 6 columns"),
        ("0,fast,2.0,Gamma,0.25,8\n", "cannot read"),
        ("0,0.5,2.0,Poisson,1,1\n", "bad rate or distribution"),
    ],
)
def test_bad_rows_name_the_file_and_line(
    trace_file: Callable[[str, str], Path], text: str, message: str
) -> None:
    path = trace_file("chunk-9-trace.csv", "0,0,0,,0,0\n" + text)
    with pytest.raises(TraceFormatError, match=rf"chunk-9-trace.csv:2: {message}"):
        list(ServeGenTrace(path).programs())


def test_a_directory_without_chunks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no chunk"):
        list(ServeGenTrace(tmp_path).programs())


def test_the_registry_reads_a_directory_with_options(trace_dir: Path) -> None:
    workload = parse_workload(f"servegen:{trace_dir}@rate_scale=0.5,start_s=600", seed=4)
    assert isinstance(workload, ServeGenTrace) and workload.timed
    assert workload.config == ServeGenConfig(seed=4, rate_scale=0.5, start_s=600.0)
    with pytest.raises(WorkloadSpecError, match="not found"):
        parse_workload(f"servegen:{trace_dir}/missing", seed=0)
    with pytest.raises(WorkloadSpecError, match="bad option"):
        parse_workload(f"servegen:{trace_dir}@speedup=2", seed=0)


def test_shifted_copies_never_share_a_prompt(trace_dir: Path) -> None:
    trace = ServeGenTrace(trace_dir)
    here = {p.steps[0].prompt.split()[0] for p in trace.programs()}
    there = {p.steps[0].prompt.split()[0] for p in trace.shifted(600.0).programs()}
    assert here and there and not here & there


def test_a_quiet_window_with_empty_pdfs_is_not_an_error(
    trace_dir: Path, trace_file: Callable[[str, str], Path]
) -> None:
    # ServeGen's own files carry "{}" for a 6 h window with no requests.
    quiet = {"input_tokens": "{}", "output_tokens": "{}", "reason_ratio": "{}"}
    busy = {"input_tokens": "{40: 1.0}", "output_tokens": "{7: 1.0}"}
    trace_file("chunk-1-dataset.json", json.dumps({"0": busy, "600": quiet}))
    tokenizer = WordTokenizer()
    programs = list(ServeGenTrace(trace_dir / "chunk-1-trace.csv").programs())
    late = [p for p in programs if p.start >= 1200]
    assert late, "the fixture has requests after the quiet window"
    for program in programs:  # the quiet window borrows the last window with lengths
        (step,) = program.steps
        assert len(tokenizer.encode(step.prompt)) == 40
        assert step.max_tokens == 7


def test_a_trace_whose_only_window_is_quiet_uses_the_default_lengths(
    trace_dir: Path, trace_file: Callable[[str, str], Path]
) -> None:
    quiet = {"input_tokens": "{}", "output_tokens": "{}"}
    trace_file("chunk-1-dataset.json", json.dumps({"0": quiet}))
    config = ServeGenConfig(max_input_tokens=50, max_output_tokens=9)
    programs = list(ServeGenTrace(trace_dir / "chunk-1-trace.csv", config).programs())
    assert programs
    assert all(1 <= p.steps[0].max_tokens <= 9 for p in programs)


def test_a_multimodal_clients_prompt_adds_its_text_and_media_tokens(
    trace_dir: Path, trace_file: Callable[[str, str], Path]
) -> None:
    pdfs = {
        "text_tokens": "{30: 1.0}",
        "image_tokens": "{12: 1.0}",
        "audio_tokens": "{0: 1.0}",
        "video_tokens": "{0: 1.0}",
        "image_count": "{1: 1.0}",
        "output_tokens": "{5: 1.0}",
    }
    trace_file("chunk-1-dataset.json", json.dumps({"0": pdfs}))
    tokenizer = WordTokenizer()
    for program in ServeGenTrace(trace_dir / "chunk-1-trace.csv").programs():
        (step,) = program.steps
        assert len(tokenizer.encode(step.prompt)) == 42
        assert step.max_tokens == 5
