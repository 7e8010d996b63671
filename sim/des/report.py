"""Show simulation results: a text table and a self-contained plotly HTML report.

The HTML embeds plotly.js from the installed ``plotly`` package (no CDN), so a
report opens offline and stays readable after an upgrade.  Each report is saved
under ``<VAR_DIR>/simulations/`` with a JSON sidecar holding the run's options
and summaries (``sim.des.saved_reports``, which lists them for the console).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from sim.des.metrics import Summary
from sim.des.saved_reports import new_report_path, write_report

COLUMNS = (
    ("policy", 16),
    ("ok", 6),
    ("req/s", 7),
    ("TTFT p50", 9),
    ("p90", 7),
    ("p99", 7),
    ("e2e p50", 8),
    ("p90", 7),
    ("p99", 7),
    ("hit %", 6),
    ("out var", 8),
    ("fwd %", 6),
    ("qwait p50", 10),
    ("p90", 7),
)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    rows = []
    for s in summaries:
        rows.append(
            [
                s.label,
                str(s.ok),
                f"{s.throughput_rps:.2f}",
                *(_s(s.ttft[p]) for p in ("p50", "p90", "p99")),
                *(_s(s.e2e[p]) for p in ("p50", "p90", "p99")),
                f"{100 * s.hit_rate:.1f}",
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
    failed = [s for s in summaries if s.failed or s.unfinished]
    for s in failed:
        lines.append(f"{s.label}: {s.failed} failed {s.errors}, {s.unfinished} unfinished")
    return "\n".join(lines)


def _figures(summaries: Sequence[Summary]) -> list[go.Figure]:
    labels = [s.label for s in summaries]
    figs = [
        go.Figure(go.Bar(x=labels, y=[s.throughput_rps for s in summaries])).update_layout(
            title="Throughput (requests/s)"
        ),
        go.Figure(go.Bar(x=labels, y=[100 * s.hit_rate for s in summaries])).update_layout(
            title="KV cache hit rate (%)"
        ),
    ]
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
    return figs


def render_html(title: str, options: dict[str, Any], summaries: Sequence[Summary]) -> str:
    """One self-contained page: options, the table, and the charts."""
    parts = []
    for index, fig in enumerate(_figures(summaries)):
        fig.update_layout(height=360, margin={"t": 48, "b": 40})
        parts.append(pio.to_html(fig, include_plotlyjs=index == 0, full_html=False))
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in table_rows(summaries)
    )
    opts = html.escape(json.dumps(options, indent=1, sort_keys=True, default=str))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><pre>{opts}</pre>"
        f"<table><tr>{head}</tr>{body}</table>{''.join(parts)}</body></html>"
    )


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
    return write_report(target, page, title, options, [s.as_dict() for s in summaries])
