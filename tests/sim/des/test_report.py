"""The table, the HTML report (plotly.js beside it, not inlined) and the saved reports."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from sim.des.config import SimConfig
from sim.des.metrics import Summary, percentile, summarize
from sim.des.report import PLOTLY_SOURCE, format_table, render_html, save_report
from sim.des.saved_reports import PLOTLY_JS, list_reports
from sim.des.world import simulate


def summaries(make_config: Callable[..., SimConfig]) -> list[Summary]:
    return [
        summarize(simulate(make_config(policy=p, max_requests=10)), p)
        for p in ("least_load", "skylb")
    ]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.99) == 4.0


def test_the_table_has_one_row_per_run_ranked_by_goodput(
    make_config: Callable[..., SimConfig],
) -> None:
    results = summaries(make_config)
    lines = format_table(results).splitlines()
    for column in (
        "goodput",
        "SLO %",
        "rej",
        "drop",
        "TTFT p50",
        "hit %",
        "hit/bound",
        "hit/start",
        "hit/reach",
        "fwd %",
    ):
        assert column in lines[0]
    rows = [line.split()[0] for line in lines[1:3]]
    best_first = sorted(results, key=lambda s: -s.goodput_rps)
    assert rows == [s.label for s in best_first]
    assert lines[-1].startswith("ranked by goodput: requests/s answered with TTFT <= 2 s")


def test_the_html_references_plotly_beside_it_and_needs_no_network(
    make_config: Callable[..., SimConfig],
) -> None:
    page = render_html("demo", {"seed": 3}, summaries(make_config))
    assert get_plotlyjs()[:2000] not in page  # not inlined: the page stays small
    assert len(page.encode()) < 200_000
    sources = re.findall(r"<script[^>]*\bsrc=['\"]([^'\"]+)", page)
    assert sources == [PLOTLY_JS]  # one relative file, no CDN
    assert page.count("Plotly.newPlot") == 6
    assert "skylb" in page and "hit/bound" in page
    assert "Inter-token latency by step term" in page and "even itl" in page


def test_a_saved_report_has_the_plotly_bundle_beside_it(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    path = save_report(tmp_path, "run", {}, summaries(make_config))
    bundle = path.parent / PLOTLY_JS
    assert bundle.read_bytes() == PLOTLY_SOURCE.read_bytes()
    assert path.stat().st_size < 200_000


def test_saved_reports_are_listed_newest_first(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    results = summaries(make_config)
    first = save_report(tmp_path, "first run", {"seed": 1}, results)
    second = save_report(tmp_path, "second run", {"seed": 2}, results[:1])
    (tmp_path / "simulations" / "broken.json").write_text("{")
    listed = list_reports(tmp_path)
    assert [info.path for info in listed] == [second, first]
    assert listed[0].title == "second run"
    assert listed[0].options == {"seed": 2}
    assert [s["label"] for s in listed[1].summaries] == ["least_load", "skylb"]
    sidecar = json.loads(first.with_suffix(".json").read_text())
    assert sidecar["summaries"][0]["ok"] == 10


def test_below_the_table_each_run_says_what_its_tokens_waited_for(
    make_config: Callable[..., SimConfig],
) -> None:
    results = summaries(make_config)
    lines = format_table(results).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["per", "token", "itl"])
    assert header == 1 + len(results)  # right after the main table's rows
    rows = [line.split() for line in lines[header + 1 : header + 1 + len(results)]]
    assert [row[0] for row in rows] == [line.split()[0] for line in lines[1 : 1 + len(results)]]
    for summary in results:
        w = summary.waits
        assert w["itl_ms"] == pytest.approx(w["fixed_ms"] + w["prefill_ms"] + w["batch_ms"])
        assert w["fixed_ms"] == pytest.approx(30.0)  # the L4 profile's weight read
        assert 0 < w["even_share"] <= w["region_share"] <= 1
        assert w["even_itl_ms"] <= w["region_itl_ms"] <= w["itl_ms"] + 1e-9
        assert w["even_itl_ms"] <= w["itl_ms"] + 1e-9
        assert w["token_batch"] >= 1
    assert lines[header + 1 + len(results)].startswith("per token: the engines' mean")


def test_a_run_with_no_tokens_sampled_prints_no_token_table(
    make_config: Callable[..., SimConfig],
) -> None:
    results = summaries(make_config)
    silent = [dataclasses.replace(s, waits={}) for s in results]
    assert "per token" not in format_table(silent)
    page = render_html("demo", {}, silent)
    assert page.count("Plotly.newPlot") == 5 and "even itl" not in page
