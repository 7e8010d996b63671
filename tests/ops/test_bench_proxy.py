"""``manage.py bench proxy``: a tiny real run, and the report's arithmetic.

The smoke test starts the command's own loopback stack (zero-compute replicas,
a throwaway database, a uvicorn balancer: the default server, and the bare proxy
beside it) and checks the
table's shape and that every request of every phase succeeded.  No timing is asserted: the bench
reports ratios, and this machine's speed is not the test's business.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ops.bench.proxy import _server_list
from ops.bench.report import COLUMNS, Pooled, compare, format_table, percentile
from ops.embedded_redis import EmbeddedRedis
from tests.support.commands import run_command


def test_tiny_run_prints_every_row_and_every_request_succeeds(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    saved = tmp_path / "proxy.json"
    text = run_command(
        "bench", "proxy", "--concurrency", "1,4", "--requests", "6", "--bare",
        "--json", str(saved),
    )  # fmt: skip

    lines = text.splitlines()
    header_index = next(i for i, line in enumerate(lines) if line.split()[:2] == ["mode", "conc"])
    table = lines[header_index:]
    for header, _, _ in COLUMNS:
        assert header in table[0]
    assert [line.split()[:3] for line in table[1:]] == [
        [mode, conc, server]
        for mode in ("stream", "nonstream")
        for conc in ("1", "4")
        for server in ("uvicorn", "bare")
    ]

    rows = json.loads(saved.read_text())["rows"]
    assert len(rows) == 8
    for row in rows:
        assert row["errors"] == 0, row["first_error"]
        assert row["direct_errors"] == 0, row["direct_first_error"]
        assert row["requests"] == 6
        assert row["rps_ratio"] > 0 and row["tokens_ratio"] > 0
        assert row["balancer_cpu_s"] is not None and row["balancer_rss_mib"] > 0
        streaming = row["mode"] == "stream"
        assert (row["ttft_p50_added_ms"] is not None) == streaming


def test_backends_without_a_balancer_are_refused_before_anything_starts() -> None:
    with pytest.raises(CommandError, match="--balancer"):
        call_command("bench", "proxy", "--backend", "http://127.0.0.1:9", stdout=io.StringIO())


def test_percentiles_are_nearest_rank_and_rows_subtract_the_direct_baseline() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert math.isnan(percentile([], 50))

    direct, proxy = Pooled(), Pooled()
    base = {"errors": 0, "first_error": "", "client_cpu_s": 0.1}
    direct.add({**base, "ok": 10, "elapsed_s": 1.0, "tokens": 640,
                "ttft_s": [0.001] * 10, "e2e_s": [0.010] * 10}, None)  # fmt: skip
    proxy.add({**base, "ok": 10, "elapsed_s": 2.0, "tokens": 640,
               "ttft_s": [0.003] * 10, "e2e_s": [0.015] * 10}, (0.5, 100 * 2**20))  # fmt: skip
    row = compare("stream", 1, "daphne", direct, proxy)
    assert row.rps_ratio == pytest.approx(0.5)
    assert row.tokens_ratio == pytest.approx(0.5)
    assert row.ttft_p50_added_ms == pytest.approx(2.0)
    assert row.e2e_p99_added_ms == pytest.approx(5.0)
    assert row.balancer_cpu_share == pytest.approx(0.25)
    assert row.balancer_cpu_ms_per_request == pytest.approx(50)
    assert row.balancer_rss_mib == pytest.approx(100)


def test_the_direct_baselines_failures_are_reported_apart_once_per_cell() -> None:
    base = {"elapsed_s": 1.0, "tokens": 640, "client_cpu_s": 0.1,
            "ttft_s": [0.001] * 10, "e2e_s": [0.010] * 10}  # fmt: skip
    direct, clean, failing = Pooled(), Pooled(), Pooled()
    direct.add({**base, "ok": 8, "errors": 2, "first_error": "IncompleteReadError"}, None)
    clean.add({**base, "ok": 10, "errors": 0, "first_error": ""}, (0.5, 2**20))
    failing.add({**base, "ok": 9, "errors": 1, "first_error": "HTTP 502: upstream"}, (0.5, 2**20))
    rows = [compare("stream", 4, "uvicorn", direct, clean),
            compare("stream", 4, "bare", direct, failing)]  # fmt: skip

    assert [(r.errors, r.first_error) for r in rows] == [(0, ""), (1, "HTTP 502: upstream")]
    assert all((r.direct_errors, r.direct_first_error) == (2, "IncompleteReadError") for r in rows)
    notes = format_table(rows).splitlines()[len(rows) + 1 :]
    assert notes == [
        "stream x4 bare: 1 failed, first: HTTP 502: upstream",
        "stream x4 direct (the baseline): 2 failed, first: IncompleteReadError",
    ]


def test_servers_are_a_comma_separated_list_and_unknown_ones_are_refused() -> None:
    assert _server_list("both") == ["daphne", "uvicorn"]
    assert _server_list("uvicorn,uvicorn-asyncio") == ["uvicorn", "uvicorn-asyncio"]
    with pytest.raises(CommandError, match="unknown server"):
        call_command("bench", "proxy", "--server", "uvicorn,gunicorn", stdout=io.StringIO())
    with pytest.raises(CommandError, match="NAME=VALUE"):
        call_command("bench", "proxy", "--balancer-env", "NOEQUALS", stdout=io.StringIO())
