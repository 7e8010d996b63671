"""The table, the self-contained HTML report and the list of saved reports."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from plotly.offline import get_plotlyjs

from sim.des.config import SimConfig
from sim.des.metrics import Summary, percentile, summarize
from sim.des.report import format_table, render_html, save_report
from sim.des.saved_reports import list_reports
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


def test_the_table_has_one_row_per_run(make_config: Callable[..., SimConfig]) -> None:
    lines = format_table(summaries(make_config)).splitlines()
    assert "TTFT p50" in lines[0] and "hit %" in lines[0] and "fwd %" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["least_load", "skylb"]


def test_the_html_embeds_plotly_and_needs_no_network(
    make_config: Callable[..., SimConfig],
) -> None:
    page = render_html("demo", {"seed": 3}, summaries(make_config))
    library = get_plotlyjs()[:2000]
    assert page.count(library) == 1  # plotly.js itself is inside, once for all charts
    assert re.search(r"<script[^>]*\bsrc=", page) is None  # nothing fetched from a CDN
    assert page.count("Plotly.newPlot") == 5
    assert "skylb" in page


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
