"""Per-window demand read from ServeGen and Azure files; other formats are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.workload_files import servegen_rate, write_azure, write_servegen
from workers.scaling.workload_traces import azure_series, servegen_series


def test_servegen_sums_every_clients_rate_over_each_window(tmp_path: Path) -> None:
    series = servegen_series(write_servegen(tmp_path / "m", windows=30, day=12))
    assert series.name == "servegen/m" and not series.lengths_known
    assert len(series.requests) == 30
    for w in (0, 3, 29):
        want = 600 * (servegen_rate(w, 0, 12) + servegen_rate(w, 1, 12))
        assert series.requests[w] == pytest.approx(want)
        assert series.prompt[w] == pytest.approx(want * 1000)


def test_azure_sums_tokens_per_window_and_drops_the_cut_last_one(tmp_path: Path) -> None:
    series = azure_series(write_azure(tmp_path / "conv.csv", minutes=5), 60.0)
    assert series.name == "azure/conv" and series.lengths_known
    assert series.requests == (6.0, 6.0, 6.0, 6.0)
    assert series.prompt == (600.0,) * 4 and series.decode == (120.0,) * 4


def test_other_formats_are_refused_with_the_expected_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"expected ServeGen chunk-<id>-trace\.csv"):
        servegen_series(tmp_path)
    (tmp_path / "chunk-0-trace.csv").write_text("start,rate\n")
    with pytest.raises(ValueError, match=r"chunk-0-trace.csv:1: not a ServeGen rate row"):
        servegen_series(tmp_path)
    bad = tmp_path / "x.csv"
    bad.write_text("time,prompt,output\n1,2,3")
    with pytest.raises(ValueError, match="expected Azure LLM inference CSV"):
        azure_series(bad, 60.0)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,2,3")
    with pytest.raises(ValueError, match=r"x.csv:2: not a request row"):
        azure_series(bad, 60.0)
