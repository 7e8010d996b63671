"""Show simulation results: a text table and a plotly HTML report.

The HTML references plotly.js as ``plotly.min.js`` next to it instead of
inlining it (4.8 MB per report): ``save_report`` copies the installed
``plotly`` package's own bundle into the reports folder once, so a report opens
offline straight from disk, and the console serves the same bundle beside the
reports it lists.  No CDN either way.  Each report is saved under
``<VAR_DIR>/simulations/`` with a JSON sidecar holding the run's options and
summaries (``sim.des.saved_reports``, which lists them for the console).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
import plotly.io as pio

from sim.des.metrics import Summary
from sim.des.saved_reports import PLOTLY_JS, new_report_path, write_report

PLOTLY_SOURCE = Path(plotly.__file__).resolve().parent / "package_data" / PLOTLY_JS

COLUMNS = (
    ("policy", 16),
    ("ok", 6),
    ("rej", 5),
    ("drop", 5),
    ("goodput", 8),
    ("SLO %", 6),
    ("req/s", 7),
    ("TTFT p50", 9),
    ("p90", 7),
    ("p99", 7),
    ("e2e p50", 8),
    ("p90", 7),
    ("p99", 7),
    ("hit %", 6),
    ("hit/bound", 9),
    ("bound %", 8),
    ("hit/start", 9),
    ("start %", 8),
    ("hit/reach", 9),
    ("reach %", 8),
    ("inf %", 6),
    ("out var", 8),
    ("fwd %", 6),
    ("qwait p50", 10),
    ("p90", 7),
)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def ranked(summaries: Sequence[Summary]) -> list[Summary]:
    """Best goodput first (ties keep the run order): what meets the SLO is what counts."""
    return sorted(summaries, key=lambda s: -s.goodput_rps)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    """One row per run, ranked by goodput."""
    rows = []
    for s in ranked(summaries):
        rows.append(
            [
                s.label,
                str(s.ok),
                str(s.rejected),
                str(s.dropped),
                f"{s.goodput_rps:.2f}",
                f"{100 * s.slo_attainment:.1f}",
                f"{s.throughput_rps:.2f}",
                *(_s(s.ttft[p]) for p in ("p50", "p90", "p99")),
                *(_s(s.e2e[p]) for p in ("p50", "p90", "p99")),
                f"{100 * s.hit_rate:.1f}",
                _share(s.hit_of_bound),
                f"{100 * s.bound_hit_rate:.1f}",
                _share(s.hit_of_bound_at_start),
                f"{100 * s.bound_at_start:.1f}",
                _share(s.hit_of_reachable),
                f"{100 * s.bound_reachable:.1f}",
                f"{100 * s.bound_infinite:.1f}",
                f"{s.outstanding_variance:.2f}",
                f"{100 * s.forwarded_share:.1f}",
                _s(s.queue_wait["p50"]),
                _s(s.queue_wait["p90"]),
            ]
        )
    return rows


def format_table(summaries: Sequence[Summary]) -> str:
    """The console table: one row per run, latencies in seconds."""
    widths = [w for _, w in COLUMNS]
    lines = [" ".join(name.rjust(w) for (name, _), w in zip(COLUMNS, widths, strict=True))]
    for row in table_rows(summaries):
        lines.append(" ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    lines.extend(format_waits(summaries))
    failed = [s for s in summaries if s.failed or s.unfinished]
    for s in failed:
        lines.append(f"{s.label}: {s.failed} failed {s.errors}, {s.unfinished} unfinished")
    if summaries:
        lines.append(LEGEND.format(slo=summaries[0].ttft_slo_s))
    return "\n".join(lines)


WAIT_COLUMNS = (
    ("per token", 16),
    ("itl ms", 7),
    ("fixed", 6),
    ("prefill", 8),
    ("batch", 6),
    ("its batch", 10),
    ("even", 6),
    ("even itl", 9),
    ("x", 6),
    ("in region", 10),
    ("x", 6),
)


def wait_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    """One row per run that sampled a token (``sim.des.metrics.token_waits``),
    ranked by goodput."""
    rows = []
    for s in ranked(summaries):
        w = s.waits
        if not w:
            continue
        rows.append(
            [
                s.label,
                *(f"{w[key]:.2f}" for key in ("itl_ms", "fixed_ms", "prefill_ms", "batch_ms")),
                f"{w['token_batch']:.1f}",
                f"{w['even_share']:.3f}",
                f"{w['even_itl_ms']:.2f}",
                f"{w['itl_ms'] / w['even_itl_ms']:.3f}",
                f"{w['region_share']:.3f}",
                f"{w['itl_ms'] / w['region_itl_ms']:.3f}",
            ]
        )
    return rows


def format_waits(summaries: Sequence[Summary]) -> list[str]:
    """What the engines' tokens waited for, as console lines; none when no run
    sampled a token."""
    rows = wait_rows(summaries)
    if not rows:
        return []
    widths = [w for _, w in WAIT_COLUMNS]
    lines = [" ".join(name.rjust(w) for (name, _), w in zip(WAIT_COLUMNS, widths, strict=True))]
    for row in rows:
        lines.append(" ".join(c.rjust(width) for c, width in zip(row, widths, strict=True)))
    lines.append(WAITS_LEGEND)
    return lines


WAITS_LEGEND = (
    "per token: the engines' mean inter-token latency (each sampled token waits its whole step) "
    "split into the fixed weight read, prefill chunks, and what grows with the batch; its "
    "batch: the batch the average token waited in; even: the share of it left had each "
    "instant's running requests been spread evenly over all the replicas (sampled each second "
    "while clients sent); even itl: the latency with the batch term at that share; x: itl / "
    "even itl; in region, x: the same with each region's requests spread over its own replicas."
)

LEGEND = (
    "ranked by goodput: requests/s answered with TTFT <= {slo:g} s; req/s and goodput are "
    "over the window clients sent in (the drain after it is left out); SLO % and goodput count "
    "every rejection (rej: 400) and drop (timeouts, 5xx, unfinished) as a miss; percentiles "
    "are over successes. hit/bound: hit rate over the fleet's KV pooled as one LRU cache "
    "(bound %); hit/start: over the same cache with each request looking up when an engine "
    "took it, not when it was sent (start %: what the run's waits left to placement); "
    "hit/reach: over what this deployment's balancers reach without forwarding, "
    "each balancer's replicas pooled for its own clients (reach %); inf %: one infinite cache."
)


def _figures(summaries: Sequence[Summary]) -> list[go.Figure]:
    summaries = ranked(summaries)
    labels = [s.label for s in summaries]
    throughput = go.Figure()
    throughput.add_bar(name="goodput", x=labels, y=[s.goodput_rps for s in summaries])
    throughput.add_bar(name="throughput", x=labels, y=[s.throughput_rps for s in summaries])
    throughput.update_layout(
        title=f"Goodput (TTFT <= {summaries[0].ttft_slo_s:g} s) and throughput (requests/s)",
        barmode="group",
    )
    hits = go.Figure()
    for name, attr in (
        ("hit rate", "hit_rate"),
        ("bound: pooled LRU", "bound_hit_rate"),
        ("pooled LRU at the engines' start times", "bound_at_start"),
        ("reachable: each balancer's replicas pooled", "bound_reachable"),
        ("one infinite cache", "bound_infinite"),
    ):
        hits.add_bar(name=name, x=labels, y=[100 * getattr(s, attr) for s in summaries])
    hits.update_layout(title="KV cache hit rate and its oracle bounds (%)", barmode="group")
    figs = [throughput, hits]
    for name, attr in (("TTFT", "ttft"), ("End-to-end latency", "e2e")):
        fig = go.Figure()
        for p in ("p50", "p90", "p99"):
            fig.add_bar(name=p, x=labels, y=[getattr(s, attr)[p] for s in summaries])
        fig.update_layout(title=f"{name} (s)", barmode="group", yaxis_type="log")
        figs.append(fig)
    figs.append(
        go.Figure(go.Bar(x=labels, y=[s.outstanding_variance for s in summaries])).update_layout(
            title="Variance of outstanding requests across replicas"
        )
    )
    timed = [s for s in summaries if s.waits]
    if timed:
        itl = go.Figure()
        names = [s.label for s in timed]
        for name, key in (("fixed", "fixed_ms"), ("prefill", "prefill_ms"), ("batch", "batch_ms")):
            itl.add_bar(name=name, x=names, y=[s.waits[key] for s in timed])
        itl.add_scatter(
            name="batches even over all replicas",
            x=names,
            y=[s.waits["even_itl_ms"] for s in timed],
            mode="markers",
        )
        itl.update_layout(title="Inter-token latency by step term (ms)", barmode="stack")
        figs.append(itl)
    return figs


def render_html(title: str, options: dict[str, Any], summaries: Sequence[Summary]) -> str:
    """One page: options, the table, and the charts, loading ``plotly.min.js`` beside it."""
    parts = [f"<script src='{PLOTLY_JS}'></script>"]
    for fig in _figures(summaries) if summaries else []:
        fig.update_layout(height=360, margin={"t": 48, "b": 40})
        parts.append(pio.to_html(fig, include_plotlyjs=False, full_html=False))
    table = _html_table([name for name, _ in COLUMNS], table_rows(summaries))
    timed = wait_rows(summaries)
    waits = _html_table([name for name, _ in WAIT_COLUMNS], timed) if timed else ""
    opts = html.escape(json.dumps(options, indent=1, sort_keys=True, default=str))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><pre>{opts}</pre>"
        f"{table}"
        f"<p>{html.escape(LEGEND.format(slo=summaries[0].ttft_slo_s)) if summaries else ''}</p>"
        f"{waits}<p>{html.escape(WAITS_LEGEND) if waits else ''}</p>"
        f"{''.join(parts)}</body></html>"
    )


def _html_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain HTML table: a header row, then the rows."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def ensure_plotly_js(folder: Path) -> Path:
    """The plotly bundle beside the reports: copied once, again after a plotly upgrade."""
    target = folder / PLOTLY_JS
    if not target.is_file() or target.stat().st_size != PLOTLY_SOURCE.stat().st_size:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PLOTLY_SOURCE, target)
    return target


def save_report(
    var_dir: Path,
    title: str,
    options: dict[str, Any],
    summaries: Sequence[Summary],
    path: Path | None = None,
) -> Path:
    """Write the HTML (to ``path`` or a fresh name under the reports dir) and its sidecar."""
    page = render_html(title, options, summaries)
    target = path if path is not None else new_report_path(var_dir, title)
    ensure_plotly_js(target.parent)
    return write_report(target, page, title, options, [s.as_dict() for s in summaries])
