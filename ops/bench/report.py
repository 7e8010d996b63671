"""Turn phase results into the proxy benchmark's comparison rows, table and JSON.

A row compares one balancer with the backends called directly, for one mode
(streaming or not) and one concurrency: throughput as a ratio (balancer /
direct, requests and tokens), latency as the time the balancer *adds*
(balancer percentile minus direct percentile, in milliseconds), and what the
balancer process spent (CPU seconds, share of one core, CPU milliseconds per
request, peak RSS).  Phases
repeated over several rounds are pooled: counts and wall time are summed and
latency samples concatenated before any ratio or percentile is taken.

A row's ``errors`` are the balancer's own failed requests; the direct phase's
are kept apart (``direct_errors``), since that phase is the baseline every
balancer of the cell shares, and a failure there is the backends' or the
generator's, not a balancer's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DIRECT = "direct"


@dataclass(slots=True)
class Pooled:
    """Results of one target (direct or a server) for one mode and concurrency."""

    ok: int = 0
    errors: int = 0
    first_error: str = ""
    elapsed_s: float = 0.0
    tokens: int = 0
    client_cpu_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    server_cpu_s: float | None = None
    server_rss_bytes: int | None = None

    def add(self, result: dict[str, Any], usage: tuple[float, int] | None) -> None:
        self.ok += result["ok"]
        self.errors += result["errors"]
        self.first_error = self.first_error or result["first_error"]
        self.elapsed_s += result["elapsed_s"]
        self.tokens += result["tokens"]
        self.client_cpu_s += result["client_cpu_s"]
        self.ttft_s += result["ttft_s"]
        self.e2e_s += result["e2e_s"]
        if usage is not None:
            cpu, rss = usage
            self.server_cpu_s = (self.server_cpu_s or 0.0) + cpu
            self.server_rss_bytes = max(self.server_rss_bytes or 0, rss)

    @property
    def rps(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s else 0.0


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    concurrency: int
    server: str
    requests: int
    errors: int  # the balancer's phases only
    direct_rps: float
    proxy_rps: float
    rps_ratio: float
    tokens_ratio: float
    ttft_p50_added_ms: float | None
    ttft_p99_added_ms: float | None
    e2e_p50_added_ms: float
    e2e_p99_added_ms: float
    balancer_cpu_s: float | None
    balancer_cpu_share: float | None  # CPU seconds per wall second of the phase
    # CPU milliseconds per successful request: unlike the ratios, barely moved by other
    # load on the machine, so the number to compare when optimizing.
    balancer_cpu_ms_per_request: float | None
    balancer_rss_mib: float | None
    client_cpu_share: float  # of the proxied phases: is the generator near its limit?
    first_error: str
    # The direct phases' failures (the shared baseline), reported apart.
    direct_errors: int = 0
    direct_first_error: str = ""


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _added_ms(proxy: Sequence[float], direct: Sequence[float], q: float) -> float:
    return (percentile(proxy, q) - percentile(direct, q)) * 1000


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def compare(mode: str, concurrency: int, server: str, direct: Pooled, proxy: Pooled) -> Row:
    stream = mode == "stream"
    wall = proxy.elapsed_s or math.nan
    cpu = proxy.server_cpu_s
    return Row(
        mode=mode,
        concurrency=concurrency,
        server=server,
        requests=proxy.ok,
        errors=proxy.errors,
        direct_rps=direct.rps,
        proxy_rps=proxy.rps,
        rps_ratio=_ratio(proxy.rps, direct.rps),
        tokens_ratio=_ratio(proxy.tps, direct.tps),
        ttft_p50_added_ms=_added_ms(proxy.ttft_s, direct.ttft_s, 50) if stream else None,
        ttft_p99_added_ms=_added_ms(proxy.ttft_s, direct.ttft_s, 99) if stream else None,
        e2e_p50_added_ms=_added_ms(proxy.e2e_s, direct.e2e_s, 50),
        e2e_p99_added_ms=_added_ms(proxy.e2e_s, direct.e2e_s, 99),
        balancer_cpu_s=cpu,
        balancer_cpu_share=cpu / wall if cpu is not None else None,
        balancer_cpu_ms_per_request=cpu * 1000 / proxy.ok if cpu is not None and proxy.ok else None,
        balancer_rss_mib=(proxy.server_rss_bytes / 2**20) if proxy.server_rss_bytes else None,
        client_cpu_share=proxy.client_cpu_s / wall,
        first_error=proxy.first_error,
        direct_errors=direct.errors,
        direct_first_error=direct.first_error,
    )


COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, Row attribute, format)
    ("mode", "mode", "s"),
    ("conc", "concurrency", "d"),
    ("server", "server", "s"),
    ("ok", "requests", "d"),
    ("err", "errors", "d"),
    ("direct rps", "direct_rps", ".1f"),
    ("proxy rps", "proxy_rps", ".1f"),
    ("rps x", "rps_ratio", ".2f"),
    ("tok/s x", "tokens_ratio", ".2f"),
    ("+ttft p50 ms", "ttft_p50_added_ms", ".2f"),
    ("+ttft p99 ms", "ttft_p99_added_ms", ".2f"),
    ("+e2e p50 ms", "e2e_p50_added_ms", ".2f"),
    ("+e2e p99 ms", "e2e_p99_added_ms", ".2f"),
    ("bal cpu s", "balancer_cpu_s", ".2f"),
    ("bal cpu %", "balancer_cpu_share", ".0%"),
    ("bal ms/req", "balancer_cpu_ms_per_request", ".2f"),
    ("bal rss MiB", "balancer_rss_mib", ".0f"),
    ("gen cpu %", "client_cpu_share", ".0%"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def format_table(rows: Sequence[Row]) -> str:
    """One aligned plain-text table (a header line, one line per row), then any errors:
    each balancer's, and the direct baseline's once per mode and concurrency."""
    cells = [[header for header, _, _ in COLUMNS]]
    cells += [[_cell(getattr(row, attr), fmt) for _, attr, fmt in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in cells]  # fmt: skip
    notes = [f"{r.mode} x{r.concurrency} {r.server}: {r.errors} failed, first: {r.first_error}"
             for r in rows if r.errors]  # fmt: skip
    # The direct phase is shared by every balancer of its cell: noted once per cell.
    failed_baselines = {(r.mode, r.concurrency): r for r in rows if r.direct_errors}
    notes += [f"{mode} x{conc} {DIRECT} (the baseline): {r.direct_errors} failed, "
              f"first: {r.direct_first_error}"
              for (mode, conc), r in failed_baselines.items()]  # fmt: skip
    return "\n".join(lines + notes) + "\n"


def write_json(path: Path, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """The rows (NaN as null) and the run's settings, for comparing runs later."""

    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and math.isnan(value) else value

    data = {"meta": meta, "rows": [{k: clean(v) for k, v in asdict(r).items()} for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")
